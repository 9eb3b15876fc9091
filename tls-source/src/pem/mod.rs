//! Decoding certificates and private keys from PEM (or DER), with a size limit.

use rustls_pki_types::pem::{self, PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{CertBundle, Error, Origin};

mod fast;

/// The default limit on the size of one input (a certificate, key or CA file): 1 MiB.
///
/// A real certificate chain is a few KiB; the limit stops a misconfigured path (a log file, a
/// device) from being read into memory.
pub const DEFAULT_MAX_SIZE: u64 = 1024 * 1024;

/// Decodes certificate chains and private keys, refusing inputs above a size limit.
///
/// Accepts PEM (the usual `tls.crt` / `tls.key`) and, for an input with no PEM section at all, DER.
/// Private keys may be PKCS#8 (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`) or SEC1
/// (`EC PRIVATE KEY`); encrypted keys are refused with [`Error::EncryptedKey`].
///
/// ```
/// use tls_source::{Decoder, Error};
///
/// let decoder = Decoder::new().max_size(64 * 1024);
/// let err = decoder.private_key("tls.key", b"not a key").unwrap_err();
/// assert!(matches!(err, Error::Malformed { .. }));
/// assert_eq!(err.to_string(), "malformed tls.key: not PEM (no BEGIN line) and not DER");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoder {
    max_size: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

// ===== impl Decoder =====

impl Decoder {
    /// A decoder with the default size limit, [`DEFAULT_MAX_SIZE`].
    pub const fn new() -> Self {
        Self {
            max_size: DEFAULT_MAX_SIZE,
        }
    }

    /// Sets the largest input accepted, in bytes.
    #[must_use]
    pub const fn max_size(mut self, bytes: u64) -> Self {
        self.max_size = bytes;
        self
    }

    /// The largest input accepted, in bytes.
    pub const fn limit(&self) -> u64 {
        self.max_size
    }

    /// Checks an input's size against the limit.
    ///
    /// # Errors
    /// [`Error::TooLarge`] naming `input`.
    pub fn check_size(&self, input: &str, len: u64) -> Result<(), Error> {
        if len > self.max_size {
            return Err(Error::TooLarge {
                input: input.to_owned(),
                limit: self.max_size,
            });
        }
        Ok(())
    }

    /// Decodes every certificate in `bytes`, in order (leaf first for a chain).
    ///
    /// `input` names the bytes in errors (a path, a Secret key).
    ///
    /// # Errors
    /// [`Error::TooLarge`], [`Error::Empty`], [`Error::Malformed`] or [`Error::NoCertificate`].
    pub fn certificates(
        &self,
        input: &str,
        bytes: &[u8],
    ) -> Result<Vec<CertificateDer<'static>>, Error> {
        let bytes = strip_bom(bytes);
        self.precheck(input, bytes)?;
        if !is_pem(bytes) {
            return der(input, bytes).map(|der| vec![CertificateDer::from(der.to_vec())]);
        }
        if let Some(certs) = fast::certificates(bytes) {
            return Ok(certs);
        }
        let mut certs = Vec::new();
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes) {
            let (kind, der) = section.map_err(|e| malformed(input, &e))?;
            if kind == SectionKind::Certificate {
                certs.push(CertificateDer::from(der));
            }
        }
        if certs.is_empty() {
            return Err(Error::NoCertificate {
                input: input.to_owned(),
            });
        }
        Ok(certs)
    }

    /// Decodes the one private key in `bytes`.
    ///
    /// # Errors
    /// [`Error::TooLarge`], [`Error::Empty`], [`Error::EncryptedKey`], [`Error::Malformed`],
    /// [`Error::NoKey`] or [`Error::MultipleKeys`].
    pub fn private_key(&self, input: &str, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
        let bytes = strip_bom(bytes);
        self.precheck(input, bytes)?;
        if contains(bytes, b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || contains(bytes, b"Proc-Type: 4,ENCRYPTED")
        {
            return Err(Error::EncryptedKey {
                input: input.to_owned(),
            });
        }
        if !is_pem(bytes) {
            let der = der(input, bytes)?;
            return PrivateKeyDer::try_from(der.to_vec()).map_err(|_| Error::Malformed {
                input: input.to_owned(),
                reason: "DER input is not a PKCS#8, PKCS#1 or SEC1 private key".to_owned(),
            });
        }
        let mut keys = Vec::new();
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes) {
            let (kind, der) = section.map_err(|e| malformed(input, &e))?;
            if let Some(key) = PrivateKeyDer::from_pem(kind, der) {
                keys.push(key);
            }
        }
        match keys.len() {
            0 => Err(Error::NoKey {
                input: input.to_owned(),
            }),
            1 => Ok(keys.remove(0)),
            count => Err(Error::MultipleKeys {
                input: input.to_owned(),
                count,
            }),
        }
    }

    /// Decodes a certificate chain, its private key and an optional CA bundle into a [`CertBundle`].
    ///
    /// Each input is a `(name, bytes)` pair; the name is used in errors.
    ///
    /// # Errors
    /// The first error of [`certificates`](Self::certificates) or
    /// [`private_key`](Self::private_key), in the order certificate, key, CA.
    pub fn bundle(
        &self,
        cert: (&str, &[u8]),
        key: (&str, &[u8]),
        ca: Option<(&str, &[u8])>,
        origin: Origin,
    ) -> Result<CertBundle, Error> {
        let chain = self.certificates(cert.0, cert.1)?;
        let key = self.private_key(key.0, key.1)?;
        let ca = match ca {
            Some((name, bytes)) => self.certificates(name, bytes)?,
            None => Vec::new(),
        };
        Ok(CertBundle::new(chain, key, origin).with_ca(ca))
    }

    fn precheck(&self, input: &str, bytes: &[u8]) -> Result<(), Error> {
        self.check_size(input, bytes.len() as u64)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Empty {
                input: input.to_owned(),
            });
        }
        Ok(())
    }
}

