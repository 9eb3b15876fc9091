//! Sealed at rest: the state tls-rotation stores for itself (a fleet's CA key, an ACME
//! account), unreadable to whoever can read where it is stored.
//!
//! A Kubernetes Secret is base64, not encryption: anyone who may `get` it (a broad Role, a
//! backup, an etcd snapshot, a support session's `kubectl get -o yaml`) reads every key in it.
//! A [`Seal`] turns each value into an envelope (AES-256-GCM, documented in [`envelope`] so
//! another implementation can open it) whose associated data binds the object and key it is
//! stored under: a sealed value copied into another object, or under another key, does not
//! open. [`KeyRing`] is the seal with keys: the first seals, all open, and key files are
//! re-read when they change, so the key rotates without a restart. [`Plain`] stores values as
//! they are (what a deployment without a seal key gets); it refuses sealed values, so a replica
//! started without the key never overwrites what it cannot read.
//!
//! ```
//! use tls_seal::{KeyRing, Location, Seal, SealKey};
//!
//! let ring = KeyRing::from_keys([SealKey::generate()?])?;
//! let at = Location::new("web", "web-tls-ca", "ca.key");
//! let sealed = ring.seal(at, b"-----BEGIN PRIVATE KEY-----...")?;
//! assert!(!sealed.starts_with(b"-----BEGIN"));
//! assert_eq!(ring.open(at, &sealed)?.plaintext(), b"-----BEGIN PRIVATE KEY-----...");
//! # Ok::<(), tls_seal::Error>(())
//! ```
//!
//! # What a seal protects, and where its key must come from
//! A seal protects what is stored against those who can read the store and not the key. A
//! key kept in a Secret of the same namespace protects nothing against `get secrets`: keep it
//! where the store's readers cannot reach (a KMS-backed store, the secrets-store CSI driver
//! mounting it from a vault, a namespace the workload's readers cannot `get`), and mount it as
//! a file. A key file holds 32 random bytes in base64: `openssl rand -base64 32`.
//!
//! # Errors
//! Every refusal names the place of the value ([`Location`]) and never its content: a value
//! stored unsealed ([`Error::Unsealed`]), sealed with a key not in the ring
//! ([`Error::UnknownKey`]), sealed while no key is configured ([`Error::NoSealKey`]), not
//! opening ([`Error::Tampered`]: altered, or copied from elsewhere), or not an envelope this
//! build reads ([`Error::Malformed`]). A caller that cannot open what is stored writes nothing
//! over it.

pub mod envelope;
mod key;

use std::fmt;

pub use envelope::{KeyId, Location};
pub use key::{KeyRing, SealKey};

/// Seals values before they are stored, and opens them when read back, given where they live.
///
/// Implemented by [`KeyRing`] (AES-256-GCM) and [`Plain`] (no sealing); a KMS-backed seal can
/// implement it too.
pub trait Seal: fmt::Debug + Send + Sync {
    /// `plaintext` sealed for `at`.
    ///
    /// # Errors
    /// Sealing failed (the random source, or the seal's backend).
    fn seal(&self, at: Location<'_>, plaintext: &[u8]) -> Result<Vec<u8>, Error>;

    /// The value stored at `at`, opened.
    ///
    /// # Errors
    /// It cannot be opened here; the error says why (see the crate docs).
    fn open(&self, at: Location<'_>, stored: &[u8]) -> Result<Opened, Error>;

    /// Re-reads the keys where they come from (files); whether they changed. Callers call it
    /// before a round of reads, and look at what is stored again when it says so.
    fn reload(&self) -> bool {
        false
    }

    /// The ids of the keys, the sealing one first; empty for a seal that does not encrypt.
    fn key_ids(&self) -> Vec<KeyId> {
        Vec::new()
    }
}

/// A value opened, and how it was stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Opened {
    plaintext: Vec<u8>,
    sealing: Sealing,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The plaintext may be a private key.
        f.debug_struct("Opened")
            .field("len", &self.plaintext.len())
            .field("sealing", &self.sealing)
            .finish()
    }
}

impl Opened {
    /// A value opened from a store sealed as `sealing` says.
    pub fn new(plaintext: Vec<u8>, sealing: Sealing) -> Self {
        Self { plaintext, sealing }
    }

    /// The value.
    pub fn plaintext(&self) -> &[u8] {
        &self.plaintext
    }

