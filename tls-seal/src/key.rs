//! [`SealKey`] and [`KeyRing`]: the AES-256-GCM seal, its keys read from files and re-read when
//! they change.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use base64::Engine as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::envelope::{self, KeyId, Location};
use crate::{Error, Opened, Seal, Sealing};

/// A seal key: 32 bytes for AES-256-GCM. Its [`Debug`] shows its [`id`](Self::id) only.
#[derive(Clone, PartialEq, Eq)]
pub struct SealKey {
    bytes: Box<[u8; 32]>,
    id: KeyId,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey").field("id", &self.id).finish()
    }
}

impl SealKey {
    /// The key made of these 32 bytes (they must be random).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let id = KeyId::of(&bytes);
        Self {
            bytes: Box::new(bytes),
            id,
        }
    }

    /// 32 random bytes from the operating system.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn generate() -> Result<Self, Error> {
        let mut bytes = [0; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::Random)?;
        Ok(Self::from_bytes(bytes))
    }

    /// A key file's text: 32 bytes in base64 (standard alphabet, padding optional), surrounding
    /// whitespace ignored. `openssl rand -base64 32` writes one.
    ///
    /// # Errors
    /// The text is not base64 or does not hold exactly 32 bytes; `origin` names it. The text
    /// itself is never part of the error.
    pub fn from_base64(origin: &str, text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::Key {
            origin: origin.to_owned(),
            reason,
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text.trim()))
            .map_err(|_| invalid("it is not base64".to_owned()))?;
        let bytes: [u8; 32] = decoded.as_slice().try_into().map_err(|_| {
            invalid(format!(
                "it holds {} bytes; a seal key is 32 random bytes in base64 (openssl rand -base64 32)",
                decoded.len()
            ))
        })?;
        Ok(Self::from_bytes(bytes))
    }

    /// Reads a key file (see [`from_base64`](Self::from_base64)); a symlink is followed, as the
    /// kubelet's `..data` layout needs.
    ///
    /// # Errors
    /// The file cannot be read or does not hold a key; the error names the path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| Error::Key {
            origin: origin.clone(),
            reason: format!("it cannot be read: {err}"),
        })?;
        Self::from_base64(&origin, &text)
    }

    /// The key in base64, for writing a key file. This is the key material: keep it out of logs.
    pub fn export_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.bytes.as_slice())
    }

    /// The key's id, as envelopes sealed with it carry it.
    pub fn id(&self) -> KeyId {
        self.id
    }

    fn aead(&self) -> LessSafeKey {
        let key = UnboundKey::new(&AES_256_GCM, self.bytes.as_slice())
            .expect("AES-256-GCM takes a 32-byte key");
        LessSafeKey::new(key)
    }

    fn seal(&self, at: Location<'_>, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let mut nonce = [0; 12];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Random)?;
        let header = envelope::header(self.id, nonce);
        let mut sealed = Vec::with_capacity(header.len() + plaintext.len() + envelope::TAG_LEN);
        sealed.extend_from_slice(&header);
        let mut in_out = plaintext.to_vec();
        self.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(envelope::aad(&header, at)),
                &mut in_out,
            )
            .map_err(|_| Error::Seal)?;
        sealed.append(&mut in_out);
        Ok(sealed)
    }

    fn open(&self, at: Location<'_>, envelope: &envelope::Envelope<'_>) -> Result<Vec<u8>, Error> {
        let mut buffer = envelope.sealed.to_vec();
        let opened = self
            .aead()
            .open_in_place(
                Nonce::assume_unique_for_key(envelope.nonce),
                Aad::from(envelope::aad(envelope.header, at)),
                &mut buffer,
            )
            .map_err(|_| Error::Tampered {
                at: at.to_string(),
                key_id: self.id,
            })?;
        let len = opened.len();
        buffer.truncate(len);
        Ok(buffer)
    }
}

