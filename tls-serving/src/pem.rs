//! PEM files to rustls types, with errors that name the file.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

fn pem_error(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Pem {
        path: path.to_owned(),
        what: what.to_string(),
    }
}

/// Every certificate in a PEM file, leaf first; at least one.
pub fn load_cert_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(pem_error(path, "no CERTIFICATE block"));
    }
    Ok(chain)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| pem_error(path, e))
}

/// A CA bundle from PEM bytes (`origin` names them in errors): every certificate
/// becomes a trust anchor; at least one must.
pub fn ca_bundle_from_pem(origin: &Path, bytes: &[u8]) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(bytes) {
        let cert = cert.map_err(|e| pem_error(origin, e))?;
        roots.add(cert).map_err(|e| pem_error(origin, e))?;
    }
    if roots.is_empty() {
        return Err(pem_error(origin, "no CERTIFICATE block"));
    }
    Ok(roots)
}

/// A CA bundle from a PEM file.
pub fn load_ca_bundle(path: &Path) -> Result<RootCertStore, Error> {
    ca_bundle_from_pem(path, &read(path)?)
}
