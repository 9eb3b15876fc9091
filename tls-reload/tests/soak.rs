//! A soak: 2,000 kubelet-style rotations of real files, about one in ten of them bad (garbage,
//! a mismatched pair, an expired certificate), while two clients make handshakes without pause.
//! No handshake may fail, every one must be served a certificate that was written as a valid
//! one (never a foreign, bad or half-written one), every good rotation is installed and every
//! bad one refused, and the process's memory stays flat.
//!
//! A few seconds by default; `TLS_ROTATION_SOAK_ROTATIONS=100000` for a long run. With
//! `--nocapture` it prints its figures.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tls_test::{KubeDir, PATIENCE, TestCa, TestCert, TestServer};

use common::{Mode, provider, source, write_kube};

/// Resident memory of this process, in KiB: `VmRSS` of `/proc/self/status`. Panics where it
/// cannot be read, so that the memory check can never pass for want of a reading.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status: the soak's memory check runs on Linux");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    assert!(kib > 0, "a resident set of {kib} KiB");
    kib
}

fn rotations() -> usize {
    std::env::var("TLS_ROTATION_SOAK_ROTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_rotations_with_bad_ones_under_handshakes() {
    let ca = TestCa::new("soak").intermediate("soak intermediate");
    let pool: Vec<TestCert> = (0..40).map(|_| ca.leaf(&["localhost"])).collect();
    let expired = ca.expired_leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write_kube(&kube, &pool[0]);
    // Every fingerprint written as valid, before it is written.
    let valid: Arc<Mutex<HashSet<String>>> =
        Arc::new(Mutex::new(HashSet::from([pool[0].fingerprint.clone()])));

    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(provider())
        .spawn(source(&kube, Mode::Notify))
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let handshakes = Arc::new(AtomicU64::new(0));
    // Two client threads, each with a runtime of its own, making handshakes without pause.
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, handshakes, valid) = (stop.clone(), handshakes.clone(), valid.clone());
            let addr = server.addr();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    while !stop.load(Ordering::Relaxed) {
                        let served = tls_test::probe(addr, "localhost")
                            .await
                            .unwrap_or_else(|e| panic!("a handshake failed: {e}"));
                        assert_eq!(served.chain.len(), 2, "the whole chain");
                        assert!(
                            valid.lock().unwrap().contains(&served.fingerprint),
                            "served {}, never written as valid",
                            served.fingerprint
                        );
                        handshakes.fetch_add(1, Ordering::Relaxed);
                    }
                });
            })
        })
        .collect();

    let total = rotations();
    let warm_up = total / 10;
    let mut status = reloader.status();
    let (mut good, mut bad, mut rss_after_warm_up) = (0u64, 0u64, 0);
    let started = Instant::now();
    let mut previous = 0;
    for i in 1..=total {
        if i == warm_up {
            rss_after_warm_up = rss_kib();
        }
        if i % 10 == 0 {
            // A bad update: refused, the current certificate keeps serving.
            let current = &pool[previous];
            match (i / 10) % 3 {
                0 => kube
                    .write(&[("tls.crt", b"garbage"), ("tls.key", b"garbage")])
                    .unwrap(),
                1 => write_kube(
                    &kube,
                    &current.with_key_of(&pool[(previous + 1) % pool.len()]),
                ),
                _ => write_kube(&kube, &expired),
            }
            tokio::time::timeout(PATIENCE, status.wait_for(|s| s.last_error.is_some()))
                .await
                .expect("the bad update is refused in time")
                .unwrap();
            bad += 1;
            continue;
        }
        let next = (previous + 1) % pool.len();
        let cert = &pool[next];
        valid.lock().unwrap().insert(cert.fingerprint.clone());
        let generation = status.borrow().generation;
        write_kube(&kube, cert);
        let installed = tokio::time::timeout(
            PATIENCE,
            status.wait_for(|s| {
                s.generation > generation
                    && s.current
                        .as_ref()
                        .is_some_and(|c| c.fingerprint_sha256 == cert.fingerprint)
            }),
        )
        .await
        .expect("the rotation is installed in time")
        .unwrap()
        .generation;
        assert_eq!(installed, generation + 1, "one install per rotation");
        previous = next;
        good += 1;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("no handshake failed");
    }
    let rss_end = rss_kib();
    let handshakes = handshakes.load(Ordering::Relaxed);
    println!(
        "soak: {good} rotations installed and {bad} bad updates refused in {elapsed:.1?}, \
         {handshakes} handshakes from 2 clients, none failed; RSS {rss_after_warm_up} KiB after \
         {warm_up} rotations, {rss_end} KiB at the end"
    );
    // What the reloader did, not what the loop counted: one install per good rotation (the
    // first certificate was generation 1), none for a bad update, and the last good one served.
    let end = reloader.status().borrow().clone();
    assert_eq!(end.generation, good + 1, "{good} rotations, {bad} refused");
    assert!(bad > 0 && good > bad, "both kinds of update were made");
    assert_eq!(
        tls_test::served(server.addr()).await,
        pool[previous].fingerprint,
        "the last good certificate is served"
    );
    assert!(handshakes > 0);
    // Flat: growth after the warm-up stays far below what keeping every rotation would cost
    // (each certificate with its key and status is a few KiB).
    let growth = rss_end.saturating_sub(rss_after_warm_up);
    assert!(
        growth < 8 * 1024,
        "memory grew {growth} KiB over {} rotations",
        total - warm_up
    );
}
