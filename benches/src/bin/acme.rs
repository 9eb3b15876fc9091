//! ACME against Pebble (Let's Encrypt's test CA, the Debian package `pebble`), measured:
//!
//! 1. **Start to every name served**, for 1, 10 and 100 names: a server of ours with an empty
//!    state directory (account, orders, TLS-ALPN-01 answered in its accept stream, the
//!    certificates installed as SNI routes) until a handshake for every name verifies against
//!    Pebble's root. The baseline, in the same run against the same Pebble: bare instant-acme
//!    with the same retry policy, every order at once, TLS-ALPN-01 answered by a minimal
//!    rustls acceptor, until every certificate is downloaded (it serves nothing). Ours is run
//!    with the default stagger (new orders 200 ms apart) and with none; then restarted on its
//!    stored state (nothing ordered).
//! 2. **A fleet of three** (127.0.0.1, .2, .3 on the API emulator, 100 names, a 1.5 s Lease):
//!    orders placed, counted on the CA's side (Pebble's log), across two leader kills while
//!    the names are being ordered, then every replica restarted, then a leader killed with
//!    everything issued.
//! 3. **Requests per minute at steady state**: each replica's requests to the API server, and
//!    the fleet's to the CA.
//!
//! `cargo run --release -p benches --bin acme [-- --runs R] [--window SECS] [--names N,N,..]
//! [--only start|fleet] [--state-in DIR]` (defaults: 3 runs, a 60 s window, names 1,10,100,
//! both parts, state directories in the system's temporary directory: give a tmpfs such as
//! `/dev/shm` to see what the disk's syncs cost). Pebble has no rate limits, so the budget
//! of first orders (50 a week per registered domain by default) is raised to let 100 names of
//! one domain through.

use std::collections::HashMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use benches::{
    AcmeReplica, AcmeServer, DEFAULT_LEASE as DEFAULTS, SHORT_LEASE as SHORT, Timing,
    acme_all_valid as all_valid, point_at_followers, until_acme_served as until_served,
};
use bytes::Bytes;
use instant_acme::{
    Account, BodyWrapper, BytesResponse, ChallengeType, HttpClient, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tls_acme::{Acme, AcmeBuilder, NameState};
use tls_test::{AcmeLayer, KubeApi, Pebble};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

/// tls-acme's own polling of an order (`RetryPolicy` in its driver), used by the baseline too.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(120));

/// How long anything here may take before the run is called failed.
const PATIENCE: Duration = Duration::from_secs(300);

/// A budget of first orders large enough for every name here (Pebble has no rate limits).
const BUDGET: u32 = 10_000;

struct Args {
    only: Option<String>,
    state_in: std::path::PathBuf,
    runs: usize,
    window: Duration,
    names: Vec<usize>,
}

fn args() -> Args {
    let mut args = Args {
        only: None,
        state_in: std::env::temp_dir(),
        runs: 3,
        window: Duration::from_secs(60),
        names: vec![1, 10, 100],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().unwrap_or_default();
        match arg.as_str() {
            "--only" => args.only = Some(value),
            "--state-in" => args.state_in = value.into(),
            "--runs" => args.runs = value.parse().expect("--runs: a count"),
            "--window" => {
                args.window = Duration::from_secs(value.parse().expect("--window: seconds"));
            }
            "--names" => {
                args.names = value
                    .split(',')
                    .map(|n| n.parse().expect("--names: counts"))
                    .collect();
            }
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// Ours: a server with the ACME certificates as strict SNI routes, TLS-ALPN-01 in its accept
// stream (what `serve --acme-directory` runs).

type Served = AcmeServer;

/// Pebble's TLS-ALPN port on 127.0.0.1, once the last server on it has let it go.
async fn bind(port: u16) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(listener) => return listener,
            Err(e) if Instant::now() > deadline => panic!("Pebble's TLS-ALPN port {port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

fn builder(directory: &str, pebble: &Pebble, names: &[String]) -> AcmeBuilder {
    let mut builder = Acme::builder(directory)
        .contact("ops@example.com")
        .directory_roots(vec![pebble.https_ca_der()])
        .crypto_provider(benches::provider())
        .new_certificates_per_week(BUDGET);
    for name in names {
        builder = builder.name(name.clone());
    }
    builder
}

/// Ours from an empty (or, `restart`, the given) state directory until every name is served.
async fn ours(
    ca: (&Pebble, &AcmeLayer),
    port: u16,
    names: &[String],
    stagger: Option<Duration>,
    state: &std::path::Path,
) -> Duration {
    let (pebble, layer) = ca;
    let root = pebble.issuing_root().await;
    let listener = bind(port).await;
    let start = Instant::now();
    let mut builder = builder(&layer.directory_url(), pebble, names).state_dir(state);
    if let Some(stagger) = stagger {
        builder = builder.stagger(stagger);
    }
    let served = Served::start(builder, listener);
    served.until("every name valid", all_valid).await;
    until_served(served.addr, names, &root).await;
    start.elapsed()
}

// ---------------------------------------------------------------------------------------------
// The baseline: bare instant-acme and a minimal TLS-ALPN-01 responder.

/// instant-acme's HTTP client (it has none without its default features): hyper-util over
/// rustls trusting Pebble's HTTPS CA.
struct Https(
    hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        BodyWrapper<Bytes>,
    >,
);

impl HttpClient for Https {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let response = self.0.request(req);
        Box::pin(async move {
            // As tls-acme's client: a request the CA does not answer in 30 s fails.
            match tokio::time::timeout(Duration::from_secs(30), response).await {
                Ok(Ok(response)) => Ok(BytesResponse::from(response)),
                Ok(Err(e)) => Err(instant_acme::Error::Other(Box::new(e))),
                Err(_) => Err(instant_acme::Error::Str("the CA did not answer in 30 s")),
            }
        })
    }
}

fn https(pebble: &Pebble) -> Box<dyn HttpClient> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pebble.https_ca_der()).expect("Pebble's CA");
    let config = rustls::ClientConfig::builder_with_provider(benches::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    Box::new(Https(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector),
    ))
}

/// TLS-ALPN-01 challenge certificates by name.
#[derive(Debug, Default)]
struct Responder(Mutex<HashMap<String, Arc<CertifiedKey>>>);

impl ResolvesServerCert for Responder {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

impl Responder {
    fn present(&self, name: &str, digest: &[u8]) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
        params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
        let cert = params.self_signed(&key).expect("a challenge certificate");
        let signing = benches::provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(key.serialize_der().into()))
            .expect("the key");
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                name.to_owned(),
                Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)),
            );
    }
}

