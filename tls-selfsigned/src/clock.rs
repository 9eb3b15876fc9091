//! Where "now" comes from.

use std::fmt;
use std::time::{Duration, SystemTime};

/// A source of wall-clock time. The generator asks it for "now" when it sets validity and when it
/// decides to renew, so tests can step it (an NTP step, a resume from suspend).
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock, [`SystemTime::now`]. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock for tests: it follows Tokio's clock (so a test with paused time moves it as time
/// auto-advances) from a starting wall-clock time, and can be stepped like an NTP step or a
/// resume from suspend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::{Duration, SystemTime};
/// use tls_selfsigned::{Clock, SteppedClock};
///
/// let clock = SteppedClock::starting_at(SystemTime::UNIX_EPOCH);
/// clock.step(Duration::from_secs(3600));
/// assert!(clock.now() >= SystemTime::UNIX_EPOCH + Duration::from_secs(3600));
/// # }
/// ```
#[derive(Debug)]
pub struct SteppedClock {
    start: SystemTime,
    since: tokio::time::Instant,
    offset: std::sync::Mutex<Duration>,
}

impl SteppedClock {
    /// A clock reading `start` now.
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            start,
            since: tokio::time::Instant::now(),
            offset: std::sync::Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the clock forward by `by`, at once.
    pub fn step(&self, by: Duration) {
        *self
            .offset
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += by;
    }
}

impl Clock for SteppedClock {
    fn now(&self) -> SystemTime {
        let offset = *self
            .offset
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.start + self.since.elapsed() + offset
    }
}
