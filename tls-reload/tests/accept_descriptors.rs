//! The accept stream under a file-descriptor limit of 40 with 60 idle connections: accepting
//! fails (EMFILE) while descriptors are out, the idle connections time out, and new handshakes
//! are served once descriptors are free. Its own test binary: it lowers the process's limit.
#![cfg(all(unix, feature = "accept"))]

mod common;

use std::time::Duration;

use futures::StreamExt as _;
use tls_reload::Incoming;
use tls_test::TestCa;
use tokio::net::{TcpListener, TcpStream};

use common::{bundle, patiently, provider};

fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_idle_connections_under_a_limit_of_forty_do_not_stop_the_server() {
    let logs = tls_test::Logs::global();
    let cert = TestCa::new("descriptors").leaf(&["localhost"]);
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(provider())
        .spawn(futures::stream::iter([Ok(bundle(&cert))]).chain(futures::stream::pending()))
        .unwrap();
    reloader.ready().await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = Incoming::builder(&reloader)
        .handshake_timeout(Duration::from_millis(500))
        .listen(listener)
        .unwrap();

    // 60 idle clients (they never send a ClientHello) wait in the backlog; then a limit 40
    // above what is open, so the server's ends of them need more descriptors than it has.
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    let limit = (open_descriptors() + 40).min(hard);
    rlimit::Resource::NOFILE.set(limit, hard).unwrap();

    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let server = tokio::spawn(async move {
        while let Some(Ok(conn)) = incoming.next().await {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(conn);
        }
    });

    // The server runs out of descriptors, drops idle connections at their time-out, and takes
    // the rest from the backlog; then a real client is served.
    let probe = patiently("a real handshake once descriptors are free", async {
        loop {
            match tls_test::probe(addr, "localhost").await {
                Ok(served) => break served,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    rlimit::Resource::NOFILE.set(soft, hard).unwrap();
    assert_eq!(probe.fingerprint, cert.fingerprint);
    patiently(
        "the real client's connection comes through the stream",
        async {
            while served.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    assert!(!server.is_finished(), "the accept stream keeps going");
    let said = logs.text();
    assert!(
        said.contains("cannot accept connections; retrying with backoff"),
        "the server did run out of descriptors: {said}"
    );
    assert!(said.contains("accepting connections again"), "{said}");
    drop(idle);
    server.abort();
}
