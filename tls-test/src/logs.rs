//! [`Logs`]: what `tracing` writes in a test binary, as text a user would read.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What `tracing` writes in this test binary (plain text, no colours), through one global
/// subscriber: a thread-local one misses events whose callsite interest another test thread
/// cached first.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs").finish_non_exhaustive()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// The logs of this test binary at info level and above: installs the global subscriber
    /// on first use.
    ///
    /// # Panics
    /// If another global subscriber was installed.
    pub fn global() -> Self {
        Self::global_at(tracing::Level::INFO)
    }

    /// The logs of this test binary at `level` and above (the first call's level holds).
    ///
    /// # Panics
    /// If another global subscriber was installed.
    pub fn global_at(level: tracing::Level) -> Self {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let writer = logs.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(level)
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
            logs
        })
        .clone()
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }

    /// The lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Waits (at most [`PATIENCE`](crate::PATIENCE)) until the logs mention `needle`; all of
    /// them then.
    ///
    /// # Panics
    /// If they do not in time, showing what they say.
    pub async fn wait_for(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + crate::PATIENCE;
        loop {
            let text = self.text();
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} in the log:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
