//! The rustls side of [`ClientTls`](crate::ClientTls): the client certificate presented now
//! (`ResolvesClientCert`), a server verifier delegating to the one for the roots trusted now,
//! and a session store that a rotation empties.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert, Resumption,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use tokio_util::sync::CancellationToken;

use super::Signatures;

/// How many sessions the client keeps for resumption (rustls's default).
const SESSIONS: usize = 256;

/// A `ClientConfig` presenting `identity`, verifying servers with `verifier`, resuming from
/// `sessions`.
pub(crate) fn client_config(
    provider: &Arc<CryptoProvider>,
    identity: &Arc<Identity>,
    verifier: &Arc<Verifier>,
    sessions: &Arc<Sessions>,
) -> Result<ClientConfig, rustls::Error> {
    let mut config = ClientConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(verifier) as _)
        .with_client_cert_resolver(Arc::clone(identity) as _);
    config.resumption = Resumption::store(Arc::clone(sessions) as _);
    Ok(config)
}

impl Identity {
    /// Presents nothing until [`store`](Self::store); `gone` is cancelled when the identity
    /// is dropped (every handle and config of the client is gone).
    pub(crate) fn new(gone: CancellationToken) -> Self {
        Self {
            current: ArcSwapOption::empty(),
            gone,
        }
    }

    /// Presents `key` from now on.
    pub(crate) fn store(&self, key: Arc<CertifiedKey>) {
        self.current.store(Some(key));
    }
}

impl Verifier {
    /// A verifier that refuses every server until [`store`](Self::store).
    pub(crate) fn new(provider: &CryptoProvider) -> Self {
        Self {
            inner: ArcSwapOption::empty(),
            signatures: Signatures(provider.signature_verification_algorithms),
        }
    }

    /// The webpki server verifier for a bundle's CA certificates and the extra `roots`, and
    /// their fingerprints; or why there is none.
    pub(crate) fn for_roots(
        bundle_cas: &[CertificateDer<'static>],
        roots: &Roots,
        provider: &Arc<CryptoProvider>,
    ) -> Result<(Arc<dyn ServerCertVerifier>, Vec<String>), String> {
        let from_bundle = if roots.bundle { bundle_cas } else { &[] };
        let roots: Vec<&CertificateDer<'static>> =
            from_bundle.iter().chain(roots.extra.iter()).collect();
        if roots.is_empty() {
            return Err("the bundle has no CA certificate (ca.crt) to trust servers with".into());
        }
        let mut store = RootCertStore::empty();
        for ca in roots.iter().map(|ca| (*ca).clone()) {
            store
                .add(ca)
                .map_err(|e| format!("a CA certificate cannot be a root: {e}"))?;
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(store),
            Arc::clone(provider),
        )
        .build()
        .map_err(|e| e.to_string())?;
        let fingerprints = roots
            .iter()
            .map(|ca| tls_source::Digest::of(ca).to_string())
            .collect();
        Ok((verifier, fingerprints))
    }

    /// Verifies servers with `verifier` from now on.
    pub(crate) fn store(&self, verifier: Arc<dyn ServerCertVerifier>) {
        self.inner.store(Some(Arc::new(verifier)));
    }
}

impl Sessions {
    /// Forgets every session: nothing from before is resumed.
    pub(crate) fn clear(&self) {
        self.inner
            .store(Arc::new(ClientSessionMemoryCache::new(SESSIONS)));
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            inner: ArcSwap::from_pointee(ClientSessionMemoryCache::new(SESSIONS)),
        }
    }
}

/// Which roots the client trusts servers with: the bundle's CA certificates (unless `bundle`
/// is off) and `extra` ones ([`ClientTlsBuilder::roots`](crate::ClientTlsBuilder::roots)).
#[derive(Debug, Clone)]
pub(crate) struct Roots {
    pub(crate) bundle: bool,
    pub(crate) extra: Arc<[CertificateDer<'static>]>,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            bundle: true,
            extra: Arc::new([]),
        }
    }
}

/// The client certificate presented now.
#[derive(Debug)]
pub(crate) struct Identity {
    current: ArcSwapOption<CertifiedKey>,
    gone: CancellationToken,
}

impl Drop for Identity {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

impl ResolvesClientCert for Identity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }

    fn has_certs(&self) -> bool {
        self.current.load().is_some()
    }
}

/// The server verifier for the roots trusted now; refuses every server before the first.
#[derive(Debug)]
pub(crate) struct Verifier {
    inner: ArcSwapOption<Arc<dyn ServerCertVerifier>>,
    signatures: Signatures,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.load().as_deref() {
            Some(inner) => {
                inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.schemes()
    }
}

/// The client's session cache, replaced (emptied) on every rotation.
#[derive(Debug)]
pub(crate) struct Sessions {
    inner: ArcSwap<ClientSessionMemoryCache>,
}

impl ClientSessionStore for Sessions {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.load().set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.load().kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.load().set_tls12_session(server_name, value);
    }

    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.load().tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.load().remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.inner.load().insert_tls13_ticket(server_name, value);
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.load().take_tls13_ticket(server_name)
    }
}
