//! Renewal as a plan, pure: given what is stored for a certificate ([`Record`]), the certificate
//! held, whether an order is in flight, the configuration and `now`, what to do next and when.
//! The driver (`driver.rs`) asks [`next`], performs the action (through `order.rs` and the
//! store) and reports the outcome back ([`ari_fetched`], [`issued`], [`failed`]); every time and
//! every random draw comes in as an argument, so the rules are tested here on a stepped clock
//! in milliseconds.
//!
//! The rules:
//! - **Lifetime** (no ARI window): renew once a third of the lifetime remains, half of it under
//!   ten days, earlier by up to a thirtieth of the lifetime by a number drawn once per
//!   certificate and stored (a restart keeps the same time).
//! - **ARI** (RFC 9773): a time inside the CA's window, chosen with the same stored number and
//!   kept until the window changes; a window that has started when it is fetched means renew
//!   now (a revocation); asked again at its `Retry-After` (one minute to a day), apart from the
//!   renewal timer; an ARI error never leaves renewal later than the lifetime rule. A CA that
//!   suggests for the new certificate the window the last one was renewed in is stale: the
//!   lifetime decides until the window moves.
//! - **Failures** wait by kind, and are kept with the configuration that failed: another
//!   configuration tries at once. A failure of ours (not the CA's rate limit, not the budget)
//!   waits at most a quarter of the held certificate's remaining validity, a minute at least:
//!   an hour's wait after a failed validation would let a 5-minute certificate expire.

use std::time::{Duration, SystemTime};

use tls_source::clock::saturating_add;

use crate::record::{FailureKind, Record, RenewReason, Window, from_unix, to_unix};

/// How long an order the CA refused (a failed validation) waits before it is tried again: less
/// only when the certificate held would otherwise expire first (a failure waits at most a
/// quarter of its remaining validity), or a retry is asked for
/// ([`Acme::retry_now`](crate::Acme::retry_now)).
pub const REFUSED_BACKOFF: Duration = Duration::from_secs(3600);
/// The shortest and the longest wait after a failed order (other than a refusal or a rate
/// limit): one minute, doubling, at most a day.
const BACKOFF_MIN: Duration = Duration::from_secs(60);
const BACKOFF_MAX: Duration = Duration::from_secs(24 * 3600);
/// ARI's `Retry-After` is followed within these bounds.
const ARI_RECHECK_MIN: Duration = Duration::from_secs(60);
const ARI_RECHECK_MAX: Duration = Duration::from_secs(24 * 3600);
/// Under this lifetime a certificate renews at half of it, not two thirds.
const SHORT_LIFETIME: Duration = Duration::from_secs(10 * 24 * 3600);
/// A retry asked for ([`retry_now`]) waits this long after the last attempt.
pub(crate) const RETRY_NOW_MIN: Duration = Duration::from_secs(60);
/// Failed validations a CA allows per name and account in an hour (Let's Encrypt: 5).
pub(crate) const REFUSALS_PER_HOUR: usize = 5;
const HOUR: u64 = 3600;

/// The certificate held for a name.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// Its ARI certificate identifier (or another stable identity of the certificate).
    pub(crate) id: String,
    pub(crate) not_before: SystemTime,
    pub(crate) not_after: SystemTime,
}

/// What the plan depends on besides the record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings<'a> {
    /// The configuration an order is made with (its names, the challenge type, where it is
    /// answered, the directory): failures are kept with it.
    pub(crate) config: &'a str,
    /// The directory offers ARI (`renewalInfo`).
    pub(crate) ari: bool,
}

/// What to do next for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing until then (the renewal time, or the next ARI check, whichever is first).
    Wait { until: SystemTime },
    /// Ask the CA's ARI about the held certificate now.
    FetchAri,
    /// Place an order; with `replaces`, naming the held certificate (ARI).
    Order { replaces: bool },
    /// Resume the order in flight.
    Resume,
    /// A failure waits until then.
    Backoff { until: SystemTime },
    /// Not tried again until the configuration changes or a retry is asked for.
    GiveUp,
}

/// What to do next. Updates `record` with what the decision fixed (the renewal time and its
/// jitter for a new certificate, failures of another configuration cleared); `draw` is a fresh
/// number in [0, 1), used only when one must be drawn.
pub(crate) fn next(
    record: &mut Record,
    held: Option<&Held>,
    in_flight: bool,
    settings: &Settings<'_>,
    now: SystemTime,
    draw: f64,
) -> Action {
    let failing = record.failed || record.failures > 0 || record.retry_at.is_some();
    if failing && record.failed_for.as_deref() != Some(settings.config) {
        // Failures of another configuration: this one is tried at once.
        record.clear_failure();
    }
    if let Some(held) = held {
        hold(record, held, draw);
    }
    if !settings.ari {
        // A CA without ARI (or one that said so): no check is planned.
        record.ari_next = None;
        record.ari_failures = 0;
    }
    if record.failed {
        return Action::GiveUp;
    }
    if let Some(retry) = record.retry_at.map(from_unix).filter(|t| *t > now) {
        return Action::Backoff { until: retry };
    }
    if in_flight {
        return Action::Resume;
    }
    let Some(renew_at) = record.renew_at.map(from_unix).filter(|_| held.is_some()) else {
        return Action::Order { replaces: false };
    };
    if renew_at <= now {
        return Action::Order {
            replaces: settings.ari && record.ari.is_some(),
        };
    }
    if settings.ari {
        match record.ari_next.map(from_unix) {
            Some(at) if at > now => Action::Wait {
                until: at.min(renew_at),
            },
            _ => Action::FetchAri,
        }
    } else {
        Action::Wait { until: renew_at }
    }
}

