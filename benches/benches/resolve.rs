//! The cost of `resolve()`, the only work rotation adds to a handshake, against cloning a static
//! `Arc<CertifiedKey>` (what a server without rotation does). Issue-level benches (swap latency,
//! handshakes, rotation-to-serve) are added beside this one.
//!
//! `cargo bench -p benches --bench resolve`

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use rustls::sign::CertifiedKey;
use tls_source::{Decoder, Origin};

fn resolve(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cert = tls_test::TestCa::new("bench").leaf(&["localhost"]);
    let bundle = Decoder::new()
        .bundle(
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
            None,
            Origin::Other("bench".into()),
        )
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let reloader = runtime.block_on(async {
        let source = futures::stream::iter(vec![Ok(bundle)]).chain(futures::stream::pending());
        let reloader = tls_reload::Reloader::builder()
            .crypto_provider(provider)
            .spawn(source)
            .unwrap();
        reloader.ready().await.unwrap();
        reloader
    });
    let resolver = reloader.resolver();
    let fixed: Arc<CertifiedKey> = resolver.current().unwrap();

    let mut group = c.benchmark_group("resolve");
    group.bench_function("static Arc clone (baseline)", |b| {
        b.iter(|| std::hint::black_box(Arc::clone(std::hint::black_box(&fixed))));
    });
    group.bench_function("CertResolver::current", |b| {
        b.iter(|| std::hint::black_box(resolver.current()));
    });
    group.finish();
}

use futures::StreamExt as _;

criterion_group!(benches, resolve);
criterion_main!(benches);