    /// The value, owned.
    pub fn into_plaintext(self) -> Vec<u8> {
        self.plaintext
    }

    /// How it was stored.
    pub fn sealing(&self) -> Sealing {
        self.sealing
    }

    /// Whether the next write should seal it again: it was sealed with a key that no longer
    /// seals, or stored unsealed and adopted.
    pub fn needs_reseal(&self) -> bool {
        self.sealing != Sealing::Current
    }
}

/// How a value was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sealing {
    /// As this seal stores it now (for [`Plain`], unsealed).
    Current,
    /// Sealed with a key of the ring that is not its first.
    OlderKey(KeyId),
    /// Unsealed, and adopted ([`KeyRing::adopt_unsealed`]).
    Unsealed,
}

/// No seal: values are stored as they are (what a deployment without a seal key writes). A
/// sealed value is refused ([`Error::NoSealKey`]), never taken for plain data.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Seal for Plain {
    fn seal(&self, _: Location<'_>, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        Ok(plaintext.to_vec())
    }

    fn open(&self, at: Location<'_>, stored: &[u8]) -> Result<Opened, Error> {
        if envelope::is_envelope(stored) {
            return Err(Error::NoSealKey {
                at: at.to_string(),
                key_id: envelope::decode(stored).ok().map(|e| e.key_id),
            });
        }
        Ok(Opened::new(stored.to_vec(), Sealing::Current))
    }
}

/// Why a value cannot be sealed or opened, or a key cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key file or text cannot be used (named by `origin`; its content is never shown).
    #[error("seal key {origin}: {reason}")]
    Key {
        /// The file, or what the text was.
        origin: String,
        /// Why.
        reason: String,
    },
    /// A key ring was given no key.
    #[error("a seal key ring needs at least one key")]
    NoKeys,
    /// The value is stored unsealed while a seal is configured.
    #[error(
        "{at} is stored unsealed while a seal key is configured; refusing it, since whoever may update the object could have planted it (adopt unsealed state once to migrate)"
    )]
    Unsealed {
        /// Where.
        at: String,
    },
    /// The value is sealed, and no seal key is configured.
    #[error("{at} is sealed{}, and no seal key is configured", key_id.map(|k| format!(" (key {k})")).unwrap_or_default())]
    NoSealKey {
        /// Where.
        at: String,
        /// The key it was sealed with, if its envelope could be read.
        key_id: Option<KeyId>,
    },
    /// The value is sealed with a key that is not in the ring.
    #[error("{at} is sealed with key {key_id}, which is not in the key ring ({})", ring.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    UnknownKey {
        /// Where.
        at: String,
        /// The key it was sealed with.
        key_id: KeyId,
        /// The ring's keys.
        ring: Vec<KeyId>,
    },
    /// The value does not open with the key its envelope names: it was altered, or sealed for
    /// another place and copied here.
    #[error("{at} does not open with key {key_id}: it was altered, or sealed for another object")]
    Tampered {
        /// Where.
        at: String,
        /// The key its envelope names.
        key_id: KeyId,
    },
    /// The value claims to be an envelope and is not one this build reads.
    #[error("{at} is not a sealed value this build can read: {reason}")]
    Malformed {
        /// Where.
        at: String,
        /// Why.
        reason: String,
    },
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
    /// The AEAD refused to seal (a value too large for one envelope).
    #[error("sealing failed")]
    Seal,
}

/// For the fuzz target: decodes and tries to open arbitrary bytes as stored values.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use super::{KeyRing, Location, Plain, Seal, SealKey};

    /// Opens `bytes` with a fixed ring and with [`Plain`]; neither may panic, and what opens
    /// must seal again and open to the same value.
    pub fn open(bytes: &[u8]) {
        static RING: std::sync::OnceLock<KeyRing> = std::sync::OnceLock::new();
        let ring = RING.get_or_init(|| {
            KeyRing::from_keys([SealKey::from_bytes([7; 32]), SealKey::from_bytes([8; 32])])
                .expect("two keys")
                .adopt_unsealed(true)
        });
        let at = Location::new("fuzz", "state", "value");
        let _ = Plain.open(at, bytes);
        if let Ok(opened) = ring.open(at, bytes) {
            let again = ring.seal(at, opened.plaintext()).expect("sealing a value");
            let reopened = ring.open(at, &again).expect("what was sealed opens");
            assert_eq!(reopened.plaintext(), opened.plaintext());
        }
    }
}
