//! No handshake fails while the files are swapped many times under concurrent handshakes.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{Harness, Mode, write_kube};
use tls_reload::Reloader;
use tls_test::TestCa;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_handshake_fails_during_many_swaps() {
    const SWAPS: usize = 60;
    const CLIENTS: usize = 4;
    let ca = TestCa::new("concurrency");
    let certs: Vec<_> = (0..4).map(|_| ca.leaf(&["localhost"])).collect();
    let known: HashSet<String> = certs.iter().map(|c| c.fingerprint.clone()).collect();
    let h = Arc::new(Harness::kube(&certs[0], Mode::Notify).await);

    let stop = Arc::new(AtomicBool::new(false));
    let handshakes = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (h, stop, handshakes) = (h.clone(), stop.clone(), handshakes.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            // Bounded: stops when told to, or after a generous number of handshakes.
            for _ in 0..100_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let served = tls_test::probe(h.server.addr(), "localhost").await;
                handshakes.fetch_add(1, Ordering::Relaxed);
                seen.push(served.map(|s| s.fingerprint).map_err(|e| e.to_string()));
            }
            seen
        }));
    }

    for i in 1..=SWAPS {
        write_kube(&h.kube, &certs[i % certs.len()]);
        // Let some handshakes and reloads happen between swaps (load shaping, not synchronisation).
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let last = &certs[SWAPS % certs.len()];
    h.expect_served(last).await;
    stop.store(true, Ordering::Relaxed);

    let mut served = HashSet::new();
    for client in clients {
        for result in client.await.unwrap() {
            let fingerprint = result.expect("every handshake succeeds");
            assert!(
                known.contains(&fingerprint),
                "served an unknown certificate"
            );
            served.insert(fingerprint);
        }
    }
    assert!(handshakes.load(Ordering::Relaxed) >= CLIENTS, "clients ran");
    assert!(
        served.len() >= 2,
        "handshakes saw rotations: {}",
        served.len()
    );
    assert!(h.status().last_error.is_none());
}

/// The resolver's per-thread cache never serves a certificate older than the last one installed
/// before the call, on the installing thread or any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_thread_sees_each_rotation_at_once() {
    let certs: Vec<_> = (0..20)
        .map(|i| TestCa::new(&format!("cache {i}")).leaf(&["localhost"]))
        .collect();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(rx)
        .unwrap();
    let resolver = reloader.resolver();
    let leaf =
        |key: &rustls::sign::CertifiedKey| tls_test::fingerprint(key.end_entity_cert().unwrap());
    for cert in &certs {
        tx.unbounded_send(Ok(common::bundle(cert))).unwrap();
        tls_test::wait_for(reloader.status(), "installed", |s| {
            common::installed(s) == Some(cert.fingerprint.as_str())
        })
        .await;
        // This thread, twice (the second from its cache), and a fresh thread.
        assert_eq!(leaf(&resolver.current().unwrap()), cert.fingerprint);
        assert_eq!(leaf(&resolver.current().unwrap()), cert.fingerprint);
        let other = resolver.clone();
        let seen = std::thread::spawn(move || leaf(&other.current().unwrap()))
            .join()
            .unwrap();
        assert_eq!(seen, cert.fingerprint);
    }
}
