//! [`Trigger`]: a handle that makes a source read again now.

use std::sync::Arc;

use tokio::sync::watch;

/// A cloneable handle that makes a source read its input again now, e.g. from a SIGHUP handler
/// or an admin endpoint. Sources hand out their own (e.g.
/// [`FileSource::trigger`](crate::FileSource::trigger)).
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
#[derive(Clone, Debug)]
pub struct Trigger {
    tx: Arc<watch::Sender<()>>,
}

/// The listening half, held by a source.
#[derive(Debug)]
pub(crate) struct Triggered {
    rx: watch::Receiver<()>,
}

impl Trigger {
    pub(crate) fn new() -> (Self, Triggered) {
        let (tx, rx) = watch::channel(());
        (Self { tx: Arc::new(tx) }, Triggered { rx })
    }

    /// Asks the source to read again.
    pub fn trigger(&self) {
        self.tx.send_modify(|()| {});
    }
}

impl Triggered {
    /// Completes when [`Trigger::trigger`] has been called since the last completion.
    ///
    /// Cancellation safe: a trigger that arrives while this future is dropped is kept.
    pub(crate) async fn notified(&mut self) {
        if self.rx.changed().await.is_err() {
            // Every handle is gone (the source keeps one): no trigger can come.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wakes_once_for_a_burst_and_keeps_an_early_trigger() {
        let (trigger, mut triggered) = Trigger::new();
        trigger.trigger();
        trigger.trigger();
        tokio::time::timeout(Duration::from_secs(5), triggered.notified())
            .await
            .expect("the early triggers are kept");
        let again = tokio::time::timeout(Duration::from_millis(50), triggered.notified()).await;
        assert!(again.is_err(), "a burst wakes once");
    }
}
