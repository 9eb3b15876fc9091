//! 2. Swap: the cost of a store with 0, 1 and 2 reader threads hammering, and the time until a
//!    reader sees it.
//!
//! The store that `CertResolver` performs is an `ArcSwapOption` store, which only the reloader
//! makes (after validation; it is not public API). So the first two groups measure that primitive
//! on the same shape of value; the last measures the public path end to end: a bundle handed to
//! a `Reloader` until `resolve()` returns it (parsing and key checks included).
//!
//! `cargo bench -p benches --bench swap`

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use benches::{Fed, bundle, certified, certs};
use criterion::{Criterion, criterion_group, criterion_main};
use rustls::sign::CertifiedKey;

fn readers(
    slot: &Arc<ArcSwapOption<CertifiedKey>>,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (slot, stop) = (slot.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        black_box(slot.load_full());
                    }
                }
            })
        })
        .collect()
}

fn swap(c: &mut Criterion) {
    let certs = certs(2);
    let keys = [certified(&certs[0]), certified(&certs[1])];

    let mut group = c.benchmark_group("swap/store");
    for n in [0, 1, 2] {
        let slot = Arc::new(ArcSwapOption::from(Some(keys[0].clone())));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = readers(&slot, n, &stop);
        let mut i = 0usize;
        group.bench_function(format!("{n} reader threads"), |b| {
            b.iter(|| {
                i += 1;
                slot.store(Some(keys[i % 2].clone()));
            });
        });
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
    group.finish();

    // How long after a store a reader spinning on load observes it.
    let mut group = c.benchmark_group("swap/visible to a reader");
    group.bench_function("store until a reader thread sees it", |b| {
        let slot = Arc::new(ArcSwapOption::from(Some(keys[0].clone())));
        let seen_ns = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let reader = {
            let (slot, seen_ns, stop, want) =
                (slot.clone(), seen_ns.clone(), stop.clone(), keys[1].clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if slot.load().as_ref().is_some_and(|k| Arc::ptr_eq(k, &want))
                        && seen_ns.load(Ordering::Acquire) == 0
                    {
                        let ns = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        seen_ns.store(ns, Ordering::Release);
                    }
                }
            })
        };
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                slot.store(Some(keys[0].clone()));
                seen_ns.store(0, Ordering::Release);
                let stored = epoch.elapsed();
                slot.store(Some(keys[1].clone()));
                let seen = loop {
                    let ns = seen_ns.load(Ordering::Acquire);
                    if ns != 0 {
                        break Duration::from_nanos(ns);
                    }
                    std::hint::spin_loop();
                };
                total += seen.saturating_sub(stored);
            }
            total
        });
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    });
    group.finish();

    // The public path: a bundle sent to the reloader until resolve() returns it.
    let runtime = benches::runtime(1);
    let fed = Fed::start(&runtime, &certs[0]);
    let resolver = fed.reloader.resolver();
    let bundles = [bundle(&certs[0]), bundle(&certs[1])];
    let fingerprints = [keys[0].cert[0].clone(), keys[1].cert[0].clone()];
    let mut group = c.benchmark_group("swap/reloader");
    let mut next = 1usize;
    group.bench_function("bundle in until resolve() returns it", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let i = next % 2;
                next += 1;
                fed.tx.unbounded_send(Ok(bundles[i].clone())).unwrap();
                while resolver
                    .current()
                    .is_none_or(|k| k.cert[0] != fingerprints[i])
                {
                    std::hint::spin_loop();
                }
            }
            start.elapsed()
        });
    });
    group.finish();
}

criterion_group!(benches, swap);
criterion_main!(benches);
