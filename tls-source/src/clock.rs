//! Where "now" comes from, and the one validity rule of the workspace.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time. Everything in the workspace that judges a certificate's validity
/// (the reload core's policy, the self-signed generator's renewal) asks a `Clock`, so that tests
/// can step it (an NTP step, a resume from suspend) and all parts agree on what "now" is.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock, [`SystemTime::now`]. The default everywhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Where an instant falls in a certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Before `notBefore`.
    NotYetValid,
    /// From `notBefore` through `notAfter`, both included (RFC 5280, 4.1.2.5).
    Valid,
    /// After `notAfter`.
    Expired,
}

impl Validity {
    /// The workspace's one validity rule: valid from `not_before` through `not_after`, both
    /// included, as RFC 5280 defines it.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tls_source::clock::Validity;
    ///
    /// let start = SystemTime::UNIX_EPOCH;
    /// let end = start + Duration::from_secs(60);
    /// assert_eq!(Validity::at(end, start, end), Validity::Valid);
    /// assert_eq!(Validity::at(end + Duration::from_nanos(1), start, end), Validity::Expired);
    /// ```
    pub fn at(now: SystemTime, not_before: SystemTime, not_after: SystemTime) -> Self {
        if now < not_before {
            Self::NotYetValid
        } else if now > not_after {
            Self::Expired
        } else {
            Self::Valid
        }
    }
}

/// 9999-12-31T23:59:59Z in seconds since the Unix epoch: RFC 5280's `notAfter` for "no
/// well-defined expiration date", the latest time a certificate can carry.
pub const LATEST_UNIX_SECONDS: u64 = 253_402_300_799;

/// The latest time a certificate can carry, 9999-12-31T23:59:59Z ([`LATEST_UNIX_SECONDS`]).
/// Times computed from outside input (a validity, an overlap) saturate here instead of
/// overflowing.
pub fn latest() -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_secs(LATEST_UNIX_SECONDS))
        // A platform whose SystemTime ends sooner: its own end, near enough.
        .or_else(|| UNIX_EPOCH.checked_add(Duration::from_secs(i32::MAX as u64)))
        .unwrap_or(UNIX_EPOCH)
}

/// `t + d`, or [`latest`] when that would be later (or not representable): for deadlines made
/// from outside input, such as `ClientAuth::overlap(Duration::MAX)`, which must never panic.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tls_source::clock::{latest, saturating_add};
///
/// let now = SystemTime::now();
/// assert_eq!(saturating_add(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// assert_eq!(saturating_add(now, Duration::MAX), latest());
/// ```
pub fn saturating_add(t: SystemTime, d: Duration) -> SystemTime {
    let latest = latest();
    match t.checked_add(d) {
        Some(sum) if sum <= latest => sum,
        _ => latest.max(t),
    }
}

/// Returns once `clock` reaches `at`, for any `at` (the year 9999 included), sleeping at most
/// `nap` at a time and asking the clock again after each sleep: a suspend, or a step of the
/// wall clock, delays it by at most `nap`, and a far deadline never overflows a timer.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use tls_source::clock::{SystemClock, sleep_until};
///
/// let past = std::time::SystemTime::now() - Duration::from_secs(1);
/// sleep_until(&SystemClock, past, Duration::from_secs(30)).await; // returns at once
/// # }
/// ```
pub async fn sleep_until(clock: &dyn Clock, at: SystemTime, nap: Duration) {
    while let Ok(remaining) = at.duration_since(clock.now()) {
        if remaining.is_zero() {
            return;
        }
        tokio::time::sleep(remaining.min(nap)).await;
    }
}

/// A time as RFC 3339 in UTC, to the second: the one format of the workspace's messages, status
/// and annotations, for any date a certificate can carry, before 1970 and up to 9999.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tls_source::clock::Rfc3339;
///
/// let t = SystemTime::UNIX_EPOCH - Duration::from_secs(631_152_000);
/// assert_eq!(Rfc3339(t).to_string(), "1950-01-01T00:00:00Z");
/// assert_eq!(Rfc3339::parse("1950-01-01T00:00:00Z"), Some(t));
/// assert_eq!(Rfc3339::parse("1950-01-01"), None);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Rfc3339(pub SystemTime);

impl Rfc3339 {
    /// Reads an RFC 3339 time (any offset); `None` if it is not one.
    pub fn parse(text: &str) -> Option<SystemTime> {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .ok()
            .map(SystemTime::from)
    }
}

impl std::fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = time::OffsetDateTime::from(self.0);
        let t = t.replace_nanosecond(0).unwrap_or(t);
        match t.format(&time::format_description::well_known::Rfc3339) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}

#[cfg(feature = "test-util")]
pub use stepped::SteppedClock;

#[cfg(feature = "test-util")]
mod stepped {
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, SystemTime};

    use super::Clock;

    /// A clock for tests (feature `test-util`): it follows Tokio's clock (so a test with paused
    /// time moves it as time auto-advances) from a starting wall-clock time, and can be stepped
    /// like an NTP step or a resume from suspend.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// use tls_source::clock::{Clock, SteppedClock};
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
        offset: Mutex<Duration>,
    }

    impl SteppedClock {
        /// A clock reading `start` now.
        pub fn starting_at(start: SystemTime) -> Self {
            Self {
                start,
                since: tokio::time::Instant::now(),
                offset: Mutex::new(Duration::ZERO),
            }
        }

        /// Moves the clock forward by `by`, at once.
        pub fn step(&self, by: Duration) {
            *self.offset.lock().unwrap_or_else(PoisonError::into_inner) += by;
        }
    }

    impl Clock for SteppedClock {
        fn now(&self) -> SystemTime {
            let offset = *self.offset.lock().unwrap_or_else(PoisonError::into_inner);
            self.start + self.since.elapsed() + offset
        }
    }
}
