//! The server: the source the flags choose, the reloader, the accept stream, the signals, the
//! graceful stop.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::Router;
use axum::routing::get;
use tls_rotation::Reloader;
use tls_rotation::k8s::seal::{KeyRing, Seal};
use tls_rotation::selfsigned::SelfSigned;
use tls_rotation::tls_source::{BoxCertSource, CertSourceExt as _, FileSource, Trigger};
use tokio::net::TcpSocket;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cli::{AcmeArgs, AcmeState, Args, Certs, Mode, SealArgs, SelfSignedArgs, Tickets};
use crate::status::{AppState, Leader, Sealing, status_json};

/// The log filter without `RUST_LOG`: our own events at info, third-party crates only at error
/// (kube's client logs a response body it cannot parse at warn; notify logs at info and warn
/// when a watched directory is deleted before it was unwatched, as the kubelet deletes the
/// previous generation right after a swap: bookkeeping of its own, nothing a user can act on.
/// What the file source cannot watch, it reports itself).
const DEFAULT_LOG_FILTER: &str =
    "info,kube_client=error,hyper=error,hyper_util=error,h2=error,notify=error";

/// How long in-flight requests get to finish after SIGINT / SIGTERM.
const GRACE: Duration = Duration::from_secs(10);
/// The exit status after a second SIGINT / SIGTERM (as a shell reports an interrupt).
const INTERRUPTED: u8 = 130;

