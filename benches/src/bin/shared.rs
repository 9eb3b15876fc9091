//! The shared self-signed store, measured on the API emulator with three replicas, each with
//! its own endpoint and a real reloader:
//!
//! - leader failover: a leader killed (it stops without releasing its Lease) until another
//!   leads and has stamped its round on the Secret, with short test leases and with the
//!   defaults (15 s lease, 10 s renew deadline, 2 s retry);
//! - the time from the leader's write of a new certificate to all three replicas serving it
//!   (installed in their resolvers);
//! - API requests per minute at steady state, for the leader and for a follower.
//!
//! `cargo run --release -p benches --bin shared [--quick | --write]` (`--quick` skips the
//! failovers with the default timing, which take a lease duration each, and counts requests
//! over 20 s instead of 60 s; `--write` measures write-to-serve only).

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{DEFAULT_LEASE as DEFAULTS, SHORT_LEASE as SHORT, Timing};
use tls_k8s::{Leadership, SharedSelfSigned, WriterStats};
use tls_reload::{Reloader, Status};
use tls_selfsigned::SelfSigned;
use tls_test::{Endpoint, KubeApi};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct Replica {
    id: String,
    endpoint: Endpoint,
    leadership: watch::Receiver<Leadership>,
    stats: watch::Receiver<WriterStats>,
    reloader: Reloader,
}

async fn replica(api: &KubeApi, id: &str, timing: Timing) -> Replica {
    let endpoint = api.endpoint().await;
    let client = benches::emulator_client(&endpoint.url());
    let generator = SelfSigned::builder()
        .dns_name("localhost")
        .ca()
        .build()
        .expect("generator");
    let shared = SharedSelfSigned::new(client, "default", "tls", id, generator)
        .lease_timing(timing.0, timing.1, timing.2)
        .start(&CancellationToken::new());
    let (leadership, stats) = (shared.leadership(), shared.stats());
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .spawn(shared)
        .expect("spawn");
    reloader
        .ready_timeout(Duration::from_secs(30))
        .await
        .expect("ready");
    Replica {
        id: id.to_owned(),
        endpoint,
        leadership,
        stats,
        reloader,
    }
}

fn fingerprint(status: &Status) -> Option<String> {
    status
        .current
        .as_ref()
        .map(|c| c.fingerprint_sha256.clone())
}

