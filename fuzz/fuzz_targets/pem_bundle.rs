//! PEM or DER certificate chains and private keys, as files or Secret data hold them: the
//! decoder must never panic, and what it accepts must be a well-formed bundle.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tls_source::{Decoder, Origin};

fuzz_target!(|data: &[u8]| {
    // Split the input into a chain, a key and a CA bundle at the first two NUL bytes.
    let mut parts = data.splitn(3, |b| *b == 0);
    let (cert, key, ca) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next(),
    );
    let decoder = Decoder::new();
    let _ = decoder.certificates("cert", data);
    let _ = decoder.private_key("key", data);
    if let Ok(bundle) = decoder.bundle(
        ("cert", cert),
        ("key", key),
        ca.map(|ca| ("ca", ca)),
        Origin::Other("fuzz".into()),
    ) {
        assert!(
            !bundle.chain().is_empty(),
            "an accepted bundle has a certificate"
        );
    }
});
