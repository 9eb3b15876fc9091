//! A fleet of three `serve --etcd-shared` replicas on a real three-member etcd cluster
//! (loopback, tmpfs), each with `--metrics`:
//!
//! - **steady state**: the requests each replica sends to etcd in a minute
//!   (`tls_etcd_requests_total`, counted by our client), by kind, the writer's and the
//!   followers';
//! - **failover**: SIGKILL of the writer to the first write of the next one (the writer key
//!   taken again, seen by polling etcd every 5 ms), against the lease TTL, three times.
//!
//! The fleet shares the self-signed CA (`--self-signed-ca`), or with `--acme` it is an ACME
//! fleet (`--acme-*`) against Pebble (Debian `pebble`) for three names, measured once every
//! replica shows them valid.
//!
//! Build serve first: `cargo build --release -p tls-rotation-serve -p benches --bin etcd_fleet`,
//! then `target/release/etcd_fleet [--quick] [--acme]` (`--quick`: 15 s of steady state).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tls_etcd::Etcd;
use tls_test::{EtcdCluster, Pebble, Serve};

const TTL: Duration = Duration::from_secs(5);

fn serve_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("SERVE_BIN") {
        return bin.into();
    }
    let bin = std::env::current_exe()
        .expect("this binary's path")
        .with_file_name("serve");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p tls-rotation-serve (or set SERVE_BIN)",
        bin.display()
    );
    bin
}

struct Replica {
    serve: Serve,
    metrics: SocketAddr,
}

/// The names of an ACME fleet (Pebble resolves every name to 127.0.0.1).
const NAMES: [&str; 3] = ["a.example.com", "b.example.com", "c.example.com"];

/// With `--acme`: Pebble, validating TLS-ALPN-01 at 127.0.0.1:`port`, where replica 0
/// listens (the others on 127.0.0.2 and .3, the same port).
struct Acme {
    pebble: Pebble,
    port: u16,
}

