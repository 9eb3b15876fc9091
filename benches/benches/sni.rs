//! 8. SNI: 10,000 certificates in one resolver. Lookup time for an exact name, a wildcard and a
//!    miss that falls to the default, against a plain `HashMap<String, Arc<CertifiedKey>>`
//!    lookup in the same run; and, at 1,000, 10,000 and 50,000 routes, the time to apply one
//!    changed route (a rotation, same name: validate and store into the route's slot), one new
//!    route (validate, and its names edited into the SNI table) and one removed route.
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
    let runtime = benches::runtime(1);
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

    drop(fed);
    apply(c, &runtime);
}

/// Applying one change through the keyed source, until the status says it is in, at 1,000,
/// 10,000 and 50,000 routes: a change costs the same whatever the number of routes (the table
/// is edited one name at a time, not rebuilt).
fn apply(c: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let default = &certs(1)[0];
    let mut group = c.benchmark_group("sni_apply");
    for n in [1_000, 10_000, 50_000] {
        let fed = FedRoutes::start(runtime, default, sni_bundles(n * 9 / 10, n / 10));
        // Keys and names of their own: a new route, not a rotation of a listed one.
        let extra: Vec<(String, tls_source::CertBundle)> = (0..2)
            .map(|i| {
                (
                    format!("bench/extra-{i}"),
                    sni_bundle(&format!("extra{i}.example.com")),
                )
            })
            .collect();
        let key = "bench/route-432".to_owned();
        // The same name, new certificates: a rotation, which stores into the route's slot.
        let rotate = [
            sni_bundle("host432.example.com"),
            sni_bundle("host432.example.com"),
        ];
        let mut status = fed.reloader.status();
        let send = |key: &str, update: KeyedUpdate| {
            fed.tx
                .unbounded_send(Ok(Keyed {
                    key: key.to_owned(),
                    update,
                }))
                .unwrap();
        };
        // Counts across criterion's calls, so that each rotation differs from what is installed.
        let mut turn = 0usize;
        group.bench_function(format!("one changed route ({n} routes)"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    turn += 1;
                    let generation = status.borrow_and_update().routes[key.as_str()].generation;
                    let start = Instant::now();
                    send(&key, KeyedUpdate::Put(rotate[turn % 2].clone()));
                    runtime
                        .block_on(
                            status.wait_for(|s| s.routes[key.as_str()].generation > generation),
                        )
                        .unwrap();
                    total += start.elapsed();
                }
                total
            });
        });
        let added = |s: &tls_reload::Status, key: &str| {
            s.routes.get(key).is_some_and(|r| r.current.is_some())
        };
        for timed_add in [true, false] {
            let what = if timed_add { "new" } else { "removed" };
            group.bench_function(format!("one {what} route ({n} routes)"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        let (key, bundle) = &extra[(i % 2) as usize];
                        let start = Instant::now();
                        send(key, KeyedUpdate::Put(bundle.clone()));
                        runtime
                            .block_on(status.wait_for(|s| added(s, key)))
                            .unwrap();
                        if timed_add {
                            total += start.elapsed();
                        }
                        let start = Instant::now();
                        send(key, KeyedUpdate::Remove);
                        runtime
                            .block_on(status.wait_for(|s| !s.routes.contains_key(key.as_str())))
                            .unwrap();
                        if !timed_add {
                            total += start.elapsed();
                        }
                    }
                    total
                });
            });
        }
        // What a status reader holds the watch for: a copy of the whole status (serve's status
        // page takes one per request), and one route's status read in place.
        let reader = fed.reloader.status();
        group.bench_function(format!("status snapshot ({n} routes)"), |b| {
            b.iter(|| reader.borrow().clone());
        });
        group.bench_function(format!("one route's status ({n} routes)"), |b| {
            b.iter(|| reader.borrow().routes.get(key.as_str()).cloned());
        });
        assert_eq!(fed.reloader.resolver().route_names(), n);
    }
    group.finish();
}

criterion_group!(benches, sni);
criterion_main!(benches);
