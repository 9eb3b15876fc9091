//! The plan on a stepped clock: certificates of 6, 45, 90 and 398 days and one valid until
//! 9999, ARI windows ahead, now, past, absent and failing, every failure kind, the stagger.

use std::time::{Duration, SystemTime};

use tls_source::clock::{Clock as _, SteppedClock, latest};

use super::*;

const DAY: Duration = Duration::from_secs(24 * 3600);
const CONFIG: &str = "a.example.com|tls-alpn-01|0.0.0.0:443|https://ca.example/dir";
const LIFETIME: Settings<'static> = Settings {
    config: CONFIG,
    ari: false,
};
const ARI: Settings<'static> = Settings {
    config: CONFIG,
    ari: true,
};

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn clock() -> SteppedClock {
    SteppedClock::starting_at(start())
}

fn held(id: &str, from: SystemTime, lifetime: Duration) -> Held {
    Held {
        id: id.into(),
        not_before: from,
        not_after: from + lifetime,
    }
}

fn window(from: SystemTime, to: SystemTime) -> Window {
    Window {
        start: to_unix(from),
        end: to_unix(to),
    }
}

/// The plan for a record with `cert` held and no order in flight.
fn step(
    record: &mut Record,
    cert: &Held,
    settings: &Settings<'_>,
    now: SystemTime,
    draw: f64,
) -> Action {
    next(record, Some(cert), false, settings, now, draw)
}

fn wait_until(action: Action) -> SystemTime {
    match action {
        Action::Wait { until } => until,
        other => panic!("expected a wait, got {other:?}"),
    }
}

/// The share of the lifetime left when the plan first says to order, stepping time an hour (or
/// a tenth of the lifetime, if less) at a time.
fn left_at_renewal(lifetime: Duration, jitter: f64) -> f64 {
    let mut now = start();
    let cert = held("c", now, lifetime);
    let mut record = Record::default();
    let stride = (lifetime / 10).min(Duration::from_secs(3600));
    loop {
        match step(&mut record, &cert, &LIFETIME, now, jitter) {
            Action::Order { .. } => break,
            Action::Wait { until } => {
                now += until
                    .duration_since(now)
                    .unwrap_or(stride)
                    .clamp(Duration::from_secs(1), stride);
            }
            other => panic!("{other:?}"),
        }
    }
    let left = cert.not_after.duration_since(now).unwrap();
    left.as_secs_f64() / lifetime.as_secs_f64()
}

// ===== the lifetime rule =====

#[test]
fn a_90_day_certificate_renews_with_a_third_left_earlier_by_its_jitter() {
    let left = left_at_renewal(90 * DAY, 0.0);
    assert!((left - 1.0 / 3.0).abs() < 0.001, "{left}");
    let left = left_at_renewal(90 * DAY, 0.999);
    assert!((left - (1.0 / 3.0 + 1.0 / 30.0)).abs() < 0.001, "{left}");
}

#[test]
fn a_45_day_certificate_renews_with_a_third_left() {
    let left = left_at_renewal(45 * DAY, 0.5);
    assert!((left - (1.0 / 3.0 + 0.5 / 30.0)).abs() < 0.001, "{left}");
}

#[test]
fn a_6_day_certificate_renews_with_half_left_never_after_it_expired() {
    let left = left_at_renewal(6 * DAY, 0.0);
    assert!((left - 0.5).abs() < 0.001, "{left}");
    let left = left_at_renewal(6 * DAY, 0.999);
    assert!(left > 0.5 && left < 0.54, "{left}");
}

#[test]
fn a_398_day_certificate_renews_with_a_third_left() {
    let left = left_at_renewal(398 * DAY, 0.25);
    assert!((left - (1.0 / 3.0 + 0.25 / 30.0)).abs() < 0.001, "{left}");
}

#[test]
fn certificates_just_under_and_over_ten_days_use_half_and_a_third() {
    let short = left_at_renewal(10 * DAY - Duration::from_secs(3600), 0.0);
    let long = left_at_renewal(10 * DAY, 0.0);
    assert!((short - 0.5).abs() < 0.01, "{short}");
    assert!((long - 1.0 / 3.0).abs() < 0.01, "{long}");
}

#[test]
fn a_300_second_certificate_renews_at_half_its_life() {
    let now = start();
    let cert = held("c", now, Duration::from_secs(300));
    let mut record = Record::default();
    let until = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.0));
    assert_eq!(until, now + Duration::from_secs(150));
}

