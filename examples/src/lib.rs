//! What the examples share: logging to stderr, stopping on a signal.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Logs to stderr as `serve` does (its `log_to_stderr`).
pub use tls_rotation_serve::log_to_stderr;

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
///
/// # Panics
/// If the signal handlers cannot be installed.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    shutdown.cancel();
}
