//! The shared store's Secrets through the seal: each value opened as read and sealed as
//! written, bound to its Secret and key (see `tls_seal`). The CA Secret is sealed whole; the
//! TLS Secret only in its `tls.key`, and only when asked (other consumers read it).

use std::collections::BTreeMap;

use tls_seal::{Location, Seal};

use crate::fenced::Stored;
use tls_selfsigned::fleet::Content;

/// Which values of a Secret are sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sealed {
    /// Every value (our own state: the CA Secret).
    All,
    /// This key only (the served TLS Secret's `tls.key`, when asked).
    Only(&'static str),
    /// None (the served TLS Secret, by default).
    Nothing,
}

impl Sealed {
    fn covers(self, key: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(only) => only == key,
            Self::Nothing => false,
        }
    }
}

/// A Secret as read, its values opened; and whether any wants sealing again (sealed with a key
/// that no longer seals, or adopted unsealed), so the writer rewrites it.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) stored: Stored,
    pub(crate) reseal: bool,
}

/// The Secret `namespace/name` as read, its `sealed` values opened with `seal`. An empty value
/// is left as it is (it holds nothing to open or to plant).
///
/// # Errors
/// A value that cannot be opened: the writer then writes nothing.
pub(crate) fn open(
    seal: &dyn Seal,
    namespace: &str,
    name: &str,
    sealed: Sealed,
    mut stored: Stored,
) -> Result<Opened, tls_seal::Error> {
    let mut reseal = false;
    for (key, value) in &mut stored.data {
        if !sealed.covers(key) || value.is_empty() {
            continue;
        }
        let opened = seal.open(Location::new(namespace, name, key), value)?;
        reseal |= opened.needs_reseal();
        *value = opened.into_plaintext();
    }
    Ok(Opened { stored, reseal })
}

/// `content` as written to `namespace/name`: its `sealed` values sealed.
///
/// # Errors
/// Sealing failed.
pub(crate) fn seal(
    seal: &dyn Seal,
    namespace: &str,
    name: &str,
    sealed: Sealed,
    (data, annotations): Content,
) -> Result<Content, tls_seal::Error> {
    let data = data
        .into_iter()
        .map(|(key, value)| {
            if !sealed.covers(&key) || value.is_empty() {
                return Ok((key, value));
            }
            let value = seal.seal(Location::new(namespace, name, &key), &value)?;
            Ok((key, value))
        })
        .collect::<Result<BTreeMap<_, _>, tls_seal::Error>>()?;
    Ok((data, annotations))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tls_seal::{KeyRing, Plain, SealKey};

    fn stored(data: &[(&str, &[u8])]) -> Stored {
        Stored {
            fence: None,
            data: data
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
            annotations: BTreeMap::new(),
        }
    }

    fn ring(keys: &[u8]) -> KeyRing {
        KeyRing::from_keys(keys.iter().map(|k| SealKey::from_bytes([*k; 32]))).expect("keys")
    }

    #[test]
    fn only_the_covered_values_are_sealed_and_they_open_again() {
        let content = (
            BTreeMap::from([
                ("tls.crt".to_owned(), b"cert".to_vec()),
                ("tls.key".to_owned(), b"key".to_vec()),
            ]),
            BTreeMap::new(),
        );
        let seal = ring(&[1]);
        let (data, _) =
            super::seal(&seal, "ns", "tls", Sealed::Only("tls.key"), content).expect("sealed");
        assert_eq!(data["tls.crt"], b"cert");
        assert_ne!(data["tls.key"], b"key");
        let read = Stored {
            fence: None,
            data,
            annotations: BTreeMap::new(),
        };
        let opened = open(&seal, "ns", "tls", Sealed::Only("tls.key"), read).expect("opens");
        assert_eq!(opened.stored.data["tls.key"], b"key");
        assert!(!opened.reseal);
    }

    /// `ca.key` = `k` in the Secret `ns/ca`, as a writer with `keys` stores it.
    fn sealed_ca(keys: &[u8]) -> Stored {
        let content = (
            BTreeMap::from([("ca.key".to_owned(), b"k".to_vec())]),
            BTreeMap::new(),
        );
        let (data, _) = super::seal(&ring(keys), "ns", "ca", Sealed::All, content).expect("sealed");
        Stored {
            fence: None,
            data,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn a_value_sealed_by_an_older_key_asks_to_be_sealed_again() {
        let opened = open(&ring(&[2, 1]), "ns", "ca", Sealed::All, sealed_ca(&[1])).expect("opens");
        assert_eq!(opened.stored.data["ca.key"], b"k");
        assert!(opened.reseal);
    }

    #[test]
    fn plain_state_is_refused_by_a_ring_and_a_sealed_one_by_plain() {
        let plain = stored(&[("ca.key", b"-----BEGIN PRIVATE KEY-----")]);
        let err = open(&ring(&[1]), "ns", "ca", Sealed::All, plain).expect_err("refused");
        assert!(matches!(err, tls_seal::Error::Unsealed { .. }), "{err}");
        let err = open(&Plain, "ns", "ca", Sealed::All, sealed_ca(&[1])).expect_err("no key");
        assert!(matches!(err, tls_seal::Error::NoSealKey { .. }), "{err}");
        let empty = stored(&[("tls.key", b"")]);
        assert!(open(&ring(&[1]), "ns", "tls", Sealed::All, empty).is_ok());
    }
}
