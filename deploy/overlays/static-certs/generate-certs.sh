#!/usr/bin/env bash
# Make a private CA and the adapter's serving certificate for overlays/static-certs:
#   ./generate-certs.sh [DIR]        (DIR defaults to certs/ beside this script)
# writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt and DIR/tls.key (ECDSA P-256). Only ca.crt,
# tls.crt and tls.key go into the cluster; keep ca.key offline to re-issue tls.crt
# (rerun with the same DIR: an existing CA is reused, the serving pair is replaced).
# The serving certificate is valid for DAYS days (default 365): renew before then.
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
trap 'rm -f "$ext" "$dir/tls.csr"' EXIT
cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:${service}.${namespace}.svc,DNS:${service}.${namespace}.svc.cluster.local
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -sha256 -days "$days" -extfile "$ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/ca.srl"
# The Secret is mounted 0440 for the adapter's group; the files here stay private.
chmod 600 "$dir/ca.key" "$dir/tls.key"
chmod 644 "$dir/ca.crt" "$dir/tls.crt"
openssl verify -CAfile "$dir/ca.crt" "$dir/tls.crt" >/dev/null
echo "wrote $dir/{ca.crt,ca.key,tls.crt,tls.key}"
