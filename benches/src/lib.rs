//! Shared set-up of the benches (see `BENCHMARKS.md` at the root for what each measures and the
//! figures). Not published.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use tls_reload::Reloader;
use tls_source::{CertBundle, Decoder, Origin};
use tls_test::TestCert;

/// The resident set of a process, in KiB (`pid`: `None` for this one), from `/proc`; 0 where
/// there is no `/proc`.
pub fn rss_kib(pid: Option<u32>) -> u64 {
    let path = pid.map_or_else(
        || "/proc/self/status".to_owned(),
        |p| format!("/proc/{p}/status"),
    );
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The median of `times` (the upper one of an even count); zero for none.
pub fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// A Lease's timing: its duration, the renew deadline, the retry period.
pub type Timing = (Duration, Duration, Duration);

/// The fleet binaries' short Lease: 1.5 s, renewed every 200 ms, given up after 1 s.
pub const SHORT_LEASE: Timing = (
    Duration::from_millis(1500),
    Duration::from_millis(1000),
    Duration::from_millis(200),
);

/// tls-k8s's default Lease timing (client-go's): 15 s, 10 s, 2 s.
pub const DEFAULT_LEASE: Timing = (
    tls_k8s::store::DEFAULT_LEASE_DURATION,
    tls_k8s::store::DEFAULT_RENEW_DEADLINE,
    tls_k8s::store::DEFAULT_RETRY_PERIOD,
);

/// A multi-threaded Tokio runtime of `workers` threads with its I/O and time drivers, as every
/// bench runs its servers and clients on.
///
/// # Panics
/// If the runtime cannot be built.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// The loop users write by hand on `config`: accept, spawn a task, handshake, drop. No session
/// tickets (`send_tls13_tickets = 0`): every handshake is full. Returns where it listens.
///
/// # Panics
/// If no loopback port can be bound.
pub async fn plain_loop(mut config: rustls::ServerConfig) -> std::net::SocketAddr {
    config.send_tls13_tickets = 0;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    addr
}

/// The crypto provider of every bench: aws-lc-rs, as the workspace's tests and `serve`.
pub use tls_test::provider;

/// `n` ECDSA P-256 leaves for `localhost` from one CA.
pub fn certs(n: usize) -> Vec<TestCert> {
    let ca = tls_test::TestCa::new("bench");
    (0..n).map(|_| ca.leaf(&["localhost"])).collect()
}

/// A bundle of `cert` (leaf and CA).
pub fn bundle(cert: &TestCert) -> CertBundle {
    Decoder::new()
        .bundle(
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
            None,
            Origin::Other("bench".into()),
        )
        .expect("bench certificate")
}

/// A `CertifiedKey` of `cert`, as rustls would hold it.
pub fn certified(cert: &TestCert) -> Arc<CertifiedKey> {
    let bundle = bundle(cert);
    Arc::new(
        CertifiedKey::from_der(
            bundle.chain().to_vec(),
            bundle.key().clone_key(),
            &provider(),
        )
        .expect("certified key"),
    )
}

/// A reloader fed through a channel: send a bundle, and it is validated and swapped in.
#[derive(Debug)]
pub struct Fed {
    /// The reloader.
    pub reloader: Reloader,
    /// Where to send bundles.
    pub tx: mpsc::UnboundedSender<Result<CertBundle, tls_source::Error>>,
}

impl Fed {
    /// Spawns on `runtime` and waits until `first` is installed.
    ///
    /// # Panics
    /// If the reloader cannot start.
    pub fn start(runtime: &tokio::runtime::Runtime, first: &TestCert) -> Self {
        Self::start_on(runtime, first, provider())
    }

    /// [`start`](Self::start) on a crypto provider of the caller's.
    ///
    /// # Panics
    /// If the reloader cannot start.
    pub fn start_on(
        runtime: &tokio::runtime::Runtime,
        first: &TestCert,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(Ok(bundle(first))).expect("open channel");
        let reloader = runtime.block_on(async {
            let reloader = Reloader::builder()
                .crypto_provider(provider)
                .spawn(rx)
                .expect("spawn");
            reloader.ready().await.expect("ready");
            reloader
        });
        Self { reloader, tx }
    }
}

/// A thread that calls `swap` every `every` until the returned guard is dropped.
#[derive(Debug)]
pub struct Swapper {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Swapper {
    /// Starts swapping.
    pub fn start(every: Duration, mut swap: impl FnMut(u64) + Send + 'static) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                swap(n);
                n += 1;
                std::thread::sleep(every);
            }
            n
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops and returns how many swaps were made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a keyed source yields.
pub type KeyedItem = Result<tls_source::Keyed, tls_source::Error>;

/// SNI set-up: `exact` leaves for `host{i}.example.com` and `wildcard` leaves for
/// `*.zone{j}.example.com`, as bundles (nothing sent yet).
pub fn sni_bundles(exact: usize, wildcard: usize) -> Vec<(String, CertBundle)> {
    let ca = tls_test::TestCa::new("sni bench");
    let exact = (0..exact).map(|i| format!("host{i}.example.com"));
    let wildcard = (0..wildcard).map(|j| format!("*.zone{j}.example.com"));
    exact
        .chain(wildcard)
        .enumerate()
        .map(|(i, name)| (format!("bench/route-{i}"), bundle(&ca.leaf(&[&name]))))
        .collect()
}

/// A bundle of a fresh leaf for `name`.
pub fn sni_bundle(name: &str) -> CertBundle {
    bundle(&tls_test::TestCa::new("sni bench").leaf(&[name]))
}

/// A reloader with a default certificate and SNI routes fed by a keyed channel.
#[derive(Debug)]
pub struct FedRoutes {
    /// The reloader.
    pub reloader: Reloader,
    /// Where to send keyed updates.
    pub tx: mpsc::UnboundedSender<KeyedItem>,
}

impl FedRoutes {
    /// Spawns on `runtime` with `default` as the default certificate, sends every route and
    /// waits until all are installed and in the SNI table.
    ///
    /// # Panics
    /// If the reloader cannot start or the routes do not arrive.
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        default: &TestCert,
        routes: Vec<(String, CertBundle)>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded();
        let (default_tx, default_rx) = mpsc::unbounded();
        default_tx
            .unbounded_send(Ok(bundle(default)))
            .expect("open channel");
        let n = routes.len();
        // The initial list, announced as a watch's is (one table build at its end).
        tx.unbounded_send(Ok(tls_source::Keyed::listing()))
            .expect("open channel");
        for (key, bundle) in routes {
            tx.unbounded_send(Ok(tls_source::Keyed {
                key,
                update: tls_source::KeyedUpdate::Put(bundle),
            }))
            .expect("open channel");
        }
        tx.unbounded_send(Ok(tls_source::Keyed::listed()))
            .expect("open channel");
        let reloader = runtime.block_on(async {
            let reloader = Reloader::builder()
                .crypto_provider(provider())
                .routes(rx)
                .spawn(default_rx.chain(futures::stream::pending()))
                .expect("spawn");
            let mut status = reloader.status();
            status
                .wait_for(|s| {
                    s.ready && s.routes.values().filter(|r| r.current.is_some()).count() == n
                })
                .await
                .expect("routes installed");
            reloader
        });
        assert_eq!(
            reloader.resolver().route_names(),
            n,
            "every name in the table"
        );
        std::mem::forget(default_tx); // keep the default source open
        Self { reloader, tx }
    }
}

/// A TLS 1.3 client that verifies the chain against `cert`'s CA and never resumes: every
/// connection is a full handshake (what the handshake and accept benches measure).
///
/// # Panics
/// If the CA does not parse, which a generated one does.
pub fn verifying_client(cert: &TestCert) -> rustls::ClientConfig {
    verifying_client_on(cert, provider())
}

/// [`verifying_client`] on a crypto provider of the caller's (e.g. one restricted to some
/// key-exchange groups).
///
/// # Panics
/// As [`verifying_client`].
pub fn verifying_client_on(cert: &TestCert, provider: Arc<CryptoProvider>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(
            Decoder::new()
                .certificates("ca", cert.ca_pem.as_bytes())
                .expect("a CA")
                .remove(0),
        )
        .expect("a usable root");
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("aws-lc-rs supports TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.resumption = rustls::client::Resumption::disabled();
    client
}

/// A server of ours for the ACME binaries: the ACME certificates as strict SNI routes,
/// TLS-ALPN-01 answered in its accept stream (what `serve --acme-directory` runs). Stops when
/// dropped.
#[derive(Debug)]
pub struct AcmeServer {
    /// The ACME client.
    pub acme: tls_acme::Acme,
    /// Its reloader.
    pub reloader: Reloader,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AcmeServer {
    fn drop(&mut self) {
        self.task.abort();
        self.reloader.stop();
    }
}

impl AcmeServer {
    /// Builds `builder` and serves its certificates on `listener`.
    ///
    /// # Panics
    /// If the configuration or the reloader cannot be built.
    pub fn start(builder: tls_acme::AcmeBuilder, listener: tokio::net::TcpListener) -> Self {
        let acme = builder.build().expect("a valid configuration");
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .routes(acme.source().expect("the source"))
            .handshake_hook(acme.challenges())
            .sni_strict(true)
            .spawn_routes()
            .expect("a reloader");
        let addr = listener.local_addr().expect("an address");
        let incoming = reloader.incoming(listener).expect("the accept stream");
        let task = tls_test::answer_each(incoming);
        Self {
            acme,
            reloader,
            addr,
            task,
        }
    }

    /// Waits (up to `tls_test::PATIENCE`) until the ACME status satisfies `pred`.
    ///
    /// # Panics
    /// If it does not in time, with the last status.
    pub async fn until(&self, what: &str, mut pred: impl FnMut(&tls_acme::AcmeStatus) -> bool) {
        let mut rx = self.acme.status();
        if tokio::time::timeout(tls_test::PATIENCE, rx.wait_for(|s| pred(s)))
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}: {:#?}", *rx.borrow());
        }
    }
}

/// A `kube::Client` for the API emulator at `url` (all of it, or one client's endpoint), in
/// the namespace `default`.
///
/// # Panics
/// If `url` is not a URL.
pub fn emulator_client(url: &str) -> kube::Client {
    let mut config = kube::Config::new(url.parse().expect("the emulator's URL"));
    config.default_namespace = "default".into();
    kube::Client::try_from(config).expect("a client")
}

/// A replica of an ACME fleet named `web` on the API emulator, for the ACME binaries: replica
/// `n` serves on 127.0.0.`n`, through an endpoint of its own (so it can be cut off).
#[derive(Debug)]
pub struct AcmeReplica {
    /// Which replica (1 to 3): its address and its identity `replica-N`.
    pub n: u8,
    /// Its connection to the API server.
    pub endpoint: tls_test::Endpoint,
    /// The server.
    pub served: AcmeServer,
}

impl AcmeReplica {
    /// Replica `n` of `builder` (its directory and names), on `port`, with the Lease `timing`.
    ///
    /// # Panics
    /// If 127.0.0.`n`:`port` cannot be bound within 10 s.
    pub async fn start(
        api: &tls_test::KubeApi,
        builder: tls_acme::AcmeBuilder,
        n: u8,
        port: u16,
        timing: Timing,
    ) -> Self {
        let endpoint = api.endpoint().await;
        let builder = builder
            .kubernetes(
                emulator_client(&endpoint.url()),
                "default",
                "web",
                format!("replica-{n}"),
            )
            .lease_timing(timing.0, timing.1, timing.2);
        let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::new(127, 0, 0, n), port));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(e) if std::time::Instant::now() > deadline => panic!("{addr}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        Self {
            n,
            endpoint,
            served: AcmeServer::start(builder, listener),
        }
    }

    /// Whether it leads the fleet.
    pub fn leading(&self) -> bool {
        self.served
            .acme
            .leadership()
            .expect("a fleet")
            .borrow()
            .leading
    }

    /// Killed as SIGKILL would: its API connection reset first (it cannot release the Lease),
    /// then everything it runs dropped.
    pub fn kill(self) {
        self.endpoint.partition(tls_test::Link::Reset);
        drop(self);
    }
}

/// Points each of `names` at the replicas that do not lead, in turn (so a killed leader's
/// address is never the one the CA validates at).
pub async fn point_at_followers(
    pebble: &tls_test::Pebble,
    replicas: &[AcmeReplica],
    names: &[String],
) {
    let followers: Vec<u8> = replicas
        .iter()
        .filter(|r| !r.leading())
        .map(|r| r.n)
        .collect();
    for (i, name) in names.iter().enumerate() {
        let n = followers[i % followers.len()];
        pebble
            .add_a(name, std::net::Ipv4Addr::new(127, 0, 0, n))
            .await;
    }
}

/// Whether every name of an ACME client's status is valid (and there is one).
pub fn acme_all_valid(status: &tls_acme::AcmeStatus) -> bool {
    !status.names.is_empty()
        && status
            .names
            .values()
            .all(|n| n.state == tls_acme::NameState::Valid)
}

/// Waits until a handshake for every one of `names` at `addr` verifies against `root`.
///
/// # Panics
/// After five minutes without.
pub async fn until_acme_served(
    addr: std::net::SocketAddr,
    names: &[String],
    root: &rustls::pki_types::CertificateDer<'static>,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    for name in names {
        while tls_test::probe_trusting(addr, name, std::slice::from_ref(root))
            .await
            .is_err()
        {
            assert!(std::time::Instant::now() < deadline, "{name} never served");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
}
