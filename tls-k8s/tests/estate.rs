//! An estate of 50,000 labelled Secrets through one watch: a relist (the watch's history
//! compacted, so resuming answers 410 Gone and the watcher lists again) keeps every route that
//! did not change, and serving never has a gap.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tls_k8s::SecretsSource;
use tls_test::{KubeApi, TestCa, TestServer};

const SECRETS: usize = 50_000;

fn host(i: usize) -> String {
    format!("host-{i}.estate.test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_of_50000_secrets_keeps_every_unchanged_route_and_serving_never_gaps() {
    let api = KubeApi::start().await;
    let ca = TestCa::new("estate");
    // Made on every core: 50,000 certificates are most of this test's time in a debug build.
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let certs: Vec<tls_test::TestCert> = std::thread::scope(|scope| {
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                let ca = &ca;
                scope.spawn(move || {
                    (t..SECRETS)
                        .step_by(threads)
                        .map(|i| (i, ca.leaf(&[&host(i)])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, tls_test::TestCert)> =
            parts.into_iter().flat_map(|p| p.join().unwrap()).collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, c)| c).collect()
    });
    let mut fingerprints = Vec::with_capacity(SECRETS);
    for (i, cert) in certs.into_iter().enumerate() {
        let name = format!("estate-{i}");
        api.put_secret(
            "default",
            &name,
            &[
                ("tls.crt", cert.cert_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        );
        api.set_label("secrets", "default", &name, "app", "estate");
        fingerprints.push(cert.fingerprint);
    }
    // The source's own port into the emulator, so its traffic can be held at the relist.
    let endpoint = api.endpoint().await;
    let source = SecretsSource::builder(common::client_at(&endpoint.url()), "default")
        .selector("app=estate")
        .build();
    let reloader = common::routes_reloader(source);
    reloader
        .ready_timeout(Duration::from_secs(600))
        .await
        .expect("the whole list in");
    let status = reloader.status().borrow().clone();
    assert_eq!(status.routes.len(), SECRETS);
    assert!(status.routes.values().all(|r| r.generation == 1));
    let server = TestServer::start(reloader.resolver()).await;
    let addr = server.addr();

    // Names across the whole estate, probed without pause through the relist.
    let sample: Vec<usize> = (0..64).map(|k| (k * 7919 + 11) % SECRETS).collect();
    let changed = SECRETS / 2 + 1;
    assert!(!sample.contains(&changed));
    let (stop, probes, wrong) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let prober = {
        let expected: Vec<(String, String)> = sample
            .iter()
            .map(|i| (host(*i), fingerprints[*i].clone()))
            .collect();
        let (stop, probes, wrong) = (stop.clone(), probes.clone(), wrong.clone());
        tokio::spawn(async move {
            let mut k = 0;
            while !stop.load(Ordering::SeqCst) {
                let (name, fingerprint) = &expected[k % expected.len()];
                k += 1;
                let got = tls_test::served_as(addr, name).await;
                if got.as_ref().ok() != Some(fingerprint) {
                    wrong.fetch_add(1, Ordering::SeqCst);
                    eprintln!("{name}: {got:?}");
                }
                probes.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    // One Secret rotated while the watch is away, its event compacted: only a relist brings it.
    // The source's traffic is held meanwhile, so it cannot watch again before the compaction.
    endpoint.pause();
    api.close_watches();
    let rotated = ca.leaf(&[&host(changed)]);
    api.put_secret(
        "default",
        &format!("estate-{changed}"),
        &[
            ("tls.crt", rotated.cert_pem.as_bytes()),
            ("tls.key", rotated.key_pem.as_bytes()),
        ],
    );
    api.compact();
    endpoint.resume();
    let label = format!("default/estate-{changed}");
    let status = tls_test::wait_for(reloader.status(), "the relist's rotation", |s| {
        s.routes[label.as_str()]
            .current
            .as_ref()
            .map(|c| c.fingerprint_sha256.as_str())
            == Some(rotated.fingerprint.as_str())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    prober.await.unwrap();
    assert!(
        api.answered_gone() >= 1,
        "the watch was answered 410 and listed again"
    );
    assert!(probes.load(Ordering::SeqCst) > 0);
    assert_eq!(
        wrong.load(Ordering::SeqCst),
        0,
        "a name served wrong or refused"
    );
    assert_eq!(status.routes.len(), SECRETS);
    let reinstalled: Vec<&Arc<str>> = status
        .routes
        .iter()
        .filter(|(key, r)| ***key != *label && r.generation != 1)
        .map(|(key, _)| key)
        .collect();
    assert!(
        reinstalled.is_empty(),
        "{} routes reinstalled",
        reinstalled.len()
    );
    assert_eq!(status.routes[label.as_str()].generation, 2);
    assert_eq!(
        tls_test::served_as(addr, &host(changed)).await.unwrap(),
        rotated.fingerprint
    );
}
