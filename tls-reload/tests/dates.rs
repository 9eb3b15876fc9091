//! Every date a certificate can carry: valid until 9999 (RFC 5280's "no well-defined
//! expiration"), from 1950, not valid before the year 9999, for thousands of years. Each once
//! panicked the reload task (tokio-util's `DelayQueue` refuses deadlines past about 795 days);
//! now each is served or refused like any other certificate, and rotation goes on after it.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use tls_reload::{ClientAuth, Error, Reloader, Status};
use tls_source::clock::SteppedClock;
use tls_test::{TestCa, new_year};

use common::{Harness, Mode, installed, write_kube};

const DAY: Duration = Duration::from_secs(86_400);

/// 9999-12-31T23:59:59Z.
fn end_of_time() -> SystemTime {
    tls_source::clock::latest()
}

fn running_and_rotating(status: &Status) {
    assert!(
        status.running,
        "the reload task is still running: {status:#?}"
    );
    assert!(status.ended.is_none(), "{status:#?}");
}

#[tokio::test]
async fn a_certificate_valid_until_9999_is_served_not_expiring_and_rotated_after() {
    let ca = TestCa::new("dates");
    let first = ca.leaf(&["localhost"]);
    let h = Harness::kube(&first, Mode::Notify).await;

    let forever = ca.leaf_valid(&["localhost"], SystemTime::now() - DAY, end_of_time());
    write_kube(&h.kube, &forever);
    h.expect_served(&forever).await;
    let status = h.status();
    running_and_rotating(&status);
    assert!(!status.expiring && !status.expired, "{status:#?}");
    assert_eq!(status.current.as_ref().unwrap().not_after, end_of_time());

    // The next rotation after it is picked up: the task did not stop.
    let next = ca.leaf(&["localhost"]);
    write_kube(&h.kube, &next);
    h.expect_served(&next).await;
    running_and_rotating(&h.status());
}

/// The widest validity there is, installed on the file watcher's thread (the inline path): its
/// expiry timers go to the task, which arms them clamped and keeps rotating.
#[tokio::test]
async fn a_certificate_valid_from_1950_to_9999_is_served_and_rotated_after() {
    let ca = TestCa::new("dates");
    let first = ca.leaf(&["localhost"]);
    let h = Harness::kube(&first, Mode::Notify).await;

    let widest = ca.leaf_valid(&["localhost"], new_year(1950), end_of_time());
    write_kube(&h.kube, &widest);
    h.expect_served(&widest).await;
    let status = h.status();
    running_and_rotating(&status);
    assert!(!status.expiring && !status.expired, "{status:#?}");
    let current = status.current.as_ref().unwrap();
    assert_eq!(
        (current.not_before, current.not_after),
        (new_year(1950), end_of_time())
    );

    let next = ca.leaf(&["localhost"]);
    write_kube(&h.kube, &next);
    h.expect_served(&next).await;
    running_and_rotating(&h.status());
    assert_eq!(installed(&h.status()), Some(next.fingerprint.as_str()));
}

#[tokio::test]
async fn a_certificate_from_1950_to_2049_is_served_with_its_dates() {
    let ca = TestCa::new("dates");
    let first = ca.leaf(&["localhost"]);
    let h = Harness::kube(&first, Mode::Notify).await;

    let old = ca.leaf_valid(&["localhost"], new_year(1950), new_year(2049));
    write_kube(&h.kube, &old);
    h.expect_served(&old).await;
    let status = h.status();
    running_and_rotating(&status);
    let current = status.current.as_ref().unwrap();
    assert_eq!(current.not_before, new_year(1950));
    assert_eq!(current.not_after, new_year(2049));
    assert_eq!(
        UNIX_EPOCH.duration_since(current.not_before).ok(),
        Some(Duration::from_secs(631_152_000)),
        "1950-01-01 is before the epoch"
    );

    let next = ca.leaf(&["localhost"]);
    write_kube(&h.kube, &next);
    h.expect_served(&next).await;
}

#[tokio::test]
async fn a_pair_not_valid_before_9999_is_refused_and_the_next_good_pair_served() {
    let ca = TestCa::new("dates");
    let first = ca.leaf(&["localhost"]);
    let h = Harness::kube(&first, Mode::Notify).await;

    let future = ca.leaf_valid(&["localhost"], new_year(9999), end_of_time());
    write_kube(&h.kube, &future);
    let status = h
        .expect_refused("is not valid before 9999-01-01T00:00:00Z", &first, 1)
        .await;
    running_and_rotating(&status);
    assert!(matches!(
        status.last_error.as_deref(),
        Some(Error::NotYetValid { .. })
    ));

    let next = ca.leaf(&["localhost"]);
    write_kube(&h.kube, &next);
    h.expect_served(&next).await;
    running_and_rotating(&h.status());
}

