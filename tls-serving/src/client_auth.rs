//! Client-certificate policies at the handshake.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{NoClientAuth, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::Error;

/// When the server asks for a client certificate and what it checks at the handshake.
/// The first five are exporter-toolkit's `client_auth_type` values.
#[derive(Debug, Clone)]
pub enum ClientAuth {
    /// `NoClientCert`: never ask.
    None,
    /// `RequestClientCert`: ask, accept none or any. This is also how Kubernetes API
    /// servers listen: the application verifies the chain per request against CAs
    /// that change at runtime.
    Request,
    /// `RequireAnyClientCert`: demand one, accept any.
    RequireAny,
    /// `VerifyClientCertIfGiven`: accept none, or one that chains to these CAs.
    VerifyIfGiven(Arc<RootCertStore>),
    /// `RequireAndVerifyClientCert`: demand one that chains to these CAs.
    RequireAndVerify(Arc<RootCertStore>),
}

impl ClientAuth {
    pub(crate) fn verifier(
        &self,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, Error> {
        let webpki = |roots: &Arc<RootCertStore>| {
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        };
        Ok(match self {
            ClientAuth::None => Arc::new(NoClientAuth),
            ClientAuth::Request => Arc::new(AnyClientCert {
                mandatory: false,
                algorithms: provider.signature_verification_algorithms,
            }),
            ClientAuth::RequireAny => Arc::new(AnyClientCert {
                mandatory: true,
                algorithms: provider.signature_verification_algorithms,
            }),
            ClientAuth::VerifyIfGiven(roots) => webpki(roots)
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::ClientCa(e.to_string()))?,
            ClientAuth::RequireAndVerify(roots) => webpki(roots)
                .build()
                .map_err(|e| Error::ClientCa(e.to_string()))?,
        })
    }
}

/// Accepts any client certificate chain at the handshake but still checks the
/// handshake signature, so a client can only present a certificate whose key it holds.
/// rustls ships no such verifier: its webpki verifier needs the CAs up front.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: clients then offer whichever certificate they have, as Go's
        // RequestClientCert servers see.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
