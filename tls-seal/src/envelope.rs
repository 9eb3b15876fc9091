//! The envelope a sealed value is stored in, version 1. Its layout, for any implementation that
//! must open it (all integers big-endian):
//!
//! | offset | length | field |
//! |---|---|---|
//! | 0 | 4 | magic: `0x89 'T' 'S' 'E'` (no PEM or text value starts with `0x89`) |
//! | 4 | 1 | version: `1` |
//! | 5 | 1 | algorithm: `1` = AES-256-GCM |
//! | 6 | 8 | key id: the first 8 bytes of SHA-256(`"tls-rotation.io/seal key id"` ‖ `0x00` ‖ key) |
//! | 14 | 12 | nonce: random |
//! | 26 | n + 16 | the ciphertext of the n-byte value, then the 16-byte GCM tag |
//!
//! The associated data binds the header and the value's place. For a value in a Kubernetes
//! object ([`Location::Object`]):
//! `"tls-rotation.io/seal"` ‖ `0x00` ‖ bytes 0..26 ‖ lp(namespace) ‖ lp(name) ‖ lp(key), where
//! lp(s) is the length of s as a 4-byte integer, then s in UTF-8. For a value at an etcd key
//! ([`Location::Etcd`]): `"tls-rotation.io/seal etcd"` ‖ `0x00` ‖ bytes 0..26 ‖ lp(key). A value
//! copied into another object, under another key of the same object, or from one store to the
//! other, does not open.

use std::fmt;

use ring::digest;

/// The first bytes of every envelope.
pub const MAGIC: [u8; 4] = [0x89, b'T', b'S', b'E'];
/// The envelope version this crate writes (and the only one it opens).
pub const VERSION: u8 = 1;
/// The algorithm byte of AES-256-GCM.
pub(crate) const AES_256_GCM: u8 = 1;
/// Magic, version, algorithm, key id, nonce.
pub(crate) const HEADER_LEN: usize = 4 + 1 + 1 + 8 + 12;
/// The GCM tag.
pub(crate) const TAG_LEN: usize = 16;
const AAD_LABEL: &[u8] = b"tls-rotation.io/seal\0";
const AAD_LABEL_ETCD: &[u8] = b"tls-rotation.io/seal etcd\0";
const KEY_ID_LABEL: &[u8] = b"tls-rotation.io/seal key id\0";

/// A seal key's id: derived from the key itself (never from where it was read), so every
/// replica names the same key the same way. Shown as 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub(crate) [u8; 8]);

impl KeyId {
    /// The id of the 32-byte key `key`.
    pub(crate) fn of(key: &[u8; 32]) -> Self {
        let mut context = digest::Context::new(&digest::SHA256);
        context.update(KEY_ID_LABEL);
        context.update(key);
        let mut id = [0; 8];
        id.copy_from_slice(&context.finish().as_ref()[..8]);
        Self(id)
    }

    /// The id's bytes, as stored in an envelope.
    pub fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Where a sealed value lives. A value opens only where it was sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location<'a> {
    /// A value in a Kubernetes object: its namespace and name, and the key within it (a
    /// Secret's data key). [`Location::new`].
    Object {
        /// The object's namespace.
        namespace: &'a str,
        /// The object's name.
        name: &'a str,
        /// The key of the value within the object.
        key: &'a str,
    },
    /// A value at an etcd key (the whole key). [`Location::etcd`].
    Etcd {
        /// The etcd key.
        key: &'a str,
    },
}

impl<'a> Location<'a> {
    /// The value `key` of the Kubernetes object `namespace/name`.
    pub fn new(namespace: &'a str, name: &'a str, key: &'a str) -> Self {
        Self::Object {
            namespace,
            name,
            key,
        }
    }

    /// The value at the etcd key `key`.
    pub fn etcd(key: &'a str) -> Self {
        Self::Etcd { key }
    }
}

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Object {
                namespace,
                name,
                key,
            } => write!(f, "{namespace}/{name} {key}"),
            Self::Etcd { key } => write!(f, "etcd {key}"),
        }
    }
}

/// An envelope, decoded (not opened).
pub(crate) struct Envelope<'a> {
    /// Bytes 0..26, authenticated as part of the associated data.
    pub(crate) header: &'a [u8],
    pub(crate) key_id: KeyId,
    pub(crate) nonce: [u8; 12],
    /// Ciphertext and tag.
    pub(crate) sealed: &'a [u8],
}

