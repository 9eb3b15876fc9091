//! The engine's timers on tokio time, judged by the validator's clock: a timer fires only once
//! the clock says its time has come, and any deadline (the year 9999 included) can be armed.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use tls_source::clock::Clock;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::engine::Due;

/// The longest a timer is armed for. tokio-util's `DelayQueue` takes deadlines up to about
/// 795 days (2^36 ms) and panics past that; a certificate can be valid until 9999. A deadline
/// further away is armed at this and armed again when it fires, until it is due.
const MAX_TIMER: Duration = Duration::from_secs(365 * 24 * 3600);

/// When a timer fired before the clock reached its time (a clock behind tokio's), the least
/// wait before it is looked at again, so a lagging clock is polled, not spun on.
const LAGGING_CLOCK: Duration = Duration::from_millis(10);

/// One timer per [`Due`], each with the time it is for.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    queue: DelayQueue<(Due, SystemTime)>,
    keys: HashMap<Due, delay_queue::Key>,
}

impl Timers {
    /// Arms `due` for `at` on `clock`, replacing its timer if it has one.
    pub(crate) fn arm(&mut self, due: Due, at: SystemTime, clock: &dyn Clock) {
        self.cancel(due);
        let wait = at.duration_since(clock.now()).unwrap_or_default();
        self.insert(due, at, wait);
    }

    pub(crate) fn cancel(&mut self, due: Due) {
        if let Some(key) = self.keys.remove(&due) {
            self.queue.try_remove(&key);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The next timer whose time has come on `clock`. Cancel-safe: a timer that fires early is
    /// armed again before this waits on.
    pub(crate) async fn next(&mut self, clock: &dyn Clock) -> Option<Due> {
        loop {
            let (due, at) = self.queue.next().await?.into_inner();
            self.keys.remove(&due);
            match at.duration_since(clock.now()) {
                Ok(rest) if !rest.is_zero() => {
                    self.insert(due, at, rest.max(LAGGING_CLOCK));
                }
                _ => return Some(due),
            }
        }
    }

    fn insert(&mut self, due: Due, at: SystemTime, wait: Duration) {
        let key = self.queue.insert((due, at), wait.min(MAX_TIMER));
        self.keys.insert(due, key);
    }
}

/// Waits until `clock` reaches `at`, for any `at` (the year 9999 included): in sleeps of at
/// most [`MAX_TIMER`], each judged again by the clock, as [`Timers`] arms its timers. A
/// plain `tokio::time::sleep` clamps a far deadline to about thirty years and would fire then.
#[cfg_attr(not(feature = "accept"), allow(dead_code))]
pub(crate) async fn sleep_until(at: SystemTime, clock: &dyn Clock) {
    while let Ok(rest) = at.duration_since(clock.now()) {
        if rest.is_zero() {
            return;
        }
        tokio::time::sleep(rest.clamp(LAGGING_CLOCK, MAX_TIMER)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tls_source::clock::SteppedClock;

    /// `sleep_until` the year 9999: pending after years of (virtual) time, and done once the
    /// clock has reached its time.
    #[tokio::test(start_paused = true)]
    async fn sleep_until_9999_waits_in_steps_until_the_clock_is_there() {
        let clock = Arc::new(SteppedClock::starting_at(tls_test::new_year(2026)));
        let at = tls_source::clock::latest();
        let sleeping = {
            let clock = Arc::clone(&clock);
            tokio::spawn(async move { sleep_until(at, &*clock).await })
        };
        tokio::time::sleep(Duration::from_secs(3 * 365 * 86_400)).await;
        assert!(!sleeping.is_finished(), "not before its time");
        clock.step(at.duration_since(clock.now()).unwrap());
        tokio::time::sleep(MAX_TIMER).await;
        sleeping.await.unwrap();
    }

    /// The year 9999 can be armed (a `DelayQueue` panics past 795 days), and fires then, not
    /// before. Virtual time.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_in_9999_is_armed_and_fires_when_due() {
        let clock = Arc::new(SteppedClock::starting_at(tls_test::new_year(2026)));
        let mut timers = Timers::default();
        let at = tls_source::clock::latest();
        timers.arm(Due::Expired(0), at, &*clock);
        assert_eq!(timers.next(&*clock).await, Some(Due::Expired(0)));
        assert!(clock.now() >= at);
    }

    #[tokio::test(start_paused = true)]
    async fn arming_again_replaces_and_a_cancelled_timer_never_fires() {
        let clock = Arc::new(SteppedClock::starting_at(tls_test::new_year(2026)));
        let start = clock.now();
        let mut timers = Timers::default();
        timers.arm(Due::Retry(1), start + Duration::from_secs(10), &*clock);
        timers.arm(Due::Retry(1), start + Duration::from_secs(60), &*clock);
        timers.arm(Due::TrustLeaves, start + Duration::from_secs(30), &*clock);
        timers.cancel(Due::TrustLeaves);
        assert_eq!(timers.next(&*clock).await, Some(Due::Retry(1)));
        assert!(clock.now() >= start + Duration::from_secs(60));
        assert!(timers.is_empty());
        assert_eq!(timers.next(&*clock).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_past_deadline_fires_at_once() {
        let clock = Arc::new(SteppedClock::starting_at(tls_test::new_year(2026)));
        let mut timers = Timers::default();
        timers.arm(Due::Expiring(2), tls_test::new_year(1950), &*clock);
        let before = tokio::time::Instant::now();
        assert_eq!(timers.next(&*clock).await, Some(Due::Expiring(2)));
        assert_eq!(tokio::time::Instant::now(), before);
    }
}
