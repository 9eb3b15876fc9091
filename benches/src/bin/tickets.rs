//! Session tickets across three `serve` replicas on 127.0.0.1, with a rustls client (aws-lc-rs,
//! its default key exchange, X25519MLKEM768 first) keeping one session cache and going
//! round-robin:
//!
//! - **resumption across the fleet**: 3,000 connections with `--session-tickets fleet` (three
//!   `--k8s-shared` replicas on the API emulator) and without: the share resumed after the
//!   first;
//! - **what it saves**: the replicas' CPU time (utime + stime from `/proc`) per connection and
//!   the client's handshake time p50/p90 for 3,000 connections, shared tickets (a
//!   `--session-tickets FILE`) against none, with a P-256 and an RSA-2048 certificate;
//! - **rotation under load**: `--session-tickets fleet --ticket-rotation 5s` for a minute under
//!   that load: failed handshakes, and the oldest ticket resumed (a second client collects
//!   tickets at the start and offers one every 250 ms, the oldest first).
//!
//! Build serve first: `cargo build --release -p tls-rotation-serve -p benches --bin tickets`,
//! then `target/release/tickets [--quick]` (`--quick`: 300 connections, rotation for 15 s).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Resumption, Tls13ClientSessionValue,
};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, HandshakeKind, NamedGroup};
use tls_test::{KubeApi, Serve};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn serve_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("SERVE_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().expect("this binary's path");
    let bin = exe.with_file_name("serve");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p tls-rotation-serve (or set SERVE_BIN)",
        bin.display()
    );
    bin
}

/// CPU time (user + system) of process `pid` so far, from `/proc/PID/stat`.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The fields after the command (in parentheses, which may hold spaces).
    let rest = &stat[stat.rfind(')').expect("the command") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 after the command.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn fleet_cpu(replicas: &[Serve]) -> Duration {
    replicas
        .iter()
        .map(|r| cpu(r.child.id().expect("running")))
        .sum()
}

/// A client session store that keeps the TLS 1.3 tickets it is given while `collecting`, with
/// when each came, and offers the oldest first (each once: rustls uses a ticket once): to see
/// how long after it was issued a ticket still resumes.
#[derive(Debug)]
struct OldTickets {
    inner: ClientSessionMemoryCache,
    collecting: std::sync::atomic::AtomicBool,
    tickets: Mutex<std::collections::VecDeque<(Tls13ClientSessionValue, Instant)>>,
    /// When the ticket offered last was issued.
    offered: Mutex<Option<Instant>>,
}

impl ClientSessionStore for OldTickets {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.inner.set_kx_hint(server_name, group);
    }
    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.inner.kx_hint(server_name)
    }
    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(server_name, value);
    }
    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(server_name)
    }
    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.remove_tls12_session(server_name);
    }
    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        if self.collecting.load(std::sync::atomic::Ordering::Relaxed) {
            self.tickets
                .lock()
                .unwrap()
                .push_back((value, Instant::now()));
        }
    }
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        let (value, issued) = self.tickets.lock().unwrap().pop_front()?;
        *self.offered.lock().unwrap() = Some(issued);
        Some(value)
    }
}

fn client(store: Option<Arc<dyn ClientSessionStore>>) -> Arc<ClientConfig> {
    let mut config = tls_test::client_config();
    if let Some(store) = store {
        config.resumption = Resumption::store(store);
    }
    Arc::new(config)
}

/// One connection and a request for a page that is not there (cheap to answer), read whole so
/// the tickets sent after the handshake are kept: how the handshake went and how long it took.
async fn connect(
    addr: std::net::SocketAddr,
    config: &Arc<ClientConfig>,
) -> Result<(HandshakeKind, Duration), String> {
    let start = Instant::now();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    let kind = tls
        .get_ref()
        .1
        .handshake_kind()
        .ok_or("no handshake kind")?;
    tls.write_all(b"GET /none HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    if !response.starts_with(b"HTTP/1.1 404") {
        return Err("no answer".into());
    }
    Ok((kind, took))
}

struct Run {
    resumed: usize,
    failed: usize,
    connections: usize,
    times: Vec<Duration>,
    cpu: Duration,
}

