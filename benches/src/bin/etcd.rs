//! The etcd sources against a real three-member etcd cluster on loopback (`tls_test::EtcdCluster`,
//! Debian's etcd 3.4), a reloader in this process behind a real TLS server:
//!
//! - **put to served**: a put of a new certificate through etcd's client, from the put's
//!   response to the first handshake served it (handshakes back to back), over 200 rotations:
//!   median and p90;
//! - **10,000 certificates under a prefix**: from the start of an `EtcdCertsSource` until every
//!   one is installed, against `etcdctl get --prefix` of the same keys (three runs each);
//! - **one change among 10,000 against among 100**: put to served for one key, 50 rotations
//!   each, alternating.
//!
//! `cargo run --release -p benches --bin etcd [--quick]` (`--quick`: 50 rotations, 1,000
//! certificates).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tls_etcd::etcd_client::{Client, Txn, TxnOp};
use tls_etcd::{Etcd, EtcdCertSource, EtcdCertsSource};
use tls_reload::Reloader;
use tls_test::{EtcdCluster, TestCa, TestCert, TestServer};

fn value(cert: &TestCert) -> Vec<u8> {
    tls_etcd::value(&cert.chain_pem, &cert.key_pem, None).into_bytes()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Puts `value` at `key` and waits until a handshake for `name` with `server` is served
/// `fingerprint`: the time from the put's response to that handshake's end.
async fn put_to_served(
    client: &mut Client,
    server: &TestServer,
    key: &str,
    name: &str,
    cert: &TestCert,
) -> Duration {
    client.put(key, value(cert), None).await.expect("put");
    let put = Instant::now();
    loop {
        if tls_test::served_as(server.addr(), name)
            .await
            .ok()
            .as_deref()
            == Some(cert.fingerprint.as_str())
        {
            return put.elapsed();
        }
        assert!(
            put.elapsed() < Duration::from_secs(20),
            "{key} never served"
        );
    }
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.9))
}

async fn put_all(client: &mut Client, prefix: &str, certs: &[TestCert]) {
    // etcd's default --max-txn-ops is 128.
    for (chunk_no, chunk) in certs.chunks(100).enumerate() {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .enumerate()
            .map(|(i, cert)| {
                TxnOp::put(
                    format!("{prefix}k{:05}", chunk_no * 100 + i),
                    value(cert),
                    None,
                )
            })
            .collect();
        client.txn(Txn::new().and_then(ops)).await.expect("txn");
    }
}

