//! 8. SNI: 10,000 certificates in one resolver. Lookup time for an exact name, a wildcard and a
//!    miss that falls to the default, against a plain `HashMap<String, Arc<CertifiedKey>>`
//!    lookup in the same run; and the time to apply one changed route (a rotation, same name:
//!    validate and store into the route's slot) and one new route (validate, and the SNI table of
//!    10,000 names rebuilt).
//!    Memory per certificate is measured by the `memory` binary.
//!
//! `cargo bench -p benches --bench sni`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{FedRoutes, certs, sni_bundle, sni_bundles};
use criterion::{Criterion, criterion_group, criterion_main};
use rustls::sign::CertifiedKey;
use tls_source::{Keyed, KeyedUpdate};

const EXACT: usize = 9_000;
const WILDCARD: usize = 1_000;

fn sni(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let default = &certs(1)[0];
    let routes = sni_bundles(EXACT, WILDCARD);
    let baseline: HashMap<String, Arc<CertifiedKey>> = routes
        .iter()
        .map(|(_, b)| {
            let validated =
                tls_reload::Validator::new(benches::provider(), tls_reload::Policy::default())
                    .validate(b)
                    .unwrap();
            (
                validated.info().dns_names[0].clone(),
                Arc::clone(validated.certified_key()),
            )
        })
        .collect();
    let fed = FedRoutes::start(&runtime, default, routes);
    let resolver = fed.reloader.resolver();

    let mut group = c.benchmark_group("sni_lookup");
    group.bench_function("HashMap<String, Arc> get + clone (baseline)", |b| {
        b.iter(|| baseline.get(black_box("host4321.example.com")).cloned());
    });
    group.bench_function("exact hit", |b| {
        b.iter(|| resolver.lookup(black_box(Some("host4321.example.com"))));
    });
    group.bench_function("wildcard hit", |b| {
        b.iter(|| resolver.lookup(black_box(Some("a.zone432.example.com"))));
    });
    group.bench_function("default (unknown name)", |b| {
        b.iter(|| resolver.lookup(black_box(Some("unknown.example.org"))));
    });
    group.bench_function("default (no SNI)", |b| {
        b.iter(|| resolver.lookup(black_box(None)));
    });
    group.finish();
    assert!(resolver.lookup(Some("host4321.example.com")).is_some());
    assert!(resolver.lookup(Some("a.zone432.example.com")).is_some());

    // Applying changes, through the keyed source: until the status says it is in.
    let extra = sni_bundles(2, 0);
    // The same name, new certificates: a rotation, which stores into the route's slot.
    let rotate = [
        sni_bundle("host4321.example.com"),
        sni_bundle("host4321.example.com"),
    ];
    let mut status = fed.reloader.status();
    let mut group = c.benchmark_group("sni_apply");
    // Counts across criterion's calls, so that each rotation differs from what is installed.
    let mut n = 0usize;
    group.bench_function("one changed route (10,000 routes)", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let key = "bench/route-4321".to_owned();
                let generation = status.borrow_and_update().routes[&key].generation;
                let start = Instant::now();
                fed.tx
                    .unbounded_send(Ok(Keyed {
                        key: key.clone(),
                        update: KeyedUpdate::Put(rotate[n % 2].clone()),
                    }))
                    .unwrap();
                runtime
                    .block_on(status.wait_for(|s| s.routes[&key].generation > generation))
                    .unwrap();
                total += start.elapsed();
            }
            total
        });
    });
    group.bench_function("one new route, table rebuilt (10,000 routes)", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let (key, bundle) = &extra[(i % 2) as usize];
                let start = Instant::now();
                fed.tx
                    .unbounded_send(Ok(Keyed {
                        key: key.clone(),
                        update: KeyedUpdate::Put(bundle.clone()),
                    }))
                    .unwrap();
                runtime
                    .block_on(
                        status.wait_for(|s| s.routes.get(key).is_some_and(|r| r.current.is_some())),
                    )
                    .unwrap();
                total += start.elapsed();
                // Out again, untimed, so that the next one is new.
                fed.tx
                    .unbounded_send(Ok(Keyed {
                        key: key.clone(),
                        update: KeyedUpdate::Remove,
                    }))
                    .unwrap();
                runtime
                    .block_on(status.wait_for(|s| !s.routes.contains_key(key)))
                    .unwrap();
            }
            total
        });
    });
    group.finish();
}

criterion_group!(benches, sni);
criterion_main!(benches);