/// Makes the record's renewal fields those of `held`: a certificate not seen before gets a
/// jitter drawn now and the lifetime rule's time (until ARI says otherwise).
fn hold(record: &mut Record, held: &Held, draw: f64) {
    if record.cert.as_deref() != Some(held.id.as_str()) {
        record.cert = Some(held.id.clone());
        record.jitter = Some(draw);
        record.renew_at = None;
        record.renew_reason = None;
        record.ari = None;
        record.ari_next = None;
        record.ari_failures = 0;
    }
    let jitter = *record.jitter.get_or_insert(draw);
    record.not_after = Some(to_unix(held.not_after));
    if record.renew_at.is_none() {
        record.renew_at = Some(to_unix(by_lifetime(held, jitter)));
        record.renew_reason = Some(RenewReason::Lifetime);
    }
}

/// The lifetime rule: once a third of the lifetime remains (half under ten days), earlier by
/// up to a thirtieth of it by `jitter`.
pub(crate) fn by_lifetime(held: &Held, jitter: f64) -> SystemTime {
    let lifetime = held
        .not_after
        .duration_since(held.not_before)
        .unwrap_or_default();
    let used = if lifetime < SHORT_LIFETIME {
        lifetime / 2
    } else {
        lifetime / 3 * 2
    };
    let early = (lifetime / 30).mul_f64(jitter.clamp(0.0, 1.0));
    saturating_add(held.not_before, used.saturating_sub(early))
}

/// A time inside `window`, by `jitter`; `now` when the window has started (a revocation, or a
/// renewal overdue).
fn in_window(window: Window, jitter: f64, now: SystemTime) -> SystemTime {
    let (start, end) = (from_unix(window.start), from_unix(window.end));
    if start <= now {
        return now;
    }
    let span = end.duration_since(start).unwrap_or_default();
    saturating_add(start, span.mul_f64(jitter.clamp(0.0, 1.0)))
}

/// ARI answered for `held` at `now`: its window and its `Retry-After`, or an error.
pub(crate) fn ari_fetched(
    record: &mut Record,
    held: &Held,
    answer: Result<(Window, Duration), ()>,
    now: SystemTime,
    draw: f64,
) {
    hold(record, held, draw);
    let jitter = record.jitter.unwrap_or(draw);
    let lifetime = by_lifetime(held, jitter);
    match answer {
        Ok((window, retry_after)) => {
            let recheck = retry_after.clamp(ARI_RECHECK_MIN, ARI_RECHECK_MAX);
            record.ari_next = Some(to_unix(saturating_add(now, recheck)));
            record.ari_failures = 0;
            if record.ari == Some(window) {
                return; // unchanged: the time chosen in it stays
            }
            record.ari = Some(window);
            if record.renewed_under == Some(window) {
                // The window the last certificate was renewed in: stale. The lifetime decides.
                record.renew_at = Some(to_unix(lifetime));
                record.renew_reason = Some(RenewReason::Lifetime);
            } else {
                record.renew_at = Some(to_unix(in_window(window, jitter, now)));
                record.renew_reason = Some(RenewReason::Ari);
            }
        }
        Err(()) => {
            record.ari_failures = record.ari_failures.saturating_add(1);
            let wait = backoff(record.ari_failures, draw).clamp(ARI_RECHECK_MIN, ARI_RECHECK_MAX);
            record.ari_next = Some(to_unix(saturating_add(now, wait)));
            // An outage never leaves renewal later than the lifetime rule.
            if record.renew_at.is_none_or(|at| from_unix(at) > lifetime) {
                record.renew_at = Some(to_unix(lifetime));
                record.renew_reason = Some(RenewReason::Lifetime);
            }
        }
    }
}

/// A certificate was issued at `now`: failures cleared; the next certificate gets renewal
/// fields of its own (the window this one was renewed under is kept, to tell a stale one).
pub(crate) fn issued(record: &mut Record, now: SystemTime) {
    record.clear_failure();
    record.renewed_under = if record.renew_reason == Some(RenewReason::Ari) {
        record.ari
    } else {
        None
    };
    record.attempted_at = Some(to_unix(now));
    record.cert = None;
    record.jitter = None;
    record.renew_at = None;
    record.renew_reason = None;
    record.ari = None;
    record.ari_next = None;
    record.ari_failures = 0;
}

