//! The unit every source produces: a certificate chain, its key, an optional CA bundle.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};

/// A SHA-256 digest, shown as lower-case hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// A digest computed elsewhere (e.g. by a streaming hasher).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 64];
        for (pair, byte) in text.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0xf)];
        }
        // Hex digits only: always UTF-8.
        f.write_str(std::str::from_utf8(&text).unwrap_or_default())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// Where a bundle came from; shown in the status and in logs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// Files on disk, as configured (symlinks are not resolved).
    Files {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
    },
    /// A Kubernetes Secret.
    Secret {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// The resourceVersion the data was read at.
        resource_version: Option<String>,
    },
    /// A key in etcd.
    Etcd {
        /// The etcd key.
        key: String,
        /// The key's `mod_revision`: the revision the value was written at.
        revision: i64,
    },
    /// Generated in this process.
    SelfSigned,
    /// Anything else, described by the source.
    Other(String),
}

impl Origin {
    /// A name for where bundles come from that stays the same across rotations (no
    /// resourceVersion): `files:PATH`, `secret:NAMESPACE/NAME`, `self-signed`, or the source's own
    /// text (`etcd:KEY` for an etcd key). The `source` label of the reload core's metrics.
    ///
    /// ```
    /// use tls_source::Origin;
    /// let origin = Origin::Secret {
    ///     namespace: "web".into(),
    ///     name: "tls".into(),
    ///     resource_version: Some("42".into()),
    /// };
    /// assert_eq!(origin.label(), "secret:web/tls");
    /// ```
    pub fn label(&self) -> String {
        match self {
            Self::Files { cert, .. } => format!("files:{}", cert.display()),
            Self::Secret {
                namespace, name, ..
            } => format!("secret:{namespace}/{name}"),
            Self::Etcd { key, .. } => format!("etcd:{key}"),
            Self::SelfSigned => "self-signed".to_owned(),
            Self::Other(text) => text.clone(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Files { cert, key } => write!(f, "files {} + {}", cert.display(), key.display()),
            Self::Secret {
                namespace,
                name,
                resource_version: Some(rv),
            } => write!(f, "secret {namespace}/{name} at resourceVersion {rv}"),
            Self::Secret {
                namespace, name, ..
            } => write!(f, "secret {namespace}/{name}"),
            Self::Etcd { key, revision } => write!(f, "etcd {key} at revision {revision}"),
            Self::SelfSigned => f.write_str("self-signed"),
            Self::Other(what) => f.write_str(what),
        }
    }
}

/// A certificate chain (leaf first), its private key and an optional CA bundle, with where it came
/// from and a digest of the material.
///
/// Cloning is cheap for the key (shared); its `Debug` output never shows key bytes.
///
/// ```
/// use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
/// use tls_source::{CertBundle, Origin};
///
/// # let (cert_der, key_der) = (vec![0x30, 0x00], vec![0x30, 0x01, 0x02]);
/// let bundle = CertBundle::new(
///     vec![CertificateDer::from(cert_der)],
///     PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
///     Origin::Other("example".into()),
/// );
/// assert!(!format!("{bundle:?}").contains("[48, 1, 2]"));
/// ```
pub struct CertBundle {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    ca: Vec<CertificateDer<'static>>,
    origin: Origin,
    digest: Digest,
}

// ===== impl CertBundle =====

impl CertBundle {
    /// A bundle of a chain (leaf first) and its private key.
    ///
    /// Nothing is validated here: the reload core parses the leaf and checks that the key matches.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        origin: Origin,
    ) -> Self {
        let key = Arc::new(key);
        let digest = material_digest(&chain, &key, &[]);
        Self {
            chain,
            key,
            ca: Vec::new(),
            origin,
            digest,
        }
    }

    /// Sets the CA bundle (trust anchors for clients, or for client authentication).
    #[must_use]
    pub fn with_ca(mut self, ca: Vec<CertificateDer<'static>>) -> Self {
        if ca.is_empty() && self.ca.is_empty() {
            // Nothing changes, nor does the digest (a file source without a CA file).
            return self;
        }
        self.digest = material_digest(&self.chain, &self.key, &ca);
        self.ca = ca;
        self
    }

