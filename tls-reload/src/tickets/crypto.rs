//! The ticket AEAD (AES-256-GCM), HKDF-SHA256 and random bytes, from the crate of the provider
//! feature that is on: aws-lc-rs when it is (rustls's default), else ring. Their APIs are the
//! same; rustls's `CryptoProvider` exposes neither for this use.

#[cfg(feature = "aws-lc-rs")]
use aws_lc_rs as imp;
#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
use ring as imp;

use imp::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use imp::hkdf;
use imp::rand::{SecureRandom as _, SystemRandom};

/// A key id: the first bytes of every ticket, so the key that opens it is found without trying
/// each.
pub(crate) const ID_LEN: usize = super::ID_LEN;
/// AES-256-GCM's tag.
const TAG_LEN: usize = 16;

/// A ticket key ready to seal and open: `id || nonce || ciphertext || tag`, the id as the
/// associated data.
pub(crate) struct Sealer {
    id: [u8; ID_LEN],
    key: LessSafeKey,
}

impl Sealer {
    pub(crate) fn new(id: [u8; ID_LEN], secret: &[u8; 32]) -> Option<Self> {
        let key = UnboundKey::new(&AES_256_GCM, secret).ok()?;
        Some(Self {
            id,
            key: LessSafeKey::new(key),
        })
    }

    pub(crate) fn id(&self) -> [u8; ID_LEN] {
        self.id
    }

    /// `plain` sealed under a random nonce (a key seals for at most two periods: far from
    /// the 2^32 tickets a random 96-bit nonce is good for).
    pub(crate) fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(ID_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.id),
                &mut out[ID_LEN + NONCE_LEN..],
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    /// What `ticket` (with this key's id in front) holds, if this key sealed it unaltered.
    pub(crate) fn open(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let rest = ticket.strip_prefix(&self.id[..])?;
        if rest.len() < NONCE_LEN + TAG_LEN {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let len = self
            .key
            .open_in_place(nonce, Aad::from(self.id), &mut buf)
            .ok()?
            .len();
        buf.truncate(len);
        Some(buf)
    }
}

/// The id a ticket starts with, if it is long enough to have one.
pub(crate) fn id_of(ticket: &[u8]) -> Option<[u8; ID_LEN]> {
    ticket.get(..ID_LEN)?.try_into().ok()
}

/// 32 random bytes.
pub(crate) fn random_secret() -> Option<[u8; 32]> {
    let mut secret = [0u8; 32];
    SystemRandom::new().fill(&mut secret).ok()?;
    Some(secret)
}

/// HKDF-SHA256 of `secret` (salted with this crate's label), expanded with `info`: 32 bytes.
pub(crate) fn derive(secret: &[u8], info: &[&[u8]]) -> Option<[u8; 32]> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"tls-rotation session tickets").extract(secret);
    let mut out = [0u8; 32];
    prk.expand(info, hkdf::HKDF_SHA256)
        .ok()?
        .fill(&mut out)
        .ok()?;
    Some(out)
}