/// An order failed at `now` with the configuration `config`: how long it waits by `kind`
/// (`until`: the CA's or the budget's time, for a rate limit).
pub(crate) fn failed(
    record: &mut Record,
    failure: Failure<'_>,
    config: &str,
    now: SystemTime,
    draw: f64,
) {
    record.failures = record.failures.saturating_add(1);
    record.last_error = Some(failure.error.to_owned());
    record.failed_for = Some(config.to_owned());
    record.failure = Some(failure.kind);
    record.attempted_at = Some(to_unix(now));
    record.failed = false;
    let hour_ago = to_unix(now).saturating_sub(HOUR);
    record.refusals.retain(|t| *t > hour_ago);
    let retry = match failure.kind {
        FailureKind::Identifier => {
            record.failed = true;
            None
        }
        FailureKind::RateLimited | FailureKind::Budget => Some(
            failure
                .until
                .unwrap_or_else(|| saturating_add(now, REFUSED_BACKOFF)),
        ),
        FailureKind::Validation => {
            record.refusals.push(to_unix(now));
            Some(saturating_add(
                now,
                REFUSED_BACKOFF.max(backoff(record.failures, draw)),
            ))
        }
        FailureKind::BadCertificate | FailureKind::Transient => {
            Some(saturating_add(now, backoff(record.failures, draw)))
        }
    };
    // A certificate held is not left to expire behind a wait of our own: a failure waits at
    // most a quarter of its remaining validity (a minute at least), so a short-lived one is
    // tried a few times before it ends. The CA's waits (a rate limit) and the budget's stand.
    let ours = matches!(
        failure.kind,
        FailureKind::Validation | FailureKind::BadCertificate | FailureKind::Transient
    );
    let retry = match (retry, record.not_after.map(from_unix)) {
        (Some(at), Some(end)) if ours => {
            let left = end.duration_since(now).unwrap_or_default();
            Some(at.min(saturating_add(now, (left / 4).max(BACKOFF_MIN))))
        }
        (retry, _) => retry,
    };
    record.retry_at = retry.map(to_unix);
}

/// How an order failed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure<'a> {
    pub(crate) kind: FailureKind,
    pub(crate) error: &'a str,
    /// Not before then (a rate limit's `Retry-After`, the budget's refill).
    pub(crate) until: Option<SystemTime>,
}

/// A retry was asked for at `now`: clears the wait unless the CA's limits forbid it, then
/// says until when (a rate limit's time; the hour in which the CA counts failed validations;
/// a minute after the last attempt).
pub(crate) fn retry_now(record: &mut Record, now: SystemTime) -> Result<(), SystemTime> {
    let waiting = record.failed || record.retry_at.is_some_and(|t| from_unix(t) > now);
    if !waiting {
        return Ok(());
    }
    let mut not_before = record
        .attempted_at
        .map_or(now, |t| saturating_add(from_unix(t), RETRY_NOW_MIN));
    match record.failure {
        Some(FailureKind::RateLimited | FailureKind::Budget) => {
            not_before = not_before.max(record.retry_at.map_or(now, from_unix));
        }
        Some(FailureKind::Validation) => {
            let hour_ago = to_unix(now).saturating_sub(HOUR);
            let mut recent: Vec<u64> = record
                .refusals
                .iter()
                .copied()
                .filter(|t| *t > hour_ago)
                .collect();
            if recent.len() >= REFUSALS_PER_HOUR {
                recent.sort_unstable();
                let frees = recent[recent.len() - REFUSALS_PER_HOUR];
                not_before = not_before.max(from_unix(frees.saturating_add(HOUR)));
            }
        }
        _ => {}
    }
    if not_before > now {
        // Sooner than the limits allow: brought forward to the first time they do.
        let until = record
            .retry_at
            .map_or(not_before, |t| not_before.min(from_unix(t)));
        record.retry_at = Some(to_unix(until));
        record.failed = false;
        return Err(until);
    }
    record.retry_at = None;
    record.failed = false;
    Ok(())
}

/// The wait after `failures` failed attempts: one minute, doubling, at most a day, less up
/// to a tenth by `draw` (replicas and names do not retry in step).
pub(crate) fn backoff(failures: u32, draw: f64) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20))
        .min(BACKOFF_MAX);
    base - (base / 10).mul_f64(draw.clamp(0.0, 1.0))
}

/// When the `position`-th certificate to order at start (from 0) is ordered: the stagger
/// spaces them, so a CA sees a ramp, not a burst (saturated: a stagger of the user's times
/// many names may be far ahead).
pub(crate) fn staggered(now: SystemTime, stagger: Duration, position: u32) -> SystemTime {
    saturating_add(now, stagger.saturating_mul(position))
}

#[cfg(test)]
mod tests;
