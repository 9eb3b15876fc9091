//! The shared store's CA Secret (its data keys and the RFC 3339 `switch-after` annotation) and
//! its fence annotations, as a writer reads them after anyone may have edited them: never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

const KEYS: [&str; 5] = ["ca.crt", "ca.key", "next.crt", "next.key", "previous.crt"];

fuzz_target!(|data: &[u8]| {
    // The first byte picks which keys are present; the rest is split between them and the
    // annotation at NUL bytes.
    let Some((&mask, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.split(|b| *b == 0);
    let switch_after = parts
        .next()
        .and_then(|p| std::str::from_utf8(p).ok())
        .filter(|_| mask & 0x80 != 0);
    let entries: Vec<(String, Vec<u8>)> = KEYS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, key)| ((*key).to_owned(), parts.next().unwrap_or_default().to_vec()))
        .collect();
    tls_k8s::fuzzing::ca_secret(&entries, switch_after);
    // The same bytes as a Secret's annotations.
    let annotations = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "annotations": {
            "tls-rotation.io/round": String::from_utf8_lossy(rest),
            "tls-rotation.io/holder": switch_after.unwrap_or_default(),
        }},
    });
    let _ = tls_k8s::fuzzing::fence(annotations.to_string().as_bytes());
});
