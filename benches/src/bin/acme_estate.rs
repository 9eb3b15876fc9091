//! ACME at the lifetimes the field is moving to, against Pebble (`apt-get install pebble`):
//!
//! 1. **Short-lived estate** (`--only short`): N names (default 100) on certificates of S
//!    seconds (default 300), a fleet of three on the API emulator (127.0.0.1, .2, .3; a Lease
//!    of 1.5 s, renewed every 200 ms, given up after 1 s), for M minutes (default 10), the
//!    leader killed twice (at a third and two thirds of the run). Reported: handshakes that got
//!    an expired or no certificate (a probe of 20 names on each ready replica every second,
//!    verified against Pebble's root at that moment: target 0); Pebble's orders against the
//!    certificates issued (each issue seen as a new `not_after` on the leader's status: target
//!    no order without its certificate, so no name ordered twice in a renewal period); the
//!    share of the lifetime left at each renewal (target: the planned half, less its jitter,
//!    none under a tenth); this process's CPU (three replicas, the emulator, the probe) and
//!    Pebble's per renewal, from `/proc`.
//! 2. **Stress** (`--only stress`): the same with 200 names on 120-second certificates.
//! 3. **Cold start** (`--only cold`): 1,000 and 10,000 certificates stored in a state
//!    directory by a fixture through the store (`tls_acme::test_util`; not ordered: the weekly
//!    budget and the stagger would make 10,000 orders take hours), then a server started on
//!    it: time until it is ready (every stored certificate installed as its route) and a probe
//!    of every 10th name verifies, orders placed (target 0), RSS per stored certificate.
//!
//! `cargo run --release -p benches --bin acme_estate [-- --only short|stress|cold]
//! [--minutes M] [--runs R]`

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime};

use benches::{AcmeReplica, SHORT_LEASE as SHORT, point_at_followers};
use tls_acme::{Acme, AcmeBuilder, AcmeStatus, NameState};
use tls_test::{KubeApi, PATIENCE, Pebble, TestCa, probe_trusting};
use tokio::net::TcpListener;

/// A budget of first orders large enough for every name here (Pebble has no rate limits).
const BUDGET: u32 = 100_000;

struct Args {
    only: Option<String>,
    minutes: u64,
    runs: usize,
    /// For `short`: the names and the certificates' lifetime (seconds).
    names: usize,
    lifetime: u64,
}