pub(crate) fn main() -> ExitCode {
    crate::log_to_stderr(DEFAULT_LOG_FILTER);
    let args = Args::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    // The application picks the crypto provider; the libraries only use it (kube's client takes
    // the process default).
    let _ = Arc::unwrap_or_clone(crate::cli::crypto_provider()).install_default();
    let shutdown = CancellationToken::new();
    // Before any source runs, so that nothing recorded is lost.
    let metrics = crate::status::metrics(&args, &shutdown).await?;

    let (source, trigger, fleet) = source(&args, &shutdown).await?;
    if let Mode::Connect(options) = &args.mode {
        let client = crate::connect::client(&args, options, source, &shutdown).await?;
        spawn_signal_handler(shutdown.clone(), trigger, None, None)?;
        if let Some(addr) = args.status_listen {
            let app = Router::new()
                .route("/", get(crate::status::client_status_json))
                .with_state(client.clone());
            let addr = crate::status::spawn_status(addr, app, metrics, shutdown.clone()).await?;
            tracing::info!("status on http://{addr}/");
        }
        return crate::connect::serve(options, client, shutdown, GRACE).await;
    }
    let (leader, released, sealing) = match fleet {
        Some(f) => (Some(f.leader), Some(f.released), Some(f.seal)),
        None => (None, None, None),
    };
    // SIGHUP reads the --allow-file again.
    let reread_rules = Arc::new(tokio::sync::Notify::new());
    let mut builder = Reloader::builder()
        .cancellation_token(shutdown.clone())
        .sni_strict(args.sni.strict)
        .ready_before_lists(args.sni.ready_before_lists);
    if let Some((path, overlap)) = &args.client_ca {
        // The client CAs: a file of their own, followed like the certificate files.
        let cas = tls_rotation::tls_source::CaFileSource::builder(path)
            .poll_interval(args.poll)
            .notify(args.notify)
            .build();
        let mut auth = tls_rotation::ClientAuth::from_source(cas).overlap(*overlap);
        let finish = ConfigFlags::of(&args);
        auth = auth.configure(move |config| finish.apply(config));
        if let Some(allow) = &args.allow {
            auth = auth.authorize(crate::allow::authorization(
                allow,
                args.poll,
                Arc::clone(&reread_rules),
                shutdown.clone(),
            )?);
        }
        builder = builder.client_auth(auth);
    }
    for (name, dir) in &args.sni.routes {
        let files = FileSource::kubernetes_dir(dir)
            .poll_interval(args.poll)
            .notify(args.notify)
            .build();
        builder = builder.route(name, files);
    }
    if let Some(prefix) = &args.sni.etcd_certs {
        let etcd = etcd(&args, &shutdown).await?;
        builder = builder.routes(tls_rotation::etcd::EtcdCertsSource::new(etcd, prefix));
    }
    if let Some((namespace, selector)) = &args.sni.secrets {
        let source = tls_rotation::k8s::SecretsSource::builder(kube_client().await?, namespace)
            .selector(selector)
            .build();
        builder = builder.routes(source);
    }
    let acme = match &args.acme {
        Some(options) => {
            let etcd = match options.state {
                AcmeState::Etcd { .. } => Some(etcd(&args, &shutdown).await?),
                _ => None,
            };
            Some(Arc::new(
                acme(options, args.listen, seal(&args.seal)?, etcd).await?,
            ))
        }
        None => None,
    };
    // ACME for a fleet: its election is the status's `leader`, released on the way out.
    let acme_leader = acme.as_deref().and_then(|a| {
        a.leadership()
            .map(Leader::K8s)
            .or_else(|| a.etcd_leadership().map(Leader::Etcd))
    });
    let (leader, released) = match acme_leader {
        Some(acme_leader) => (
            Some(acme_leader),
            acme.as_deref()
                .map(|a| -> futures::future::BoxFuture<'static, ()> { Box::pin(a.released()) }),
        ),
        None => (leader, released),
    };
    if let Some(acme) = &acme {
        // Each name's certificate is an SNI route; TLS-ALPN-01 is answered in the accept
        // stream (before ready too).
        builder = builder
            .routes(acme.source().context("the ACME source")?)
            .handshake_hook(acme.challenges());
    }
    let lease = match &leader {
        Some(Leader::K8s(lease)) => Some(lease.clone()),
        _ => None,
    };
    if let Some(tickets) = session_tickets(&args, lease, &shutdown).await? {
        builder = builder.session_tickets(tickets);
    }
    let reloader = builder.spawn(source)?;
    if let (Some(acme), Some(addr)) = (&acme, args.acme.as_ref().and_then(|a| a.http_listen)) {
        spawn_http01(acme, addr, shutdown.clone()).await?;
    }

    // Reserve the port first, so a busy one fails at once; listen (and announce) only once a
    // certificate is installed: until then connections are refused, not left hanging.
    let socket = bind(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
    spawn_signal_handler(
        shutdown.clone(),
        trigger,
        acme.clone(),
        args.allow
            .as_ref()
            .and_then(|a| a.file.as_ref())
            .map(|_| reread_rules),
    )?;
    tokio::select! {
        ready = ready(&reloader, args.ready_timeout, args.fail_fast) => ready?,
        () = shutdown.cancelled() => return Ok(()),
    }
    let listener = socket.listen(1024)?;
    let addr = listener.local_addr()?;
    let mut incoming = tls_rotation::Incoming::builder(&reloader)
        .handshake_timeout(args.handshake_timeout)
        .cancellation_token(shutdown.clone());
    if let Some(age) = args.recycle_after {
        incoming = incoming.recycle_after(age);
    }
    if args.client_ca.is_none() {
        // With --client-ca the reloader builds the configs, finished by the same flags.
        let mut config = reloader.server_config()?;
        ConfigFlags::of(&args).apply(&mut config);
        // Empty: the config's ALPN is kept.
        incoming = incoming.server_config(config).alpn(Vec::<Vec<u8>>::new());
    }
    let incoming = incoming.listen(listener)?;
    let app = Router::new()
        .route("/", get(status_json))
        .with_state(AppState {
            status: reloader.status(),
            leader,
            sealing,
            acme: acme.as_deref().map(tls_rotation::acme::Acme::status),
            tickets: (!matches!(args.tickets, Tickets::Off)).then(|| reloader.clone()),
        });
    let status_addr = match args.status_listen {
        Some(addr) => {
            Some(crate::status::spawn_status(addr, app.clone(), metrics, shutdown.clone()).await?)
        }
        None => None,
    };

    // A reload task that stops by itself (it panicked, its sources ended) leaves certificates
    // that will never rotate again: serving goes on until the server shuts down gracefully,
    // then the process exits 1, so that an orchestrator restarts it.
    let stopped_alone = tokio::spawn({
        let (reloader, shutdown) = (reloader.clone(), shutdown.clone());
        async move {
            let ended = reloader.stopped().await;
            (!shutdown.is_cancelled()).then(|| {
                tracing::error!(%ended, "the certificate reloader stopped; shutting down so that the process is restarted");
                shutdown.cancel();
                ended
            })
        }
    });
    // The first line on stdout, always this: scripts wait for it.
    println!("listening on https://{addr}");
    if let Some(status) = status_addr {
        println!("status on http://{status}/");
    }
    match &args.mode {
        Mode::Http(proxy) => {
            tracing::info!(upstream = %proxy.upstream, "proxying HTTP");
            tls_rotation::http::HttpServer::new()
                .drain(GRACE)
                .idle_timeout(proxy.idle_timeout)
                .serve(incoming, crate::proxy::http::Proxy::new(proxy))
                .await;
            tracing::info!("all connections closed");
        }
        Mode::Tcp {
            upstream,
            proxy_protocol,
            idle_timeout,
        } => {
            tracing::info!(%upstream, proxy_protocol, "passing each connection's bytes on");
            let proxy = crate::proxy::tcp::TcpProxy {
                upstream: upstream.clone(),
                proxy_protocol: *proxy_protocol,
                idle_timeout: *idle_timeout,
            };
            proxy.serve(incoming, GRACE).await;
        }
        Mode::Status | Mode::Connect(_) => {
            serve(incoming, app).await;
        }
    }
    reloader.stopped().await;
    if let Some(released) = released {
        // A leader gives up its Lease, so that another replica leads at once.
        let _ = tokio::time::timeout(Duration::from_secs(10), released).await;
    }
    if let Ok(Some(ended)) = stopped_alone.await {
        anyhow::bail!(
            "the certificate reloader stopped ({ended}); exiting so that the process is restarted"
        );
    }
    Ok(())
}

/// What the flags set on every `ServerConfig` serve serves with (its own, or each one the
/// reloader rebuilds for `--client-ca`).
#[derive(Clone, Copy)]
struct ConfigFlags {
    /// `--upstream-tcp`: bytes, so no application protocol is negotiated (a client's ALPN is
    /// ignored); otherwise `h2` and `http/1.1`.
    bytes: bool,
    /// `--no-resumption`: no tickets and no session cache (the reloader keeps its own session
    /// store for mTLS; with no ticket sent, nothing is resumed from it).
    no_resumption: bool,
}

impl ConfigFlags {
    fn of(args: &Args) -> Self {
        Self {
            bytes: matches!(args.mode, Mode::Tcp { .. }),
            no_resumption: args.no_resumption,
        }
    }

    fn apply(self, config: &mut tls_rotation::rustls::ServerConfig) {
        config.alpn_protocols = if self.bytes {
            Vec::new()
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        if self.no_resumption {
            config.session_storage =
                Arc::new(tls_rotation::rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
    }
}

/// A socket bound to `addr`, not yet listening.
fn bind(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Waits for the first certificate: at most `timeout`, and with `fail_fast` only until the
/// first error.
async fn ready(reloader: &Reloader, timeout: Duration, fail_fast: bool) -> anyhow::Result<()> {
    if !fail_fast {
        return Ok(reloader.ready_timeout(timeout).await?);
    }
    match reloader.ready_or_first_error(timeout).await {
        Err(tls_rotation::NotReady::Failed { error }) => bail!("--fail-fast: {error}"),
        other => Ok(other?),
    }
}

/// The certificate source the flags choose; the trigger that re-reads files (SIGHUP); with
/// `--k8s-shared`, the fleet's side.
type Chosen = (BoxCertSource, Option<Trigger>, Option<Fleet>);

/// With `--k8s-shared` or `--etcd-shared`: the leadership, the end of the writer (its Lease or
/// writer key released), and the seal with whether this replica can open the stored state.
struct Fleet {
    leader: Leader,
    released: futures::future::BoxFuture<'static, ()>,
    seal: Sealing,
}

/// The `--seal-key` ring (or none), as the status page shows it.
fn seal(args: &SealArgs) -> anyhow::Result<Option<Arc<dyn Seal>>> {
    if args.keys.is_empty() {
        return Ok(None);
    }
    let ring = KeyRing::from_files(&args.keys)
        .context("--seal-key")?
        .adopt_unsealed(args.adopt_unsealed);
    if args.adopt_unsealed {
        tracing::warn!(
            "--seal-adopt-unsealed: state found unsealed is sealed and trusted; remove the flag once it is"
        );
    }
    Ok(Some(Arc::new(ring)))
}

async fn source(args: &Args, shutdown: &CancellationToken) -> anyhow::Result<Chosen> {
    // With --connect the certificate is a client's.
    let client = matches!(args.mode, Mode::Connect(_));
    let files = |builder: tls_rotation::tls_source::FileSourceBuilder| {
        let source = builder.poll_interval(args.poll).notify(args.notify).build();
        let trigger = source.trigger();
        Ok((source.boxed_source(), Some(trigger), None))
    };
    match &args.certs {
        Certs::SelfSigned(options) => {
            let generator = generator(options, client)?;
            Ok((generator.into_source().boxed_source(), None, None))
        }
        Certs::Shared {
            namespace,
            name,
            lease,
            identity,
            options,
        } => {
            let mut shared = tls_rotation::k8s::SharedSelfSigned::new(
                kube_client().await?,
                namespace,
                name,
                identity,
                generator(options, client)?,
            );
            if let Some(lease) = lease {
                shared = shared.lease(lease);
            }
            let ring = seal(&args.seal)?;
            if let Some(ring) = &ring {
                shared = shared
                    .seal(ring.clone())
                    .seal_served_key(args.seal.served_key);
            }
            let shared = shared.start(&CancellationToken::new());
            let fleet = Fleet {
                leader: Leader::K8s(shared.leadership()),
                released: Box::pin(shared.stopped()),
                seal: Sealing {
                    seal: ring,
                    access: shared.access(),
                },
            };
            Ok((shared.boxed_source(), None, Some(fleet)))
        }
        // The client CAs (`--client-ca`) are a source of their own (see `run`): never the
        // server's CA, which is `--ca` or the directory's `ca.crt`.
        Certs::Files { cert, key, ca } => {
            let builder = FileSource::builder(cert, key);
            files(match ca {
                Some(ca) => builder.ca(ca),
                None => builder,
            })
        }
        Certs::Dir(dir) => files(FileSource::kubernetes_dir(dir)),
        Certs::Secret { namespace, name } => {
            let mut source =
                tls_rotation::k8s::SecretSource::builder(kube_client().await?, namespace, name);
            if let Some(ring) = seal(&args.seal)? {
                source = source.seal(ring);
            }
            Ok((source.build().boxed_source(), None, None))
        }
        Certs::EtcdShared {
            prefix,
            name,
            identity,
            ttl,
            options,
        } => {
            let etcd = etcd(args, shutdown).await?;
            let retry = etcd_retry(*ttl);
            let mut shared = tls_rotation::etcd::SharedSelfSigned::new(
                etcd,
                prefix,
                name,
                identity,
                generator(options, client)?,
            )
            .lease_timing(*ttl, retry);
            let ring = seal(&args.seal)?;
            if let Some(ring) = &ring {
                shared = shared.seal(ring.clone());
            }
            let shared = shared.start(&CancellationToken::new());
            let fleet = Fleet {
                leader: Leader::Etcd(shared.leadership()),
                released: Box::pin(shared.stopped()),
                seal: Sealing {
                    seal: ring,
                    access: shared.access(),
                },
            };
            Ok((shared.boxed_source(), None, Some(fleet)))
        }
        Certs::Etcd { key } => {
            let source = tls_rotation::etcd::EtcdCertSource::new(etcd(args, shutdown).await?, key);
            Ok((source.boxed_source(), None, None))
        }
    }
}

/// How to reach etcd, from `--etcd` and its flags: a client certificate followed like
/// `--cert`'s files (through `ClientTls`, so a renewed one is presented on the next connection),
/// or only the CA, read once.
async fn etcd(
    args: &Args,
    shutdown: &CancellationToken,
) -> anyhow::Result<tls_rotation::etcd::Etcd> {
    let options = args.etcd.as_ref().context("--etcd")?;
    let mut etcd = tls_rotation::etcd::Etcd::builder(&options.endpoints);
    let provider = crate::cli::crypto_provider();
    match (&options.ca, &options.client) {
        (Some(ca), Some((cert, key))) => {
            let files = FileSource::builder(cert, key)
                .ca(ca)
                .poll_interval(args.poll)
                .notify(args.notify)
                .build();
            let client = tls_rotation::ClientTls::builder()
                .crypto_provider(provider)
                .cancellation_token(shutdown.clone())
                .spawn(files)?;
            client
                .ready_timeout(args.ready_timeout)
                .await
                .with_context(|| {
                    format!(
                        "--etcd-client-cert {} / --etcd-client-key {}",
                        cert.display(),
                        key.display()
                    )
                })?;
            etcd = etcd.tls(Arc::new(client.client_config()?));
        }
        (Some(ca), None) => {
            let pem = std::fs::read(ca).with_context(|| format!("--etcd-ca {}", ca.display()))?;
            let certs = tls_rotation::tls_source::Decoder::new()
                .certificates(&format!("--etcd-ca {}", ca.display()), &pem)?;
            let mut roots = tls_rotation::rustls::RootCertStore::empty();
            for cert in certs {
                roots
                    .add(cert)
                    .with_context(|| format!("--etcd-ca {}", ca.display()))?;
            }
            let config = tls_rotation::rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            etcd = etcd.tls(Arc::new(config));
        }
        (None, _) => {}
    }
    if let Some((user, file)) = &options.user {
        etcd = etcd.user_with_password_file(user, file);
    }
    Ok(etcd.build()?)
}

/// The session tickets of `--session-tickets`: from the file's secret, or the fleet's keys
/// (written by the Lease holder `leader` says, read by this replica until `shutdown`).
async fn session_tickets(
    args: &Args,
    leader: Option<watch::Receiver<tls_rotation::k8s::Leadership>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<tls_rotation::SessionTickets>> {
    Ok(match &args.tickets {
        Tickets::Off => None,
        Tickets::File {
            path,
            secret,
            rotation,
        } => Some(
            tls_rotation::SessionTickets::from_secret(&secret.0)
                .with_context(|| format!("--session-tickets {}", path.display()))?
                .rotation(*rotation),
        ),
        Tickets::Fleet {
            namespace,
            name,
            identity,
            rotation,
        } => {
            let leader = leader.context("--session-tickets fleet: the fleet has no Lease")?;
            let mut fleet = tls_rotation::k8s::FleetTickets::new(
                kube_client().await?,
                namespace,
                name,
                crate::cli::crypto_provider().secure_random,
            )
            .rotation(*rotation);
            if let Some(seal) = seal(&args.seal)? {
                fleet = fleet.seal(seal);
            }
            let keys = fleet.keys();
            fleet.start(leader, identity.clone(), shutdown.clone());
            Some(tls_rotation::SessionTickets::shared(keys)?.rotation(*rotation))
        }
    })
}

/// How often the holder of an etcd writer lease of `ttl` keeps it alive (and a follower
/// retries): a third of the TTL, at most 2 s.
fn etcd_retry(ttl: Duration) -> Duration {
    (ttl / 3).min(Duration::from_secs(2))
}

/// The ACME client of `--acme-directory` (checked when the flags were); a fleet's account
/// and order keys sealed with `seal` (`--seal-key`).
async fn acme(
    options: &AcmeArgs,
    listen: SocketAddr,
    seal: Option<Arc<dyn Seal>>,
    etcd: Option<tls_rotation::etcd::Etcd>,
) -> anyhow::Result<tls_rotation::acme::Acme> {
    // Where the challenge is answered: a failure under one place is tried at once under another.
    let answered_at = match (options.challenge, options.http_listen) {
        (tls_rotation::acme::ChallengeType::Http01, Some(http)) => http,
        _ => listen,
    };
    let mut builder = tls_rotation::acme::Acme::builder(&options.directory)
        .challenge(options.challenge)
        .answered_at(answered_at.to_string())
        .new_certificates_per_week(options.weekly_limit);
    builder = match &options.profile {
        Some((name, true)) => builder.require_profile(name),
        Some((name, false)) => builder.profile(name),
        None => builder,
    };
    builder = match &options.state {
        AcmeState::Dir(dir) => builder.state_dir(dir),
        AcmeState::Fleet {
            namespace,
            name,
            lease,
            identity,
        } => {
            let mut builder = builder.kubernetes(kube_client().await?, namespace, name, identity);
            if let Some(seal) = seal {
                builder = builder.seal(seal);
            }
            match lease {
                Some(lease) => builder.lease(lease),
                None => builder,
            }
        }
        AcmeState::Etcd {
            prefix,
            name,
            identity,
            ttl,
        } => {
            let etcd = etcd.context("--etcd")?;
            let mut builder = builder
                .etcd(etcd, prefix, name, identity)
                .etcd_lease_timing(*ttl, etcd_retry(*ttl));
            if let Some(seal) = seal {
                builder = builder.seal(seal);
            }
            builder
        }
    };
    for domain in &options.domains {
        builder = builder.name(domain);
    }
    if let Some(email) = &options.email {
        builder = builder.contact(email);
    }
    if let Some(ca) = &options.directory_ca {
        builder = builder.directory_ca_file(ca);
    }
    if let Some((kid, key)) = &options.eab {
        builder = builder.external_account(kid, key.0.clone());
    }
    for fallback in &options.fallbacks {
        let mut ca = tls_rotation::acme::FallbackCa::new(&fallback.url);
        if let Some(path) = &fallback.ca {
            ca = ca.ca_file(path);
        }
        if let Some((kid, key)) = &fallback.eab {
            ca = ca.external_account(kid, key.0.clone());
        }
        builder = builder.fallback(ca);
    }
    if let Some((server, key)) = &options.dns {
        use tls_rotation::acme::rfc2136::{Rfc2136, TsigKey};
        let key = TsigKey::from_file(key)?;
        let solver = Rfc2136::new(server.clone(), key)
            .map_err(|e| anyhow::anyhow!("--acme-dns-server: {e}"))?;
        builder = builder.dns01_solver(std::sync::Arc::new(solver));
    }
    Ok(builder.build()?)
}

/// The HTTP-01 responder on `addr` (plain HTTP), until `shutdown`.
async fn spawn_http01(
    acme: &tls_rotation::acme::Acme,
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = Router::new().route_service("/.well-known/acme-challenge/{token}", acme.http01());
    crate::status::serve_plain(addr, "--acme-http-listen", app, shutdown).await?;
    tracing::info!(%addr, "answering ACME HTTP-01 challenges on http://{addr}");
    Ok(())
}

/// The self-signed generator for `localhost`, `127.0.0.1`, `::1` and each `--name`; with
/// `client` (`--connect`), leaves a TLS client may present too.
fn generator(options: &SelfSignedArgs, client: bool) -> anyhow::Result<SelfSigned> {
    let mut names: Vec<&str> = vec!["localhost", "127.0.0.1", "::1"];
    for name in &options.names {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let mut builder = names.into_iter().fold(
        SelfSigned::builder(),
        tls_rotation::selfsigned::Builder::name,
    );
    if let Some(validity) = options.validity {
        builder = builder.validity(validity);
    }
    if let Some(dir) = &options.dir {
        builder = builder.persist(dir);
    }
    if options.ca {
        builder = builder.ca();
    }
    if client {
        builder = builder.client_auth();
    }
    Ok(builder.build()?)
}

async fn kube_client() -> anyhow::Result<tls_rotation::k8s::kube::Client> {
    tls_rotation::k8s::kube::Client::try_default()
        .await
        .context("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")
}

/// SIGHUP re-reads the certificate files and the `--allow-file` (`rules`), and retries every
/// failed ACME name (as the CA's limits allow); SIGINT and SIGTERM cancel `shutdown`, and a
/// second one exits at once.
fn spawn_signal_handler(
    shutdown: CancellationToken,
    trigger: Option<Trigger>,
    acme: Option<Arc<tls_rotation::acme::Acme>>,
    rules: Option<Arc<tokio::sync::Notify>>,
) -> anyhow::Result<()> {
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        loop {
            let stop = tokio::select! {
                _ = hangup.recv() => false,
                _ = terminate.recv() => true,
                _ = interrupt.recv() => true,
            };
            if !stop {
                if let Some(rules) = &rules {
                    tracing::info!("SIGHUP: re-reading --allow-file");
                    rules.notify_one();
                }
                if let Some(acme) = &acme {
                    tracing::info!(
                        "SIGHUP: retrying every failed ACME name (as the CA's limits allow)"
                    );
                    acme.retry_now();
                }
                match &trigger {
                    Some(trigger) => {
                        tracing::info!("SIGHUP: re-reading the certificate files");
                        trigger.trigger();
                    }
                    None => tracing::info!(
                        "SIGHUP: nothing to re-read (the source follows changes itself)"
                    ),
                }
                continue;
            }
            if shutdown.is_cancelled() {
                tracing::warn!("second signal: exiting now");
                std::process::exit(i32::from(INTERRUPTED));
            }
            tracing::info!(
                "shutting down: no new connections, {GRACE:?} for in-flight requests (a second signal exits now)"
            );
            shutdown.cancel();
        }
    });
    Ok(())
}

/// Serves HTTP on every connection until the stream ends (on shutdown), then waits up to
/// [`GRACE`] for open ones: tls-reload's `serve_http`, which closes each connection gracefully
/// on shutdown, when the accept stream says to recycle it, or when its client's CA is no
/// longer trusted.
async fn serve(incoming: tls_rotation::Incoming<tokio::net::TcpStream>, app: Router) {
    tls_rotation::http::HttpServer::new()
        .drain(GRACE)
        .serve(incoming, app)
        .await;
    tracing::info!("all connections closed");
}