fn etcdctl_get_prefix(cluster: &EtcdCluster, prefix: &str) -> Duration {
    let start = Instant::now();
    let status = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
        .args(["get", "--prefix", prefix])
        .stdout(Stdio::null())
        .status()
        .expect("etcdctl");
    assert!(status.success());
    start.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rotations, estate, changes) = if quick {
        (50, 1_000, 20)
    } else {
        (200, 10_000, 50)
    };
    let cluster = EtcdCluster::builder()
        .start()
        .expect("etcd is installed (apt-get install etcd-server etcd-client)");
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let mut client = etcd.connect().await.unwrap();
    let provider = tls_test::provider();
    let ca = TestCa::new("etcd bench");

    // 1. Put to served, one certificate.
    let key = "/bench/certs/web";
    let first = ca.leaf(&["localhost"]);
    client.put(key, value(&first), None).await.unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(provider.clone())
        .spawn(EtcdCertSource::new(etcd.clone(), key))
        .unwrap();
    reloader.ready().await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    let certs: Vec<TestCert> = (0..rotations).map(|_| ca.leaf(&["localhost"])).collect();
    let mut samples = Vec::with_capacity(rotations);
    for cert in &certs {
        samples.push(put_to_served(&mut client, &server, key, "localhost", cert).await);
    }
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    let (p50, p90) = summary(samples);
    println!(
        "put to served, one key, {rotations} rotations: median {}, p90 {}, mean {}",
        ms(p50),
        ms(p90),
        ms(mean)
    );
    drop(server);
    reloader.stop();

    // 2. An estate under a prefix, and the same read by etcdctl.
    let prefix = "/bench/estate/certs/";
    let leaves: Vec<TestCert> = (0..estate)
        .map(|i| ca.leaf(&[&format!("h{i:05}.estate.test")]))
        .collect();
    let put = Instant::now();
    put_all(&mut client, prefix, &leaves).await;
    println!(
        "{estate} certificates put in {:.1} s ({} bytes each)",
        put.elapsed().as_secs_f64(),
        value(&leaves[0]).len()
    );
    let small_prefix = "/bench/small/certs/";
    let small: Vec<TestCert> = (0..100)
        .map(|i| ca.leaf(&[&format!("h{i:05}.small.test")]))
        .collect();
    put_all(&mut client, small_prefix, &small).await;

    // The source alone: its list (pages at one revision, each value decoded), without the
    // reload core's validation and install.
    let mut listed = Vec::new();
    for _ in 0..3 {
        use futures::StreamExt as _;
        let start = Instant::now();
        let mut source = EtcdCertsSource::new(etcd.clone(), prefix);
        while let Some(item) = source.next().await {
            if matches!(item.unwrap().update, tls_source::KeyedUpdate::Listed) {
                break;
            }
        }
        listed.push(start.elapsed());
    }

    // The same keys through etcd-client in one request, nothing decoded: the transfer alone.
    let mut raw = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let response = client
            .kv_client()
            .max_decoding_message_size(256 << 20)
            .get(
                prefix,
                Some(tls_etcd::etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        assert_eq!(response.kvs().len(), estate);
        raw.push(start.elapsed());
    }

    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut estate_reloader = None;
    for run in 0..3 {
        theirs.push(etcdctl_get_prefix(&cluster, prefix));
        let start = Instant::now();
        let reloader = Reloader::builder()
            .crypto_provider(provider.clone())
            .routes(EtcdCertsSource::new(etcd.clone(), prefix))
            .spawn_routes()
            .unwrap();
        tls_test::wait_for(reloader.status(), "every certificate installed", |s| {
            s.routes.len() == estate && s.routes.values().all(|r| r.current.is_some())
        })
        .await;
        ours.push(start.elapsed());
        if run == 2 {
            estate_reloader = Some(reloader);
        } else {
            reloader.stop();
        }
    }
    let show = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
    println!("start until all {estate} served: {}", show(&ours));
    println!("etcdctl get --prefix of the same: {}", show(&theirs));
    println!("the source alone, until listed: {}", show(&listed));
    println!(
        "one get of the prefix through etcd-client, nothing decoded: {}",
        show(&raw)
    );
    let ratios: Vec<String> = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()))
        .collect();
    println!("ratio by run: {}", ratios.join(", "));

    // 3. One change among the estate, against one among 100, alternating.
    let big = estate_reloader.expect("the last run's reloader");
    let big_server = TestServer::start(big.resolver()).await;
    let small_reloader = Reloader::builder()
        .crypto_provider(provider.clone())
        .routes(EtcdCertsSource::new(etcd.clone(), small_prefix))
        .spawn_routes()
        .unwrap();
    tls_test::wait_for(small_reloader.status(), "100 installed", |s| {
        s.routes.len() == 100 && s.routes.values().all(|r| r.current.is_some())
    })
    .await;
    let small_server = TestServer::start(small_reloader.resolver()).await;
    let (mut at_big, mut at_small) = (Vec::new(), Vec::new());
    for i in 0..changes {
        let name = format!("h{:05}.estate.test", (i * 37) % estate);
        let cert = ca.leaf(&[&name]);
        let key = format!("{prefix}k{:05}", (i * 37) % estate);
        at_big.push(put_to_served(&mut client, &big_server, &key, &name, &cert).await);
        let name = format!("h{:05}.small.test", (i * 37) % 100);
        let cert = ca.leaf(&[&name]);
        let key = format!("{small_prefix}k{:05}", (i * 37) % 100);
        at_small.push(put_to_served(&mut client, &small_server, &key, &name, &cert).await);
    }
    let (big50, big90) = summary(at_big);
    let (small50, small90) = summary(at_small);
    println!(
        "one change among {estate}: median {}, p90 {}; among 100: median {}, p90 {}; ratio of medians {:.2}x",
        ms(big50),
        ms(big90),
        ms(small50),
        ms(small90),
        big50.as_secs_f64() / small50.as_secs_f64()
    );
}
