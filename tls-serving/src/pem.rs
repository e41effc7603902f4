//! PEM files to rustls types, with errors that name the file.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// Bounded, regular files only: a certificate path given `/dev/zero` or a FIFO fails at
/// once instead of eating memory or blocking.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, Error> {
    config_file::read(path, config_file::DEFAULT_LIMIT).map_err(|source| Error::Read {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every PEM load refuses what is not a regular file, at once, naming the path.
    #[test]
    fn pem_files_that_are_not_regular_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        for path in [Path::new("/dev/zero"), fifo.as_path(), dir.path()] {
            let errors = [
                load_cert_chain(path).map(|_| ()).unwrap_err(),
                load_private_key(path).map(|_| ()).unwrap_err(),
                load_ca_bundle(path).map(|_| ()).unwrap_err(),
            ];
            for e in errors {
                assert!(matches!(e, Error::Read { .. }), "{path:?}: {e:?}");
                assert!(e.to_string().contains("not a regular file"), "{e}");
            }
        }
    }

    #[test]
    fn a_pem_file_past_the_limit_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.pem");
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(config_file::DEFAULT_LIMIT + 1).expect("grow");
        let e = load_ca_bundle(&path).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
    }
}
