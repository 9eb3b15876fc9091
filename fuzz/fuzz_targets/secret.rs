//! Secrets as the API returns them (JSON): decoding their data (base64, the three keys, the
//! PEM/DER bundle) and their fence annotations must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tls_k8s::fuzzing::secret(data);
    let _ = tls_k8s::fuzzing::fence(data);
});
