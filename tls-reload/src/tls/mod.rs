//! Everything that touches rustls's API lives in this module, so that a rustls upgrade (0.24
//! renames `ResolvesServerCert`) changes these files only.

pub(crate) mod client;
mod client_auth;
mod resolver;
mod sni;

use std::sync::Arc;
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use tls_source::CertBundle;

pub(crate) use client_auth::mtls_server_config;
pub use resolver::{CertResolver, HandshakeHook, Takeover, on_local_addr};
pub(crate) use sni::{RouteName, Slot, Table, TableEdit};

use crate::{Error, Purpose};

/// Loads the bundle's key with `provider` and checks that it matches the leaf, whose
/// `SubjectPublicKeyInfo` (DER) the caller has parsed already: what rustls's
/// `CertifiedKey::keys_match` compares, without parsing the leaf once more.
pub(crate) fn certify(
    bundle: &CertBundle,
    leaf_spki: &[u8],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, Error> {
    let key = provider
        .key_provider
        .load_private_key(bundle.key().clone_key())
        .map_err(|source| Error::Key {
            origin: bundle.origin().clone(),
            source: Box::new(source),
        })?;
    match key.public_key() {
        Some(spki) if spki.as_ref() == leaf_spki => {}
        Some(_) => {
            return Err(Error::KeyMismatch {
                origin: bundle.origin().clone(),
            });
        }
        None => {
            tracing::warn!(
                origin = %bundle.origin(),
                "the crypto provider cannot tell whether this key matches its certificate; installing it unchecked"
            );
        }
    }
    Ok(Arc::new(CertifiedKey::new(bundle.chain().to_vec(), key)))
}

/// Verifies the bundle's chain against `roots` for `purpose` at `now`, with webpki (rustls's
/// own verifiers, so the result is what a rustls peer would decide).
pub(crate) fn verify_chain(
    bundle: &CertBundle,
    roots: &[CertificateDer<'static>],
    purpose: Purpose,
    now: SystemTime,
    provider: &Arc<CryptoProvider>,
) -> Result<(), Error> {
    let untrusted = |reason: String| Error::Untrusted {
        origin: bundle.origin().clone(),
        reason,
    };
    let mut store = RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone())
            .map_err(|e| untrusted(format!("a root cannot be used: {e}")))?;
    }
    let store = Arc::new(store);
    let (leaf, intermediates) = bundle
        .chain()
        .split_first()
        .ok_or_else(|| untrusted("no certificate".into()))?;
    let now = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    match purpose {
        Purpose::ClientAuth => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                store,
                provider.clone(),
            )
            .build()
            .map_err(|e| untrusted(e.to_string()))?;
            verifier
                .verify_client_cert(leaf, intermediates, now)
                .map(drop)
                .map_err(|e| untrusted(e.to_string()))
        }
        Purpose::ServerAuth | Purpose::Any => {
            // The name is checked by the policy; the verifier needs one, so it gets the leaf's own.
            let info =
                tls_source::x509::LeafInfo::parse(leaf).map_err(|e| untrusted(e.to_string()))?;
            let name = info
                .dns_names
                .first()
                .and_then(|n| ServerName::try_from(n.replace('*', "wildcard")).ok())
                .or_else(|| info.ip_addresses.first().map(|ip| ServerName::from(*ip)))
                .ok_or_else(|| untrusted("the leaf has no DNS name or IP address".into()))?;
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                store,
                provider.clone(),
            )
            .build()
            .map_err(|e| untrusted(e.to_string()))?;
            verifier
                .verify_server_cert(leaf, intermediates, &name, &[], now)
                .map(drop)
                .map_err(|e| untrusted(e.to_string()))
        }
    }
}

/// A `ServerConfig` on `provider`'s safe defaults, without client authentication, serving from
/// `resolver`.
pub(crate) fn server_config(
    provider: Arc<CryptoProvider>,
    resolver: Arc<CertResolver>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver))
}

/// The config a [`Takeover`] is served with: `provider`'s safe defaults, no client
/// authentication, its one ALPN protocol, its certificate (none: the handshake fails).
pub(crate) fn takeover_config(
    provider: Arc<CryptoProvider>,
    takeover: Takeover,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    #[derive(Debug)]
    struct Fixed(Option<Arc<CertifiedKey>>);
    impl rustls::server::ResolvesServerCert for Fixed {
        fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            self.0.clone()
        }
    }
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Fixed(takeover.certified)));
    config.alpn_protocols = vec![takeover.alpn];
    Ok(Arc::new(config))
}

/// A config that serves nothing: every handshake fails with an alert (what a connection
/// that no hook takes over gets before the reloader is ready).
#[cfg(feature = "accept")]
pub(crate) fn refusing_config(
    provider: Arc<CryptoProvider>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    #[derive(Debug)]
    struct Nothing;
    impl rustls::server::ResolvesServerCert for Nothing {
        fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }
    Ok(Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Nothing)),
    ))
}

/// rustls's *ring* provider, for a build that chooses `ring` (feature `ring`).
///
/// rustls 0.23.48 deprecated `rustls::crypto::ring::default_provider` because *ring* has no
/// post-quantum key exchange: a server on it answers a current client, which offers
/// X25519MLKEM768 first, with a `HelloRetryRequest` (one more round trip per full handshake)
/// and settles on a classical group. *ring* still builds where aws-lc-rs cannot (no C compiler able to build
/// AWS-LC, some targets), so this workspace keeps it as an opt-in, and this function is the one
/// place that calls the deprecated constructor: use it instead of rustls's, and no build of
/// yours warns. Prefer aws-lc-rs (feature `aws-lc-rs`) when it builds.
///
/// ```
/// # #[cfg(feature = "ring")] {
/// let provider = std::sync::Arc::new(tls_reload::ring_provider());
/// let builder = tls_reload::Reloader::builder().crypto_provider(provider);
/// # let _ = builder; }
/// ```
#[cfg(feature = "ring")]
#[allow(deprecated)]
pub fn ring_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The crypto provider a builder of this workspace uses when given none (the crate docs'
/// "Choosing ring or aws-lc-rs"): aws-lc-rs when this crate's `aws-lc-rs` feature is on (with
/// `ring` on too: features add up across a dependency graph, so the post-quantum one wins rather
/// than neither); *ring* when only `ring` is; otherwise the process default, if one is installed.
/// Never installs anything. tls-acme's builder takes the same.
///
/// ```
/// // With the `aws-lc-rs` feature: the hybrid post-quantum key exchange comes first.
/// # #[cfg(feature = "aws-lc-rs")] {
/// let provider = tls_reload::default_crypto_provider().expect("the feature's provider");
/// assert_eq!(provider.kx_groups[0].name(), rustls::NamedGroup::X25519MLKEM768);
/// # }
/// ```
pub fn default_crypto_provider() -> Option<Arc<CryptoProvider>> {
    #[cfg(feature = "aws-lc-rs")]
    return Some(Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Some(Arc::new(crate::ring_provider()));
    #[allow(unreachable_code)]
    CryptoProvider::get_default().map(Arc::clone)
}

/// The handshake-signature checks every verifier of ours does the same way: with the
/// provider's algorithms (only the certificate decision differs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signatures(pub(crate) rustls::crypto::WebPkiSupportedAlgorithms);

impl Signatures {
    pub(crate) fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    pub(crate) fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    pub(crate) fn schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}
