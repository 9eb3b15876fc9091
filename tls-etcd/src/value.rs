//! The value of a certificate key: a JSON object shaped like a TLS Secret's data, with PEM text
//! (not base64) in each field, so that chain and key always change together:
//!
//! ```json
//! {"tls.crt": "-----BEGIN CERTIFICATE-----\n...", "tls.key": "-----BEGIN PRIVATE KEY-----\n...", "ca.crt": "..."}
//! ```
//!
//! `ca.crt` is optional; other fields are ignored. A value whose key is sealed at rest
//! (`tls_seal`, as a fleet on etcd writes it with a seal key) holds `"tls.key.sealed"`, the
//! envelope in base64, in place of `"tls.key"`; it opens only at this etcd key
//! ([`sealed_location`]).

use std::sync::Arc;

use base64::Engine as _;
use tls_seal::{Location, Seal};
use tls_source::{CertBundle, Decoder, Digest, Origin};

use crate::Error;

/// The field of the certificate chain (leaf first), as in a `kubernetes.io/tls` Secret.
pub const TLS_CRT: &str = "tls.crt";
/// The field of the private key.
pub const TLS_KEY: &str = "tls.key";
/// The field of the CA bundle (optional).
pub const CA_CRT: &str = "ca.crt";
/// What a field's name ends with when it holds a sealed value (the envelope, base64).
pub const SEALED_SUFFIX: &str = ".sealed";

/// Where the field `field` of the value at the etcd key `key` is sealed: the place its
/// envelope is bound to (`KEY#FIELD`).
pub fn sealed_location(key: &str, field: &str) -> String {
    format!("{key}#{field}")
}

/// How values are read: the decoder's limits, and the seal that opens a sealed `tls.key`.
#[derive(Clone, Default)]
pub(crate) struct Reader {
    pub(crate) decoder: Decoder,
    pub(crate) seal: Option<Arc<dyn Seal>>,
}

/// What identifies a value: the digest of its raw bytes. The sources compare it with the last
/// one passed on before reading anything, so the same bytes put again (or listed again) are
/// neither parsed nor opened.
pub(crate) fn digest(value: &[u8]) -> Digest {
    Digest::of(value)
}

/// Reads the value of `key`, stored at `revision` (its `mod_revision`): the bundle, or why
/// there is none.
pub(crate) fn bundle(
    key: &str,
    value: &[u8],
    revision: i64,
    reader: &Reader,
) -> Result<CertBundle, tls_source::Error> {
    let decoder = &reader.decoder;
    let origin = || format!("etcd {key}");
    let bad = |reason: String| {
        tls_source::Error::source(
            origin(),
            Error::BadValue {
                key: key.to_owned(),
                reason,
            },
        )
    };
    // The size first: the decoder's limit applies to the whole value (no JSON parse of a huge one).
    decoder.check_size(&format!("etcd key {key}"), value.len() as u64)?;
    // serde_json's message says where parsing stopped, never what it read.
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(value)
        .map_err(|err| {
            bad(format!(
                "not a JSON object with \"{TLS_CRT}\" and \"{TLS_KEY}\" ({:?} error at line {}, column {})",
                err.classify(),
                err.line(),
                err.column()
            ))
        })?;
    let field = |name: &str| -> Result<Option<&str>, tls_source::Error> {
        match object.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(bad(format!("\"{name}\" is not a string of PEM text"))),
        }
    };
    let (cert, tls_key, ca) = (field(TLS_CRT)?, field(TLS_KEY)?, field(CA_CRT)?);
    let sealed_field = format!("{TLS_KEY}{SEALED_SUFFIX}");
    let opened;
    let tls_key = match (tls_key, field(&sealed_field)?) {
        (Some(key), _) => Some(key),
        (None, None) => None,
        (None, Some(sealed)) => {
            let Some(seal) = &reader.seal else {
                return Err(bad(format!(
                    "\"{TLS_KEY}\" is sealed (\"{sealed_field}\"): the source needs the seal key"
                )));
            };
            let envelope = base64::engine::general_purpose::STANDARD
                .decode(sealed)
                .map_err(|_| bad(format!("\"{sealed_field}\" is not base64")))?;
            seal.reload();
            let at = sealed_location(key, TLS_KEY);
            let plaintext = seal
                .open(Location::etcd(&at), &envelope)
                .map_err(|err| tls_source::Error::source(origin(), err))?
                .into_plaintext();
            opened = String::from_utf8(plaintext)
                .map_err(|_| bad(format!("the opened \"{TLS_KEY}\" is not PEM text")))?;
            Some(opened.as_str())
        }
    };
    let missing: Vec<&str> = [(TLS_CRT, cert), (TLS_KEY, tls_key)]
        .into_iter()
        .filter(|(_, v)| v.is_none())
        .map(|(name, _)| name)
        .collect();
    let (Some(cert), Some(tls_key)) = (cert, tls_key) else {
        return Err(bad(format!("no {} field", missing.join(" or "))));
    };
    let input = |field: &str| format!("etcd key {key} field {field}");
    decoder.bundle(
        (&input(TLS_CRT), cert.as_bytes()),
        (&input(TLS_KEY), tls_key.as_bytes()),
        ca.map(|ca| (input(CA_CRT), ca.as_bytes()))
            .as_ref()
            .map(|(n, b)| (n.as_str(), *b)),
        Origin::Etcd {
            key: key.to_owned(),
            revision,
        },
    )
}

