//! A fleet's object as the JSON value of one etcd key: each value as text under its name, or,
//! sealed, as the envelope in base64 under `NAME.sealed` (bound to the key and the name,
//! [`sealed_location`]); the annotations under `"annotations"`.
//!
//! An object holding `tls.crt` and `tls.key` (or `tls.key.sealed`) is also a value
//! [`EtcdCertSource`](crate::EtcdCertSource) reads: a fleet's leaf (`SharedSelfSigned`) and an
//! ACME fleet's certificates are written this way, their keys sealed with a seal key.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tls_etcd::store::object::{decode, encode};
//! use tls_seal::{KeyRing, SealKey};
//!
//! let ring = KeyRing::from_keys([SealKey::generate()?])?;
//! let data = BTreeMap::from([("order.key".to_owned(), b"-----BEGIN PRIVATE KEY-----".to_vec())]);
//! let annotations = BTreeMap::from([("url".to_owned(), "https://ca.example/order/1".to_owned())]);
//! let bytes = encode("/p/fleets/web/acme/state/names/a", &data, &annotations, &ring, &["order.key"])?;
//! assert!(!String::from_utf8_lossy(&bytes).contains("PRIVATE KEY"));
//! let opened = decode("/p/fleets/web/acme/state/names/a", &bytes, &ring, &["order.key"]).unwrap();
//! assert_eq!((opened.data, opened.annotations), (data, annotations));
//! # Ok::<(), tls_seal::Error>(())
//! ```

use std::collections::BTreeMap;

use base64::Engine as _;
use tls_seal::{Location, Seal};

use crate::value::{SEALED_SUFFIX, sealed_location};

/// The field of an object's annotations.
pub const ANNOTATIONS: &str = "annotations";

/// An object's values, by name (PEM or other text; sealed ones as opened).
pub type Data = BTreeMap<String, Vec<u8>>;
/// An object's annotations: text by name, never sealed.
pub type Annotations = BTreeMap<String, String>;

/// An object as read: its values (sealed ones opened), its annotations, and whether a value
/// wants sealing again (opened with a key that no longer seals, or adopted unsealed).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Opened {
    /// The values, sealed ones opened.
    pub data: Data,
    /// The annotations.
    pub annotations: Annotations,
    /// Whether a value wants sealing again: written again, it is sealed with the seal's
    /// current key.
    pub reseal: bool,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be private keys: only their names.
        f.debug_struct("Opened")
            .field("data", &self.data.keys().collect::<Vec<_>>())
            .field("annotations", &self.annotations)
            .field("reseal", &self.reseal)
            .finish()
    }
}

/// Why an object could not be read. Neither says what the value held.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    /// Not the JSON of an object (garbage put by hand): the reason, never the content.
    #[error("{0}")]
    Malformed(String),
    /// A sealed value (or one that must be sealed) does not open.
    #[error(transparent)]
    Sealed(tls_seal::Error),
}

/// Encodes `data` and `annotations` as the value of `key`, the values named in `sealed` put
/// through `seal` (with [`tls_seal::Plain`] they stay text).
///
/// # Errors
/// The seal's, when it cannot seal.
pub fn encode(
    key: &str,
    data: &Data,
    annotations: &Annotations,
    seal: &dyn Seal,
    sealed: &[&str],
) -> Result<Vec<u8>, tls_seal::Error> {
    let mut object = serde_json::Map::new();
    for (name, value) in data {
        let stored = if sealed.contains(&name.as_str()) {
            let at = sealed_location(key, name);
            seal.seal(Location::etcd(&at), value)?
        } else {
            value.clone()
        };
        if stored.starts_with(&tls_seal::envelope::MAGIC) {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&stored);
            object.insert(format!("{name}{SEALED_SUFFIX}"), encoded.into());
        } else {
            // PEM: text. (Anything else would be lossy: the fleet writes only PEM.)
            object.insert(
                name.clone(),
                String::from_utf8_lossy(&stored).into_owned().into(),
            );
        }
    }
    if !annotations.is_empty() {
        let annotations: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        object.insert(ANNOTATIONS.to_owned(), annotations.into());
    }
    Ok(serde_json::Value::Object(object).to_string().into_bytes())
}

