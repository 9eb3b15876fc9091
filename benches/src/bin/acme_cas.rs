//! ACME's DNS-01 on a real DNS server, and a second CA when the first is down, measured against
//! Pebble (Debian `pebble`) and BIND 9 (Debian `bind9`, `bind9-dnsutils`):
//!
//! 1. **DNS-01 through BIND**: 10 wildcard names (`*.wN.example.test`, a certificate each),
//!    their records published by RFC 2136 updates signed with TSIG (`tls_acme::rfc2136`), each
//!    checked on the zone's servers before the CA is told; from start until a handshake for
//!    `x.wN.example.test` verifies against Pebble's root, for every N; then the
//!    `_acme-challenge` records left in the zone (an AXFR). The baseline, in the same run:
//!    the same names through a solver that sets challtestsrv's TXT records in memory (no DNS
//!    protocol, no check).
//! 2. **Fallback**: 10 names, the preferred CA down (an `AcmeLayer` closing every
//!    connection), until every name is served from the second, verified against its root. The
//!    baseline: the second CA alone.
//!
//! Each part runs `--runs` times (default 3), alternating with its baseline.
//! `cargo run --release -p benches --bin acme_cas [-- --runs R]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{AcmeServer, acme_all_valid as all_valid, until_acme_served as until_served};
use rustls::pki_types::CertificateDer;
use tls_acme::rfc2136::{Rfc2136, TsigKey};
use tls_acme::{Acme, AcmeBuilder, ChallengeType, Dns01Solver, FallbackCa, SolverFuture};
use tls_test::{Bind, Pebble, UPDATE_KEY};
use tokio::net::TcpListener;

const PATIENCE: Duration = Duration::from_secs(300);
const NAMES: usize = 10;

fn builder(directory: &str, pebble: &Pebble, state: &std::path::Path) -> AcmeBuilder {
    Acme::builder(directory)
        .contact("ops@example.com")
        .directory_roots(vec![pebble.https_ca_der()])
        .crypto_provider(benches::provider())
        .new_certificates_per_week(10_000)
        .stagger(Duration::ZERO)
        .state_dir(state)
}

/// Starts `builder` on `listener` and waits until every one of `probes` is served a chain of
/// `root`: the time it took.
async fn served(
    builder: AcmeBuilder,
    listener: TcpListener,
    probes: &[String],
    root: &CertificateDer<'static>,
) -> Duration {
    let start = Instant::now();
    let server = AcmeServer::start(builder, listener);
    server.until("every name valid", all_valid).await;
    until_served(server.addr, probes, root).await;
    start.elapsed()
}

/// DNS-01 through challtestsrv's memory (the baseline).
#[derive(Debug)]
struct Challtestsrv(Arc<Pebble>);

impl Dns01Solver for Challtestsrv {
    fn present<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { Ok(self.0.set_txt(record, value).await?) })
    }

    fn clean_up<'a>(&'a self, record: &'a str, _value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { Ok(self.0.clear_txt(record).await?) })
    }
}

fn stats(label: &str, runs: &[Duration]) {
    let ms: Vec<String> = runs
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect();
    println!("{label}: {} ms", ms.join(", "));
}

async fn dns(runs: usize) {
    let mut grants = Bind::builder().zone("example.test", &["* IN A 127.0.0.1"]);
    let mut names = Vec::new();
    let mut probes = Vec::new();
    for n in 0..NAMES {
        grants = grants.grant(&format!("name _acme-challenge.w{n}.example.test. TXT"));
        names.push(format!("*.w{n}.example.test"));
        probes.push(format!("x.w{n}.example.test"));
    }
    let bind = grants
        .start()
        .await
        .expect("BIND 9 (apt install bind9 bind9-dnsutils)");
    let through_bind = Pebble::builder()
        .dns_server(bind.addr())
        .start()
        .await
        .expect("Pebble (apt install pebble)");
    let in_memory = Arc::new(Pebble::builder().start().await.expect("Pebble"));
    let (bind_root, memory_root) = (
        through_bind.issuing_root().await,
        in_memory.issuing_root().await,
    );
    let key = TsigKey::from_file(bind.key_file(UPDATE_KEY)).expect("the key");
    let solver = Arc::new(
        Rfc2136::new(bind.addr().to_string(), key)
            .expect("a solver")
            .propagation(PATIENCE, Duration::from_millis(50)),
    );
    let (mut ours, mut baseline) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let state = tempfile::tempdir().expect("a directory");
        let mut b = builder(&through_bind.directory_url(), &through_bind, state.path())
            .challenge(ChallengeType::Dns01)
            .dns01_solver(Arc::clone(&solver) as Arc<dyn Dns01Solver>);
        for name in &names {
            b = b.name(name.clone());
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let took = served(b, listener, &probes, &bind_root).await;
        let left = bind
            .zone_records("example.test")
            .await
            .into_iter()
            .filter(|r| r.starts_with("_acme-challenge"))
            .count();
        println!(
            "run {run}: DNS-01 through BIND, {NAMES} wildcards: {took:?}; _acme-challenge records left: {left}"
        );
        ours.push(took);

        let state = tempfile::tempdir().expect("a directory");
        let mut b = builder(&in_memory.directory_url(), &in_memory, state.path())
            .challenge(ChallengeType::Dns01)
            .dns01_solver(Arc::new(Challtestsrv(Arc::clone(&in_memory))));
        for name in &names {
            b = b.name(name.clone());
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let took = served(b, listener, &probes, &memory_root).await;
        println!("run {run}: DNS-01 in challtestsrv's memory (baseline): {took:?}");
        baseline.push(took);
    }
    stats("DNS-01 through BIND", &ours);
    stats("baseline, challtestsrv's memory", &baseline);
}

/// `port` on 127.0.0.1 once the last server on it has let it go.
async fn bind(port: u16) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => return listener,
            Err(e) if Instant::now() > deadline => panic!("port {port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn fallback(runs: usize) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    let first = Pebble::builder()
        .tls_port(port)
        .start()
        .await
        .expect("Pebble");
    let second = Pebble::builder()
        .tls_port(port)
        .start()
        .await
        .expect("Pebble");
    let (first_layer, second_root) = (first.layer().await, second.issuing_root().await);
    first_layer.set_unreachable(true);
    let names: Vec<String> = (0..NAMES).map(|n| format!("a{n}.example.com")).collect();
    let (mut ours, mut baseline) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let state = tempfile::tempdir().expect("a directory");
        let mut b = builder(&first_layer.directory_url(), &first, state.path())
            .fallback(FallbackCa::new(second.directory_url()).roots(vec![second.https_ca_der()]));
        for name in &names {
            b = b.name(name.clone());
        }
        let listener = bind(port).await;
        let took = served(b, listener, &names, &second_root).await;
        println!("run {run}: the first CA down, {NAMES} names from the second: {took:?}");
        ours.push(took);

        let state = tempfile::tempdir().expect("a directory");
        let mut b = builder(&second.directory_url(), &second, state.path());
        for name in &names {
            b = b.name(name.clone());
        }
        let listener = bind(port).await;
        let took = served(b, listener, &names, &second_root).await;
        println!("run {run}: the second CA alone (baseline): {took:?}");
        baseline.push(took);
    }
    stats("the first down, served from the second", &ours);
    stats("baseline, the second alone", &baseline);
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut runs = 3;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|r| r.parse().ok()).expect("--runs N"),
            other => panic!("unknown argument {other}: acme_cas [--runs R]"),
        }
    }
    dns(runs).await;
    fallback(runs).await;
}