/// Whether `bytes` claim to be an envelope (start with [`MAGIC`]).
pub(crate) fn is_envelope(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// Decodes an envelope's fields, or says why it is not one this crate can open.
pub(crate) fn decode(bytes: &[u8]) -> Result<Envelope<'_>, String> {
    if !is_envelope(bytes) {
        return Err("it does not start with the envelope's magic bytes".to_owned());
    }
    if bytes.len() < HEADER_LEN + TAG_LEN {
        return Err(format!(
            "it is truncated ({} bytes; an envelope has at least {})",
            bytes.len(),
            HEADER_LEN + TAG_LEN
        ));
    }
    let version = bytes[4];
    if version != VERSION {
        return Err(format!(
            "envelope version {version} is unknown (this build opens version {VERSION})"
        ));
    }
    let algorithm = bytes[5];
    if algorithm != AES_256_GCM {
        return Err(format!(
            "algorithm {algorithm} is unknown (1 is AES-256-GCM)"
        ));
    }
    let mut key_id = [0; 8];
    key_id.copy_from_slice(&bytes[6..14]);
    let mut nonce = [0; 12];
    nonce.copy_from_slice(&bytes[14..HEADER_LEN]);
    Ok(Envelope {
        header: &bytes[..HEADER_LEN],
        key_id: KeyId(key_id),
        nonce,
        sealed: &bytes[HEADER_LEN..],
    })
}

/// The header of a new envelope.
pub(crate) fn header(key_id: KeyId, nonce: [u8; 12]) -> [u8; HEADER_LEN] {
    let mut header = [0; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4] = VERSION;
    header[5] = AES_256_GCM;
    header[6..14].copy_from_slice(&key_id.0);
    header[14..].copy_from_slice(&nonce);
    header
}

/// The associated data for an envelope with `header` at `at`.
pub(crate) fn aad(header: &[u8], at: Location<'_>) -> Vec<u8> {
    // The bytes of a Kubernetes location are those of the envelope's first version (values
    // sealed before etcd locations existed open unchanged); an etcd location has a label of
    // its own, so that no object location and etcd key can give the same bytes.
    let (label, parts): (&[u8], &[&str]) = match &at {
        Location::Object {
            namespace,
            name,
            key,
        } => (AAD_LABEL, &[namespace, name, key]),
        Location::Etcd { key } => (AAD_LABEL_ETCD, &[key]),
    };
    let mut aad = Vec::with_capacity(
        label.len() + header.len() + parts.iter().map(|p| 4 + p.len()).sum::<usize>(),
    );
    aad.extend_from_slice(label);
    aad.extend_from_slice(header);
    for part in parts {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        aad.extend_from_slice(&len.to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_decodes_to_what_was_written() {
        let id = KeyId::of(&[7; 32]);
        let mut bytes = header(id, [9; 12]).to_vec();
        bytes.extend_from_slice(&[0; TAG_LEN]);
        let envelope = decode(&bytes).expect("an envelope");
        assert_eq!(envelope.key_id, id);
        assert_eq!(envelope.nonce, [9; 12]);
        assert_eq!(envelope.sealed.len(), TAG_LEN);
    }

    #[test]
    fn what_is_not_an_envelope_says_why() {
        let id = KeyId::of(&[7; 32]);
        let mut good = header(id, [0; 12]).to_vec();
        good.extend_from_slice(&[0; TAG_LEN]);
        let cases: [(&[u8], &str); 4] = [
            (b"-----BEGIN PRIVATE KEY-----", "magic"),
            (&good[..30], "truncated (30 bytes"),
            (
                &[&good[..4], &[2], &good[5..]].concat(),
                "version 2 is unknown",
            ),
            (
                &[&good[..5], &[9], &good[6..]].concat(),
                "algorithm 9 is unknown",
            ),
        ];
        for (bytes, says) in cases {
            let Err(reason) = decode(bytes) else {
                panic!("{bytes:?} decoded")
            };
            assert!(reason.contains(says), "{reason:?} should say {says:?}");
        }
    }

    #[test]
    fn the_key_id_is_the_documented_digest() {
        // Computed outside this crate, as the module docs describe it:
        // (printf 'tls-rotation.io/seal key id\0'; head -c 32 /dev/zero) | sha256sum | cut -c1-16
        assert_eq!(KeyId::of(&[0; 32]).to_string(), "1d508cd0408c7192");
    }

    #[test]
    fn the_associated_data_tells_places_apart() {
        let header = header(KeyId::of(&[1; 32]), [0; 12]);
        let a = aad(&header, Location::new("ns", "ab", "c"));
        let b = aad(&header, Location::new("ns", "a", "bc"));
        assert_ne!(a, b, "length prefixes keep name and key apart");
        let etcd = aad(&header, Location::etcd("ns/a/bc"));
        assert_ne!(a, etcd);
        assert!(etcd.starts_with(b"tls-rotation.io/seal etcd\0"));
    }
}