/// Decodes the value of `key`, opening the values named in `sealed` with `seal` (a value that
/// must be sealed but is stored as text is refused by a key ring unless it adopts unsealed
/// values, and wants sealing then). Sealed values not named in `sealed` are opened too.
///
/// # Errors
/// [`Unreadable::Malformed`] for what is not an object's JSON, [`Unreadable::Sealed`] for a
/// value that does not open.
pub fn decode(
    key: &str,
    bytes: &[u8],
    seal: &dyn Seal,
    sealed: &[&str],
) -> Result<Opened, Unreadable> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
        .map_err(|err| {
            Unreadable::Malformed(format!(
                "{key} is not a JSON object ({:?} error at line {}, column {})",
                err.classify(),
                err.line(),
                err.column()
            ))
        })?;
    let mut opened = Opened {
        data: Data::new(),
        annotations: Annotations::new(),
        reseal: false,
    };
    for (field, value) in &object {
        if field == ANNOTATIONS {
            let map = value.as_object().ok_or_else(|| {
                Unreadable::Malformed(format!("{key}: \"{ANNOTATIONS}\" is not an object"))
            })?;
            for (k, v) in map {
                if let Some(v) = v.as_str() {
                    opened.annotations.insert(k.clone(), v.to_owned());
                }
            }
            continue;
        }
        let text = value
            .as_str()
            .ok_or_else(|| Unreadable::Malformed(format!("{key}: \"{field}\" is not a string")))?;
        let (name, stored) = match field.strip_suffix(SEALED_SUFFIX) {
            Some(name) => {
                let envelope = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|_| {
                        Unreadable::Malformed(format!("{key}: \"{field}\" is not base64"))
                    })?;
                (name, envelope)
            }
            None => (field.as_str(), text.as_bytes().to_vec()),
        };
        let value = if sealed.contains(&name) || field.ends_with(SEALED_SUFFIX) {
            let at = sealed_location(key, name);
            let open = seal
                .open(Location::etcd(&at), &stored)
                .map_err(Unreadable::Sealed)?;
            opened.reseal |= open.needs_reseal();
            open.into_plaintext()
        } else {
            stored
        };
        opened.data.insert(name.to_owned(), value);
    }
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use tls_seal::{KeyRing, Plain, SealKey};

    use super::*;

    fn content() -> (Data, Annotations) {
        (
            Data::from([
                ("tls.crt".into(), b"-----BEGIN CERTIFICATE-----\n".to_vec()),
                (
                    "tls.key".into(),
                    b"-----BEGIN PRIVATE KEY-----\nsecret\n".to_vec(),
                ),
            ]),
            Annotations::from([(
                "tls-rotation.io/renew-after".into(),
                "2030-01-01T00:00:00Z".into(),
            )]),
        )
    }

    fn encode_content(
        key: &str,
        (data, annotations): &(Data, Annotations),
        seal: &dyn Seal,
    ) -> Vec<u8> {
        encode(key, data, annotations, seal, &["tls.key"]).unwrap()
    }

    #[test]
    fn an_object_reads_back_as_written_sealed_or_not() {
        let ring = KeyRing::from_keys([SealKey::from_bytes([3; 32])]).unwrap();
        for seal in [&Plain as &dyn Seal, &ring] {
            let bytes = encode_content("/f/web/tls", &content(), seal);
            let opened = decode("/f/web/tls", &bytes, seal, &["tls.key"]).unwrap();
            assert_eq!((opened.data, opened.annotations), content());
            assert!(!opened.reseal);
        }
        let sealed = encode_content("/f/web/tls", &content(), &ring);
        let text = String::from_utf8(sealed.clone()).unwrap();
        assert!(
            text.contains("\"tls.key.sealed\"") && !text.contains("secret"),
            "{text}"
        );
        assert!(
            text.contains("BEGIN CERTIFICATE"),
            "certificates stay readable"
        );
        // Bound to its key: copied elsewhere, it does not open.
        assert!(matches!(
            decode("/f/other/tls", &sealed, &ring, &["tls.key"]),
            Err(Unreadable::Sealed(_))
        ));
        // Stored unsealed where a ring expects it sealed: refused.
        let plain = encode_content("/f/web/tls", &content(), &Plain);
        assert!(matches!(
            decode("/f/web/tls", &plain, &ring, &["tls.key"]),
            Err(Unreadable::Sealed(_))
        ));
    }

    #[test]
    fn garbage_is_malformed_and_never_shown() {
        for bytes in [
            &b"garbage"[..],
            b"[1]",
            b"{\"tls.crt\": 1}",
            b"{\"annotations\": 2}",
        ] {
            let Err(Unreadable::Malformed(reason)) = decode("/f/web/tls", bytes, &Plain, &[])
            else {
                panic!("{bytes:?} read");
            };
            assert!(
                reason.contains("/f/web/tls") && !reason.contains("garbage"),
                "{reason}"
            );
        }
    }
}