fn args() -> Args {
    let mut args = Args {
        only: None,
        minutes: 10,
        runs: 3,
        names: 100,
        lifetime: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().unwrap_or_default();
        match arg.as_str() {
            "--only" => args.only = Some(value),
            "--minutes" => args.minutes = value.parse().expect("--minutes: a count"),
            "--runs" => args.runs = value.parse().expect("--runs: a count"),
            "--names" => args.names = value.parse().expect("--names: a count"),
            "--lifetime" => args.lifetime = value.parse().expect("--lifetime: seconds"),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

use benches::AcmeServer as Served;

fn builder(directory: &str, pebble: &Pebble, names: &[String]) -> AcmeBuilder {
    let mut builder = Acme::builder(directory)
        .contact("ops@example.com")
        .directory_roots(vec![pebble.https_ca_der()])
        .crypto_provider(benches::provider())
        .stagger(Duration::from_millis(20))
        .new_certificates_per_week(BUDGET);
    for name in names {
        builder = builder.name(name.clone());
    }
    builder
}

/// CPU time (user and system) of a process, from `/proc/PID/stat`.
fn cpu(pid: Option<u32>) -> Duration {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_owned(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The fields after the command (which may hold spaces) start after its closing ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime: fields 14 and 15 of stat, 11 and 12 after the state; 100 ticks a second.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

// ===== the short-lived estate =====

type Replica = AcmeReplica;

/// Replica `n` of the estate's fleet.
async fn start_replica(
    api: &KubeApi,
    (pebble, directory): (&Pebble, &str),
    port: u16,
    names: &[String],
    n: u8,
) -> Replica {
    AcmeReplica::start(api, builder(directory, pebble, names), n, port, SHORT).await
}

/// What `replica` shows now.
fn status_of(replica: &Replica) -> AcmeStatus {
    replica.served.acme.status().borrow().clone()
}

/// What the estate run saw.
#[derive(Default)]
struct Seen {
    probes: u64,
    /// Handshakes that got an expired certificate, or none.
    bad: u64,
    bad_examples: Vec<String>,
    /// Each name's latest `not_after`.
    not_after: HashMap<String, SystemTime>,
    issued: u64,
    /// The share of the lifetime left at each renewal.
    left: Vec<f64>,
    /// The failures the leader reported, and how often each was seen changing.
    errors: HashMap<String, u64>,
    last_error: HashMap<String, String>,
}

impl Seen {
    /// Folds in a leader's status observed at `now`.
    fn observe(&mut self, status: &AcmeStatus, now: SystemTime, lifetime: Duration) {
        for (name, n) in &status.names {
            if let Some(error) = &n.last_error
                && self.last_error.get(name) != Some(error)
            {
                self.last_error.insert(name.clone(), error.clone());
                // The name varies: the failure's kind is what is counted.
                let kind = error.replace(name.as_str(), "NAME");
                *self.errors.entry(kind).or_default() += 1;
            }
            let Some(end) = n.not_after else { continue };
            match self.not_after.insert(name.clone(), end) {
                None => self.issued += 1,
                Some(old) if end > old => {
                    self.issued += 1;
                    let left = old.duration_since(now).unwrap_or_default();
                    self.left.push(left.as_secs_f64() / lifetime.as_secs_f64());
                }
                Some(old) => {
                    self.not_after.insert(name.clone(), old);
                }
            }
        }
    }
}

async fn estate(names: usize, lifetime: Duration, minutes: u64) {
    let names: Vec<String> = (0..names)
        .map(|i| format!("s{i}.short.example.com"))
        .collect();
    let port = tls_test::free_port().port();
    let Some(pebble) = Pebble::builder()
        .tls_port(port)
        .validity(lifetime)
        .start()
        .await
    else {
        panic!("Pebble is not installed (apt-get install pebble)");
    };
    let root = pebble.issuing_root().await;
    let api = KubeApi::start().await;
    let directory = pebble.directory_url();
    let ca = (&pebble, directory.as_str());
    // Every replica answers every published challenge: the CA validates at replica 2 and 3 in
    // turn, so a killed leader's address is not the one it is sent to...
    for (i, name) in names.iter().enumerate() {
        let n = 2 + (i % 2) as u8;
        pebble.add_a(name, Ipv4Addr::new(127, 0, 0, n)).await;
    }
    let mut replicas = Vec::new();
    for n in 1..=3 {
        replicas.push(start_replica(&api, ca, port, &names, n).await);
        if n == 1 {
            while !replicas[0].leading() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // ...until the first leader is killed; then the names point at whichever two replicas do
    // not lead (every replica restarted in a killed one's place is a follower).
    let mut seen = Seen::default();
    let start = Instant::now();
    let cpu_before = (cpu(None), cpu(pebble.pid()));
    let run = Duration::from_secs(minutes * 60);
    let kills = [run / 3, run * 2 / 3];
    let mut killed = 0;
    let mut next_probe = Instant::now();
    let mut probe_index = 0usize;
    let mut ready: Vec<bool> = vec![false; 3];
    while start.elapsed() < run {
        let now = SystemTime::now();
        if let Some(leader) = replicas.iter().find(|r| r.leading()) {
            seen.observe(&status_of(leader), now, lifetime);
        }
        for (i, replica) in replicas.iter().enumerate() {
            if !ready[i] {
                ready[i] = replica.served.reloader.status().borrow().ready;
            }
        }
        if killed < kills.len() && start.elapsed() >= kills[killed] {
            let i = replicas
                .iter()
                .position(Replica::leading)
                .expect("a leader");
            point_at_followers(&pebble, &replicas, &names).await;
            let old = replicas.remove(i);
            let n = old.n;
            old.kill();
            replicas.insert(i, start_replica(&api, ca, port, &names, n).await);
            ready[i] = false;
            killed += 1;
            println!(
                "short: leader replica-{n} killed at {:.0} s ({} orders so far)",
                start.elapsed().as_secs_f64(),
                pebble.orders()
            );
        }
        if Instant::now() >= next_probe {
            next_probe += Duration::from_secs(1);
            // Once every name holds a certificate: 20 names on each ready replica.
            if seen.not_after.len() == names.len() {
                for (i, replica) in replicas.iter().enumerate() {
                    if !ready[i] {
                        continue;
                    }
                    for k in 0..20 {
                        let name = &names[(probe_index + k) % names.len()];
                        seen.probes += 1;
                        if let Err(e) =
                            probe_trusting(replica.served.addr, name, std::slice::from_ref(&root))
                                .await
                        {
                            seen.bad += 1;
                            if seen.bad_examples.len() < 5 {
                                seen.bad_examples
                                    .push(format!("replica-{} {name}: {e}", replica.n));
                            }
                        }
                    }
                }
                probe_index += 20;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_after = (cpu(None), cpu(pebble.pid()));
    // Orders placed in the run's last seconds are let finish before counting (at most a
    // minute): an order in flight is not one without its certificate.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(60) {
        let Some(leader) = replicas.iter().find(|r| r.leading()) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = status_of(leader);
        seen.observe(&status, SystemTime::now(), lifetime);
        if status
            .names
            .values()
            .all(|n| n.state != NameState::Ordering)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let orders = pebble.orders() as u64;
    let renewals = seen.left.len().max(1) as f64;
    let mut left = seen.left.clone();
    left.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        left.get(((left.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "short: {} names on {} s certificates, {minutes} min, a fleet of three (Lease 1.5 s / 1 s / 200 ms), the leader killed twice",
        names.len(),
        lifetime.as_secs()
    );
    println!(
        "short: probes {} (20 names on each ready replica every second): expired or no certificate {} {:?}",
        seen.probes, seen.bad, seen.bad_examples
    );
    println!(
        "short: certificates issued {} (first {} + renewals {}), Pebble's orders {orders} (target: as many as issued)",
        seen.issued,
        names.len(),
        seen.left.len()
    );
    println!(
        "short: lifetime left at renewal: min {:.3}, p5 {:.3}, median {:.3}, max {:.3}; under a tenth: {} (planned: 0.5 plus up to 1/30)",
        pct(0.0),
        pct(0.05),
        pct(0.5),
        pct(1.0),
        left.iter().filter(|l| **l < 0.1).count()
    );
    let mut errors: Vec<_> = seen.errors.iter().collect();
    errors.sort_by(|a, b| b.1.cmp(a.1));
    for (error, count) in errors.iter().take(5) {
        println!("short: failures seen {count}x: {error}");
    }
    println!(
        "short: CPU per renewal: this process (3 replicas, emulator, probe) {:.1} ms, Pebble {:.1} ms",
        (cpu_after.0 - cpu_before.0).as_secs_f64() * 1e3 / renewals,
        (cpu_after.1 - cpu_before.1).as_secs_f64() * 1e3 / renewals,
    );
}

// ===== the cold start =====

async fn cold(n: usize, runs: usize) {
    let port = tls_test::free_port().port();
    let Some(pebble) = Pebble::builder().tls_port(port).start().await else {
        panic!("Pebble is not installed (apt-get install pebble)");
    };
    let ca = TestCa::new("cold start CA");
    let names: Vec<String> = (0..n).map(|i| format!("c{i}.cold.example.com")).collect();
    let state = tempfile::tempdir().expect("a state directory");
    {
        let started = Instant::now();
        for name in &names {
            let leaf = ca.leaf(&[name]);
            tls_acme::test_util::store_certificate(
                state.path(),
                name,
                leaf.chain_pem.as_bytes(),
                leaf.key_pem.as_bytes(),
            )
            .await
            .expect("stored");
        }
        println!(
            "cold: {n} certificates stored by the fixture in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let root = ca.cert_der();
    let directory = pebble.directory_url();
    let mut times = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..runs {
        let before = benches::rss_kib(None);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let started = Instant::now();
        let served = Served::start(
            builder(&directory, &pebble, &names).state_dir(state.path()),
            listener,
        );
        served
            .reloader
            .ready_timeout(PATIENCE)
            .await
            .expect("ready");
        let ready = started.elapsed();
        for name in names.iter().step_by(10) {
            probe_trusting(served.addr, name, std::slice::from_ref(&root))
                .await
                .unwrap_or_else(|e| panic!("{name} not served: {e}"));
        }
        rss.push(benches::rss_kib(None).saturating_sub(before));
        times.push(ready);
        // Every name valid: the plan looked at each, and ordered nothing.
        let mut status = served.acme.status();
        tokio::time::timeout(
            PATIENCE,
            status.wait_for(|s| s.names.values().all(|n| n.state == NameState::Valid)),
        )
        .await
        .expect("every name valid")
        .expect("a status");
        // What the driver writes after a start (each certificate's record, the first time:
        // its jitter is drawn once and stored) is done before the next run starts.
        let records = state.path().join("names");
        let deadline = Instant::now() + PATIENCE * 6;
        while Instant::now() < deadline
            && std::fs::read_dir(&records).map_or(started.elapsed() < Duration::from_secs(3), |d| {
                d.count() < n
            })
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(served);
    }
    let median = benches::median(times[1..].to_vec());
    println!(
        "cold: {n} stored certificates: ready (every route installed) in {:.0} ms, median of the {} restarts after the first ({:?}, the first one's first); {:.2} ms a name; orders placed {} (target 0); RSS {:.1} KiB a certificate (first run: {} KiB)",
        median.as_secs_f64() * 1e3,
        runs - 1,
        times
            .iter()
            .map(|t| format!("{:.0} ms", t.as_secs_f64() * 1e3))
            .collect::<Vec<_>>(),
        median.as_secs_f64() * 1e3 / n as f64,
        pebble.orders(),
        rss[0] as f64 / n as f64,
        rss[0]
    );
}

#[tokio::main]
async fn main() {
    let args = args();
    let only = args.only.as_deref();
    if only.is_none() || only == Some("cold") {
        for n in [1_000, 10_000] {
            cold(n, args.runs).await;
        }
    }
    if only.is_none() || only == Some("short") {
        estate(args.names, Duration::from_secs(args.lifetime), args.minutes).await;
    }
    if only.is_none() || only == Some("stress") {
        estate(200, Duration::from_secs(120), args.minutes.min(5)).await;
    }
}
