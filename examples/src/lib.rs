//! What the examples share: stopping on a signal.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

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
