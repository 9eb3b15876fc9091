//! [`Trigger`]: a handle that makes a source read again now.

use std::sync::Arc;

use tokio::sync::Notify;

/// A cloneable handle that makes a source read its input again now, e.g. from a SIGHUP handler
/// or an admin endpoint.
///
/// Triggers coalesce: several before the source gets to read cause one read. A trigger made
/// before the source is first polled is kept and honoured.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use tls_source::FileSource;
///
/// let source = FileSource::builder("tls.crt", "tls.key").build();
/// let reread = source.trigger();
/// reread.trigger(); // cheap, never blocks, fine to call from any thread
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Trigger {
    notify: Arc<Notify>,
}

impl Trigger {
    /// A new, unconnected trigger; sources make their own, see e.g.
    /// [`FileSource::trigger`](crate::FileSource::trigger).
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the source to read again.
    pub fn trigger(&self) {
        self.notify.notify_one();
    }

    /// Completes when [`trigger`](Self::trigger) has been called (since the last completion).
    ///
    /// # Cancellation safety
    /// Cancellation safe: a trigger that arrives while this future is dropped is kept for the next
    /// call.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}
