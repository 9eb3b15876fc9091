//! An estate of N labelled `kubernetes.io/tls` Secrets served by `serve --k8s-secrets`, measured
//! from outside as a user would (issue 23; BENCHMARKS.md row 11):
//!
//! - start until ready (serve listens once every listed Secret is considered), against the time a
//!   plain HTTP client takes to fetch the same list from the same emulator in the same run;
//! - the resident set of `serve` per route, beyond an empty estate's, and beyond the certificate
//!   and key bytes, with `--metrics` off and on;
//! - one Secret rotated, added or deleted until a handshake for its name is served the change
//!   (from the emulator's time of the write);
//! - a relist (the watch's history compacted and its stream closed, so the watcher gets 410 and
//!   lists again) until a Secret changed meanwhile is served, while every other name probed keeps
//!   being served its own certificate.
//!
//! The emulator runs in a process of its own (this binary, `estate emulator N`), so that neither
//! its memory nor its CPU counts as `serve`'s.
//!
//! `cargo build --release --example serve && cargo run --release -p benches --bin estate --
//! [--serve PATH] [--changes K] [--metrics] N...` (default N: 1000 10000 50000; K: 15).

use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tls_test::{TestCa, TestCert};

const NAMESPACE: &str = "default";
const LABEL: (&str, &str) = ("app", "scale");
/// How long serve gets to become ready, and a change to be served.
const PATIENCE: Duration = Duration::from_secs(600);

fn host(i: usize) -> String {
    format!("host-{i}.scale.test")
}

fn secret(i: usize) -> String {
    format!("scale-{i}")
}

fn unix_nanos(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

// ---------------------------------------------------------------------------------------------
// The emulator process: N Secrets, then one command a line on stdin, one answer a line on stdout.

/// `estate emulator N`: prints `url URL BYTES` (BYTES: the certificate and key DER of all N),
/// then answers `rotate I`, `add I`, `delete I`, `relist I` (compact and close the watches, then
/// rotate I) with `done FINGERPRINT WRITTEN_AT_UNIX_NANOS`.
fn emulator(n: usize) {
    let runtime = benches::runtime(1);
    let api = runtime.block_on(tls_test::KubeApi::start());
    let ca = TestCa::new("estate");
    let mut bytes = 0usize;
    for i in 0..n {
        let cert = leaf(&ca, i);
        bytes += cert.cert_der.len() + cert.key_der.len();
        put(&api, i, &cert, true);
    }
    println!("url {} {bytes}", api.url());
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        let mut words = line.split_whitespace();
        let (Some(command), Some(i)) = (words.next(), words.next()) else {
            continue;
        };
        let i: usize = i.parse().expect("an index");
        let (fingerprint, at) = match command {
            "rotate" | "add" => {
                let cert = leaf(&ca, i);
                let rv = put(&api, i, &cert, command == "add");
                (cert.fingerprint, api.written_at(rv).expect("written"))
            }
            "delete" => {
                assert!(
                    api.delete("secrets", NAMESPACE, &secret(i)),
                    "scale-{i} exists"
                );
                ("-".to_owned(), SystemTime::now())
            }
            "relist" => {
                api.compact();
                api.close_watches();
                let at = SystemTime::now();
                let cert = leaf(&ca, i);
                put(&api, i, &cert, false);
                (cert.fingerprint, at)
            }
            other => panic!("unknown command {other}"),
        };
        println!("done {fingerprint} {}", unix_nanos(at));
        std::io::stdout().flush().expect("stdout");
    }
}

/// A leaf for host `i`, valid for 90 days as an ACME CA's (a shorter one would be inside the
/// expiry-warning window, and every route would log a warning).
fn leaf(ca: &TestCa, i: usize) -> TestCert {
    let now = SystemTime::now();
    ca.leaf_valid(
        &[&host(i)],
        now - Duration::from_secs(3600),
        now + Duration::from_secs(90 * 86400),
    )
}

