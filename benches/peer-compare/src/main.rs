//! Rotation to serving, measured from outside: each server is its own process, the client is
//! this one. Ours is the `serve` example (`--cert-dir`, default poll 10 s); the peer is a
//! tokio-rustls loop on `tls_hot_reload::load_server_config`. For each scenario the time is from
//! the write (the `..data` rename, or the end of an in-place write) to the first handshake that
//! gets the new certificate; a scenario not served within the cap is reported as such.
//!
//! `peer-compare SERVE_BINARY [SWAPS [RUNS [GAP_US]]]` (RUNS: the swaps repeated with fresh
//! servers, each run's medians and ratio reported, then their median and spread; 30 swaps and 1 run
//! by default; GAP_US microseconds after each swap is served, 0 by default, keep what a server does
//! after a rotation out of the other's next swap); `peer-compare --in-process [SWAPS]` for swap to
//! install inside one process (no client); `peer-compare --handshakes SERVE_BINARY [N [GAP_US]]`
//! for handshakes with no rotation (the floor under every swap figure, each of which ends with
//! one); GAP_US microseconds between handshakes (0 by default) let each server finish what it does
//! after a handshake (its tickets, its HTTP connection) before the other's is timed; `library:MODE`
//! in place of SERVE_BINARY serves with the library in this binary instead, each layer on its own
//! (`loop`, `incoming`, `each`, `http`: see `library_mode`); `peer-compare --peer-server DIR` and
//! `--ours-server MODE DIR` are internal. `PEER_COMPARE_LOGS=1` passes the servers' logs through
//! (`RUST_LOG` sets ours).

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tls_test::{KubeDir, TestCa, TestCert, overwrite_in_place};

/// How long a scenario may take before it counts as not seen (the peer never polls; ours polls
/// every 10 s by default, so anything under 10 s is the fast path).
const CAP: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--ours-server") {
        return ours_server(&args[1], Path::new(&args[2]));
    }
    if args.first().map(String::as_str) == Some("--peer-server") {
        return peer_server(Path::new(&args[1]));
    }
    if args.first().map(String::as_str) == Some("--in-process") {
        let swaps = args
            .get(1)
            .map_or(200, |n| n.parse().expect("SWAPS is a number"));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        return runtime.block_on(in_process(swaps));
    }
    if args.first().map(String::as_str) == Some("--handshakes") {
        let serve = PathBuf::from(
            args.get(1)
                .expect("usage: peer-compare --handshakes SERVE_BINARY [N [GAP_US]]"),
        );
        let n = args
            .get(2)
            .map_or(2000, |n| n.parse().expect("N is a number"));
        let gap = Duration::from_micros(
            args.get(3)
                .map_or(0, |n| n.parse().expect("GAP_US is a number")),
        );
        let runtime = tokio::runtime::Runtime::new().unwrap();
        return runtime.block_on(handshakes(&serve, n, gap));
    }
    let serve = PathBuf::from(
        args.first()
            .expect("usage: peer-compare SERVE_BINARY [SWAPS [RUNS [GAP_US]]]"),
    );
    let swaps: usize = args
        .get(1)
        .map_or(30, |n| n.parse().expect("SWAPS is a number"));
    let runs: usize = args
        .get(2)
        .map_or(1, |n| n.parse().expect("RUNS is a number"));
    let gap = Duration::from_micros(
        args.get(3)
            .map_or(0, |n| n.parse().expect("GAP_US is a number")),
    );
    assert!(swaps > 0 && runs > 0, "SWAPS and RUNS are at least 1");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(compare(&serve, swaps, runs, gap));
}

/// The peer, as its README shows it: a `ServerConfig` from `load_server_config`, an accept loop.
fn peer_server(dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = tls_hot_reload::load_server_config(
            dir.join("tls.key").display().to_string(),
            dir.join("tls.crt").display().to_string(),
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening on https://{}", listener.local_addr().unwrap());
        handshake_loop(listener, Arc::new(config)).await
    });
}

/// The peer's server: each connection's handshake in a task of its own, the connection dropped
/// once it is made. `library:loop` runs our config under this same loop.
async fn handshake_loop(listener: tokio::net::TcpListener, config: Arc<rustls::ServerConfig>) -> ! {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (tcp, _) = listener.accept().await.unwrap();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _ = acceptor.accept(tcp).await;
        });
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Server {
    Ours,
    Peer,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Self::Ours => "tls-rotation serve",
            Self::Peer => "tls-hot-reload 0.4.1",
        }
    }
}