#[test]
fn a_certificate_valid_until_9999_waits_without_overflow_and_renews_in_time() {
    let now = start();
    let cert = Held {
        id: "forever".into(),
        not_before: now,
        not_after: latest(),
    };
    let mut record = Record::default();
    let until = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.999));
    assert!(until > now && until < latest(), "{until:?}");
    // A clock stepped to the end of time orders, never panics.
    let action = step(&mut record, &cert, &LIFETIME, latest(), 0.5);
    assert_eq!(action, Action::Order { replaces: false });
}

#[test]
fn a_certificate_valid_from_1950_to_9999_renews_in_between_and_stores_without_overflow() {
    let from_1950 = SystemTime::UNIX_EPOCH - 20 * 365 * DAY;
    let cert = Held {
        id: "long".into(),
        not_before: from_1950,
        not_after: latest(),
    };
    let mut record = Record::default();
    let now = start();
    let until = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.999));
    assert!(until > now && until < latest(), "{until:?}");
    let stored = Record::from_json(&record.to_json()).unwrap();
    assert_eq!(stored.renew_at, record.renew_at);
    // ARI for it: a window at the end of time, an outage, a failure; nothing overflows.
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(latest(), latest()), Duration::MAX)),
        now,
        0.5,
    );
    ari_fetched(&mut record, &cert, Err(()), latest(), 0.5);
    failed(
        &mut record,
        failure(FailureKind::Transient, None),
        CONFIG,
        latest(),
        0.5,
    );
    assert_eq!(record.retry_at, Some(to_unix(latest())));
}

#[test]
fn a_certificate_already_expired_is_ordered_at_once() {
    let now = start();
    let cert = held("old", now - 100 * DAY, 90 * DAY);
    let mut record = Record::default();
    assert_eq!(
        step(&mut record, &cert, &LIFETIME, now, 0.3),
        Action::Order { replaces: false }
    );
}

#[test]
fn nothing_held_is_ordered_at_once() {
    let mut record = Record::default();
    assert_eq!(
        next(&mut record, None, false, &LIFETIME, start(), 0.3),
        Action::Order { replaces: false }
    );
}

#[test]
fn the_renewal_time_is_drawn_once_per_certificate_and_kept_across_restarts() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    let first = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.7));
    // A restart: the record read back, another number drawn.
    let mut stored = Record::from_json(&record.to_json()).unwrap();
    for draw in [0.0, 0.2, 0.99] {
        let again = wait_until(next(
            &mut stored,
            Some(&cert),
            false,
            &LIFETIME,
            now + DAY,
            draw,
        ));
        assert_eq!(again, first, "draw {draw}");
    }
    // The next certificate gets a time of its own.
    issued(&mut stored, first);
    let renewed = held("d", first, 90 * DAY);
    let second = wait_until(next(
        &mut stored,
        Some(&renewed),
        false,
        &LIFETIME,
        first,
        0.1,
    ));
    assert_eq!(second, by_lifetime(&renewed, 0.1));
    assert_eq!(stored.renew_reason, Some(RenewReason::Lifetime));
}

#[test]
fn a_record_of_the_previous_version_gets_its_jitter_once_and_keeps_it() {
    let now = start();
    let cert = held("c", now, 45 * DAY);
    let mut record =
        Record::from_json(br#"{"retry_at":null,"failures":0,"last_error":null}"#).unwrap();
    let first = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.4));
    let second = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.9));
    assert_eq!(first, second);
    assert_eq!(record.jitter, Some(0.4));
}

// ===== ARI =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn with_ari_the_window_is_fetched_first_then_a_time_inside_it_is_kept() {
    let clock = clock();
    let cert = held("c", clock.now(), 90 * DAY);
    let mut record = Record::default();
    assert_eq!(
        step(&mut record, &cert, &ARI, clock.now(), 0.5),
        Action::FetchAri
    );
    let (from, to) = (clock.now() + 60 * DAY, clock.now() + 62 * DAY);
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(from, to), 6 * 3600 * Duration::from_secs(1))),
        clock.now(),
        0.9,
    );
    assert_eq!(record.renew_reason, Some(RenewReason::Ari));
    let renew = from_unix(record.renew_at.unwrap());
    assert_eq!(renew, from + DAY, "halfway, by the stored jitter");
    // Until the next check: the Retry-After.
    let until = wait_until(next(
        &mut record,
        Some(&cert),
        false,
        &ARI,
        clock.now(),
        0.1,
    ));
    assert_eq!(until, clock.now() + Duration::from_secs(6 * 3600));
    // The same window again: the same time, whatever is drawn.
    clock.step(6 * 3600 * Duration::from_secs(1));
    assert_eq!(
        step(&mut record, &cert, &ARI, clock.now(), 0.1),
        Action::FetchAri
    );
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(from, to), DAY)),
        clock.now(),
        0.01,
    );
    assert_eq!(from_unix(record.renew_at.unwrap()), renew);
}

