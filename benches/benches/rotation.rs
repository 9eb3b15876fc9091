//! Rotation-to-serve latency: after a kubelet-style `..data` swap, how long until a fresh TLS
//! handshake is served the new certificate. Notify fast path (poll off) and poll-only path
//! (poll every 100 ms). And for the Kubernetes Secret source: from the Secret update on the API
//! emulator to a handshake served the new certificate.
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
    Files {
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
    source: impl tls_source::CertSource + 'static,
    store: Store,
    certs: Vec<TestCert>,
) -> Setup {
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
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
    serve(source, Store::Files { _dir: dir, kube }, certs).await
}

/// A Secret on the API emulator, watched by `SecretSource`.
async fn setup_secret() -> Setup {
    let certs = certs();
    let api = tls_test::KubeApi::start().await;
    put_secret(&api, &certs[0]);
    let mut config = kube::Config::new(api.url().parse().unwrap());
    config.default_namespace = "default".into();
    let client = kube::Client::try_from(config).unwrap();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("rotation_to_serve");
    for name in ["notify", "poll_100ms", "kubernetes_secret"] {
        let notify = name != "poll_100ms";
        let mut setup = runtime.block_on(async {
            if name == "kubernetes_secret" {
                setup_secret().await
            } else {
                setup(notify).await
            }
        });
        group.sample_size(if notify { 50 } else { 20 });
        group.measurement_time(Duration::from_secs(if notify { 5 } else { 30 }));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += rotate_once(&mut setup).await;
                    }
                    total
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, rotation);
criterion_main!(benches);
