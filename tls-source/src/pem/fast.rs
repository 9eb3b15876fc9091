//! A fast path for the usual certificate file: nothing but `CERTIFICATE` sections, each a
//! BEGIN line, lines of standard base64 and an END line (as OpenSSL, cert-manager and rcgen
//! write them), with blank lines between. Certificates are public, so their base64 needs no
//! constant-time decoding; this reads such a file in a fraction of the general decoder's
//! time. Anything else (text around the sections, other labels, headers, spaces, padding or
//! trailing bits that are not canonical, which the `base64` crate's standard engine refuses)
//! is declined with `None` and read by `rustls-pki-types`, whose verdict (and error message)
//! stands. What this accepts it decodes as `rustls-pki-types` does (the tests compare the two).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls_pki_types::CertificateDer;

const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
const END: &[u8] = b"-----END CERTIFICATE-----";

/// The certificates of `bytes` when it is a plain certificate file; `None` for anything the
/// general decoder must judge.
pub(super) fn certificates(bytes: &[u8]) -> Option<Vec<CertificateDer<'static>>> {
    let mut lines = bytes
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let mut certs = Vec::new();
    let mut body = Vec::with_capacity(bytes.len());
    // Blank lines between sections (and a file's last newline) are skipped.
    while let Some(line) = lines.by_ref().find(|line| !line.is_empty()) {
        if line != BEGIN {
            return None;
        }
        body.clear();
        loop {
            let line = lines.next()?;
            if line == END {
                break;
            }
            if line.is_empty() {
                return None;
            }
            body.extend_from_slice(line);
        }
        let der = STANDARD.decode(&body).ok().filter(|der| !der.is_empty())?;
        certs.push(CertificateDer::from(der));
    }
    (!certs.is_empty()).then_some(certs)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rustls_pki_types::pem::{PemObject, SectionKind};

    use super::*;

    /// `ders` as a PEM file: lines of `width` digits, `crlf` line ends, `blank` lines between
    /// sections.
    fn pem(ders: &[Vec<u8>], width: usize, crlf: bool, blank: usize) -> Vec<u8> {
        let eol: &[u8] = if crlf { b"\r\n" } else { b"\n" };
        let mut out = Vec::new();
        for der in ders {
            out.extend_from_slice(BEGIN);
            out.extend_from_slice(eol);
            for line in STANDARD.encode(der).as_bytes().chunks(width) {
                out.extend_from_slice(line);
                out.extend_from_slice(eol);
            }
            out.extend_from_slice(END);
            out.extend_from_slice(eol);
            out.extend(std::iter::repeat_n(eol, blank).flatten());
        }
        out
    }

    /// What `rustls-pki-types` reads: the certificates, or that it refused the input.
    fn general(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
        let mut certs = Vec::new();
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes) {
            let (kind, der) = section.ok()?;
            if kind == SectionKind::Certificate {
                certs.push(der);
            }
        }
        Some(certs)
    }

    fn ders(certs: Vec<CertificateDer<'static>>) -> Vec<Vec<u8>> {
        certs.into_iter().map(|c| c.to_vec()).collect()
    }

    fn file() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 1..1500), 1..4),
            1usize..20,
            any::<bool>(),
            0usize..3,
        )
            .prop_map(|(ders, width, crlf, blank)| pem(&ders, width * 4, crlf, blank))
    }

    proptest! {
        #[test]
        fn plain_files_are_read_as_the_general_decoder_reads_them(
            contents in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..1500), 1..4),
            width in 1usize..20,
            crlf: bool,
            blank in 0usize..3,
        ) {
            let bytes = pem(&contents, width * 4, crlf, blank);
            let fast = certificates(&bytes).map(ders);
            prop_assert_eq!(fast, Some(contents.clone()));
            prop_assert_eq!(general(&bytes), Some(contents));
        }

        #[test]
        fn what_it_accepts_after_a_change_the_general_decoder_reads_alike(
            bytes in file(),
            at in any::<prop::sample::Index>(),
            byte: u8,
            how in 0u8..3,
        ) {
            let mut bytes = bytes;
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
            if let Some(fast) = certificates(&bytes) {
                prop_assert_eq!(Some(ders(fast)), general(&bytes));
            }
        }
    }

    #[test]
    fn a_real_chain_is_read_on_the_fast_path() {
        let ca = tls_test::TestCa::new("fast");
        let leaf = ca.leaf(&["localhost"]);
        let bytes = leaf.chain_pem.as_bytes();
        let fast = certificates(bytes).expect("a plain chain is read here");
        assert_eq!(Some(ders(fast)), general(bytes));
    }

    #[test]
    fn anything_else_is_declined() {
        let plain = pem(&[vec![1, 2, 3, 4]], 64, false, 0);
        let text = |s: &str| s.as_bytes().to_vec();
        for (what, bytes) in [
            (
                "text before",
                [text("subject=CN=a\n"), plain.clone()].concat(),
            ),
            ("text after", [plain.clone(), text("trailing\n")].concat()),
            (
                "another label",
                text("-----BEGIN X509 CRL-----\nAQID\n-----END X509 CRL-----\n"),
            ),
            (
                "a space",
                text("-----BEGIN CERTIFICATE-----\nAQID \n-----END CERTIFICATE-----\n"),
            ),
            ("no END", text("-----BEGIN CERTIFICATE-----\nAQID\n")),
            (
                "no padding",
                text("-----BEGIN CERTIFICATE-----\nAQIDBA\n-----END CERTIFICATE-----\n"),
            ),
            (
                "trailing bits",
                text("-----BEGIN CERTIFICATE-----\nAQIDBB==\n-----END CERTIFICATE-----\n"),
            ),
            (
                "a blank line inside",
                text("-----BEGIN CERTIFICATE-----\nAQID\n\nAQID\n-----END CERTIFICATE-----\n"),
            ),
            ("empty", Vec::new()),
        ] {
            assert_eq!(certificates(&bytes), None, "{what}");
        }
    }
}
