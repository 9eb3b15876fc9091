//! 3. Handshake throughput: full TLS 1.3 handshakes over loopback (no resumption, no tickets),
//!    ECDSA P-256, the client verifying the chain: rustls `with_single_cert` (static) against our
//!    reloader, and our reloader while it rotates every 10 ms.
//!
//! `cargo bench -p benches --bench handshake`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{Fed, Swapper, bundle, certs, provider, verifying_client};
use criterion::{Criterion, criterion_group, criterion_main};
use rustls::ServerConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn server_config() -> rustls::ConfigBuilder<ServerConfig, rustls::WantsVerifier> {
    ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
}

async fn serve(config: ServerConfig) -> SocketAddr {
    benches::plain_loop(config).await
}

async fn handshake(connector: &TlsConnector, addr: SocketAddr) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.expect("handshake");
}

fn handshakes(c: &mut Criterion) {
    let runtime = benches::runtime(2);
    let certs = certs(2);
    let bundles = [bundle(&certs[0]), bundle(&certs[1])];
    let connector = TlsConnector::from(Arc::new(verifying_client(&certs[0])));

    // Two reloaders: one that keeps its certificate, one that a writer rotates every 10 ms.
    let steady = Fed::start(&runtime, &certs[0]);
    let rotated = Fed::start(&runtime, &certs[0]);
    let static_addr = runtime.block_on(serve(
        server_config()
            .with_no_client_auth()
            .with_single_cert(bundles[0].chain().to_vec(), bundles[0].key().clone_key())
            .unwrap(),
    ));
    let reloader_addr = runtime.block_on(serve(
        server_config()
            .with_no_client_auth()
            .with_cert_resolver(steady.reloader.resolver()),
    ));
    let rotating_addr = runtime.block_on(serve(
        server_config()
            .with_no_client_auth()
            .with_cert_resolver(rotated.reloader.resolver()),
    ));
    let tx = rotated.tx.clone();
    let rotating = Swapper::start(Duration::from_millis(10), move |n| {
        let _ = tx.unbounded_send(Ok(bundles[(n % 2) as usize].clone()));
    });

    let mut group = c.benchmark_group("handshake");
    group
        .sample_size(60)
        .measurement_time(Duration::from_secs(12));
    for (name, addr) in [
        ("static with_single_cert (baseline)", static_addr),
        ("tls-reload resolver", reloader_addr),
        ("tls-reload resolver, rotating every 10ms", rotating_addr),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        handshake(&connector, addr).await;
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();

    // Paired: the three servers take turns, handshake by handshake, so that the machine's drift
    // (two cores shared by client, servers and the rotating writer) falls on all of them alike;
    // separate criterion runs of the same server differ by several percent on this machine.
    const ROUNDS: usize = 4000;
    let addrs = [static_addr, reloader_addr, rotating_addr];
    let mut times: [Vec<Duration>; 3] = Default::default();
    runtime.block_on(async {
        for round in 0..ROUNDS {
            for i in 0..3 {
                // Rotate the order each round, so no server always goes first.
                let slot = (i + round) % 3;
                let start = Instant::now();
                handshake(&connector, addrs[slot]).await;
                times[slot].push(start.elapsed());
            }
        }
    });
    let swaps = rotating.stop();
    assert!(swaps > 10, "rotated {swaps} times");
    let generation = rotated.reloader.status().borrow().generation;
    let [mut s, mut r, mut rr] = times;
    let median = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (s, r, rr) = (median(&mut s), median(&mut r), median(&mut rr));
    println!(
        "paired handshakes, {ROUNDS} each, medians (the rotating reloader installed {generation} certificates):"
    );
    println!("  static with_single_cert: {s:?}");
    println!(
        "  tls-reload resolver:     {r:?}  throughput ratio {:.3}",
        s.as_secs_f64() / r.as_secs_f64()
    );
    println!(
        "  rotating every 10ms:     {rr:?}  throughput ratio {:.3}",
        s.as_secs_f64() / rr.as_secs_f64()
    );
}

criterion_group!(benches, handshakes);
criterion_main!(benches);