async fn round_robin(replicas: &[Serve], n: usize) -> Run {
    let config = client(None);
    let before = fleet_cpu(replicas);
    let mut run = Run {
        resumed: 0,
        failed: 0,
        connections: n,
        times: Vec::with_capacity(n),
        cpu: Duration::ZERO,
    };
    for i in 0..n {
        match connect(replicas[i % replicas.len()].addr, &config).await {
            Ok((kind, took)) => {
                run.resumed += usize::from(kind == HandshakeKind::Resumed);
                run.times.push(took);
            }
            Err(_) => run.failed += 1,
        }
    }
    run.cpu = fleet_cpu(replicas) - before;
    run
}

fn percentile(times: &[Duration], p: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn report(what: &str, run: &Run) {
    println!(
        "{what}: {} connections, {} failed, resumed {} ({:.2}% of those after the first), replicas' CPU {:.1} µs per connection, handshake p50 {:.0} µs p90 {:.0} µs",
        run.connections,
        run.failed,
        run.resumed,
        100.0 * run.resumed as f64 / (run.connections.saturating_sub(1).max(1)) as f64,
        run.cpu.as_secs_f64() * 1e6 / run.connections as f64,
        percentile(&run.times, 0.5).as_secs_f64() * 1e6,
        percentile(&run.times, 0.9).as_secs_f64() * 1e6,
    );
}

async fn fleet(api: &KubeApi, dir: &Path, name: &str, extra: &[&str]) -> Vec<Serve> {
    let mut replicas = Vec::new();
    for i in 0..3 {
        let home = dir.join(format!("{name}-{i}"));
        std::fs::create_dir_all(&home).unwrap();
        let kubeconfig = home.join("kubeconfig");
        std::fs::write(&kubeconfig, tls_test::kubeconfig(&api.url())).unwrap();
        let identity = format!("{name}-{i}");
        let shared = format!("default/{name}");
        let mut args = vec!["--k8s-shared", &shared, "--identity", &identity];
        args.extend(extra);
        replicas.push(
            Serve::start_with_env(
                &serve_bin(),
                &args,
                &[("KUBECONFIG", kubeconfig.as_os_str())],
            )
            .await,
        );
    }
    if extra.contains(&"fleet") {
        for serve in &replicas {
            serve
                .wait_status("the fleet's ticket keys", |s| {
                    s["session_tickets"]["source"] == "fleet"
                })
                .await;
        }
    }
    replicas
}

async fn files(dir: &Path, key_type: &str, tickets: Option<&Path>) -> Vec<Serve> {
    let (cert, key) = (
        dir.join(format!("{key_type}.crt")),
        dir.join(format!("{key_type}.key")),
    );
    if !cert.exists() {
        let algorithm: &[&str] = match key_type {
            "rsa" => &["-newkey", "rsa:2048"],
            _ => &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
        };
        let made = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-nodes",
                "-days",
                "30",
                "-subj",
                "/CN=localhost",
            ])
            .args(algorithm)
            .args(["-addext", "subjectAltName=DNS:localhost", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl");
        assert!(made.status.success(), "{made:?}");
    }
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let mut args = vec![
            "--cert".to_owned(),
            cert.to_str().unwrap().to_owned(),
            "--key".to_owned(),
            key.to_str().unwrap().to_owned(),
        ];
        if let Some(tickets) = tickets {
            args.extend([
                "--session-tickets".to_owned(),
                tickets.to_str().unwrap().to_owned(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        replicas.push(Serve::start(&serve_bin(), &args).await);
    }
    replicas
}

fn stop(replicas: Vec<Serve>) {
    drop(replicas);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, rotate_for) = if quick {
        (300, Duration::from_secs(15))
    } else {
        (3000, Duration::from_secs(60))
    };
    println!(
        "client: rustls 0.23 on aws-lc-rs, key exchange {:?} first; serve: its default provider (aws-lc-rs)",
        rustls::crypto::aws_lc_rs::default_provider().kx_groups[0].name()
    );
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::start().await;

    // Resumption across the fleet.
    let shared = fleet(&api, dir.path(), "web", &["--session-tickets", "fleet"]).await;
    report(
        "fleet, --session-tickets fleet",
        &round_robin(&shared, n).await,
    );
    stop(shared);
    let alone = fleet(&api, dir.path(), "web-off", &[]).await;
    report(
        "fleet, --session-tickets off",
        &round_robin(&alone, n).await,
    );
    stop(alone);

    // What it saves, by certificate key type.
    let file = dir.path().join("tickets");
    let secret: String = (0..32).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    std::fs::write(
        &file,
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            secret.as_bytes(),
        ),
    )
    .unwrap();
    for key_type in ["p256", "rsa"] {
        let on = files(dir.path(), key_type, Some(&file)).await;
        let with = round_robin(&on, n).await;
        stop(on);
        let off = files(dir.path(), key_type, None).await;
        let without = round_robin(&off, n).await;
        stop(off);
        report(&format!("{key_type}, --session-tickets FILE"), &with);
        report(&format!("{key_type}, --session-tickets off"), &without);
        println!(
            "{key_type}: replicas' CPU per connection, shared tickets / none: {:.3}x",
            with.cpu.as_secs_f64() / without.cpu.as_secs_f64()
        );
    }

    // Rotation under load.
    let rotating = fleet(
        &api,
        dir.path(),
        "web-rotate",
        &["--session-tickets", "fleet", "--ticket-rotation", "5s"],
    )
    .await;
    let store = Arc::new(OldTickets {
        inner: ClientSessionMemoryCache::new(32),
        collecting: std::sync::atomic::AtomicBool::new(true),
        tickets: Mutex::new(std::collections::VecDeque::new()),
        offered: Mutex::new(None),
    });
    let old = client(Some(Arc::clone(&store) as Arc<dyn ClientSessionStore>));
    let addrs: Vec<_> = rotating.iter().map(|r| r.addr).collect();
    // Tickets issued now, one offered every 250 ms from here on.
    let offers = usize::try_from(rotate_for.as_millis() / 250).unwrap_or(usize::MAX);
    // Each connection after the first uses a ticket and brings two: one more a connection.
    for i in 0..offers + 2 {
        connect(addrs[i % addrs.len()], &old)
            .await
            .expect("a full handshake");
    }
    store
        .collecting
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let load = tokio::spawn({
        let addrs = addrs.clone();
        async move {
            let config = client(None);
            let (mut ok, mut failed, mut resumed) = (0usize, 0usize, 0usize);
            let until = Instant::now() + rotate_for;
            let mut i = 0;
            while Instant::now() < until {
                match connect(addrs[i % addrs.len()], &config).await {
                    Ok((kind, _)) => {
                        ok += 1;
                        resumed += usize::from(kind == HandshakeKind::Resumed);
                    }
                    Err(_) => failed += 1,
                }
                i += 1;
            }
            (ok, failed, resumed)
        }
    });
    let (mut oldest_resumed, mut first_full_after, mut old_failed) = (Duration::ZERO, None, 0);
    let until = Instant::now() + rotate_for;
    let mut i = 0;
    while Instant::now() < until {
        *store.offered.lock().unwrap() = None;
        match connect(addrs[i % addrs.len()], &old).await {
            Ok((kind, _)) => {
                if let Some(issued) = *store.offered.lock().unwrap() {
                    let age = issued.elapsed();
                    match kind {
                        HandshakeKind::Resumed => oldest_resumed = oldest_resumed.max(age),
                        _ => {
                            first_full_after.get_or_insert(age);
                        }
                    }
                }
            }
            Err(_) => old_failed += 1,
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (ok, failed, resumed) = load.await.unwrap();
    println!(
        "rotation every 5 s for {} s under load: {ok} handshakes, {failed} failed, {resumed} resumed; tickets issued at the start, one offered every 250 ms ({old_failed} failed): the oldest resumed {:.1} s after it was issued (limit: two periods, 10 s), the first refused (a full handshake) at {:.1} s",
        rotate_for.as_secs(),
        oldest_resumed.as_secs_f64(),
        first_full_after.map_or(f64::NAN, |d| d.as_secs_f64()),
    );
    stop(rotating);
}
