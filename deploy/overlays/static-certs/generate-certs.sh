#!/usr/bin/env bash
# Make a private CA, the adapter's serving certificate and KEDA's client certificate for
# overlays/static-certs:
#   ./generate-certs.sh [DIR]        (DIR defaults to certs/ beside this script)
# writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt, DIR/tls.key, DIR/keda-client.crt and
# DIR/keda-client.key (ECDSA P-256). Only ca.key stays out of the cluster; keep it
# offline to re-issue the others (rerun with the same DIR: an existing CA is reused, both
# pairs are replaced). The client certificate (clientAuth only) is what the adapter's
# gRPC port requires of KEDA (--grpc-client-ca-file). Both certificates are valid for
# DAYS days (default 365): renew before then. EXTRA_SANS adds subjectAltName entries to
# the serving certificate (e.g. EXTRA_SANS=DNS:localhost for an adapter reached on this
# machine).
set -euo pipefail
dir="${1:-$(cd "$(dirname "$0")" && pwd)/certs}"
days="${DAYS:-365}"
service="gpu-metrics-adapter"
namespace="gpu-monitoring"
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/ca.key" ] || [ ! -s "$dir/ca.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key"
    openssl req -x509 -new -key "$dir/ca.key" -sha256 -days 3650 \
        -subj "/CN=${service}-ca" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$dir/ca.crt"
fi
openssl ecparam -name prime256v1 -genkey -noout -out "$dir/tls.key"
openssl req -new -key "$dir/tls.key" -subj "/CN=${service}.${namespace}.svc" -out "$dir/tls.csr"
ext="$(mktemp)"
trap 'rm -f "$ext" "$dir/tls.csr" "$dir/keda-client.csr"' EXIT
cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:${service}.${namespace}.svc,DNS:${service}.${namespace}.svc.cluster.local${EXTRA_SANS:+,$EXTRA_SANS}
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -sha256 -days "$days" -extfile "$ext" -out "$dir/tls.crt" 2>/dev/null
# KEDA's client certificate.
openssl ecparam -name prime256v1 -genkey -noout -out "$dir/keda-client.key"
openssl req -new -key "$dir/keda-client.key" -subj "/CN=keda" -out "$dir/keda-client.csr"
cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
EXT
openssl x509 -req -in "$dir/keda-client.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -sha256 -days "$days" -extfile "$ext" -out "$dir/keda-client.crt" 2>/dev/null
rm -f "$dir/ca.srl"
# The Secrets are mounted 0440 for the adapter's group; the files here stay private.
chmod 600 "$dir/ca.key" "$dir/tls.key" "$dir/keda-client.key"
chmod 644 "$dir/ca.crt" "$dir/tls.crt" "$dir/keda-client.crt"
openssl verify -CAfile "$dir/ca.crt" "$dir/tls.crt" "$dir/keda-client.crt" >/dev/null
echo "wrote $dir/{ca.crt,ca.key,tls.crt,tls.key,keda-client.crt,keda-client.key}"
