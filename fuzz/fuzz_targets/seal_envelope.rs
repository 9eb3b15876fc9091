//! Sealed values as read back from a Secret: decoding an envelope and opening it (with a ring
//! that adopts unsealed values, and with no seal) must never panic, and what opens must seal
//! again and open to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tls_seal::fuzzing::open(data);
});