async fn start(cluster: &EtcdCluster, id: usize, acme: Option<&Acme>) -> Replica {
    let metrics = tls_test::free_port();
    let endpoints = cluster.endpoints().join(",");
    let ttl = format!("{}s", TTL.as_secs());
    let (metrics_arg, identity) = (metrics.to_string(), format!("web-{id}"));
    let mut args: Vec<String> = [
        "--etcd",
        &endpoints,
        "--etcd-shared",
        "web",
        "--identity",
        &identity,
        "--etcd-lease-ttl",
        &ttl,
        "--metrics",
        &metrics_arg,
    ]
    .map(str::to_owned)
    .to_vec();
    match acme {
        None => args.push("--self-signed-ca".to_owned()),
        Some(acme) => {
            args.extend([
                "--listen".to_owned(),
                format!("127.0.0.{}:{}", id + 1, acme.port),
                "--acme-directory".to_owned(),
                acme.pebble.directory_url(),
                "--acme-directory-ca".to_owned(),
                acme.pebble.https_ca_file().display().to_string(),
            ]);
            for name in NAMES {
                args.extend(["--acme-domain".to_owned(), name.to_owned()]);
            }
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = Serve::start(&serve_bin(), &args).await;
    Replica { serve, metrics }
}

/// Waits until every replica shows every ACME name valid.
async fn until_issued(replicas: &[Option<Replica>]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    for replica in replicas.iter().flatten() {
        loop {
            let (status, _) = replica.serve.get().await;
            if NAMES
                .iter()
                .all(|n| status["acme"]["names"][n]["state"] == "valid")
            {
                break;
            }
            assert!(Instant::now() < deadline, "not issued: {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `tls_etcd_requests_total` by request kind, from the replica's /metrics.
async fn requests(replica: &Replica) -> BTreeMap<String, f64> {
    let text = tls_test::plain_get(replica.metrics, "/metrics")
        .await
        .unwrap_or_default();
    let mut by_kind = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("tls_etcd_requests_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let kind = labels
            .split("request=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?")
            .to_owned();
        *by_kind.entry(kind).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    by_kind
}

async fn leading(replicas: &[Option<Replica>]) -> Option<usize> {
    for (i, replica) in replicas.iter().enumerate() {
        if let Some(replica) = replica {
            let (status, _) = replica.serve.get().await;
            if status["leader"]["leading"] == true {
                return Some(i);
            }
        }
    }
    None
}

async fn wait_leader(replicas: &[Option<Replica>]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(i) = leading(replicas).await {
            return i;
        }
        assert!(Instant::now() < deadline, "no writer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let acme = if std::env::args().any(|a| a == "--acme") {
        let port = tls_test::free_port().port();
        let pebble = Pebble::builder().tls_port(port).start_required().await;
        Some(Acme { pebble, port })
    } else {
        None
    };
    let steady = if quick {
        Duration::from_secs(15)
    } else {
        Duration::from_secs(60)
    };
    let cluster = EtcdCluster::builder()
        .start()
        .expect("etcd is installed (apt-get install etcd-server etcd-client)");
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let mut client = etcd.connect().await.unwrap();
    let writer_key = "/tls-rotation/fleets/web/writer";
    let mut replicas: Vec<Option<Replica>> = Vec::new();
    for id in 0..3 {
        replicas.push(Some(start(&cluster, id, acme.as_ref()).await));
    }
    let leader = wait_leader(&replicas).await;
    if let Some(acme) = &acme {
        until_issued(&replicas).await;
        println!(
            "{} names issued, {} orders",
            NAMES.len(),
            acme.pebble.orders()
        );
    }
    // Settled: the writer has written, the followers listed.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Steady state.
    let mut before = Vec::new();
    for replica in replicas.iter().flatten() {
        before.push(requests(replica).await);
    }
    tokio::time::sleep(steady).await;
    let minutes = steady.as_secs_f64() / 60.0;
    println!(
        "steady state, {} s, requests to etcd per minute (tls_etcd_requests_total):",
        steady.as_secs()
    );
    for (i, replica) in replicas.iter().flatten().enumerate() {
        let after = requests(replica).await;
        let per_minute: BTreeMap<&String, String> = after
            .iter()
            .map(|(k, v)| {
                let rate = (v - before[i].get(k).copied().unwrap_or(0.0)) / minutes;
                (k, format!("{rate:.1}"))
            })
            .filter(|(_, rate)| rate != "0.0")
            .collect();
        let total: f64 = after.values().sum::<f64>() - before[i].values().sum::<f64>();
        println!(
            "  web-{i} ({}): {:.1} per minute {per_minute:?}",
            if i == leader { "writer" } else { "follower" },
            total / minutes
        );
    }

    // Failover, three times.
    let retry = (TTL / 3).min(Duration::from_secs(2));
    println!(
        "failover (TTL {TTL:?}, retry {retry:?}): SIGKILL of the writer to the writer key taken again"
    );
    for _ in 0..3 {
        let leader = wait_leader(&replicas).await;
        let held = client.get(writer_key, None).await.unwrap();
        let round = held.kvs()[0].create_revision();
        let killed = replicas[leader].take().unwrap();
        killed.serve.signal("-KILL");
        let t0 = Instant::now();
        let taken = loop {
            let now = client.get(writer_key, None).await.unwrap();
            if now
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() != round)
            {
                break t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        println!(
            "  {:.2} s ({:.2}x the TTL; TTL + retry = {:.2} s)",
            taken.as_secs_f64(),
            taken.as_secs_f64() / TTL.as_secs_f64(),
            (TTL + retry).as_secs_f64()
        );
        drop(killed);
        replicas[leader] = Some(start(&cluster, leader, acme.as_ref()).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if let Some(acme) = &acme {
        println!("orders in all: {}", acme.pebble.orders());
    }
}