/// A server process; killed on drop.
struct Running {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(server: Server, serve: &Path, dir: &Path) -> Option<Running> {
    let mut command = match (server, library_mode(serve)) {
        (Server::Ours, Some(mode)) => {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.arg("--ours-server").arg(mode).arg(dir);
            c
        }
        (Server::Ours, None) => {
            let mut c = Command::new(serve);
            c.arg("--cert-dir")
                .arg(dir)
                .args(["--listen", "127.0.0.1:0"]);
            c
        }
        (Server::Peer, _) => {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.arg("--peer-server").arg(dir);
            c
        }
    };
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("PEER_COMPARE_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on https://")
        .and_then(|addr| addr.parse().ok());
    match addr {
        Some(addr) => Some(Running { child, addr }),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// Both servers, each on a kubelet-style directory of its own under `root` holding `cert`, each
/// with an empty list for what is measured of it.
fn start_both<T>(
    serve: &Path,
    root: &Path,
    cert: &TestCert,
) -> Vec<(Server, KubeDir, Running, Vec<T>)> {
    [Server::Ours, Server::Peer]
        .into_iter()
        .map(|server| {
            let kube = KubeDir::new(root.join(server.name().replace(' ', "-"))).unwrap();
            write(&kube, cert);
            let running = start(server, serve, kube.path()).expect("server starts");
            (server, kube, running, Vec::new())
        })
        .collect()
}

fn write(kube: &KubeDir, cert: &TestCert) {
    kube.write(&pair(cert)).unwrap();
}

fn pair(cert: &TestCert) -> [(&'static str, &[u8]); 2] {
    [
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ]
}

/// Handshakes until `cert` is served; the time since `since`, or `None` past the cap.
async fn served(addr: SocketAddr, cert: &TestCert, since: Instant) -> Option<Duration> {
    served_after(addr, cert, since).await.0
}

/// As [`served`], with how many handshakes it took (more than one: the first got the old
/// certificate, the swap not yet installed when the server read its `ClientHello`).
async fn served_after(
    addr: SocketAddr,
    cert: &TestCert,
    since: Instant,
) -> (Option<Duration>, usize) {
    let mut handshakes = 0;
    loop {
        handshakes += 1;
        if let Ok(seen) = tls_test::probe(addr, "localhost").await
            && seen.fingerprint == cert.fingerprint
        {
            return (Some(since.elapsed()), handshakes);
        }
        if since.elapsed() > CAP {
            return (None, handshakes);
        }
    }
}

/// The value at `p` (0 to 1) of `sorted`, the nearest rank (for an even count the median is the
/// upper of the middle two).
fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Milliseconds to the microsecond: a run of 1,000 tells apart differences of 1%, which two
/// decimals (10 µs in about 700) could not show.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn compare(serve: &Path, swaps: usize, runs: usize, gap: Duration) {
    let ca = TestCa::new("peer compare");
    let certs: Vec<TestCert> = (0..4).map(|_| ca.leaf(&["localhost"])).collect();

    // 1. The kubelet's `..data` swap, alternating between the two servers; each run with
    //    servers of its own.
    let mut all = Vec::with_capacity(runs);
    for run in 1..=runs {
        if runs > 1 {
            println!("# run {run} of {runs}");
        }
        all.push(swap_run(serve, swaps, &certs, gap).await);
    }
    if runs > 1 {
        summarize(&all);
    }

    // 2. Layout changes, a fresh server for each.
    println!("\n## layout changes (time to serve; the cap is {CAP:?})");
    for scenario in Scenario::ALL {
        for server in [Server::Ours, Server::Peer] {
            let outcome = scenario.run(server, serve, &certs).await;
            println!("{:52} {:22} {outcome}", scenario.name(), server.name());
        }
    }
}

/// One run of alternating `..data` swaps on fresh servers, `gap` after each one is served;
/// prints it and returns the two medians (ours, the peer's).
async fn swap_run(serve: &Path, swaps: usize, certs: &[TestCert], gap: Duration) -> [Duration; 2] {
    let root = tempfile::tempdir().unwrap();
    let mut setups = start_both(serve, root.path(), &certs[0]);
    for i in 0..swaps * 2 {
        let (_, kube, running, times) = &mut setups[i % 2];
        let cert = &certs[1 + (i / 2) % 3];
        let staged = kube.stage(&pair(cert)).unwrap();
        let since = Instant::now();
        staged.swap().unwrap();
        staged.finish().unwrap();
        let finished = since.elapsed();
        let (took, handshakes) = served_after(running.addr, cert, since).await;
        times.push((took, handshakes, finished));
        if !gap.is_zero() {
            // Blocking on purpose: nothing else runs in this process meanwhile.
            std::thread::sleep(gap);
        }
    }
    println!(
        "## kubelet `..data` swap, {swaps} swaps each, alternating, {} us after each",
        gap.as_micros()
    );
    let mut medians = Vec::new();
    for (server, _, _, times) in &setups {
        let mut seen: Vec<Duration> = times.iter().filter_map(|(took, ..)| *took).collect();
        seen.sort();
        let missed = times.len() - seen.len();
        let late = times
            .iter()
            .filter(|(_, handshakes, _)| *handshakes > 1)
            .count();
        let mut finish: Vec<Duration> = times.iter().map(|(.., finished)| *finished).collect();
        finish.sort();
        let median = percentile(&seen, 0.5);
        medians.push(median);
        println!(
            "{:22} median {}  p90 {}  min {}  max {}  not served within {CAP:?}: {missed}  \
             old certificate at the first handshake: {late}\n{:22} the client's own rename and \
             removal of the old generation: median {:.1} us",
            server.name(),
            ms(median),
            ms(percentile(&seen, 0.9)),
            ms(seen[0]),
            ms(seen[seen.len() - 1]),
            "",
            percentile(&finish, 0.5).as_secs_f64() * 1e6,
        );
    }
    println!(
        "ratio (ours / peer, median): {:.3}x",
        medians[0].as_secs_f64() / medians[1].as_secs_f64()
    );
    [medians[0], medians[1]]
}

/// The runs side by side: each server's medians, each run's ratio, and the median and spread
/// (lowest to highest) of both.
fn summarize(runs: &[[Duration; 2]]) {
    let list = |values: &[f64], unit: &str| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let each: Vec<String> = values.iter().map(|v| format!("{v:.2}{unit}")).collect();
        format!(
            "{}; median {:.2}{unit}, spread {:.2}{unit} to {:.2}{unit}",
            each.join(", "),
            percentile(&sorted, 0.5),
            sorted[0],
            sorted[sorted.len() - 1],
        )
    };
    let ms_of = |i: usize| -> Vec<f64> { runs.iter().map(|r| r[i].as_secs_f64() * 1e3).collect() };
    let ratios: Vec<f64> = runs
        .iter()
        .map(|r| r[0].as_secs_f64() / r[1].as_secs_f64())
        .collect();
    let slower = ratios.iter().filter(|r| **r > 1.0).count();
    println!("\n## {} runs", runs.len());
    for (i, server) in [Server::Ours, Server::Peer].into_iter().enumerate() {
        println!("{:22} medians {}", server.name(), list(&ms_of(i), " ms"));
    }
    println!(
        "ratios (ours / peer)   {}; runs where ours was slower: {slower}",
        list(&ratios, "x")
    );
}

#[derive(Clone, Copy)]
enum Scenario {
    RemovedAndLaidOutAgain,
    AppearsAfterStart,
    InPlaceBehindDataLinks,
    InPlaceBehindLinkToAnotherDirectory,
}

impl Scenario {
    const ALL: [Self; 4] = [
        Self::RemovedAndLaidOutAgain,
        Self::AppearsAfterStart,
        Self::InPlaceBehindDataLinks,
        Self::InPlaceBehindLinkToAnotherDirectory,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::RemovedAndLaidOutAgain => "directory removed and laid out again",
            Self::AppearsAfterStart => "certificate directory created after start",
            Self::InPlaceBehindDataLinks => "in-place write behind the ..data links",
            Self::InPlaceBehindLinkToAnotherDirectory => {
                "in-place write to a link target elsewhere"
            }
        }
    }

