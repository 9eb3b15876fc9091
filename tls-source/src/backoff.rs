//! [`Backoff`]: how long to wait before the next retry, as a value.

use std::time::Duration;

/// Exponential backoff as an iterator of waits: `initial`, doubling up to `max`, forever.
/// [`reset`](Self::reset) after a success starts again from `initial` (kube-runtime's `Backoff`
/// is the model). Sources use it where they retry (a file watch that cannot start).
///
/// ```
/// use std::time::Duration;
/// use tls_source::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// let waits: Vec<_> = backoff.by_ref().take(6).collect();
/// assert_eq!(waits[0], Duration::from_millis(100));
/// assert_eq!(waits[3], Duration::from_millis(800));
/// assert_eq!(waits[5], Duration::from_secs(1));
/// backoff.reset();
/// assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial` and doubles up to `max` (`max` is raised to `initial` if lower).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// Starts again from the initial wait.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(self.max);
        Some(wait)
    }
}
