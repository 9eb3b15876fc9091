//! Rotation-to-serve latency: after a kubelet-style `..data` swap, how long until a fresh TLS
//! handshake is served the new certificate. Notify fast path (poll off), files rewritten in
//! place behind the links (notify, then the in-place quiet period), and the poll-only path (poll
//! every 100 ms). And for the Kubernetes Secret source: from the Secret update on the API
//! emulator to a handshake served the new certificate. Criterion reports means; the median and
//! p90 of the single rotations are printed at the end.
//!
//! `cargo bench -p benches --bench rotation`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tls_reload::Reloader;
use tls_source::FileSource;
use tls_test::{KubeDir, TestCa, TestCert, TestServer};

/// Where the certificate is written, and how.
enum Store {
    /// A kubelet-style directory, rotated by the `..data` swap.
    Files {
        _dir: tempfile::TempDir,
        kube: KubeDir,
    },
    /// The same directory, rotated by rewriting the files behind the links in place.
    InPlace {
        _dir: tempfile::TempDir,
        kube: KubeDir,
    },
    Secret(tls_test::KubeApi),
}

struct Setup {
    store: Store,
    server: TestServer,
    _reloader: Reloader,
    certs: Vec<TestCert>,
    next: usize,
}

fn write(kube: &KubeDir, cert: &TestCert) {
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .expect("write");
}

fn certs() -> Vec<TestCert> {
    let ca = TestCa::new("rotation bench");
    (0..8).map(|_| ca.leaf(&["localhost"])).collect()
}

async fn serve(
    source: impl tls_source::IntoCertSource,
    store: Store,
    certs: Vec<TestCert>,
) -> Setup {
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .spawn(source)
        .unwrap();
    reloader.ready().await.unwrap();
    Setup {
        store,
        server: TestServer::start(reloader.resolver()).await,
        _reloader: reloader,
        certs,
        next: 1,
    }
}

/// Files in a kubelet-style directory, watched (notify, poll at one hour) or polled (100 ms).
async fn setup(notify: bool) -> Setup {
    setup_files(notify, false).await
}

async fn setup_files(notify: bool, in_place: bool) -> Setup {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write(&kube, &certs[0]);
    let builder = FileSource::kubernetes_dir(kube.path());
    let source = if notify {
        builder.poll_interval(Duration::from_secs(3600)).build()
    } else {
        builder
            .notify(false)
            .poll_interval(Duration::from_millis(100))
            .build()
    };
    let store = if in_place {
        Store::InPlace { _dir: dir, kube }
    } else {
        Store::Files { _dir: dir, kube }
    };
    serve(source, store, certs).await
}

/// A Secret on the API emulator, watched by `SecretSource`.
async fn setup_secret() -> Setup {
    let certs = certs();
    let api = tls_test::KubeApi::start().await;
    put_secret(&api, &certs[0]);
    let client = benches::emulator_client(&api.url());
    let source = tls_k8s::SecretSource::builder(client, "default", "tls").build();
    serve(source, Store::Secret(api), certs).await
}

fn put_secret(api: &tls_test::KubeApi, cert: &TestCert) {
    api.put_secret(
        "default",
        "tls",
        &[
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
        ],
    );
}

/// One rotation: swap (files, or the Secret), then handshake until the new certificate is served.
async fn rotate_once(s: &mut Setup) -> Duration {
    let cert = &s.certs[s.next % s.certs.len()];
    s.next += 1;
    match &s.store {
        Store::Secret(api) => put_secret(api, cert),
        Store::Files { kube, .. } => write(kube, cert),
        Store::InPlace { kube, .. } => {
            let real = |name| std::fs::canonicalize(kube.file(name)).expect("resolves");
            tls_test::overwrite_in_place(&real("tls.key"), cert.key_pem.as_bytes()).unwrap();
            tls_test::overwrite_in_place(&real("tls.crt"), cert.chain_pem.as_bytes()).unwrap();
        }
    }
    let start = Instant::now();
    loop {
        let served = tls_test::probe(s.server.addr(), "localhost").await.unwrap();
        if served.fingerprint == cert.fingerprint {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rotation not served"
        );
    }
}

fn rotation(c: &mut Criterion) {
    let runtime = benches::runtime(2);
    let mut group = c.benchmark_group("rotation_to_serve");
    let mut spread = Vec::new();
    for name in [
        "notify",
        "in_place_write",
        "poll_100ms",
        "kubernetes_secret",
    ] {
        let mut setup = runtime.block_on(async {
            match name {
                "kubernetes_secret" => setup_secret().await,
                "in_place_write" => setup_files(true, true).await,
                other => setup(other == "notify").await,
            }
        });
        let fast = matches!(name, "notify" | "kubernetes_secret");
        group.sample_size(if fast { 50 } else { 10 });
        group.measurement_time(Duration::from_secs(if fast { 5 } else { 30 }));
        // Every rotation's own time, for the median and p90 criterion does not give.
        let mut each = Vec::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let one = rotate_once(&mut setup).await;
                        each.push(one);
                        total += one;
                    }
                    total
                })
            });
        });
        each.sort();
        spread.push((name, each));
    }
    group.finish();
    // A filter on the command line (`-- rotation_to_serve/notify`) leaves the others empty.
    for (name, each) in spread.into_iter().filter(|(_, each)| !each.is_empty()) {
        let at = |p: f64| each[((each.len() - 1) as f64 * p).round() as usize];
        println!(
            "rotation_to_serve/{name}: {} rotations, median {:?}, p90 {:?}",
            each.len(),
            at(0.5),
            at(0.9)
        );
    }
}

criterion_group!(benches, rotation);
criterion_main!(benches);