    async fn run(self, server: Server, serve: &Path, certs: &[TestCert]) -> String {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tls");
        let (first, next) = (&certs[0], &certs[1]);
        let outcome =
            |t: Option<Duration>| t.map_or_else(|| format!("not served within {CAP:?}"), ms);
        match self {
            Self::AppearsAfterStart => {
                let Some(running) = ({
                    let (later, serve) = (dir.clone(), serve.to_path_buf());
                    // Ours waits for its first certificate; the peer cannot start without one.
                    let start = std::thread::spawn(move || start(server, &serve, &later));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let kube = KubeDir::new(&dir).unwrap();
                    write(&kube, next);
                    let since = Instant::now();
                    let running = start.join().unwrap();
                    running.map(|r| (r, since))
                }) else {
                    return "does not start without the files".into();
                };
                let (running, since) = running;
                outcome(served(running.addr, next, since).await)
            }
            Self::RemovedAndLaidOutAgain => {
                let kube = KubeDir::new(&dir).unwrap();
                write(&kube, first);
                let running = start(server, serve, &dir).expect("server starts");
                std::fs::remove_dir_all(&dir).unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                let kube = KubeDir::new(&dir).unwrap();
                let staged = kube.stage(&pair(next)).unwrap();
                let since = Instant::now();
                staged.swap().unwrap();
                staged.finish().unwrap();
                outcome(served(running.addr, next, since).await)
            }
            Self::InPlaceBehindDataLinks => {
                let kube = KubeDir::new(&dir).unwrap();
                write(&kube, first);
                let running = start(server, serve, &dir).expect("server starts");
                let real = |name| std::fs::canonicalize(dir.join(name)).unwrap();
                overwrite_in_place(&real("tls.key"), next.key_pem.as_bytes()).unwrap();
                overwrite_in_place(&real("tls.crt"), next.chain_pem.as_bytes()).unwrap();
                let since = Instant::now();
                outcome(served(running.addr, next, since).await)
            }
            Self::InPlaceBehindLinkToAnotherDirectory => {
                let elsewhere = root.path().join("elsewhere");
                std::fs::create_dir_all(&elsewhere).unwrap();
                std::fs::create_dir_all(&dir).unwrap();
                for (name, content) in pair(first) {
                    std::fs::write(elsewhere.join(name), content).unwrap();
                    std::os::unix::fs::symlink(elsewhere.join(name), dir.join(name)).unwrap();
                }
                let running = start(server, serve, &dir).expect("server starts");
                overwrite_in_place(&elsewhere.join("tls.key"), next.key_pem.as_bytes()).unwrap();
                overwrite_in_place(&elsewhere.join("tls.crt"), next.chain_pem.as_bytes()).unwrap();
                let since = Instant::now();
                outcome(served(running.addr, next, since).await)
            }
        }
    }
}

/// Swap to install, inside one process, without a client: each library's resolver is read in a
/// loop on the bench's own thread until it holds the new certificate, yielding between reads
/// (a reader that never yields keeps its core from a library thread the scheduler put there:
/// the time then measured where each library's threads were placed, and the peer's p90 was
/// 3 ms in 2026-12-04's runs against 0.3 ms with the yield). What the black-box figure cannot
/// show: it counts whole handshakes of the client (about 0.3 ms each).
async fn in_process(swaps: usize) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = TestCa::new("in process");
    let certs: Vec<TestCert> = (0..4).map(|_| ca.leaf(&["localhost"])).collect();
    let root = tempfile::tempdir().unwrap();
    let ours_dir = KubeDir::new(root.path().join("ours")).unwrap();
    let peer_dir = KubeDir::new(root.path().join("peer")).unwrap();
    write(&ours_dir, &certs[0]);
    write(&peer_dir, &certs[0]);
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .spawn(tls_source::FileSource::kubernetes_dir(ours_dir.path()).build())
        .unwrap();
    reloader.ready().await.unwrap();
    let resolver = reloader.resolver();
    let peer = tls_hot_reload::CertifiedKeyWatched::new(
        peer_dir.file("tls.key").display().to_string(),
        peer_dir.file("tls.crt").display().to_string(),
    )
    .await
    .unwrap();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..swaps * 2 {
        let cert = &certs[1 + (i / 2) % 3];
        let dir = if i % 2 == 0 { &ours_dir } else { &peer_dir };
        let staged = dir.stage(&pair(cert)).unwrap();
        let ours_turn = i % 2 == 0;
        let since = Instant::now();
        staged.swap().unwrap();
        // Read on this thread, which is not one of the runtime's workers (`block_on` runs the
        // future here): no thread to start after the swap (spawning one took 0.2 to 0.5 ms on
        // the 2-core VM, counted against whichever library kept the other core busy), and the
        // time is taken the moment the certificate is seen, not after a join.
        let took = loop {
            let leaf = if ours_turn {
                resolver.current().unwrap().cert[0].clone()
            } else {
                peer.cloned().cert[0].clone()
            };
            if leaf == cert.cert_der {
                break since.elapsed();
            }
            assert!(since.elapsed() < CAP, "not installed");
            std::thread::yield_now();
        };
        staged.finish().unwrap();
        if ours_turn {
            ours.push(took)
        } else {
            theirs.push(took)
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut medians = Vec::new();
    for (name, mut times) in [("tls-rotation", ours), ("tls-hot-reload 0.4.1", theirs)] {
        times.sort();
        let median = percentile(&times, 0.5);
        medians.push(median);
        println!(
            "{name:22} swap to install: median {:.1} us  p90 {:.1} us",
            median.as_secs_f64() * 1e6,
            percentile(&times, 0.9).as_secs_f64() * 1e6
        );
    }
    println!(
        "ratio (ours / peer, median): {:.2}x",
        medians[0].as_secs_f64() / medians[1].as_secs_f64()
    );
}

/// Handshakes with no rotation, alternating between the two servers: the floor under the swap
/// figures (each of which ends with one such handshake). With a `gap`, the client waits that
/// long after each one, so that a server's work after a handshake does not land in the other's
/// timing (in the swap runs, the client's untimed staging of the next swap plays that part).
async fn handshakes(serve: &Path, n: usize, gap: Duration) {
    let ca = TestCa::new("peer compare");
    let cert = ca.leaf(&["localhost"]);
    let root = tempfile::tempdir().unwrap();
    let mut setups = start_both(serve, root.path(), &cert);
    for i in 0..n * 2 {
        let (_, _, running, times) = &mut setups[i % 2];
        let since = Instant::now();
        let seen = tls_test::probe(running.addr, "localhost").await.unwrap();
        times.push(since.elapsed());
        assert_eq!(seen.fingerprint, cert.fingerprint);
        if !gap.is_zero() {
            // Blocking on purpose: nothing else runs in this process meanwhile.
            std::thread::sleep(gap);
        }
    }
    println!(
        "## handshakes, no rotation, {n} each, alternating, {} us between them",
        gap.as_micros()
    );
    let mut medians = Vec::new();
    for (server, _, _, times) in &mut setups {
        times.sort();
        let median = percentile(times, 0.5);
        medians.push(median);
        println!(
            "{:22} median {:.1} us  p90 {:.1} us",
            server.name(),
            median.as_secs_f64() * 1e6,
            percentile(times, 0.9).as_secs_f64() * 1e6
        );
    }
    println!(
        "ratio (ours / peer, median): {:.3}x",
        medians[0].as_secs_f64() / medians[1].as_secs_f64()
    );
}

/// `library:MODE` in place of SERVE_BINARY: the library in this process's binary, with no HTTP
/// server unless MODE says so, to tell what each layer costs: `loop` (the peer's accept loop on
/// `Reloader::server_config`), `incoming` (the `Incoming` stream, each connection dropped in a
/// task of its own), `each` (`Incoming::spawn_each`, each dropped in its handshake's task),
/// `http` (`http::serve_http`, as `serve` serves).
fn library_mode(serve: &Path) -> Option<&str> {
    serve.to_str()?.strip_prefix("library:")
}

/// Our library serving `dir` the `mode` [`library_mode`] names.
fn ours_server(mode: &str, dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let reloader =
            tls_reload::Reloader::spawn(tls_source::FileSource::kubernetes_dir(dir).build())
                .unwrap();
        reloader.ready().await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening on https://{}", listener.local_addr().unwrap());
        if mode == "loop" {
            handshake_loop(listener, Arc::new(reloader.server_config().unwrap())).await;
        }
        let incoming = reloader.incoming(listener).unwrap();
        match mode {
            "incoming" => {
                use futures::StreamExt as _;
                let mut incoming = incoming;
                while let Some(Ok(conn)) = incoming.next().await {
                    tokio::spawn(async move { drop(conn) });
                }
            }
            "each" => drop(incoming.spawn_each(|conn| async move { drop(conn) }).await),
            "http" => {
                let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
                tls_reload::http::serve_http(incoming, app).await;
            }
            other => panic!("library:{other}: the modes are loop, incoming, each and http"),
        }
    });
}
