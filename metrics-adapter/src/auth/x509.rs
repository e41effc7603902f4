//! Client certificates, verified per request as k8s.io/apiserver's x509 authenticator
//! does: the leaf must chain to the CA (intermediates from the peer's chain), be valid
//! now, and allow client authentication.

use crate::error::Error;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, UnixTime};

/// The names of a verified client certificate's subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The first CN, empty when there is none.
    pub common_name: String,
    /// Every O, in order.
    pub organizations: Vec<String>,
}

/// Verifies `chain[0]` against `roots`, with the rest of `chain` as intermediates and
/// the client-auth key usage, and returns its subject.
pub fn verify_client(
    chain: &[CertificateDer<'_>],
    roots: &RootCertStore,
) -> Result<Subject, Error> {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(Error::Unauthenticated("no client certificate".into()));
    };
    let end_entity = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| Error::Unauthenticated(format!("unparsable client certificate: {e}")))?;
    let algorithms = rustls::crypto::ring::default_provider()
        .signature_verification_algorithms
        .all;
    end_entity
        .verify_for_usage(
            algorithms,
            &roots.roots,
            intermediates,
            UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .map_err(|e| {
            Error::Unauthenticated(format!("verifying certificate {}: {e}", describe(leaf)))
        })?;
    subject(leaf)
}

/// The CN and O fields of a certificate's subject.
pub fn subject(cert: &CertificateDer<'_>) -> Result<Subject, Error> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| Error::Unauthenticated(format!("unparsable client certificate: {e}")))?;
    let subject = parsed.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_string)
        .collect();
    Ok(Subject {
        common_name,
        organizations,
    })
}

/// `CN=…` of a certificate for error messages (as Go's messages name the subject).
fn describe(cert: &CertificateDer<'_>) -> String {
    match subject(cert) {
        Ok(s) => format!("CN={:?}", s.common_name),
        Err(_) => "(unparsable)".into(),
    }
}