#[test]
fn an_ari_window_that_moves_moves_the_renewal_with_it() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &ARI, now, 0.0);
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(now + 60 * DAY, now + 62 * DAY), DAY)),
        now,
        0.0,
    );
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(now + 30 * DAY, now + 32 * DAY), DAY)),
        now + DAY,
        0.0,
    );
    assert_eq!(from_unix(record.renew_at.unwrap()), now + 30 * DAY);
}

#[test]
fn an_ari_window_that_has_started_means_renew_now_replacing_the_certificate() {
    let now = start();
    let cert = held("c", now - 10 * DAY, 90 * DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &ARI, now, 0.5);
    // A mass revocation: the window moved into the past.
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(now - DAY, now - Duration::from_secs(60)), DAY)),
        now,
        0.5,
    );
    assert_eq!(
        step(&mut record, &cert, &ARI, now, 0.5),
        Action::Order { replaces: true }
    );
}

#[test]
fn an_ari_window_starting_now_means_renew_now() {
    let now = start();
    let cert = held("c", now - 10 * DAY, 90 * DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &ARI, now, 0.5);
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(now, now + DAY), DAY)),
        now,
        0.5,
    );
    assert_eq!(
        step(&mut record, &cert, &ARI, now, 0.5),
        Action::Order { replaces: true }
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_time_chosen_in_a_future_window_stays_when_the_window_starts() {
    let clock = clock();
    let cert = held("c", clock.now(), 90 * DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &ARI, clock.now(), 0.5);
    let w = window(clock.now() + DAY, clock.now() + 3 * DAY);
    ari_fetched(&mut record, &cert, Ok((w, DAY)), clock.now(), 0.5);
    let chosen = from_unix(record.renew_at.unwrap());
    clock.step(DAY + Duration::from_secs(60));
    ari_fetched(&mut record, &cert, Ok((w, DAY)), clock.now(), 0.5);
    assert_eq!(
        from_unix(record.renew_at.unwrap()),
        chosen,
        "not pulled to now"
    );
}

#[test]
fn an_ari_retry_after_is_clamped_between_a_minute_and_a_day() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let w = window(now + 60 * DAY, now + 61 * DAY);
    for (asked, kept) in [
        (Duration::ZERO, 60),
        (Duration::from_secs(600), 600),
        (Duration::MAX, 86_400),
    ] {
        let mut record = Record::default();
        let _ = step(&mut record, &cert, &ARI, now, 0.5);
        ari_fetched(&mut record, &cert, Ok((w, asked)), now, 0.5);
        assert_eq!(record.ari_next, Some(to_unix(now) + kept), "{asked:?}");
    }
}

#[test]
fn an_ari_outage_never_leaves_renewal_later_than_the_lifetime_rule() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &ARI, now, 0.0);
    // A window later than the lifetime rule, then ARI fails.
    ari_fetched(
        &mut record,
        &cert,
        Ok((window(now + 80 * DAY, now + 81 * DAY), DAY)),
        now,
        0.0,
    );
    assert_eq!(from_unix(record.renew_at.unwrap()), now + 80 * DAY);
    ari_fetched(&mut record, &cert, Err(()), now + DAY, 0.0);
    assert_eq!(from_unix(record.renew_at.unwrap()), by_lifetime(&cert, 0.0));
    assert_eq!(record.renew_reason, Some(RenewReason::Lifetime));
    // Asked again within the backoff's bounds, a minute first.
    assert_eq!(record.ari_next, Some(to_unix(now + DAY) + 60));
}