/// The value for a certificate, chain and key (and optional CA bundle) as PEM text: what
/// [`EtcdCertSource`](crate::EtcdCertSource) reads. For tools and tests that put certificates.
///
/// ```
/// let value = tls_etcd::value("-----BEGIN CERTIFICATE-----\n", "-----BEGIN PRIVATE KEY-----\n", None);
/// let json: serde_json::Value = serde_json::from_str(&value).unwrap();
/// assert!(json["tls.crt"].as_str().unwrap().starts_with("-----BEGIN CERTIFICATE"));
/// assert!(json.get("ca.crt").is_none());
/// ```
pub fn value(cert_pem: &str, key_pem: &str, ca_pem: Option<&str>) -> String {
    let mut object = serde_json::Map::new();
    object.insert(TLS_CRT.to_owned(), cert_pem.into());
    object.insert(TLS_KEY.to_owned(), key_pem.into());
    if let Some(ca) = ca_pem {
        object.insert(CA_CRT.to_owned(), ca.into());
    }
    serde_json::Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String, tls_test::TestCert) {
        let leaf = tls_test::TestCa::new("etcd value test").leaf(&["a.test"]);
        (leaf.cert_pem.clone(), leaf.key_pem.clone(), leaf)
    }

    #[test]
    fn a_value_with_chain_and_key_is_a_bundle_from_that_key_and_revision() {
        let (cert, key, _) = pair();
        let read = bundle(
            "/p/certs/a",
            value(&cert, &key, None).as_bytes(),
            7,
            &Reader::default(),
        );
        let bundle = read.unwrap();
        assert_eq!(bundle.chain().len(), 1);
        assert_eq!(bundle.origin().to_string(), "etcd /p/certs/a at revision 7");
        assert_eq!(bundle.origin().label(), "etcd:/p/certs/a");
    }

    #[test]
    fn bad_values_are_reported_by_key_and_never_echo_the_value() {
        let (cert, key, leaf) = pair();
        let secret = key.lines().nth(1).unwrap().to_owned();
        let cases: Vec<(String, &str)> = vec![
            (format!("not json {secret}"), "not a JSON object"),
            ("[1,2]".to_owned(), "not a JSON object"),
            (format!(r#"{{"tls.key": {key:?}}}"#), "no tls.crt field"),
            (format!(r#"{{"tls.crt": {cert:?}}}"#), "no tls.key field"),
            ("{}".to_owned(), "no tls.crt or tls.key field"),
            (
                format!(r#"{{"tls.crt": 5, "tls.key": {key:?}}}"#),
                "\"tls.crt\" is not a string",
            ),
            (
                format!(r#"{{"tls.crt": {cert:?}, "tls.key": "garbage {secret}"}}"#),
                "tls.key",
            ),
        ];
        for (value, expected) in cases {
            let read = bundle("/p/certs/a", value.as_bytes(), 1, &Reader::default());
            let message = read.unwrap_err().to_string();
            assert!(message.contains("/p/certs/a"), "{message}");
            assert!(message.contains(expected), "{expected:?} in {message}");
            tls_test::assert_no_key_material(&message, &leaf);
        }
    }

    #[test]
    fn an_oversized_value_is_refused_before_it_is_parsed() {
        let big = vec![b' '; 2 << 20];
        let read = bundle("/p/certs/a", &big, 1, &Reader::default());
        assert!(
            read.unwrap_err()
                .to_string()
                .contains("larger than the limit")
        );
    }

    #[test]
    fn the_digest_follows_the_bytes() {
        let (cert, key, leaf) = pair();
        let a = value(&cert, &key, None);
        let b = value(&cert, &key, Some(&leaf.ca_pem));
        let reader = Reader::default();
        // The same bytes at another revision are the same value: see cert.rs's tests, where
        // they are put again and nothing is passed on (or parsed).
        assert_ne!(digest(a.as_bytes()), digest(b.as_bytes()));
        assert_eq!(bundle("k", b.as_bytes(), 1, &reader).unwrap().ca().len(), 1);
    }
}
