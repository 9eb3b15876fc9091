//! The rustls side of client authentication: the `ServerConfig` with a webpki client verifier
//! for the trusted CAs, or, while none is trusted, a verifier that refuses every client.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{StoresServerSessions, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use super::{CertResolver, Signatures};

/// A `ServerConfig` that requires a client certificate chaining to one of `roots`, serving from
/// `resolver`, resuming from `sessions`, issuing no stateless tickets; and its verifier (open
/// connections are checked again with it when a CA leaves).
pub(crate) fn mtls_server_config(
    provider: &Arc<CryptoProvider>,
    resolver: &Arc<CertResolver>,
    roots: &[CertificateDer<'static>],
    sessions: &Arc<dyn StoresServerSessions>,
    authorization: Option<&crate::Authorization>,
) -> Result<(ServerConfig, Arc<dyn ClientCertVerifier>), rustls::Error> {
    let verifier: Arc<dyn ClientCertVerifier> = if roots.is_empty() {
        Arc::new(RefuseAll(Signatures(
            provider.signature_verification_algorithms,
        )))
    } else {
        let mut store = RootCertStore::empty();
        for root in roots {
            store.add(root.clone())?;
        }
        WebPkiClientVerifier::builder_with_provider(Arc::new(store), Arc::clone(provider))
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?
    };
    let verifier: Arc<dyn ClientCertVerifier> = match authorization {
        Some(authorization) => Arc::new(Authorized {
            inner: verifier,
            authorization: authorization.clone(),
        }),
        None => verifier,
    };
    let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::clone(&verifier))
        .with_cert_resolver(Arc::clone(resolver) as _);
    config.session_storage = Arc::clone(sessions);
    Ok((config, verifier))
}

/// Refuses every client certificate: the verifier while no CA is trusted.
#[derive(Debug)]
pub(crate) struct RefuseAll(Signatures);

impl ClientCertVerifier for RefuseAll {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}

/// A verifier, then the authorization rules on the client's identity.
#[derive(Debug)]
struct Authorized {
    inner: Arc<dyn ClientCertVerifier>,
    authorization: crate::Authorization,
}

impl ClientCertVerifier for Authorized {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.authorization.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