/// The AES-256-GCM seal with a ring of keys: the first seals, all open. Each key comes from a
/// file ([`from_files`](Self::from_files)) or from memory ([`from_keys`](Self::from_keys)).
///
/// Rolling a new key across a fleet is three rollouts, and every replica keeps working through
/// each: add the new key second (open-only) everywhere; put it first (values are re-sealed with
/// it on the next write); remove the old one once everything stored is sealed with the new one.
///
/// A value stored unsealed is refused ([`Error::Unsealed`]) unless
/// [`adopt_unsealed`](Self::adopt_unsealed) is on: otherwise whoever may `update` a Secret but
/// not `get` it could plant a value of their choosing for the writer to seal and every replica
/// to trust.
///
/// ```
/// use tls_seal::{KeyRing, Location, Seal, SealKey};
///
/// let old = SealKey::generate()?;
/// let new = SealKey::generate()?;
/// let at = Location::new("web", "web-tls-ca", "ca.key");
/// let sealed = KeyRing::from_keys([old.clone()])?.seal(at, b"a private key")?;
///
/// // The new key first, the old one still opens (and says the value wants re-sealing).
/// let ring = KeyRing::from_keys([new, old])?;
/// let opened = ring.open(at, &sealed)?;
/// assert_eq!(opened.plaintext(), b"a private key");
/// assert!(opened.needs_reseal());
/// // Elsewhere it does not open.
/// assert!(ring.open(Location::new("web", "other", "ca.key"), &sealed).is_err());
/// # Ok::<(), tls_seal::Error>(())
/// ```
pub struct KeyRing {
    slots: RwLock<Vec<Slot>>,
    adopt_unsealed: bool,
}

/// One key of the ring, and the file it is re-read from.
struct Slot {
    path: Option<PathBuf>,
    key: SealKey,
    /// The last reload failure reported for this file, so it is logged once.
    failing: Option<String>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("keys", &self.key_ids())
            .field("adopt_unsealed", &self.adopt_unsealed)
            .finish()
    }
}

