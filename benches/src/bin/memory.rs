//! 7. Memory: resident set size after 100 rotations and after 100,000, through a real reloader
//!    (each rotation validated and swapped, with status and events). Nothing may leak.
//! 8. Memory per SNI route: the live heap a reloader keeps for 10,000 routes (certificate,
//!    signing key, SNI table, status), per route, beyond the DER of its chain.
//!
//! `cargo run --release -p benches --bin memory` (`ROTATIONS=1000000` for a longer run)

use std::alloc::System;
use std::time::Instant;

use benches::{Fed, FedRoutes, bundle, certs, sni_bundles};
use cap::Cap;

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

const ROUTES: usize = 10_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let certs = certs(4);
    let bundles: Vec<_> = certs.iter().map(bundle).collect();
    let fed = Fed::start(&runtime, &certs[0]);
    let mut status = fed.reloader.status();
    let start = Instant::now();
    let mut rotate = |from: u64, to: u64| {
        runtime.block_on(async {
            for i in from..to {
                let generation = status.borrow_and_update().generation;
                fed.tx
                    .unbounded_send(Ok(bundles[(i % 3 + 1) as usize % 4].clone()))
                    .expect("reloader running");
                status
                    .wait_for(|s| s.generation > generation)
                    .await
                    .expect("reloader running");
            }
        });
    };
    // Alternate between three bundles that differ from the one installed each time.
    rotate(0, 100);
    let after_100 = benches::rss_kib(None);
    let rotations = std::env::var("ROTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    rotate(100, rotations);
    let after_100k = benches::rss_kib(None);
    let generation = fed.reloader.status().borrow().generation;
    println!("rotations: {generation} in {:.1?}", start.elapsed());
    println!("RSS after 100 rotations:     {after_100} KiB");
    println!("RSS after {rotations} rotations: {after_100k} KiB");
    println!("growth: {} KiB", after_100k.saturating_sub(after_100));
    drop(fed);

    // SNI: what the reloader keeps per route. The bundles are consumed (dropped once
    // validated), so the live heap after, less the heap before they were made, is what is kept.
    let before = ALLOC.allocated();
    let routes = sni_bundles(ROUTES * 9 / 10, ROUTES / 10);
    let der: usize = routes
        .iter()
        .map(|(_, b)| b.chain().iter().map(|c| c.len()).sum::<usize>())
        .sum();
    let start = Instant::now();
    let fed = FedRoutes::start(&runtime, &certs[0], routes);
    let kept = ALLOC.allocated().saturating_sub(before);
    println!(
        "{ROUTES} SNI routes installed in {:.1?}; live heap kept: {} KiB, chain DER {} KiB",
        start.elapsed(),
        kept / 1024,
        der / 1024
    );
    println!(
        "per route: {} bytes, of which chain DER {} bytes: {} bytes beyond the DER",
        kept / ROUTES,
        der / ROUTES,
        kept.saturating_sub(der) / ROUTES
    );
    drop(fed);
}