#[test]
fn ari_failing_from_the_start_keeps_the_lifetime_rule_and_retries_less_often() {
    let now = start();
    let cert = held("c", now, 45 * DAY);
    let mut record = Record::default();
    let mut at = now;
    let mut waits = Vec::new();
    for _ in 0..15 {
        assert_eq!(step(&mut record, &cert, &ARI, at, 0.0), Action::FetchAri);
        ari_fetched(&mut record, &cert, Err(()), at, 0.0);
        let until = wait_until(step(&mut record, &cert, &ARI, at, 0.0));
        waits.push(until.duration_since(at).unwrap().as_secs());
        at = until;
    }
    assert_eq!(&waits[..3], &[60, 120, 240]);
    assert_eq!(*waits.last().unwrap(), 86_400, "at most a day apart");
    assert_eq!(from_unix(record.renew_at.unwrap()), by_lifetime(&cert, 0.0));
}

#[test]
fn a_ca_found_without_ari_plans_no_check() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    assert_eq!(step(&mut record, &cert, &ARI, now, 0.5), Action::FetchAri);
    // The CA says it has no ARI: the lifetime decides, and no check is planned.
    ari_fetched(&mut record, &cert, Err(()), now, 0.5);
    let until = wait_until(step(&mut record, &cert, &LIFETIME, now, 0.5));
    assert_eq!(until, by_lifetime(&cert, 0.5));
    assert_eq!(record.ari_next, None);
}

#[test]
fn without_ari_no_window_is_asked_for_and_orders_do_not_replace() {
    let now = start();
    let cert = held("c", now - 89 * DAY, 90 * DAY);
    let mut record = Record::default();
    assert_eq!(
        step(&mut record, &cert, &LIFETIME, now, 0.0),
        Action::Order { replaces: false }
    );
}

#[test]
fn a_window_the_last_certificate_was_renewed_in_is_stale_and_the_lifetime_decides() {
    let now = start();
    let old = held("old", now - 10 * DAY, 90 * DAY);
    let w = window(now - DAY, now + DAY);
    let mut record = Record::default();
    let _ = step(&mut record, &old, &ARI, now, 0.5);
    ari_fetched(&mut record, &old, Ok((w, DAY)), now, 0.5);
    assert_eq!(
        step(&mut record, &old, &ARI, now, 0.5),
        Action::Order { replaces: true }
    );
    issued(&mut record, now);
    let new = held("new", now, 90 * DAY);
    assert_eq!(step(&mut record, &new, &ARI, now, 0.5), Action::FetchAri);
    // The CA answers the new certificate with the old window.
    ari_fetched(&mut record, &new, Ok((w, DAY)), now, 0.5);
    assert_eq!(record.renew_reason, Some(RenewReason::Lifetime));
    let until = wait_until(step(&mut record, &new, &ARI, now, 0.5));
    assert_eq!(until, now + DAY, "the next ARI check, not an order");
}

// ===== failures =====

fn failure(kind: FailureKind, until: Option<SystemTime>) -> Failure<'static> {
    Failure {
        kind,
        error: "it failed",
        until,
    }
}

#[test]
fn a_failed_validation_waits_an_hour_and_is_kept_with_its_configuration() {
    let now = start();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Validation, None),
        CONFIG,
        now,
        0.5,
    );
    assert_eq!(
        next(&mut record, None, false, &LIFETIME, now, 0.5),
        Action::Backoff {
            until: now + REFUSED_BACKOFF
        }
    );
    assert_eq!(record.refusals, vec![to_unix(now)]);
}

#[test]
fn a_failure_never_waits_past_a_quarter_of_what_is_left_of_a_held_certificate() {
    let now = start();
    // A 300-second certificate at half its life: a failed validation waits a minute, not an
    // hour; a 6-day one keeps the hour.
    for (lifetime, wait) in [(Duration::from_secs(300), 60), (6 * DAY, 3600)] {
        let cert = held("c", now - lifetime / 2, lifetime);
        let mut record = Record::default();
        let _ = step(&mut record, &cert, &LIFETIME, now, 0.0);
        failed(
            &mut record,
            failure(FailureKind::Validation, None),
            CONFIG,
            now,
            0.0,
        );
        assert_eq!(record.retry_at, Some(to_unix(now) + wait), "{lifetime:?}");
    }
    // 40 minutes left: transient failures wait at most 10 minutes.
    let cert = held(
        "c",
        now - 20 * Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let mut record = Record::default();
    let _ = step(&mut record, &cert, &LIFETIME, now, 0.0);
    for _ in 0..8 {
        failed(
            &mut record,
            failure(FailureKind::Transient, None),
            CONFIG,
            now,
            0.0,
        );
    }
    assert_eq!(record.retry_at, Some(to_unix(now) + 600));
    // The CA's rate limit stands, whatever is left.
    failed(
        &mut record,
        failure(FailureKind::RateLimited, Some(now + DAY)),
        CONFIG,
        now,
        0.0,
    );
    assert_eq!(record.retry_at, Some(to_unix(now + DAY)));
}

#[test]
fn a_changed_configuration_tries_a_failed_name_at_once() {
    let now = start();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Validation, None),
        CONFIG,
        now,
        0.5,
    );
    let fixed = Settings {
        config: "a.example.com|tls-alpn-01|0.0.0.0:8443|https://ca.example/dir",
        ari: false,
    };
    assert_eq!(
        next(&mut record, None, false, &fixed, now, 0.5),
        Action::Order { replaces: false }
    );
    assert_eq!(record.failures, 0);
    assert!(record.last_error.is_none());
}