async fn wait(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn stored_holder(api: &KubeApi) -> Option<String> {
    api.get("secrets", "default", "tls")?["metadata"]["annotations"]
        [tls_k8s::store::HOLDER_ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

fn show(label: &str, v: &[Duration]) {
    let mut sorted = v.to_vec();
    sorted.sort();
    println!(
        "{label}: median {:.1} ms, min {:.1} ms, max {:.1} ms ({} runs)",
        benches::median(sorted.clone()).as_secs_f64() * 1e3,
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3,
        sorted.len()
    );
}

/// Kills the leader `runs` times; each time, the time until another leads, and until it has
/// stamped its round on the Secret.
async fn failover(timing: Timing, runs: usize) -> (Vec<Duration>, Vec<Duration>) {
    let api = KubeApi::start().await;
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(replica(&api, id, timing).await);
    }
    let (mut leading, mut stamped) = (Vec::new(), Vec::new());
    for run in 0..runs {
        wait("one leader", || {
            replicas
                .iter()
                .filter(|r| r.leadership.borrow().leading)
                .count()
                == 1
                && replicas.iter().any(|r| {
                    r.leadership.borrow().leading && stored_holder(&api).as_deref() == Some(&r.id)
                })
        })
        .await;
        let at = replicas
            .iter()
            .position(|r| r.leadership.borrow().leading)
            .expect("a leader");
        let old = replicas.remove(at);
        // Killed, as a pod is: its API link cut first, so it cannot release its Lease (a stop
        // alone releases it, and the failover would measure a release, not an expiry).
        old.endpoint.partition(tls_test::Link::Reset);
        old.reloader.stop();
        let _ = old.reloader.stopped().await;
        let killed = Instant::now();
        wait("a new leader", || {
            replicas.iter().any(|r| r.leadership.borrow().leading)
        })
        .await;
        leading.push(killed.elapsed());
        wait("its fencing write", || {
            replicas.iter().any(|r| {
                r.leadership.borrow().leading && stored_holder(&api).as_deref() == Some(&r.id)
            })
        })
        .await;
        stamped.push(killed.elapsed());
        // Back to three.
        replicas.push(replica(&api, &format!("r{run}"), timing).await);
    }
    let generated: u64 = replicas
        .iter()
        .map(|r| r.stats.borrow().generated_leaves)
        .sum();
    assert_eq!(generated, 0, "nothing regenerated by the survivors");
    (leading, stamped)
}

/// The leader's write of a new certificate until all three serve it: the Secret is spoiled
/// (garbage in tls.crt, which the readers refuse), the leader regenerates and writes. Times
/// are the emulator's (when a write was stored) and the reload cores' (`loaded_at`).
async fn write_to_serve(runs: usize) -> (Vec<Duration>, Vec<Duration>) {
    let api = Arc::new(KubeApi::start().await);
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(replica(&api, id, SHORT).await);
    }
    let (mut to_write, mut to_serve) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        wait("agreement", || {
            let first = fingerprint(&replicas[0].reloader.status().borrow());
            first.is_some()
                && replicas
                    .iter()
                    .all(|r| fingerprint(&r.reloader.status().borrow()) == first)
        })
        .await;
        let old = fingerprint(&replicas[0].reloader.status().borrow());
        let spoiled = api.put_secret(
            "default",
            "tls",
            &[("tls.crt", b"junk"), ("tls.key", b"junk")],
        );
        let spoiled_at = api.written_at(spoiled).expect("stored");
        wait("all three serving the new leaf", || {
            replicas.iter().all(|r| {
                let now = fingerprint(&r.reloader.status().borrow());
                now.is_some() && now != old
            })
        })
        .await;
        // The leader's write: the Secret's resourceVersion now (nothing else writes it).
        let rv: u64 =
            api.get("secrets", "default", "tls").expect("secret")["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse().ok())
                .expect("resourceVersion");
        let write_at = api.written_at(rv).expect("stored");
        // When each replica installed it (the reload core's own time stamp).
        let served_at = replicas
            .iter()
            .filter_map(|r| {
                r.reloader
                    .status()
                    .borrow()
                    .current
                    .as_ref()
                    .map(|c| c.loaded_at)
            })
            .max()
            .expect("installed");
        let since = |later: std::time::SystemTime, earlier| {
            later.duration_since(earlier).unwrap_or_default()
        };
        to_write.push(since(write_at, spoiled_at));
        to_serve.push(since(served_at, write_at));
    }
    (to_write, to_serve)
}

/// Requests per minute at steady state, per replica role, over `window`.
async fn requests(window: Duration) -> Vec<(bool, f64)> {
    let api = KubeApi::start().await;
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(replica(&api, id, DEFAULTS).await);
    }
    wait("one leader", || {
        replicas
            .iter()
            .filter(|r| r.leadership.borrow().leading)
            .count()
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: Vec<u64> = replicas.iter().map(|r| r.endpoint.requests()).collect();
    tokio::time::sleep(window).await;
    replicas
        .iter()
        .zip(before)
        .map(|(r, before)| {
            let made = r.endpoint.requests() - before;
            (
                r.leadership.borrow().leading,
                made as f64 * 60.0 / window.as_secs_f64(),
            )
        })
        .collect()
}

/// Measures and prints the write-to-serve figures.
async fn write_phase() {
    let (to_write, to_serve) = write_to_serve(30).await;
    show(
        "a spoiled Secret until the leader's new certificate is written",
        &to_write,
    );
    show(
        "the leader's write until all three replicas serve it",
        &to_serve,
    );
}

/// Measures and prints the failover figures with `timing` (named `label`).
async fn failover_phase(label: &str, timing: Timing, runs: usize) {
    let (leading, stamped) = failover(timing, runs).await;
    show(&format!("failover, {label}: a new leader"), &leading);
    show(
        &format!("failover, {label}: the new leader's fencing write on the Secret"),
        &stamped,
    );
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--write") {
        write_phase().await;
        return;
    }
    failover_phase("1.5 s lease / 1 s renew deadline / 200 ms retry", SHORT, 10).await;
    if !quick {
        failover_phase("defaults 15 s / 10 s / 2 s", DEFAULTS, 3).await;
    }
    write_phase().await;
    let window = if quick {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(60)
    };
    for (leading, per_minute) in requests(window).await {
        println!(
            "API requests per minute at steady state (defaults, over {window:?}), {}: {per_minute:.1}",
            if leading { "leader" } else { "follower" }
        );
    }
}
