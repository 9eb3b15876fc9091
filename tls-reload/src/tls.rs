//! Everything that touches rustls's server-side API lives here, so that a rustls upgrade (0.24
//! renames `ResolvesServerCert`) changes one file.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tls_source::{CertBundle, Digest};

use crate::Error;

/// The rustls certificate resolver that serves whatever the [`Reloader`](crate::Reloader)
/// installed last.
///
/// `resolve` is wait-free and allocation-free: one atomic load and a reference-count increment
/// (arc-swap). It returns `None`, so the handshake fails cleanly, only before the first
/// certificate is installed; wait for [`Reloader::ready`](crate::Reloader::ready) before
/// accepting connections.
pub struct CertResolver {
    /// What `resolve` hands out: one `ArcSwap` load, no extra indirection.
    current: ArcSwapOption<CertifiedKey>,
    /// The digest of the bundle `current` came from. Written with `current` by the one reload
    /// task, read only by it (and `Debug`): never on the handshake path.
    digest: Mutex<Option<Digest>>,
}

/// A certificate ready to install: the rustls key and the digest of the bundle it came from.
pub(crate) struct Installed {
    pub(crate) certified: Arc<CertifiedKey>,
    pub(crate) digest: Digest,
}

// ===== impl CertResolver =====

impl CertResolver {
    pub(crate) fn new() -> Self {
        Self {
            current: ArcSwapOption::const_empty(),
            digest: Mutex::new(None),
        }
    }

    /// The certificate served now, if any: exactly what `resolve` returns to rustls (the same
    /// code, so the resolve benches measure it).
    #[inline]
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }

    pub(crate) fn digest(&self) -> Option<Digest> {
        *self.digest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn store(&self, installed: Installed) {
        let mut digest = self.digest.lock().unwrap_or_else(PoisonError::into_inner);
        self.current.store(Some(installed.certified));
        *digest = Some(installed.digest);
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("digest", &self.digest())
            .finish_non_exhaustive()
    }
}

/// Loads the bundle's key with `provider` and checks that it matches the leaf.
pub(crate) fn certify(bundle: &CertBundle, provider: &CryptoProvider) -> Result<Installed, Error> {
    let key = provider
        .key_provider
        .load_private_key(bundle.key().clone_key())
        .map_err(|source| Error::Key {
            origin: bundle.origin().clone(),
            source: Box::new(source),
        })?;
    let certified = CertifiedKey::new(bundle.chain().to_vec(), key);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            tracing::warn!(
                origin = %bundle.origin(),
                "the crypto provider cannot tell whether this key matches its certificate; installing it unchecked"
            );
        }
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(Error::KeyMismatch {
                origin: bundle.origin().clone(),
            });
        }
        Err(other) => {
            return Err(Error::Parse {
                origin: bundle.origin().clone(),
                reason: other.to_string(),
            });
        }
    }
    Ok(Installed {
        certified: Arc::new(certified),
        digest: bundle.digest(),
    })
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

/// The process-default crypto provider, or the one enabled by this crate's feature.
pub(crate) fn default_provider() -> Option<Arc<CryptoProvider>> {
    if let Some(provider) = CryptoProvider::get_default() {
        return Some(Arc::clone(provider));
    }
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Some(Arc::new(rustls::crypto::ring::default_provider()));
    #[cfg(all(feature = "aws-lc-rs", not(feature = "ring")))]
    return Some(Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    #[allow(unreachable_code)]
    None
}