    /// Replaces the origin; the digest, which covers only the material, is unchanged.
    #[must_use]
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// The certificate chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The leaf certificate, if the chain is not empty.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.chain.first()
    }

    /// The private key.
    pub fn key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// The CA bundle; empty when there is none.
    pub fn ca(&self) -> &[CertificateDer<'static>] {
        &self.ca
    }

    /// Where the bundle came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// SHA-256 over the chain, key and CA (DER, length-prefixed): equal digests, equal material.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// SHA-256 over the chain, key and CA (DER, each tagged and length-prefixed).
fn material_digest(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    ca: &[CertificateDer<'static>],
) -> Digest {
    let mut h = Sha256::new();
    let mut put = |tag: u8, bytes: &[u8]| {
        h.update([tag]);
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    for c in chain {
        put(b'c', c.as_ref());
    }
    put(b'k', key.secret_der());
    for c in ca {
        put(b'a', c.as_ref());
    }
    Digest(h.finalize().into())
}

impl Clone for CertBundle {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: Arc::clone(&self.key),
            ca: self.ca.clone(),
            origin: self.origin.clone(),
            digest: self.digest,
        }
    }
}

impl fmt::Debug for CertBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key_kind = match &*self.key {
            PrivateKeyDer::Pkcs1(_) => "PKCS#1",
            PrivateKeyDer::Sec1(_) => "SEC1",
            PrivateKeyDer::Pkcs8(_) => "PKCS#8",
            _ => "other",
        };
        f.debug_struct("CertBundle")
            .field("chain_len", &self.chain.len())
            .field("key", &format_args!("<{key_kind} private key, redacted>"))
            .field("ca_len", &self.ca.len())
            .field("origin", &self.origin)
            .field("digest", &self.digest)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decoder;

    #[test]
    fn a_digest_reads_as_sha256sum_writes_it() {
        // `printf abc | sha256sum`
        assert_eq!(
            Digest::of(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            format!("{:?}", Digest::of(b"")),
            "Digest(e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855)"
        );
    }

    #[test]
    fn digest_tracks_the_material_not_the_origin() {
        let ca = tls_test::TestCa::new("bundle tests");
        let a = ca.leaf(&["a.test"]);
        let b = ca.leaf(&["b.test"]);
        let d = Decoder::new();
        let bundle = |leaf: &tls_test::TestCert, origin| {
            d.bundle(
                ("crt", leaf.cert_pem.as_bytes()),
                ("key", leaf.key_pem.as_bytes()),
                None,
                origin,
            )
            .unwrap()
        };
        let a1 = bundle(&a, Origin::SelfSigned);
        let a2 = bundle(&a, Origin::Other("elsewhere".into()));
        let b1 = bundle(&b, Origin::SelfSigned);
        assert_eq!(a1.digest(), a2.digest());
        assert_ne!(a1.digest(), b1.digest());
        let with_ca = a1.clone().with_ca(vec![ca.cert_der()]);
        assert_ne!(with_ca.digest(), a1.digest());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let leaf = tls_test::TestCa::new("debug").leaf(&["a.test"]);
        let bundle = Decoder::new()
            .bundle(
                ("crt", leaf.cert_pem.as_bytes()),
                ("key", leaf.key_pem.as_bytes()),
                None,
                Origin::SelfSigned,
            )
            .unwrap();
        let debug = format!("{bundle:?} {bundle:#?}");
        tls_test::assert_no_key_material(&debug, &leaf);
        assert!(debug.contains("redacted"));
    }

    #[test]
    fn origin_display() {
        let files = Origin::Files {
            cert: "/etc/tls/tls.crt".into(),
            key: "/etc/tls/tls.key".into(),
        };
        assert_eq!(
            files.to_string(),
            "files /etc/tls/tls.crt + /etc/tls/tls.key"
        );
        let secret = Origin::Secret {
            namespace: "web".into(),
            name: "tls".into(),
            resource_version: Some("42".into()),
        };
        assert_eq!(secret.to_string(), "secret web/tls at resourceVersion 42");
    }
}
