//! Rotation-to-serve latency: after a kubelet-style `..data` swap, how long until a fresh TLS
//! handshake is served the new certificate. Notify fast path (poll off) and poll-only path
//! (poll every 100 ms, so the expected mean is about half the interval).
//!
//! `cargo bench -p benches --bench rotation`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tls_reload::Reloader;
use tls_source::FileSource;
use tls_test::{KubeDir, TestCa, TestCert, TestServer};

struct Setup {
    _dir: tempfile::TempDir,
    kube: KubeDir,
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

async fn setup(notify: bool) -> Setup {
    let ca = TestCa::new("rotation bench");
    let certs: Vec<_> = (0..8).map(|_| ca.leaf(&["localhost"])).collect();
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
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .spawn(source)
        .unwrap();
    reloader.ready().await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    Setup {
        _dir: dir,
        kube,
        server,
        _reloader: reloader,
        certs,
        next: 1,
    }
}

/// One rotation: swap, then handshake until the new certificate is served.
async fn rotate_once(s: &mut Setup) -> Duration {
    let cert = &s.certs[s.next % s.certs.len()];
    s.next += 1;
    write(&s.kube, cert);
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
    for (name, notify) in [("notify", true), ("poll_100ms", false)] {
        let mut setup = runtime.block_on(setup(notify));
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
