//! Test-only fault injection (feature `__test-hooks`, never for production): lets end-to-end
//! tests of a whole program (the `serve` example) make the reload core panic on one input, to
//! show what is contained and what is reported. Dormant unless its environment variables are
//! set.

use std::sync::OnceLock;

use tls_source::{CertBundle, Origin};

/// The environment variable read once: checking a bundle whose origin, as text, contains its
/// value panics (contained: the input is rejected with reason `internal`).
pub const PANIC_ON_ORIGIN: &str = "TLS_RELOAD_TEST_PANIC_ON_ORIGIN";

/// The environment variable read once: installing a bundle whose origin contains its value
/// panics outside any containment, so the reload task itself ends ([`Ended::Panicked`]).
///
/// [`Ended::Panicked`]: crate::Ended::Panicked
pub const PANIC_TASK_ON_ORIGIN: &str = "TLS_RELOAD_TEST_PANIC_TASK_ON_ORIGIN";

fn needle(var: &'static str, cell: &'static OnceLock<Option<String>>) -> Option<&'static str> {
    cell.get_or_init(|| std::env::var(var).ok().filter(|n| !n.is_empty()))
        .as_deref()
}

/// Panics when the bundle's origin contains the value of [`PANIC_ON_ORIGIN`].
pub(crate) fn before_check(bundle: &CertBundle) {
    static NEEDLE: OnceLock<Option<String>> = OnceLock::new();
    if let Some(needle) = needle(PANIC_ON_ORIGIN, &NEEDLE)
        && bundle.origin().to_string().contains(needle)
    {
        panic!("injected by {PANIC_ON_ORIGIN} for {}", bundle.origin());
    }
}

/// Panics when the origin contains the value of [`PANIC_TASK_ON_ORIGIN`].
pub(crate) fn before_install(origin: &Origin) {
    static NEEDLE: OnceLock<Option<String>> = OnceLock::new();
    if let Some(needle) = needle(PANIC_TASK_ON_ORIGIN, &NEEDLE)
        && origin.to_string().contains(needle)
    {
        panic!("injected by {PANIC_TASK_ON_ORIGIN} for {origin}");
    }
}