/// Text editors on Windows start UTF-8 files with a byte-order mark; OpenSSL reads past it.
fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

fn is_pem(bytes: &[u8]) -> bool {
    contains(bytes, b"-----BEGIN ")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    // Compared only where the first byte matches: a memcmp at every position was most of the
    // cost of decoding a certificate.
    haystack
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == first)
        .any(|(at, _)| haystack[at + 1..].starts_with(rest))
}

/// Accepts bytes that look like one DER SEQUENCE; the parse that follows says more.
fn der<'a>(input: &str, bytes: &'a [u8]) -> Result<&'a [u8], Error> {
    if bytes.first() == Some(&0x30) {
        Ok(bytes)
    } else {
        Err(Error::Malformed {
            input: input.to_owned(),
            reason: "not PEM (no BEGIN line) and not DER".to_owned(),
        })
    }
}

/// Describes a PEM error without echoing any of the input's bytes.
fn malformed(input: &str, err: &pem::Error) -> Error {
    let reason = match err {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "truncated PEM: the {} section has no END line",
            String::from_utf8_lossy(end_marker)
        ),
        pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".to_owned(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".to_owned(),
        pem::Error::SectionTooLarge => "a PEM section is too large".to_owned(),
        _ => "invalid PEM".to_owned(),
    };
    Error::Malformed {
        input: input.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tls_test::{KeyFormat, TestCa};

    fn ca() -> TestCa {
        TestCa::new("pem tests")
    }

    #[test]
    fn decodes_a_chain_leaf_first() {
        let ca = ca();
        let leaf = ca.leaf(&["example.test"]);
        let chain = format!("{}{}", leaf.cert_pem, ca.cert_pem());
        let certs = Decoder::new()
            .certificates("tls.crt", chain.as_bytes())
            .unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(certs[0].as_ref(), leaf.cert_der.as_ref());
        assert_eq!(certs[1].as_ref(), ca.cert_der().as_ref());
    }

    #[test]
    fn decodes_pkcs8_pkcs1_and_sec1_keys() {
        for format in [KeyFormat::Pkcs8, KeyFormat::Sec1, KeyFormat::Pkcs1] {
            let pair = tls_test::fixture_pair(format);
            let key = Decoder::new()
                .private_key("tls.key", pair.key_pem.as_bytes())
                .unwrap_or_else(|e| panic!("{format:?}: {e}"));
            let matches = matches!(
                (&key, format),
                (PrivateKeyDer::Pkcs8(_), KeyFormat::Pkcs8)
                    | (PrivateKeyDer::Sec1(_), KeyFormat::Sec1)
                    | (PrivateKeyDer::Pkcs1(_), KeyFormat::Pkcs1)
            );
            assert!(matches, "{format:?} decoded as the wrong kind");
        }
    }

    #[test]
    fn accepts_a_byte_order_mark_and_crlf_line_endings() {
        let leaf = ca().leaf(&["localhost"]);
        let windows = |pem: &str| {
            let mut bytes = b"\xEF\xBB\xBF".to_vec();
            bytes.extend_from_slice(pem.replace('\n', "\r\n").as_bytes());
            bytes
        };
        let bundle = Decoder::new()
            .bundle(
                ("tls.crt", &windows(&leaf.chain_pem)),
                ("tls.key", &windows(&leaf.key_pem)),
                None,
                Origin::SelfSigned,
            )
            .unwrap();
        assert_eq!(bundle.chain().len(), 2);
        assert_eq!(bundle.chain()[0], leaf.cert_der);
    }

    #[test]
    fn decodes_der() {
        let leaf = ca().leaf(&["der.test"]);
        let decoder = Decoder::new();
        let certs = decoder
            .certificates("tls.crt", leaf.cert_der.as_ref())
            .unwrap();
        assert_eq!(certs[0].as_ref(), leaf.cert_der.as_ref());
        let key = decoder.private_key("tls.key", &leaf.key_der).unwrap();
        assert!(matches!(key, PrivateKeyDer::Pkcs8(_)));
    }

    #[test]
    fn names_the_input_in_every_error() {
        let leaf = ca().leaf(&["x.test"]);
        let d = Decoder::new();
        let two_keys = format!("{}{}", leaf.key_pem, leaf.key_pem);
        let truncated = &leaf.cert_pem[..leaf.cert_pem.len() / 2];
        let cases: Vec<(Error, &str)> = vec![
            (d.certificates("a.crt", b"").unwrap_err(), "a.crt is empty"),
            (
                d.certificates("a.crt", b" \n\t").unwrap_err(),
                "a.crt is empty",
            ),
            (
                d.certificates("a.crt", leaf.key_pem.as_bytes())
                    .unwrap_err(),
                "no certificate found in a.crt",
            ),
            (
                d.private_key("a.key", leaf.cert_pem.as_bytes())
                    .unwrap_err(),
                "no private key found in a.key",
            ),
            (
                d.private_key("a.key", two_keys.as_bytes()).unwrap_err(),
                "a.key holds 2 private keys, expected exactly one",
            ),
            (
                d.certificates("a.crt", truncated.as_bytes()).unwrap_err(),
                "malformed a.crt: truncated PEM: the CERTIFICATE section has no END line",
            ),
            (
                d.certificates("a.crt", b"hello world").unwrap_err(),
                "malformed a.crt: not PEM (no BEGIN line) and not DER",
            ),
            (
                d.max_size(100)
                    .certificates("a.crt", leaf.cert_pem.as_bytes())
                    .unwrap_err(),
                "a.crt is larger than the limit of 100 bytes",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn refuses_encrypted_keys() {
        let pair = tls_test::fixture_encrypted_key();
        let err = Decoder::new()
            .private_key("enc.key", pair.as_bytes())
            .unwrap_err();
        assert!(matches!(err, Error::EncryptedKey { .. }), "{err}");
        assert!(err.to_string().contains("enc.key"));
    }

    #[test]
    fn refuses_bad_base64_without_echoing_it() {
        let leaf = ca().leaf(&["x.test"]);
        // Corrupt the body of the key: an invalid base64 character in the middle.
        let mut lines: Vec<String> = leaf.key_pem.lines().map(str::to_owned).collect();
        lines[1].replace_range(3..4, "*");
        let corrupt = lines.join("\n");
        let err = Decoder::new()
            .private_key("a.key", corrupt.as_bytes())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed a.key: a PEM section is not valid base64"
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_input(bytes: Vec<u8>) {
            let d = Decoder::new();
            let _ = d.certificates("in", &bytes);
            let _ = d.private_key("in", &bytes);
        }

        #[test]
        fn never_panics_on_damaged_pem(cut in 0usize..600, flip in 0usize..600) {
            let pem = tls_test::fixture_pair(tls_test::KeyFormat::Sec1).key_pem;
            let mut bytes = pem.into_bytes();
            if flip < bytes.len() { bytes[flip] ^= 0x55; }
            bytes.truncate(cut.min(bytes.len()));
            let _ = Decoder::new().private_key("in", &bytes);
        }
    }
}