/// Writes Secret `i` with `cert` (labelled when `new`); returns the resourceVersion at which it
/// is visible to the label-selector watch.
fn put(api: &tls_test::KubeApi, i: usize, cert: &TestCert, new: bool) -> u64 {
    let rv = api.put_secret(
        NAMESPACE,
        &secret(i),
        &[
            ("tls.crt", cert.cert_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
        ],
    );
    if new {
        api.set_label("secrets", NAMESPACE, &secret(i), LABEL.0, LABEL.1)
    } else {
        rv
    }
}

struct Emulator {
    child: Child,
    stdin: ChildStdin,
    stdout: std::io::BufReader<ChildStdout>,
    addr: SocketAddr,
    url: String,
    /// The certificate and key DER of the N Secrets.
    material: usize,
}

impl Emulator {
    fn start(n: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .args(["emulator", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("emulator process");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("emulator's url");
        let mut words = line.split_whitespace().skip(1);
        let url = words.next().expect("url").to_owned();
        let material = words.next().and_then(|b| b.parse().ok()).expect("bytes");
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("emulator address");
        Self {
            child,
            stdin,
            stdout,
            addr,
            url,
            material,
        }
    }

    /// Sends `command i`; returns the fingerprint written and when.
    fn command(&mut self, command: &str, i: usize) -> (String, SystemTime) {
        writeln!(self.stdin, "{command} {i}").expect("emulator stdin");
        self.stdin.flush().expect("emulator stdin");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("emulator answer");
        let mut words = line.split_whitespace().skip(1);
        let fingerprint = words.next().expect("fingerprint").to_owned();
        let nanos: u64 = words.next().and_then(|n| n.parse().ok()).expect("time");
        (fingerprint, UNIX_EPOCH + Duration::from_nanos(nanos))
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The measuring side.

struct Serve {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port on loopback, never one this process was given before (`tls_test::free_port`).
fn free_port() -> u16 {
    tls_test::free_port().port()
}

/// The time this machine's CPUs were taken by its host (`steal` in `/proc/stat`): on a virtual
/// machine a busy host makes a run slower than the code, and this says by how much.
fn steal() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks = stat
        .lines()
        .next()
        .and_then(|cpu| cpu.split_whitespace().nth(8))
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The share of the machine's CPU time stolen by the host over `wall`, in percent.
fn stolen(taken: Duration, wall: Duration) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    100.0 * taken.as_secs_f64() / (wall.as_secs_f64() * cores).max(1e-9)
}

/// The CPU time (user and system) the process has used.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|t| t.parse::<u64>().ok()))
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// The time a plain HTTP client takes to fetch the label-selected list (the body read whole).
async fn plain_list(addr: SocketAddr) -> (Duration, usize) {
    let path = format!(
        "/api/v1/namespaces/{NAMESPACE}/secrets?labelSelector={}%3D{}",
        LABEL.0, LABEL.1
    );
    let start = Instant::now();
    let response = tls_test::plain_get(addr, &path).await.expect("list");
    (start.elapsed(), response.len())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Waits until a handshake for `name` is served `fingerprint`; the time since `since`.
async fn served_after(
    addr: SocketAddr,
    name: &str,
    fingerprint: &str,
    since: SystemTime,
) -> Duration {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if tls_test::served_as(addr, name).await.ok().as_deref() == Some(fingerprint) {
            return SystemTime::now().duration_since(since).unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "{name} never served {fingerprint}"
        );
    }
}

struct Figures {
    n: usize,
    list: Duration,
    list_bytes: usize,
    ready: Duration,
    ready_cpu: Duration,
    /// The share of CPU time the host took during the lists and during the start (percent).
    list_stolen: f64,
    ready_stolen: f64,
    rss_kib: u64,
    material: usize,
    rotate: Duration,
    add: Duration,
    delete: Duration,
    relist: Duration,
    relist_wrong: usize,
    relist_probes: usize,
    status_page: Duration,
}

fn start_serve(serve: &Path, emulator: &Emulator, metrics: bool) -> (Serve, Instant) {
    let dir = tempfile::tempdir().expect("tempdir");
    let default = TestCa::new("default").leaf(&["localhost"]);
    std::fs::write(dir.path().join("tls.crt"), &default.cert_pem).expect("write");
    std::fs::write(dir.path().join("tls.key"), &default.key_pem).expect("write");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, tls_test::kubeconfig(&emulator.url)).expect("kubeconfig");
    let port = free_port();
    let mut command = Command::new(serve);
    command
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--key")
        .arg(dir.path().join("tls.key"))
        .args(["--k8s-secrets", NAMESPACE, "--selector"])
        .arg(format!("{}={}", LABEL.0, LABEL.1))
        .args(["--ready-timeout", "10m"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if metrics {
        command
            .arg("--metrics")
            .arg(format!("127.0.0.1:{}", free_port()));
    }
    let start = Instant::now();
    let child = command.spawn().expect("serve");
    (
        Serve {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        },
        start,
    )
}

/// Waits until serve listens (it does once ready).
async fn until_listening(addr: SocketAddr) {
    let deadline = Instant::now() + PATIENCE;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "serve never listened");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn measure(serve: &Path, n: usize, changes: usize, metrics: bool) -> Figures {
    let mut emulator = Emulator::start(n);
    let mut lists = Vec::new();
    let mut list_bytes = 0;
    let (list_start, list_steal) = (Instant::now(), steal());
    for _ in 0..3 {
        let (took, bytes) = plain_list(emulator.addr).await;
        lists.push(took);
        list_bytes = bytes;
    }
    let list_stolen = stolen(steal() - list_steal, list_start.elapsed());
    let ready_steal = steal();
    let (server, start) = start_serve(serve, &emulator, metrics);
    until_listening(server.addr).await;
    let ready = start.elapsed();
    let ready_stolen = stolen(steal() - ready_steal, ready);
    let ready_cpu = cpu(server.child.id());
    // Every name probed is served its own certificate from the first handshake (the probe of
    // the names themselves is the test's job; here: that the estate is in).
    let status_start = Instant::now();
    let (code, body, _) = tls_test::https_get(server.addr, "localhost", "/")
        .await
        .expect("status page");
    let status_page = status_start.elapsed();
    assert_eq!(code, 200);
    let routes = body.matches("\"names\"").count();
    assert_eq!(routes, n, "every Secret is a route in the status");
    // The resident set once settled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_kib = benches::rss_kib(Some(server.child.id()));

    let mut rotate = Vec::new();
    let mut add = Vec::new();
    let mut delete = Vec::new();
    for k in 0..changes {
        let i = (k * 7919) % n.max(1);
        if n > 0 {
            let (fingerprint, at) = emulator.command("rotate", i);
            rotate.push(served_after(server.addr, &host(i), &fingerprint, at).await);
        }
        let new = n + k;
        let (fingerprint, at) = emulator.command("add", new);
        add.push(served_after(server.addr, &host(new), &fingerprint, at).await);
        let default = tls_test::served_as(server.addr, "unknown.scale.test")
            .await
            .expect("the default");
        let (_, at) = emulator.command("delete", new);
        delete.push(served_after(server.addr, &host(new), &default, at).await);
    }

    // A relist: every other name keeps its own certificate meanwhile.
    let (relist, relist_wrong, relist_probes) = if n > 0 {
        let mut expected = std::collections::HashMap::new();
        let sample: Vec<usize> = (0..50).map(|k| (k * 104_729 + 13) % n).collect();
        for &i in &sample {
            let got = tls_test::served_as(server.addr, &host(i))
                .await
                .expect("served");
            expected.insert(i, got);
        }
        let changed = (n / 2 + 1) % n;
        expected.remove(&changed);
        let (fingerprint, at) = emulator.command("relist", changed);
        let deadline = Instant::now() + PATIENCE;
        let (mut wrong, mut probes) = (0, 0);
        let took = loop {
            // Another name first: the probes run while the list is applied.
            let i = sample[probes % sample.len()];
            if i != changed {
                let got = tls_test::served_as(server.addr, &host(i)).await.ok();
                if got.as_ref() != expected.get(&i) {
                    wrong += 1;
                }
            }
            probes += 1;
            if tls_test::served_as(server.addr, &host(changed))
                .await
                .ok()
                .as_deref()
                == Some(fingerprint.as_str())
            {
                break SystemTime::now().duration_since(at).unwrap_or_default();
            }
            assert!(Instant::now() < deadline, "the relist never completed");
        };
        (took, wrong, probes)
    } else {
        (Duration::ZERO, 0, 0)
    };
    drop(server);
    Figures {
        n,
        list: benches::median(lists),
        list_bytes,
        ready,
        ready_cpu,
        list_stolen,
        ready_stolen,
        rss_kib,
        material: emulator.material,
        rotate: benches::median(rotate),
        add: benches::median(add),
        delete: benches::median(delete),
        relist,
        relist_wrong,
        relist_probes,
        status_page,
    }
}

fn report(f: &Figures, empty_rss: u64, metrics: bool) {
    let beyond_empty = f.rss_kib.saturating_sub(empty_rss) * 1024;
    let per_route = beyond_empty / f.n.max(1) as u64;
    let material = f.material / f.n.max(1);
    println!(
        "N={} metrics={}: list (plain HTTP, {:.1} MB) {}, ready {} ({:.2}x the list; CPU {}; host steal {:.0}% during the lists, {:.0}% during the start); RSS {} KiB \
         ({} bytes a route beyond an empty estate's {} KiB; {} of them certificate and key DER, \
         {} beyond); rotate {}, add {}, delete {}; relist until served {} ({} of {} probes of \
         other names served wrong); status page {}",
        f.n,
        if metrics { "on" } else { "off" },
        f.list_bytes as f64 / 1e6,
        ms(f.list),
        ms(f.ready),
        f.ready.as_secs_f64() / f.list.as_secs_f64().max(1e-9),
        ms(f.ready_cpu),
        f.list_stolen,
        f.ready_stolen,
        f.rss_kib,
        per_route,
        empty_rss,
        material,
        per_route.saturating_sub(material as u64),
        ms(f.rotate),
        ms(f.add),
        ms(f.delete),
        ms(f.relist),
        f.relist_wrong,
        f.relist_probes,
        ms(f.status_page),
    );
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("emulator") {
        args.next();
        let n = args.next().and_then(|n| n.parse().ok()).expect("N");
        return emulator(n);
    }
    let mut serve = PathBuf::from("target/release/examples/serve");
    let mut changes = 15;
    let mut metrics = false;
    let mut sizes = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve" => serve = PathBuf::from(args.next().expect("--serve PATH")),
            "--changes" => {
                changes = args
                    .next()
                    .and_then(|k| k.parse().ok())
                    .expect("--changes K");
            }
            "--metrics" => metrics = true,
            n => sizes.push(n.parse().expect("N: a number of Secrets")),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1000, 10_000, 50_000];
    }
    assert!(
        serve.exists(),
        "{} not found: cargo build --release --example serve",
        serve.display()
    );
    let runtime = benches::runtime(1);
    runtime.block_on(async {
        let empty = measure(&serve, 0, 3, metrics).await;
        report(&empty, empty.rss_kib, metrics);
        for n in sizes {
            let figures = measure(&serve, n, changes, metrics).await;
            report(&figures, empty.rss_kib, metrics);
        }
    });
}
