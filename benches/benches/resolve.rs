//! 1. Resolve cost: what rotation adds to every handshake. Our resolver against cloning a static
//!    `Arc<CertifiedKey>` (a server without rotation), `RwLock<Arc<_>>` and `Mutex<Arc<_>>` (what
//!    people write by hand); on one thread, with a writer swapping every 1 ms, and with a second
//!    reader thread hammering as well.
//!
//! `cargo bench -p benches --bench resolve`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use benches::{Fed, Swapper, bundle, certified, certs};
use criterion::{Criterion, criterion_group, criterion_main};
use rustls::sign::CertifiedKey;

/// The ways a server can hold its certificate.
#[derive(Clone)]
enum Holder {
    Ours(Arc<tls_reload::CertResolver>),
    Static(Arc<CertifiedKey>),
    RwLock(Arc<RwLock<Arc<CertifiedKey>>>),
    Mutex(Arc<Mutex<Arc<CertifiedKey>>>),
}

impl Holder {
    #[inline]
    fn resolve(&self) -> Option<Arc<CertifiedKey>> {
        match self {
            Self::Ours(resolver) => resolver.current(),
            Self::Static(key) => Some(Arc::clone(key)),
            Self::RwLock(lock) => Some(Arc::clone(&lock.read().unwrap())),
            Self::Mutex(lock) => Some(Arc::clone(&lock.lock().unwrap())),
        }
    }
}

fn resolve(c: &mut Criterion) {
    let runtime = benches::runtime(1);
    let certs = certs(2);
    let keys = [certified(&certs[0]), certified(&certs[1])];
    let bundles = [bundle(&certs[0]), bundle(&certs[1])];
    let fed = Fed::start(&runtime, &certs[0]);
    let holders = [
        (
            "static Arc clone (baseline)",
            Holder::Static(keys[0].clone()),
        ),
        (
            "tls-reload CertResolver",
            Holder::Ours(fed.reloader.resolver()),
        ),
        (
            "RwLock<Arc>",
            Holder::RwLock(Arc::new(RwLock::new(keys[0].clone()))),
        ),
        (
            "Mutex<Arc>",
            Holder::Mutex(Arc::new(Mutex::new(keys[0].clone()))),
        ),
    ];

    for (name, holder) in &holders {
        assert!(holder.resolve().is_some(), "{name} serves a certificate");
    }

    // A writer that swaps every 1 ms: through the reloader (validation included) for ours, a
    // plain store for the locks.
    let start_swapper = |holder: &Holder| -> Option<Swapper> {
        let every = Duration::from_millis(1);
        match holder.clone() {
            Holder::Static(_) => None,
            Holder::Ours(_) => {
                let tx = fed.tx.clone();
                let bundles = bundles.clone();
                Some(Swapper::start(every, move |n| {
                    let _ = tx.unbounded_send(Ok(bundles[(n % 2) as usize].clone()));
                }))
            }
            Holder::RwLock(lock) => {
                let keys = keys.clone();
                Some(Swapper::start(every, move |n| {
                    *lock.write().unwrap() = keys[(n % 2) as usize].clone();
                }))
            }
            Holder::Mutex(lock) => {
                let keys = keys.clone();
                Some(Swapper::start(every, move |n| {
                    *lock.lock().unwrap() = keys[(n % 2) as usize].clone();
                }))
            }
        }
    };

    let mut group = c.benchmark_group("resolve/1 reader");
    for (name, holder) in &holders {
        group.bench_function(*name, |b| b.iter(|| black_box(holder.resolve())));
    }
    group.finish();

    let mut group = c.benchmark_group("resolve/1 reader + writer every 1ms");
    for (name, holder) in &holders {
        let Some(swapper) = start_swapper(holder) else {
            continue;
        };
        group.bench_function(*name, |b| b.iter(|| black_box(holder.resolve())));
        let swaps = swapper.stop();
        assert!(swaps > 0);
    }
    group.finish();

    // The static `Arc` has no writer; it runs here with the second reader only, to show what the
    // shared reference count alone costs.
    let mut group = c.benchmark_group("resolve/2 readers + writer every 1ms");
    for (name, holder) in &holders {
        let swapper = start_swapper(holder);
        let stop = Arc::new(AtomicBool::new(false));
        let other = {
            let (holder, stop) = (holder.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        black_box(holder.resolve());
                    }
                }
            })
        };
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(holder.resolve());
                }
                start.elapsed()
            });
        });
        stop.store(true, Ordering::Relaxed);
        other.join().unwrap();
        drop(swapper);
    }
    group.finish();
}

criterion_group!(benches, resolve);
criterion_main!(benches);