#[test]
fn a_rejected_identifier_gives_up_until_the_configuration_changes() {
    let now = start();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Identifier, None),
        CONFIG,
        now,
        0.5,
    );
    assert_eq!(
        next(&mut record, None, false, &LIFETIME, now + 365 * DAY, 0.5),
        Action::GiveUp
    );
    let other = Settings {
        config: "other",
        ari: false,
    };
    assert_eq!(
        next(&mut record, None, false, &other, now, 0.5),
        Action::Order { replaces: false }
    );
}

#[test]
fn a_rate_limit_waits_for_the_cas_time_and_the_budget_for_its_refill() {
    let now = start();
    for kind in [FailureKind::RateLimited, FailureKind::Budget] {
        let mut record = Record::default();
        failed(
            &mut record,
            failure(kind, Some(now + 3 * DAY)),
            CONFIG,
            now,
            0.5,
        );
        assert_eq!(
            next(&mut record, None, false, &LIFETIME, now, 0.5),
            Action::Backoff {
                until: now + 3 * DAY
            },
            "{kind:?}"
        );
        assert_eq!(
            next(&mut record, None, false, &LIFETIME, now + 3 * DAY, 0.5),
            Action::Order { replaces: false }
        );
    }
    // A rate limit without a time waits an hour.
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::RateLimited, None),
        CONFIG,
        now,
        0.5,
    );
    assert_eq!(record.retry_at, Some(to_unix(now + REFUSED_BACKOFF)));
}

#[test]
fn transient_failures_and_bad_certificates_back_off_from_a_minute_to_a_day() {
    let now = start();
    for kind in [FailureKind::Transient, FailureKind::BadCertificate] {
        let mut record = Record::default();
        let mut waits = Vec::new();
        for _ in 0..13 {
            failed(&mut record, failure(kind, None), CONFIG, now, 0.0);
            waits.push(record.retry_at.unwrap() - to_unix(now));
        }
        assert_eq!(&waits[..4], &[60, 120, 240, 480], "{kind:?}");
        assert_eq!(waits[12], 86_400, "{kind:?}");
    }
}

#[test]
fn backoff_is_jittered_down_by_at_most_a_tenth() {
    for (failures, base) in [(1, 60u64), (2, 120), (12, 86_400), (40, 86_400)] {
        let base = Duration::from_secs(base);
        assert_eq!(backoff(failures, 0.0), base);
        let low = backoff(failures, 0.999_999);
        assert!(low < base && low >= base - base / 10, "{failures}: {low:?}");
    }
}

#[test]
fn an_order_in_flight_is_resumed_not_placed_again_unless_it_waits() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    assert_eq!(
        next(&mut record, Some(&cert), true, &LIFETIME, now, 0.5),
        Action::Resume
    );
    failed(
        &mut record,
        failure(FailureKind::Transient, None),
        CONFIG,
        now,
        0.0,
    );
    assert_eq!(
        next(&mut record, Some(&cert), true, &LIFETIME, now, 0.5),
        Action::Backoff {
            until: now + Duration::from_secs(60)
        }
    );
    assert_eq!(
        next(
            &mut record,
            Some(&cert),
            true,
            &LIFETIME,
            now + Duration::from_secs(60),
            0.5
        ),
        Action::Resume
    );
}

#[test]
fn an_issued_certificate_clears_failures_but_not_the_hours_refusals() {
    let now = start();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Validation, None),
        CONFIG,
        now,
        0.5,
    );
    issued(&mut record, now + REFUSED_BACKOFF);
    assert_eq!(record.failures, 0);
    assert!(record.retry_at.is_none() && record.last_error.is_none());
    assert_eq!(record.refusals.len(), 1);
}

