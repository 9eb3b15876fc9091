//! Short-lived leaves are renewed before they expire, with real handshakes watching: no failed
//! handshake, no expired leaf ever served; in CA mode a client that trusts only the CA verifies
//! every leaf.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::CertificateDer;
use tls_reload::Reloader;
use tls_selfsigned::SelfSigned;
use tls_source::clock::{Clock as _, SteppedClock};
use tls_test::{PATIENCE, TestServer};
use x509_parser::prelude::{FromDer as _, X509Certificate};

fn not_after(der: &[u8]) -> SystemTime {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    SystemTime::UNIX_EPOCH
        + Duration::from_secs(cert.validity().not_after.timestamp().try_into().unwrap())
}

async fn serve(generator: SelfSigned) -> (Reloader, TestServer) {
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .spawn(generator.into_source())
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    (reloader, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_second_leaves_are_replaced_before_they_expire() {
    let generator = SelfSigned::builder()
        .dns_name("localhost")
        .validity(Duration::from_secs(3))
        .build()
        .unwrap();
    let (reloader, server) = serve(generator).await;
    let mut seen = HashSet::new();
    let start = Instant::now();
    // Bounded: about 7.5 s of handshakes, long enough for three renewals.
    while start.elapsed() < Duration::from_millis(7500) {
        let served = tls_test::probe(server.addr(), "localhost")
            .await
            .expect("no failed handshake");
        let expires = not_after(&served.chain[0]);
        assert!(SystemTime::now() < expires, "an expired leaf was served");
        seen.insert(served.fingerprint);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.len() >= 3, "renewed repeatedly: {} leaves", seen.len());
    let status = reloader.status().borrow().clone();
    assert!(status.generation >= 3);
    assert!(status.last_error.is_none(), "{:?}", status.last_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_only_the_ca_verifies_every_leaf() {
    let generator = SelfSigned::builder()
        .dns_name("localhost")
        .validity(Duration::from_secs(3))
        .ca()
        .build()
        .unwrap();
    let ca_pem = generator.ca_pem().unwrap().unwrap();
    let ca = tls_source::Decoder::new()
        .certificates("ca", ca_pem.as_bytes())
        .unwrap()
        .remove(0);
    let roots: Vec<CertificateDer<'static>> = vec![ca.clone()];
    let (reloader, server) = serve(generator).await;
    let mut seen = HashSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(5000) {
        let served = tls_test::probe_trusting(server.addr(), "localhost", &roots)
            .await
            .expect("verified by the CA, by name, in validity");
        seen.insert(served.fingerprint);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen.len() >= 2,
        "leaves rotated under one CA: {}",
        seen.len()
    );
    let info = reloader.status().borrow().current.clone().unwrap();
    assert_eq!(info.ca_fingerprints_sha256, [tls_test::fingerprint(&ca)]);
}

/// The wall clock jumps two months ahead (a laptop resumed, an NTP step): the renewal happens
/// within one nap of the jump, not after the two months of sleep a timer would have waited.
#[tokio::test(start_paused = true)]
async fn renewal_follows_a_clock_jump() {
    use futures::StreamExt as _;
    let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let mut source = SelfSigned::builder()
        .dns_name("localhost")
        .validity(Duration::from_secs(90 * 86400))
        .clock(clock.clone())
        .build()
        .unwrap()
        .into_source();
    let first = source.next().await.unwrap().unwrap();
    let jumped_at = tokio::time::Instant::now() + Duration::from_secs(10);
    let stepper = clock.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(jumped_at).await;
        stepper.step(Duration::from_secs(61 * 86400));
    });
    let second = source.next().await.unwrap().unwrap();
    let waited = tokio::time::Instant::now() - jumped_at;
    assert!(
        waited <= tls_selfsigned::MAX_NAP,
        "renewed {waited:?} after the jump"
    );
    assert_ne!(first.digest(), second.digest());
    // The new leaf is valid from the jumped clock's now.
    let expires = not_after(second.leaf().unwrap());
    assert!(expires > clock.now() + Duration::from_secs(89 * 86400));
}

/// A leaf never outlives its CA, so leaves signed by a CA that expires in seconds are due for
/// renewal the moment they are made. The source renews at most once per `MIN_RENEWAL_GAP`, not
/// in a tight loop (which once burned a core generating about 150 certificates a second).
#[tokio::test]
async fn a_leaf_due_at_birth_is_not_renewed_in_a_tight_loop() {
    use futures::StreamExt as _;
    let owner = SelfSigned::builder()
        .dns_name("localhost")
        .ca_validity(Duration::from_secs(4))
        .build()
        .unwrap();
    let ca = owner.ca_pair().unwrap().unwrap();
    let mut source = SelfSigned::builder()
        .dns_name("localhost")
        .validity(Duration::from_secs(86400))
        .ca_from_pem(ca.cert_pem, ca.key_pem)
        .build()
        .unwrap()
        .into_source();
    let start = Instant::now();
    let mut generated = 0;
    while start.elapsed() < Duration::from_millis(2500) {
        match tokio::time::timeout(Duration::from_millis(100), source.next()).await {
            Ok(Some(Ok(_))) => generated += 1,
            Ok(other) => panic!("{other:?}"),
            Err(_) => {}
        }
    }
    // One at start, then one a second (MIN_RENEWAL_GAP).
    assert!(
        (2..=4).contains(&generated),
        "{generated} certificates in 2.5 s: at most 4"
    );
}
