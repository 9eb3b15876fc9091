//! Test-only fault injection (feature `__test-hooks`, not for production): lets end-to-end
//! tests of a whole program (the `serve` example) make the reload core panic on one input, to
//! show the panic is contained.

use std::sync::OnceLock;

use tls_source::CertBundle;

/// The environment variable read once: checking a bundle whose origin, as text, contains its
/// value panics.
pub const PANIC_ON_ORIGIN: &str = "TLS_RELOAD_TEST_PANIC_ON_ORIGIN";

/// Panics when the bundle's origin contains the value of [`PANIC_ON_ORIGIN`].
pub(crate) fn before_check(bundle: &CertBundle) {
    static NEEDLE: OnceLock<Option<String>> = OnceLock::new();
    let needle = NEEDLE.get_or_init(|| {
        std::env::var(PANIC_ON_ORIGIN)
            .ok()
            .filter(|n| !n.is_empty())
    });
    if let Some(needle) = needle {
        if bundle.origin().to_string().contains(needle.as_str()) {
            panic!("injected by {PANIC_ON_ORIGIN} for {}", bundle.origin());
        }
    }
}