/// One name ordered and its certificate downloaded.
async fn bare_order(
    account: &Account,
    responder: &Responder,
    name: &str,
) -> Result<(), instant_acme::Error> {
    let mut order = account
        .new_order(&NewOrder::new(&[Identifier::Dns(name.to_owned())]))
        .await?;
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization?;
        let mut challenge = authorization
            .challenge(ChallengeType::TlsAlpn01)
            .expect("TLS-ALPN-01 offered");
        let digest = challenge.key_authorization().digest();
        responder.present(name, digest.as_ref());
        challenge.set_ready().await?;
    }
    let status = order.poll_ready(&POLL).await?;
    assert_eq!(status, OrderStatus::Ready, "{name}");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
    let csr = rcgen::CertificateParams::new(vec![name.to_owned()])
        .and_then(|p| p.serialize_request(&key))
        .expect("a CSR");
    order.finalize_csr(csr.der()).await?;
    order.poll_certificate(&POLL).await?;
    Ok(())
}

/// Bare instant-acme: a new account, every name ordered at once, until every certificate is
/// downloaded; an error if a request failed (the CA did not answer one in 30 s).
async fn baseline(
    ca: (&Pebble, &AcmeLayer),
    port: u16,
    names: &[String],
) -> Result<Duration, instant_acme::Error> {
    let (pebble, layer) = ca;
    let responder = Arc::new(Responder::default());
    let mut config = rustls::ServerConfig::builder_with_provider(benches::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&responder) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = vec![b"acme-tls/1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = bind(port).await;
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    let start = Instant::now();
    let (account, _) = Account::builder_with_http(https(pebble))
        .create(
            &NewAccount {
                contact: &["mailto:ops@example.com"],
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            layer.directory_url(),
            None,
        )
        .await
        .expect("an account");
    let done = futures::future::join_all(
        names
            .iter()
            .map(|name| bare_order(&account, &responder, name)),
    )
    .await;
    let took = start.elapsed();
    task.abort();
    done.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(took)
}

/// Phase 1: start to every name served, against the baseline, `runs` times per count.
/// One run of phase 1 for `n` names on a Pebble of its own: the baseline's time and
/// requests, ours with no stagger (time, requests), restarted, with the default stagger.
struct Run {
    bare: (Duration, usize),
    quick: (Duration, usize),
    restarted: Duration,
    staggered: Duration,
}

async fn one_run(args: &Args, n: usize) -> Result<Run, instant_acme::Error> {
    let port = tls_test::free_port().port();
    let Some(pebble) = Pebble::builder().tls_port(port).start().await else {
        panic!("Pebble is not installed (apt-get install pebble)");
    };
    let layer = pebble.layer().await;
    let ca = (&pebble, &layer);
    let names = |tag: &str| -> Vec<String> {
        (0..n)
            .map(|i| format!("n{i}.{tag}.n{n}.example.com"))
            .collect()
    };
    let before = layer.requests();
    let took = baseline(ca, port, &names("bare")).await?;
    let bare = (took, layer.requests() - before);

    let state = tempfile::tempdir_in(&args.state_in).expect("a state directory");
    let before = layer.requests();
    let ours_names = names("quick");
    let took = ours(ca, port, &ours_names, Some(Duration::ZERO), state.path()).await;
    let quick = (took, layer.requests() - before);
    let orders = pebble.orders();
    let restarted = ours(ca, port, &ours_names, None, state.path()).await;
    assert_eq!(pebble.orders(), orders, "a restart ordered nothing");

    let state = tempfile::tempdir_in(&args.state_in).expect("a state directory");
    let staggered = ours(ca, port, &names("staggered"), None, state.path()).await;
    Ok(Run {
        bare,
        quick,
        restarted,
        staggered,
    })
}

/// How long one run of phase 1 may take before its Pebble is taken to have stalled.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Phase 1: start to every name served, against the baseline, `runs` times per count.
async fn start_to_served(args: &Args) {
    for &n in &args.names {
        let (mut bare, mut quick, mut staggered, mut restarted) = (vec![], vec![], vec![], vec![]);
        let (mut bare_requests, mut our_requests) = (vec![], vec![]);
        for _ in 0..args.runs {
            // Pebble 2.4 now and then stops answering some of 100 simultaneous requests (seen
            // with bare instant-acme and with ours, a few runs in ten; its directory still
            // answers): such a run is abandoned, said, and run again on a new Pebble.
            let mut attempts = 0;
            let run = loop {
                attempts += 1;
                match tokio::time::timeout(RUN_LIMIT, one_run(args, n)).await {
                    Ok(Ok(run)) => break run,
                    Ok(Err(e)) => println!("  (run abandoned, a request failed: {e})"),
                    Err(_) => {
                        println!("  (run abandoned: not done in {RUN_LIMIT:?}, Pebble stalled)");
                    }
                }
                assert!(attempts < 4, "four runs abandoned");
            };
            bare.push(run.bare.0);
            bare_requests.push(run.bare.1);
            quick.push(run.quick.0);
            our_requests.push(run.quick.1);
            restarted.push(run.restarted);
            staggered.push(run.staggered);
        }
        let show = |v: &[Duration]| {
            let list: Vec<String> = v.iter().map(|d| format!("{:.0}", ms(*d))).collect();
            format!(
                "median {:.0} ms [{}]",
                ms(benches::median(v.to_vec())),
                list.join(", ")
            )
        };
        let (b, q) = (
            benches::median(bare.clone()),
            benches::median(quick.clone()),
        );
        println!(
            "{n} names, start until every name served ({} runs):",
            args.runs
        );
        println!(
            "  bare instant-acme (certificates downloaded): {}",
            show(&bare)
        );
        println!(
            "  ours, no stagger: {} = {:.2}x, {:.0} ms more than bare",
            show(&quick),
            q.as_secs_f64() / b.as_secs_f64(),
            ms(q.saturating_sub(b))
        );
        println!(
            "  ours, default stagger (200 ms between new orders): {}",
            show(&staggered)
        );
        println!(
            "  ours restarted on its stored state (0 orders): {}",
            show(&restarted)
        );
        println!("  requests to the CA per run: bare {bare_requests:?}, ours {our_requests:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Phase 2 and 3: a fleet of three.

/// Where the fleet is: the API server, the CA (and the layer in front of it that counts
/// requests), the port every replica serves on, the names.
struct Fleet<'a> {
    api: &'a KubeApi,
    pebble: &'a Pebble,
    layer: &'a AcmeLayer,
    port: u16,
    names: &'a [String],
}

type Replica = AcmeReplica;

/// Replica `n` of the fleet (127.0.0.`n`), with the Lease `timing`.
async fn start_replica(fleet: &Fleet<'_>, n: u8, timing: Timing) -> Replica {
    let builder = builder(&fleet.layer.directory_url(), fleet.pebble, fleet.names);
    AcmeReplica::start(fleet.api, builder, n, fleet.port, timing).await
}

/// How many names `replica` shows valid.
fn valid(replica: &Replica) -> usize {
    replica
        .served
        .acme
        .status()
        .borrow()
        .names
        .values()
        .filter(|n| n.state == NameState::Valid)
        .count()
}

async fn wait(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Kills the leader as SIGKILL would (its API connection reset, everything dropped; the Lease
/// is not released) and starts a replica in its place.
async fn kill_leader(fleet: &Fleet<'_>, replicas: &mut Vec<Replica>) {
    let i = replicas
        .iter()
        .position(Replica::leading)
        .expect("a leader");
    point_at_followers(fleet.pebble, replicas, fleet.names).await;
    let old = replicas.remove(i);
    let n = old.n;
    old.kill();
    replicas.insert(i, start_replica(fleet, n, SHORT).await);
}

/// Every replica dropped, and three started with `timing`: until each is ready and serves
/// every name (the time returned), and one leads with every name valid.
async fn restart(
    fleet: &Fleet<'_>,
    replicas: Vec<Replica>,
    timing: Timing,
) -> (Vec<Replica>, Duration) {
    let root = fleet.pebble.issuing_root().await;
    drop(replicas);
    let start = Instant::now();
    let mut replicas = Vec::new();
    for n in 1..=3 {
        replicas.push(start_replica(fleet, n, timing).await);
    }
    for replica in &replicas {
        replica
            .served
            .reloader
            .ready_timeout(PATIENCE)
            .await
            .expect("ready");
        until_served(replica.served.addr, fleet.names, &root).await;
    }
    let served = start.elapsed();
    wait("a leader", || replicas.iter().any(Replica::leading)).await;
    for replica in &replicas {
        replica.served.until("every name valid", all_valid).await;
    }
    (replicas, served)
}

async fn fleet(args: &Args) {
    let names: Vec<String> = (0..100)
        .map(|i| format!("f{i}.fleet.example.com"))
        .collect();
    let port = tls_test::free_port().port();
    let Some(pebble) = Pebble::builder().tls_port(port).start().await else {
        panic!("Pebble is not installed (apt-get install pebble)");
    };
    let layer = pebble.layer().await;
    let root = pebble.issuing_root().await;
    let api = KubeApi::start().await;
    let fleet = Fleet {
        api: &api,
        pebble: &pebble,
        layer: &layer,
        port,
        names: &names,
    };
    let start = Instant::now();
    let first = start_replica(&fleet, 1, SHORT).await;
    wait("a leader", || first.leading()).await;
    let mut replicas = vec![first];
    for n in [2, 3] {
        replicas.push(start_replica(&fleet, n, SHORT).await);
    }
    point_at_followers(&pebble, &replicas, &names).await;
    // Two leaders killed while the names are being ordered.
    for at in [30, 65] {
        wait("names being issued", || {
            replicas.iter().any(|r| valid(r) >= at)
        })
        .await;
        let valid = replicas.iter().map(valid).max().unwrap_or(0);
        kill_leader(&fleet, &mut replicas).await;
        println!(
            "fleet: leader killed with {valid} of 100 names issued ({} orders so far)",
            pebble.orders()
        );
    }
    for replica in &replicas {
        replica.served.until("every name valid", all_valid).await;
        until_served(replica.served.addr, &names, &root).await;
    }
    let issued = start.elapsed();
    let first_orders = pebble.orders();
    println!(
        "fleet: 100 names, two leaders killed on the way: every replica serves every name {:.1} s after the first started; orders placed {first_orders} (target 100)",
        issued.as_secs_f64()
    );

    let (mut replicas, served_again) = restart(&fleet, replicas, SHORT).await;
    kill_leader(&fleet, &mut replicas).await;
    wait("a new leader", || replicas.iter().any(Replica::leading)).await;
    for replica in &replicas {
        replica.served.until("every name valid", all_valid).await;
    }
    // With the default timing (the steady state below).
    let (replicas, _) = restart(&fleet, replicas, DEFAULTS).await;
    println!(
        "fleet: every replica restarted (each ready and serving all 100 names {:.0} ms after the restart), a leader killed, every replica restarted again: orders placed {} (target 0)",
        ms(served_again),
        pebble.orders() - first_orders
    );

    // Steady state, default lease timing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (orders, acme) = (pebble.orders(), layer.requests());
    let before: Vec<u64> = replicas.iter().map(|r| r.endpoint.requests()).collect();
    tokio::time::sleep(args.window).await;
    let per_minute = 60.0 / args.window.as_secs_f64();
    for (replica, before) in replicas.iter().zip(before) {
        println!(
            "steady state over {:?}, default lease timing: replica-{} ({}) {:.1} API requests per minute",
            args.window,
            replica.n,
            if replica.leading() {
                "leader"
            } else {
                "follower"
            },
            (replica.endpoint.requests() - before) as f64 * per_minute
        );
    }
    println!(
        "steady state over {:?}: requests to the CA {:.1} per minute, orders {}",
        args.window,
        (layer.requests() - acme) as f64 * per_minute,
        pebble.orders() - orders
    );
}

#[tokio::main]
async fn main() {
    let args = args();
    if args.only.as_deref() != Some("fleet") {
        start_to_served(&args).await;
    }
    if args.only.as_deref() != Some("start") {
        fleet(&args).await;
    }
}
