//! 9. The accept stream's cost: full TLS 1.3 handshakes over loopback through
//!    `tls_reload::Incoming` against a plain `TcpListener` + `TlsAcceptor` loop (a task per
//!    connection), both on the same reloader and the same `ServerConfig` (no tickets, no ALPN).
//!    Sequential handshakes, paired (the two servers take turns), and 8 clients at once.
//!
//! `cargo bench -p benches --bench accept`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{Fed, certs, provider, verifying_client};
use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt as _;
use rustls::pki_types::ServerName;
use tls_reload::{Incoming, Reloader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

fn config(reloader: &Reloader) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(reloader.resolver());
    config.send_tls13_tickets = 0;
    config
}

/// The loop users wrote by hand: accept, spawn, handshake.
async fn plain(reloader: &Reloader) -> SocketAddr {
    benches::plain_loop(config(reloader)).await
}

/// The accept stream, each established connection handed to a task (as a server does).
async fn incoming(reloader: &Reloader) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = Incoming::builder(reloader)
        .server_config(config(reloader))
        .alpn(Vec::<Vec<u8>>::new())
        .listen(listener)
        .unwrap();
    tokio::spawn(async move {
        while let Some(Ok(conn)) = incoming.next().await {
            tokio::spawn(async move { drop(conn) });
        }
    });
    addr
}

async fn handshake(connector: &TlsConnector, addr: SocketAddr) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.expect("handshake");
}

/// `clients` clients at once, `each` handshakes each: the wall time.
async fn parallel(
    connector: &TlsConnector,
    addr: SocketAddr,
    clients: usize,
    each: usize,
) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let connector = connector.clone();
            tokio::spawn(async move {
                for _ in 0..each {
                    handshake(&connector, addr).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    start.elapsed()
}

fn accept(c: &mut Criterion) {
    let runtime = benches::runtime(2);
    let certs = certs(1);
    let fed = Fed::start(&runtime, &certs[0]);
    let connector = TlsConnector::from(Arc::new(verifying_client(&certs[0])));
    let plain_addr = runtime.block_on(plain(&fed.reloader));
    let incoming_addr = runtime.block_on(incoming(&fed.reloader));

    let mut group = c.benchmark_group("accept");
    group
        .sample_size(40)
        .measurement_time(Duration::from_secs(8));
    for (name, addr) in [
        ("plain accept loop (baseline)", plain_addr),
        ("tls_reload::Incoming", incoming_addr),
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

    // Paired, as in the handshake bench: turns handshake by handshake, the order alternating.
    const ROUNDS: usize = 4000;
    let addrs = [plain_addr, incoming_addr];
    let mut times: [Vec<Duration>; 2] = Default::default();
    runtime.block_on(async {
        for round in 0..ROUNDS {
            for i in 0..2 {
                let slot = (i + round) % 2;
                let start = Instant::now();
                handshake(&connector, addrs[slot]).await;
                times[slot].push(start.elapsed());
            }
        }
    });
    let [mut p, mut s] = times;
    let median = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (p, s) = (median(&mut p), median(&mut s));
    println!("paired sequential handshakes, {ROUNDS} each, medians:");
    println!("  plain accept loop:    {p:?}");
    println!(
        "  tls_reload::Incoming: {s:?}  throughput ratio {:.3}",
        p.as_secs_f64() / s.as_secs_f64()
    );

    // 8 clients at once, 250 handshakes each, 6 rounds alternating: total wall time.
    let (mut plain_total, mut incoming_total) = (Duration::ZERO, Duration::ZERO);
    runtime.block_on(async {
        for round in 0..6 {
            let order = if round % 2 == 0 {
                addrs
            } else {
                [addrs[1], addrs[0]]
            };
            for addr in order {
                let took = parallel(&connector, addr, 8, 250).await;
                if addr == plain_addr {
                    plain_total += took;
                } else {
                    incoming_total += took;
                }
            }
        }
    });
    let rate = |total: Duration| 6.0 * 8.0 * 250.0 / total.as_secs_f64();
    println!("8 clients at once, 12,000 handshakes per server:");
    println!(
        "  plain accept loop:    {:.0} handshakes/s",
        rate(plain_total)
    );
    println!(
        "  tls_reload::Incoming: {:.0} handshakes/s  throughput ratio {:.3}",
        rate(incoming_total),
        rate(incoming_total) / rate(plain_total)
    );
}

criterion_group!(benches, accept);
criterion_main!(benches);