// ===== retries asked for =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_asked_for_clears_a_failed_validation_a_minute_after_the_attempt() {
    let clock = clock();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Validation, None),
        CONFIG,
        clock.now(),
        0.5,
    );
    // Too soon: moved to a minute after the attempt, not an hour.
    let until =
        retry_now(&mut record, clock.now() + Duration::from_secs(10)).expect_err("too soon");
    assert_eq!(until, clock.now() + RETRY_NOW_MIN);
    assert_eq!(
        next(&mut record, None, false, &LIFETIME, clock.now(), 0.5),
        Action::Backoff {
            until: clock.now() + RETRY_NOW_MIN
        }
    );
    clock.step(RETRY_NOW_MIN);
    retry_now(&mut record, clock.now()).expect("a minute later");
    assert_eq!(
        next(&mut record, None, false, &LIFETIME, clock.now(), 0.5),
        Action::Order { replaces: false }
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_asked_for_respects_the_cas_failed_validations_per_hour() {
    let clock = clock();
    let mut record = Record::default();
    let first = clock.now();
    for _ in 0..REFUSALS_PER_HOUR {
        failed(
            &mut record,
            failure(FailureKind::Validation, None),
            CONFIG,
            clock.now(),
            0.5,
        );
        clock.step(Duration::from_secs(120));
        let _ = retry_now(&mut record, clock.now());
    }
    let until = retry_now(&mut record, clock.now()).expect_err("five in the hour");
    assert_eq!(until, first + Duration::from_secs(3600));
}

#[test]
fn a_retry_asked_for_never_comes_before_a_rate_limit_and_revives_a_given_up_name() {
    let now = start();
    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::RateLimited, Some(now + DAY)),
        CONFIG,
        now,
        0.5,
    );
    assert_eq!(
        retry_now(&mut record, now + 3600 * Duration::from_secs(1)),
        Err(now + DAY)
    );
    assert_eq!(record.retry_at, Some(to_unix(now + DAY)));

    let mut record = Record::default();
    failed(
        &mut record,
        failure(FailureKind::Identifier, None),
        CONFIG,
        now,
        0.5,
    );
    retry_now(&mut record, now + RETRY_NOW_MIN).expect("after a minute");
    assert_eq!(
        next(
            &mut record,
            None,
            false,
            &LIFETIME,
            now + RETRY_NOW_MIN,
            0.5
        ),
        Action::Order { replaces: false }
    );
}

#[test]
fn a_retry_asked_for_a_name_not_waiting_changes_nothing() {
    let now = start();
    let cert = held("c", now, 90 * DAY);
    let mut record = Record::default();
    let before = step(&mut record, &cert, &LIFETIME, now, 0.5);
    let kept = record.clone();
    retry_now(&mut record, now).expect("nothing to wait for");
    assert_eq!(record, kept);
    assert_eq!(step(&mut record, &cert, &LIFETIME, now, 0.5), before);
}

// ===== the stagger =====

#[test]
fn the_stagger_spaces_the_orders_at_start_and_saturates() {
    let now = start();
    let stagger = Duration::from_millis(200);
    let times: Vec<_> = (0..4).map(|i| staggered(now, stagger, i)).collect();
    assert_eq!(times[0], now);
    assert_eq!(times[3], now + Duration::from_millis(600));
    assert_eq!(staggered(now, Duration::MAX, 3), latest());
}

/// A profile changes the lifetime the CA issues (Let's Encrypt's `classic` 90 days, `shortlived`
/// about 6): the plan follows the certificate held, so after a change of profile the next
/// certificate renews by its own lifetime, half of 6 days, not by the 90 days before it.
#[test]
fn a_change_of_profile_renews_by_the_new_certificates_lifetime() {
    let now = start();
    let classic = held("classic", now, 90 * DAY);
    let mut record = Record::default();
    let renew = wait_until(step(&mut record, &classic, &LIFETIME, now, 0.0));
    assert_eq!(renew, by_lifetime(&classic, 0.0));
    // Renewed under shortlived: 6 days, renewed with half of it left.
    issued(&mut record, renew);
    let shortlived = held("shortlived", renew, 6 * DAY);
    let next_renewal = wait_until(step(&mut record, &shortlived, &LIFETIME, renew, 0.0));
    assert_eq!(next_renewal, renew + 3 * DAY);
    assert!(
        next_renewal < renew + (90 * DAY) / 3,
        "not the classic rule"
    );
}
