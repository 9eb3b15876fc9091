//! What the validator refuses and what the status says about time: chains that clients reject,
//! a replaced not-yet-valid pair that must never come back, a served certificate expiring.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{Harness, Mode, write_kube};
use tls_reload::{Policy, Purpose, Reloader, Roots, Validator};
use tls_test::{KubeDir, PATIENCE, TestCa, TestCert, TestServer};

const DAY: Duration = Duration::from_secs(86_400);

fn write_pem(h: &Harness, chain: &str, key: &str) {
    h.kube
        .write(&[("tls.crt", chain.as_bytes()), ("tls.key", key.as_bytes())])
        .unwrap();
}

/// `first` in a kubelet-style directory (in the returned temporary one), served by a reloader
/// with `policy` that is ready.
async fn kube_reloader(first: &TestCert, policy: Policy) -> (tempfile::TempDir, KubeDir, Reloader) {
    let dir = tempfile::tempdir().unwrap();
    let (kube, source) = common::kube_source(dir.path(), "tls", first);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .policy(policy)
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    (dir, kube, reloader)
}

/// Writes a bad chain and checks it is refused with an error containing `expected` while `good`
/// keeps serving.
async fn refused(h: &Harness, good: &TestCert, chain: &str, key: &str, expected: &str) {
    let generation = h.status().generation;
    write_pem(h, chain, key);
    h.expect_refused(expected, good, generation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_that_clients_refuse_are_refused_saying_why() {
    let root = TestCa::new("root");
    let intermediate = root.intermediate("intermediate");
    let good = intermediate.leaf(&["localhost"]);
    let h = Harness::kube(&good, Mode::Notify).await;

    // 400 certificates: far over the count limit (and over the 100 KiB OpenSSL accepts).
    let leaf = intermediate.leaf(&["localhost"]);
    let long = format!("{}{}", leaf.cert_pem, intermediate.cert_pem().repeat(399));
    refused(
        &h,
        &good,
        &long,
        &leaf.key_pem,
        "the chain holds 400 certificates, more than the limit of 10 (Policy::max_chain_len)",
    )
    .await;

    // In the wrong order: the root before the intermediate that issued the leaf.
    let wrong = format!(
        "{}{}{}",
        leaf.cert_pem,
        root.cert_pem(),
        intermediate.cert_pem()
    );
    refused(
        &h,
        &good,
        &wrong,
        &leaf.key_pem,
        "the chain is out of order: certificate 0 (CN=localhost, issued by CN=intermediate) is followed by CN=root",
    )
    .await;

    // The right order is accepted.
    let right = format!(
        "{}{}{}",
        leaf.cert_pem,
        intermediate.cert_pem(),
        root.cert_pem()
    );
    write_pem(&h, &right, &leaf.key_pem);
    h.expect_served(&leaf).await;
    assert!(h.status().last_error.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_over_the_byte_limit_is_refused_naming_the_limit() {
    let ca = TestCa::new("bytes");
    let good = ca.leaf(&["localhost"]);
    let (_dir, kube, reloader) = kube_reloader(
        &good,
        Policy::default().max_chain_len(1000).max_chain_bytes(4096),
    )
    .await;
    let leaf = ca.leaf(&["localhost"]);
    let big = format!("{}{}", leaf.cert_pem, ca.cert_pem().repeat(20));
    kube.write(&[
        ("tls.crt", big.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
    ])
    .unwrap();
    let status = tls_test::wait_for(reloader.status(), "the size error", |s| {
        s.last_error.is_some()
    })
    .await;
    let err = status.last_error.as_ref().unwrap().to_string();
    assert!(
        err.contains("more than the limit of 4096 bytes (Policy::max_chain_bytes"),
        "{err}"
    );
    assert_eq!(common::installed(&status), Some(good.fingerprint.as_str()));
}

/// A leaf for `localhost` whose validity starts in 2 seconds.
fn valid_in_2s(ca: &TestCa) -> TestCert {
    let now = SystemTime::now();
    ca.leaf_valid(
        &["localhost"],
        now + Duration::from_secs(2),
        now + Duration::from_secs(86400),
    )
}

/// A pair refused as not yet valid, then replaced by garbage before it became valid, is never
/// installed: the garbage cancelled its retry. Virtual time, stepped past the moment the
/// replaced pair would have become valid (the engine's unit tests cover the same rule by hand).
#[tokio::test(start_paused = true)]
async fn a_not_yet_valid_pair_replaced_by_garbage_never_comes_back() {
    use tls_source::clock::SteppedClock;
    let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let now = tls_source::clock::Clock::now(&*clock);
    let ca = TestCa::new("resurrection");
    let good = ca.leaf(&["localhost"]);
    let future = ca.leaf_valid(&["localhost"], now + Duration::from_secs(2), now + DAY);
    let (tx, reloader) = common::clocked(clock.clone(), &good);
    tokio::time::timeout(PATIENCE, reloader.ready())
        .await
        .unwrap()
        .unwrap();
    let error_says = |text: &'static str| {
        move |s: &tls_reload::Status| {
            s.last_error
                .as_ref()
                .is_some_and(|e| e.to_string().contains(text))
        }
    };

    tx.unbounded_send(Ok(common::bundle(&future))).unwrap();
    tls_test::wait_for(
        reloader.status(),
        "rejected as not yet valid",
        error_says("not valid before"),
    )
    .await;
    // What the file source reports for garbage on disk.
    let garbage = tls_source::Error::Malformed {
        input: "tls.crt".into(),
        reason: "no PEM certificate".into(),
    };
    tx.unbounded_send(Err(garbage)).unwrap();
    tls_test::wait_for(
        reloader.status(),
        "the garbage reported",
        error_says("tls.crt"),
    )
    .await;

    // Past the moment the replaced pair would have become valid.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(tls_source::clock::Clock::now(&*clock) > now + Duration::from_secs(3));
    let status = reloader.status().borrow().clone();
    assert_eq!(common::installed(&status), Some(good.fingerprint.as_str()));
    assert_eq!(
        status.generation, 1,
        "the replaced pair was never installed"
    );
    assert!(
        status
            .last_error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("tls.crt")),
        "the garbage is still what the status reports: {:?}",
        status.last_error
    );
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_yet_valid_pair_left_alone_is_installed_when_it_becomes_valid() {
    let ca = TestCa::new("retry");
    let good = ca.leaf(&["localhost"]);
    let h = Harness::kube(&good, Mode::Notify).await;
    let future = valid_in_2s(&ca);
    write_kube(&h.kube, &future);
    h.expect_served(&future).await;
    assert!(h.status().last_error.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_certificate_expiring_is_visible_in_the_status() {
    let ca = TestCa::new("expiry");
    let now = SystemTime::now();
    let short = ca.leaf_valid(
        &["localhost"],
        now - Duration::from_secs(3600),
        now + Duration::from_secs(4),
    );
    let (_dir, kube, reloader) = kube_reloader(
        &short,
        Policy::default().expiry_warning(Duration::from_secs(2)),
    )
    .await;
    let status = reloader.status().borrow().clone();
    assert!(!status.expiring && !status.expired, "{status:?}");
    assert!(status.last_error.is_none());

    let status = tls_test::wait_for(reloader.status(), "expiring", |s| s.expiring).await;
    assert!(!status.expired);
    let status = tls_test::wait_for(reloader.status(), "expired", |s| s.expired).await;
    let err = status
        .last_error
        .as_ref()
        .expect("an expired certificate is an error")
        .to_string();
    assert!(err.contains("the served certificate expired at"), "{err}");
    // Still served: there is nothing better.
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(tls_test::served(server.addr()).await, short.fingerprint);

    // A valid replacement clears it.
    let fresh = ca.leaf(&["localhost"]);
    write_kube(&kube, &fresh);
    let status = tls_test::wait_for(reloader.status(), "replaced", |s| {
        common::installed(s) == Some(fresh.fingerprint.as_str())
    })
    .await;
    assert!(
        !status.expired && !status.expiring && status.last_error.is_none(),
        "{status:?}"
    );
}

/// A rotation is installed on the file watcher's thread (the inline path), which leaves the
/// new certificate's expiry timers for the reload task without waking it: the source's item
/// that follows hands them over. A replacement that expires sooner than the certificate it
/// replaces must still be reported expiring, then expired, on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_to_a_certificate_that_expires_sooner_reports_its_expiry() {
    let ca = TestCa::new("expiry");
    let long = ca.leaf(&["localhost"]);
    let (_dir, kube, reloader) = kube_reloader(
        &long,
        Policy::default().expiry_warning(Duration::from_secs(2)),
    )
    .await;

    let now = SystemTime::now();
    let short = ca.leaf_valid(
        &["localhost"],
        now - Duration::from_secs(3600),
        now + Duration::from_secs(5),
    );
    write_kube(&kube, &short);
    let status = tls_test::wait_for(reloader.status(), "the replacement installed", |s| {
        common::installed(s) == Some(short.fingerprint.as_str())
    })
    .await;
    assert!(!status.expired, "{status:?}");
    let expiring = tls_test::wait_for(reloader.status(), "expiring", |s| s.expiring).await;
    assert_eq!(
        common::installed(&expiring),
        Some(short.fingerprint.as_str())
    );
    let status = tls_test::wait_for(reloader.status(), "expired", |s| s.expired).await;
    let not_after = status.current.as_ref().unwrap().not_after;
    assert!(
        SystemTime::now() >= not_after,
        "reported expired before its notAfter: {status:?}"
    );
    let err = status.last_error.as_ref().unwrap().to_string();
    assert!(err.contains("the served certificate expired at"), "{err}");
}

#[test]
fn the_validator_checks_purpose_and_roots_on_its_own() {
    let ca = TestCa::new("validator");
    let other = TestCa::new("other");
    let leaf = ca.leaf(&["api.example.com"]);
    let bundle = common::bundle(&leaf);
    let provider = common::provider();

    let client = Validator::new(
        provider.clone(),
        Policy::default().purpose(Purpose::ClientAuth),
    );
    let err = client.validate(&bundle).unwrap_err().to_string();
    assert!(
        err.contains("extended key usage does not allow TLS client authentication"),
        "{err}"
    );

    let trusting = |ca: &TestCa| {
        Validator::new(
            provider.clone(),
            Policy::default().verify_against(Roots::Given(Arc::from(vec![ca.cert_der()]))),
        )
    };
    let validated = trusting(&ca).validate(&bundle).unwrap();
    assert_eq!(validated.info().dns_names, ["api.example.com"]);
    assert_eq!(validated.digest(), bundle.digest());
    let err = trusting(&other).validate(&bundle).unwrap_err().to_string();
    assert!(
        err.contains("does not verify against the trusted roots"),
        "{err}"
    );

    let bundle_ca = Validator::new(
        provider.clone(),
        Policy::default().verify_against(Roots::BundleCa),
    );
    let err = bundle_ca.validate(&bundle).unwrap_err().to_string();
    assert!(err.contains("no CA certificates (ca.crt)"), "{err}");
    let with_ca = bundle.clone().with_ca(vec![ca.cert_der()]);
    assert_eq!(bundle_ca.validate(&with_ca).unwrap().ca().len(), 1);

    let err = Validator::new(provider, Policy::default().require_name("www.example.com"))
        .validate(&bundle)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not cover www.example.com (it is for api.example.com)"),
        "{err}"
    );
}