impl KeyRing {
    /// The keys in these files, in order: the first seals. Each file holds 32 random bytes in
    /// base64 (`openssl rand -base64 32 > seal.key`) and is re-read by [`reload`](Seal::reload).
    ///
    /// # Errors
    /// No path was given, or a file cannot be read or holds no key (the error names it).
    pub fn from_files<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Result<Self, Error> {
        let slots = paths
            .into_iter()
            .map(|path| {
                let path = path.into();
                Ok(Slot {
                    key: SealKey::from_file(&path)?,
                    path: Some(path),
                    failing: None,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Self::with_slots(slots)
    }

    /// These keys, in order: the first seals.
    ///
    /// # Errors
    /// No key was given.
    pub fn from_keys(keys: impl IntoIterator<Item = SealKey>) -> Result<Self, Error> {
        let slots = keys
            .into_iter()
            .map(|key| Slot {
                path: None,
                key,
                failing: None,
            })
            .collect();
        Self::with_slots(slots)
    }

    fn with_slots(slots: Vec<Slot>) -> Result<Self, Error> {
        if slots.is_empty() {
            return Err(Error::NoKeys);
        }
        Ok(Self {
            slots: RwLock::new(slots),
            adopt_unsealed: false,
        })
    }

    /// Opens values stored unsealed as they are (reported as [`Sealing::Unsealed`], so the
    /// caller seals them on its next write): the one-time migration of state written before a
    /// seal was configured. Default: off, they are refused.
    #[must_use]
    pub fn adopt_unsealed(mut self, adopt: bool) -> Self {
        self.adopt_unsealed = adopt;
        self
    }

    fn slots(&self) -> std::sync::RwLockReadGuard<'_, Vec<Slot>> {
        self.slots.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Seal for KeyRing {
    fn seal(&self, at: Location<'_>, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        self.slots()[0].key.seal(at, plaintext)
    }

    fn open(&self, at: Location<'_>, stored: &[u8]) -> Result<Opened, Error> {
        if !envelope::is_envelope(stored) {
            return if self.adopt_unsealed {
                Ok(Opened::new(stored.to_vec(), Sealing::Unsealed))
            } else {
                Err(Error::Unsealed { at: at.to_string() })
            };
        }
        let envelope = envelope::decode(stored).map_err(|reason| Error::Malformed {
            at: at.to_string(),
            reason,
        })?;
        let slots = self.slots();
        let Some(index) = slots.iter().position(|s| s.key.id == envelope.key_id) else {
            return Err(Error::UnknownKey {
                at: at.to_string(),
                key_id: envelope.key_id,
                ring: slots.iter().map(|s| s.key.id).collect(),
            });
        };
        let plaintext = slots[index].key.open(at, &envelope)?;
        let sealing = if index == 0 {
            Sealing::Current
        } else {
            Sealing::OlderKey(envelope.key_id)
        };
        Ok(Opened::new(plaintext, sealing))
    }

    fn reload(&self) -> bool {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let mut changed = false;
        for slot in slots.iter_mut() {
            let Some(path) = &slot.path else { continue };
            match SealKey::from_file(path) {
                Ok(key) => {
                    slot.failing = None;
                    if key.id != slot.key.id {
                        tracing::info!(path = %path.display(), old = %slot.key.id, new = %key.id, "the seal key file changed");
                        slot.key = key;
                        changed = true;
                    }
                }
                Err(err) => {
                    let reason = err.to_string();
                    if slot.failing.as_ref() != Some(&reason) {
                        tracing::warn!(error = %reason, key_id = %slot.key.id, "the seal key file cannot be re-read; keeping the key it held");
                        slot.failing = Some(reason);
                    }
                }
            }
        }
        changed
    }

    fn key_ids(&self) -> Vec<KeyId> {
        self.slots().iter().map(|s| s.key.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Location<'static> = Location::Object {
        namespace: "web",
        name: "web-tls-ca",
        key: "ca.key",
    };

    fn key(byte: u8) -> SealKey {
        SealKey::from_bytes([byte; 32])
    }

    #[test]
    fn a_sealed_value_opens_where_it_was_sealed_and_nowhere_else() {
        let ring = KeyRing::from_keys([key(1)]).expect("a key");
        let sealed = ring.seal(AT, b"secret").expect("sealed");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let opened = ring.open(AT, &sealed).expect("opens");
        assert_eq!(opened.plaintext(), b"secret");
        assert_eq!(opened.sealing(), Sealing::Current);
        for elsewhere in [
            Location::new("other", "web-tls-ca", "ca.key"),
            Location::new("web", "web-tls-ca-2", "ca.key"),
            Location::new("web", "web-tls-ca", "next.key"),
        ] {
            let err = ring.open(elsewhere, &sealed).expect_err("must not open");
            assert!(matches!(err, Error::Tampered { .. }), "{err}");
            assert!(err.to_string().contains(&elsewhere.to_string()), "{err}");
        }
    }

    #[test]
    fn an_envelope_made_from_the_documented_layout_by_another_implementation_opens() {
        // Made with Python's `cryptography` (AESGCM) from the layout in `envelope`'s docs:
        // key bytes 0..32, nonce bytes 100..112, at web/web-tls-ca ca.key.
        let hex = "895453450101d9c3e5cf6ce9dc916465666768696a6b6c6d6e6f3b7ebf0a1c8d76fc47423e86b511029830e26f67fb00961fc2bfd8298fcaca2682e6e7c6e86b26347698daff34ded928";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let key = SealKey::from_bytes(std::array::from_fn(|i| i as u8));
        let ring = KeyRing::from_keys([key]).expect("a key");
        let opened = ring.open(AT, &bytes).expect("opens");
        assert_eq!(opened.plaintext(), b"sealed by another implementation");
    }

    #[test]
    fn every_byte_of_an_envelope_is_authenticated() {
        let ring = KeyRing::from_keys([key(1)]).expect("a key");
        let sealed = ring.seal(AT, b"a value long enough").expect("sealed");
        for i in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[i] ^= 0x01;
            assert!(
                ring.open(AT, &tampered).is_err(),
                "byte {i} flipped still opens"
            );
        }
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let ring = KeyRing::from_keys([key(1)]).expect("a key");
        assert_ne!(
            ring.seal(AT, b"v").expect("a"),
            ring.seal(AT, b"v").expect("b")
        );
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = KeyRing::from_keys([key(1)]).expect("a key");
        let sealed_old = old.seal(AT, b"v").expect("sealed");
        let ring = KeyRing::from_keys([key(2), key(1)]).expect("keys");
        let opened = ring.open(AT, &sealed_old).expect("the second key opens");
        assert_eq!(opened.sealing(), Sealing::OlderKey(key(1).id()));
        assert!(opened.needs_reseal());
        let resealed = ring.seal(AT, opened.plaintext()).expect("sealed");
        let new_only = KeyRing::from_keys([key(2)]).expect("a key");
        assert_eq!(
            new_only.open(AT, &resealed).expect("opens").plaintext(),
            b"v"
        );
        let err = new_only
            .open(AT, &sealed_old)
            .expect_err("the old key is gone");
        assert!(
            matches!(&err, Error::UnknownKey { key_id, .. } if *key_id == key(1).id()),
            "{err}"
        );
        assert!(err.to_string().contains(&key(1).id().to_string()), "{err}");
    }

    #[test]
    fn an_unsealed_value_is_refused_unless_adopted() {
        let ring = KeyRing::from_keys([key(1)]).expect("a key");
        let err = ring
            .open(AT, b"-----BEGIN PRIVATE KEY-----")
            .expect_err("refused");
        assert!(matches!(err, Error::Unsealed { .. }), "{err}");
        let adopting = KeyRing::from_keys([key(1)])
            .expect("a key")
            .adopt_unsealed(true);
        let opened = adopting.open(AT, b"plain").expect("adopted");
        assert_eq!(
            (opened.plaintext(), opened.sealing()),
            (&b"plain"[..], Sealing::Unsealed)
        );
    }

    #[test]
    fn key_text_is_checked_and_never_echoed() {
        let good = key(3).export_base64();
        assert_eq!(
            SealKey::from_base64("k", &format!("  {good}\n"))
                .expect("ok")
                .id(),
            key(3).id()
        );
        let short = base64::engine::general_purpose::STANDARD.encode([5u8; 16]);
        for (text, says) in [
            ("not base64!", "not base64"),
            (short.as_str(), "holds 16 bytes"),
        ] {
            let err = SealKey::from_base64("/keys/seal.key", text).expect_err("refused");
            let message = err.to_string();
            assert!(
                message.contains("/keys/seal.key") && message.contains(says),
                "{message}"
            );
            assert!(!message.contains(text), "{message}");
        }
        assert!(!format!("{:?}", key(3)).contains(&good));
    }

    #[test]
    fn key_files_are_re_read_when_they_change_and_a_bad_one_keeps_its_key() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("seal.key");
        std::fs::write(&path, key(1).export_base64()).expect("written");
        let ring = KeyRing::from_files([&path]).expect("read");
        assert_eq!(ring.key_ids(), [key(1).id()]);
        assert!(!ring.reload(), "nothing changed");
        std::fs::write(&path, "garbage").expect("written");
        assert!(!ring.reload(), "a bad file changes nothing");
        assert_eq!(ring.key_ids(), [key(1).id()]);
        std::fs::write(&path, key(2).export_base64()).expect("written");
        assert!(ring.reload());
        assert_eq!(ring.key_ids(), [key(2).id()]);
        let missing = KeyRing::from_files([dir.path().join("absent")]).expect_err("no file");
        assert!(missing.to_string().contains("absent"), "{missing}");
        assert!(matches!(
            KeyRing::from_files(Vec::<PathBuf>::new()),
            Err(Error::NoKeys)
        ));
    }
}