/// A far-off `notBefore` is tried again when it comes, however far: the retry timer is armed
/// at most a year ahead and armed again until it is due. Virtual time.
#[tokio::test(start_paused = true)]
async fn a_bundle_valid_in_1000_days_is_installed_in_1000_days() {
    let clock = std::sync::Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let now = tls_source::clock::Clock::now(&*clock);
    let ca = TestCa::new("dates");
    let first = ca.leaf(&["localhost"]);
    let later = ca.leaf_valid(&["localhost"], now + 1000 * DAY, now + 3000 * DAY);
    let (tx, reloader) = common::clocked(clock.clone(), &first);
    // Virtual bounds: they fire (and fail the test) instead of hanging if nothing happens.
    let within = |days: u64| Duration::from_secs(days * 86_400);
    tokio::time::timeout(within(1), reloader.ready())
        .await
        .unwrap()
        .unwrap();
    tx.unbounded_send(Ok(common::bundle(&later))).unwrap();
    let mut status = reloader.status();
    let refused = tokio::time::timeout(
        within(1),
        status.wait_for(|s| matches!(s.last_error.as_deref(), Some(Error::NotYetValid { .. }))),
    )
    .await
    .expect("refused at once")
    .unwrap()
    .clone();
    assert_eq!(installed(&refused), Some(first.fingerprint.as_str()));

    let status = tokio::time::timeout(
        within(1100),
        status.wait_for(|s| installed(s) == Some(later.fingerprint.as_str())),
    )
    .await
    .expect("installed once its notBefore came")
    .unwrap()
    .clone();
    let at = tls_source::clock::Clock::now(&*clock);
    let not_before = status.current.as_ref().unwrap().not_before;
    assert!(at >= not_before, "not before its notBefore");
    assert!(at < now + 1001 * DAY, "not much after it either");
    running_and_rotating(&status);
    assert!(!status.expiring);
}

/// A certificate valid for 1000 days enters its expiry-warning window a week before the end and
/// is reported expired after it, though both deadlines are past what one timer can hold.
#[tokio::test(start_paused = true)]
async fn the_expiry_of_a_certificate_valid_for_1000_days_is_reported() {
    let clock = std::sync::Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let now = tls_source::clock::Clock::now(&*clock);
    let ca = TestCa::new("dates");
    let long = ca.leaf_valid(&["localhost"], now - DAY, now + 1000 * DAY);
    let source =
        futures::stream::iter([Ok(common::bundle(&long))]).chain(futures::stream::pending());
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .clock(clock.clone())
        .spawn(source)
        .unwrap();
    let mut status = reloader.status();
    let within = |days: u64| Duration::from_secs(days * 86_400);
    tokio::time::timeout(within(1), reloader.ready())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.borrow().expiring);

    tokio::time::timeout(within(1100), status.wait_for(|s| s.expiring))
        .await
        .expect("the warning comes")
        .unwrap();
    let at = tls_source::clock::Clock::now(&*clock);
    let not_after = status.borrow().current.as_ref().unwrap().not_after;
    assert!(
        at >= not_after - 7 * DAY && at < not_after - 6 * DAY,
        "a week before the end"
    );
    assert!(!status.borrow().expired);

    let expired = tokio::time::timeout(within(100), status.wait_for(|s| s.expired))
        .await
        .expect("the expiry is reported")
        .unwrap()
        .clone();
    assert!(tls_source::clock::Clock::now(&*clock) > not_after);
    assert!(matches!(
        expired.last_error.as_deref(),
        Some(Error::ServedExpired { .. })
    ));
    running_and_rotating(&expired);
}

#[tokio::test]
async fn a_client_ca_overlap_of_duration_max_keeps_the_ca_until_9999() {
    let (old_ca, new_ca) = (TestCa::new("old client CA"), TestCa::new("new client CA"));
    let server = TestCa::new("server");
    let leaf = server.leaf(&["localhost"]);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(common::bundle_with_cas(&leaf, &[&old_ca])))
        .unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .client_auth(ClientAuth::from_bundle().overlap(Duration::MAX))
        .spawn(rx)
        .unwrap();
    common::patiently("ready", reloader.ready()).await.unwrap();
    let next = server.leaf(&["localhost"]);
    tx.unbounded_send(Ok(common::bundle_with_cas(&next, &[&new_ca])))
        .unwrap();
    let status = tls_test::wait_for(reloader.status(), "both CAs trusted", |s| {
        s.client_cas.len() == 2
    })
    .await;
    running_and_rotating(&status);
    let old = tls_test::fingerprint(&old_ca.cert_der());
    let leaving = status
        .client_cas
        .iter()
        .find(|ca| ca.fingerprint_sha256 == old)
        .unwrap();
    assert_eq!(leaving.leaves_at, Some(end_of_time()));
    assert_eq!(installed(&status), Some(next.fingerprint.as_str()));
}
