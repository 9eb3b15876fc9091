//! Test-only fault injection (feature `__test-hooks`, never for production): lets end-to-end
//! tests of a whole program (the `serve` example) make the reload core panic on one input, to
//! show what is contained and what is reported. Dormant unless its environment variables are
//! set. An input is picked by its origin (as text) or its leaf's SHA-256 fingerprint
//! containing the variable's value.

use std::sync::OnceLock;

use tls_source::{CertBundle, Digest, Origin};

/// The environment variable read once: checking a matching bundle panics (contained: the
/// input is rejected with reason `internal`).
pub const PANIC_ON: &str = "TLS_RELOAD_TEST_PANIC_ON";

/// The environment variable read once: installing a matching bundle panics outside any
/// containment, so the reload task itself ends ([`Ended::Panicked`]).
///
/// [`Ended::Panicked`]: crate::Ended::Panicked
pub const PANIC_TASK_ON: &str = "TLS_RELOAD_TEST_PANIC_TASK_ON";

fn needle(var: &'static str, cell: &'static OnceLock<Option<String>>) -> Option<&'static str> {
    cell.get_or_init(|| std::env::var(var).ok().filter(|n| !n.is_empty()))
        .as_deref()
}

fn picks(needle: &str, origin: &Origin, fingerprint: &str) -> bool {
    origin.to_string().contains(needle) || fingerprint.contains(needle)
}

/// Panics when the bundle is picked by [`PANIC_ON`].
pub(crate) fn before_check(bundle: &CertBundle) {
    static NEEDLE: OnceLock<Option<String>> = OnceLock::new();
    if let Some(needle) = needle(PANIC_ON, &NEEDLE) {
        let fingerprint = bundle
            .leaf()
            .map(|leaf| Digest::of(leaf).to_string())
            .unwrap_or_default();
        if picks(needle, bundle.origin(), &fingerprint) {
            panic!("injected by {PANIC_ON} for {}", bundle.origin());
        }
    }
}

/// Panics when the certificate is picked by [`PANIC_TASK_ON`].
pub(crate) fn before_install(info: &crate::CertInfo) {
    static NEEDLE: OnceLock<Option<String>> = OnceLock::new();
    if let Some(needle) = needle(PANIC_TASK_ON, &NEEDLE)
        && picks(needle, &info.origin, &info.fingerprint_sha256)
    {
        panic!("injected by {PANIC_TASK_ON} for {}", info.origin);
    }
}
