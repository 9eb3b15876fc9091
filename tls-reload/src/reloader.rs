//! The reloader's handle, its builder and its task.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use rustls::crypto::CryptoProvider;
use tls_source::clock::{Clock, SystemClock};
use tls_source::{BoxCertSource, BoxKeyedCertSource, IntoCertSource, KeyedCertSource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client_auth::{ClientAuth, TrustParts};
use crate::status::Ended;
use crate::task::{self, Plan, Server};
use crate::tls::{self, CertResolver, HandshakeHook, RouteName};
use crate::{Error, NotReady, Policy, Status, Validator};

/// Drives certificate sources, validates each bundle and swaps it into a rustls resolver.
///
/// Made with [`Reloader::builder`] (or [`Reloader::spawn`] for the defaults). The reload task:
/// - validates each bundle with a [`Validator`] (the key matches the leaf, the [`Policy`]:
///   validity, purpose, names, chain order and size) and only then swaps;
/// - keeps the last good certificate on every error, recording it in the route's status and
///   logging it (`tracing` warn); logs each install at info;
/// - is latest-wins: when a burst of bundles is waiting, only the newest is validated and swapped;
///   anything newer from a source, an error included, cancels a pending retry;
/// - serves one certificate, or many by SNI ([`Builder::route`], [`Builder::routes`]): one task
///   for every route, and one route's bad update never touches the others;
/// - says when the served certificate enters the expiry-warning window and when it expires
///   ([`Status::expiring`], [`Status::expired`]), logging a warning at each;
/// - ends when its cancellation token is cancelled, when every source has ended, or when every
///   `Reloader` handle and resolver is gone; [`stopped`](Self::stopped) says which (a panic
///   included). The resolver keeps serving the last certificates after it ends.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use tls_reload::Reloader;
/// use tls_source::FileSource;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let shutdown = CancellationToken::new();
/// let reloader = Reloader::builder()
///     .cancellation_token(shutdown.clone())
///     .route("api.example.com", FileSource::kubernetes_dir("/etc/tls/api").build())
///     .route("*.example.com", FileSource::kubernetes_dir("/etc/tls/wildcard").build())
///     .spawn(FileSource::kubernetes_dir("/etc/tls/default").build())?;
/// reloader.ready_timeout(Duration::from_secs(10)).await?;
/// let config = reloader.server_config()?; // or .with_cert_resolver(reloader.resolver())
/// // ... serve with `config` until `shutdown` is cancelled.
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Reloader {
    resolver: Arc<CertResolver>,
    provider: Arc<CryptoProvider>,
    status: watch::Receiver<Status>,
    /// How the reload task ended, once it has: what [`stopped`](Self::stopped) waits for,
    /// apart from the status, so that its waiters are not woken by every rotation.
    ended: watch::Receiver<Option<Ended>>,
    pub(crate) token: CancellationToken,
    /// With client authentication: the config for new connections, rebuilt when the trust
    /// changes.
    tls_config: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    /// With client authentication: the verifier after each removal of a CA (what the accept
    /// stream's connections watch).
    #[cfg_attr(not(feature = "accept"), allow(dead_code))]
    revoked: Option<watch::Receiver<Arc<dyn rustls::server::danger::ClientCertVerifier>>>,
    /// With client authentication: the verifier in force now (a resumed client is checked
    /// against it).
    trust_now: Option<Arc<ArcSwap<Arc<dyn rustls::server::danger::ClientCertVerifier>>>>,
    /// With [`ClientAuth::authorize`](crate::ClientAuth::authorize): a new value on every
    /// change of the rules (open connections are checked again with `trust_now`).
    #[cfg_attr(not(feature = "accept"), allow(dead_code))]
    rules: Option<watch::Receiver<u64>>,
    /// The session tickets every config gets ([`Builder::session_tickets`]).
    ticketer: Option<Arc<dyn rustls::server::ProducesTickets>>,
    #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
    tickets: Option<Arc<crate::tickets::Ticketer>>,
    /// Whether there is a default route ([`Builder::spawn`], not `spawn_routes`): what
    /// [`ready_timeout`](Self::ready_timeout) names when it has no certificate.
    has_default: bool,
}

/// Configures a [`Reloader`].
#[must_use = "a builder does nothing until `spawn` or `build` is called"]
pub struct Builder {
    provider: Option<Arc<CryptoProvider>>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    token: Option<CancellationToken>,
    named: Vec<(String, BoxCertSource)>,
    keyed: Vec<BoxKeyedCertSource>,
    strict: bool,
    ready_before_lists: bool,
    client_auth: Option<ClientAuth>,
    hook: Option<Arc<dyn HandshakeHook>>,
    #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
    tickets: Option<Arc<crate::tickets::Ticketer>>,
}

/// The reload task, for the caller to run: [`Builder::build`] returns it with its
/// [`Reloader`]. Spawn it (`tokio::spawn(task)`, a `JoinSet`, a `TaskTracker`) or await it; it
/// resolves to how it [`Ended`]. Dropping it unrun leaves the resolver empty and the status says
/// [`Ended::Dropped`].
#[must_use = "the reload task does nothing unless spawned or awaited"]
pub struct ReloadTask {
    inner: BoxFuture<'static, Ended>,
}

// ===== impl Builder =====

impl Default for Builder {
    fn default() -> Self {
        Self {
            provider: None,
            policy: Policy::default(),
            clock: Arc::new(SystemClock),
            token: None,
            named: Vec::new(),
            keyed: Vec::new(),
            strict: false,
            ready_before_lists: false,
            client_auth: None,
            hook: None,
            #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
            tickets: None,
        }
    }
}

impl Builder {
    /// The crypto provider that loads keys (and that [`Reloader::server_config`] uses). Default:
    /// aws-lc-rs when this crate's `aws-lc-rs` feature is on, *ring* when only `ring` is;
    /// failing that, the process default (`CryptoProvider::get_default`). Never installs one
    /// (see the crate docs, "Choosing ring or aws-lc-rs").
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// What is accepted; see [`Policy`].
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Where "now" comes from, for validity and expiry (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The token that stops the reload task. The reloader watches a child of it, so
    /// [`Reloader::stop`] does not cancel `token`. Default: a new token.
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// An SNI route: handshakes for `name` (an exact DNS name, or a one-label wildcard such as
    /// `*.example.com`, which covers `a.example.com` but neither `example.com` nor
    /// `a.b.example.com`) are served the certificate from `source`, which must cover the name.
    /// Exact routes win over wildcards; names are case-insensitive. `name` may be an IP address
    /// (`192.0.2.7`, `2001:db8::7`): its certificate is served to handshakes without a server
    /// name, as [`CertResolver`] says. Repeatable.
    pub fn route<S>(mut self, name: impl Into<String>, source: S) -> Self
    where
        S: IntoCertSource,
    {
        self.named.push((name.into(), source.into_cert_source()));
        self
    }

    /// SNI routes from a keyed source (e.g. every TLS Secret matching a label selector): each
    /// key's certificate is served for the DNS names it holds, and for its IP addresses to
    /// handshakes without a server name (see [`CertResolver`]); a removed key removes its
    /// routes. A name claimed by a [`route`](Self::route) stays with it; between keys, the
    /// smallest key keeps a name they share. Repeatable.
    ///
    /// A source's routes are served once its initial list is in (it says so with
    /// [`KeyedUpdate::Listing`](tls_source::KeyedUpdate::Listing) then `Listed`, as tls-k8s's
    /// `SecretsSource` does; a source that does not counts as listed at its first item), and
    /// the reloader is [ready](Reloader::ready) only then: every listed key considered,
    /// installed or rejected (one bad key does not hold readiness back). So after a restart no
    /// listed name is served the default certificate, or refused under strict SNI, while the
    /// list loads; and the list is applied as one table. A source that cannot list (the API
    /// unreachable) then keeps the reloader unready: see
    /// [`ready_before_lists`](Self::ready_before_lists).
    pub fn routes<S>(mut self, source: S) -> Self
    where
        S: KeyedCertSource + 'static,
    {
        self.keyed.push(Box::pin(source));
        self
    }

    /// Ready once the default certificate (and the named routes) serve, without waiting for the
    /// keyed sources' initial lists: the default certificate is served while they load, to
    /// every name (or, under strict SNI, to the names it covers), and each source's routes join
    /// when its list is in. For a server that must come up while its route source cannot be
    /// reached. Default: off (ready waits for the lists).
    pub fn ready_before_lists(mut self, ready: bool) -> Self {
        self.ready_before_lists = ready;
        self
    }

    /// Strict SNI: a handshake whose server name no route serves fails, instead of being
    /// served the default certificate; so does one that sends none, unless an IP certificate
    /// serves it (the one for the local address it arrived on, or the one IP certificate there
    /// is: see [`CertResolver`]). The default certificate, if there is one, is then served like
    /// a route, to the names it covers (its DNS SANs, and its IP addresses; a name a route
    /// claims stays with the route). Default: off.
    pub fn sni_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// A [`HandshakeHook`] the resolver asks before its routes on every handshake: what it
    /// answers is served; what it leaves (`None`) goes to the routes. How a source reaches into
    /// handshakes (an ACME TLS-ALPN-01 challenge) without this crate depending on it. Its
    /// answers are not validated: they are the hook's. A hook may also take whole handshakes
    /// over ([`HandshakeHook::take_over`]), which the accept stream serves with a config of
    /// their own, also before the reloader is ready.
    pub fn handshake_hook(mut self, hook: Arc<dyn HandshakeHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Issues TLS 1.3 session tickets on the keys `tickets` gives (a secret the processes
    /// share, a fleet's keys, or this process's own; see [`SessionTickets`]), in every config
    /// the reloader builds ([`Reloader::server_config`], the accept stream's, and with client
    /// authentication its configs too: the accept stream checks each resumed client against the
    /// trust in force, [`Reloader::verify_resumed`]). Default: none (rustls's per-process
    /// session cache only). Needs the feature `aws-lc-rs` or `ring`.
    ///
    /// [`SessionTickets`]: crate::SessionTickets
    #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
    pub fn session_tickets(mut self, tickets: crate::SessionTickets) -> Self {
        self.tickets = Some(Arc::new(crate::tickets::Ticketer::new(tickets)));
        self
    }

    /// Requires client certificates (mTLS), trusted as [`ClientAuth`] says; the trust rotates
    /// with the default certificate's bundle. Serve with [`Reloader::current_server_config`]
    /// per connection ([`Incoming`](crate::Incoming) does).
    pub fn client_auth(mut self, auth: ClientAuth) -> Self {
        self.client_auth = Some(auth);
        self
    }

    /// Spawns the reload task on the current Tokio runtime, serving `source` as the default
    /// certificate (and the routes added).
    ///
    /// # Errors
    /// [`Error::NoCryptoProvider`] when none was given and none can be found;
    /// [`Error::InvalidRouteName`] for a route name that is not a DNS name or wildcard.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn<S>(self, source: S) -> Result<Reloader, Error>
    where
        S: IntoCertSource,
    {
        let (reloader, task) = self.build(source)?;
        tokio::spawn(task);
        Ok(reloader)
    }

    /// Spawns the reload task for the routes alone, with no default certificate: a handshake
    /// no route serves fails.
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn), and [`Error::NoSources`] without any route.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn_routes(self) -> Result<Reloader, Error> {
        let (reloader, task) = self.build_routes()?;
        tokio::spawn(task);
        Ok(reloader)
    }

    /// Like [`spawn`](Self::spawn), but hands the task to the caller to run (no runtime needed
    /// to call this).
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    pub fn build<S>(self, source: S) -> Result<(Reloader, ReloadTask), Error>
    where
        S: IntoCertSource,
    {
        self.make(Some(source.into_cert_source()))
    }

    /// Like [`spawn_routes`](Self::spawn_routes), but hands the task to the caller to run.
    ///
    /// # Errors
    /// As [`spawn_routes`](Self::spawn_routes).
    pub fn build_routes(self) -> Result<(Reloader, ReloadTask), Error> {
        self.make(None)
    }

    fn make(self, default: Option<BoxCertSource>) -> Result<(Reloader, ReloadTask), Error> {
        let has_default = default.is_some();
        let provider = self
            .provider
            .or_else(tls::default_crypto_provider)
            .ok_or(Error::NoCryptoProvider)?;
        let named = self
            .named
            .into_iter()
            .map(|(name, source)| Ok((RouteName::parse(&name)?, source)))
            .collect::<Result<Vec<_>, Error>>()?;
        if default.is_none() && named.is_empty() && self.keyed.is_empty() {
            return Err(Error::NoSources);
        }
        // Strict SNI looks names up even without routes: the default is served by its names.
        let has_routes = !named.is_empty() || !self.keyed.is_empty() || self.strict;
        let token = self.token.unwrap_or_default().child_token();
        let gone = CancellationToken::new();
        let resolver = Arc::new(CertResolver::new(
            has_routes,
            self.strict,
            gone.clone(),
            self.hook,
        ));
        let (tx, rx) = watch::channel(Status {
            running: true,
            ..Status::default()
        });
        let (ended_tx, ended_rx) = watch::channel(None);
        let validator = Validator::new(Arc::clone(&provider), self.policy).with_clock(self.clock);
        #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
        let ticketer = self
            .tickets
            .clone()
            .map(|t| t as Arc<dyn rustls::server::ProducesTickets>);
        #[cfg(not(any(feature = "aws-lc-rs", feature = "ring")))]
        let ticketer: Option<Arc<dyn rustls::server::ProducesTickets>> = None;
        let (trust, tls_config) = match self.client_auth {
            Some(auth) => {
                let parts =
                    TrustParts::new(auth, Arc::clone(&provider), &resolver, ticketer.clone())
                        .map_err(|e| Error::ClientAuthConfig {
                            reason: e.to_string(),
                        })?;
                (
                    Some((parts.set, parts.config, parts.source)),
                    Some((parts.shared, parts.revoked, parts.current, parts.rules)),
                )
            }
            None => (None, None),
        };
        let clock = Arc::clone(validator.clock());
        let plan = Plan {
            default,
            named,
            keyed: self.keyed,
            trust,
            strict: self.strict,
            ready_before_lists: self.ready_before_lists,
        };
        let (engine, inputs, trust) = plan.start(validator);
        let server = Server {
            resolver: Arc::downgrade(&resolver),
            trust,
            status: tx.clone(),
        };
        let cancel = token.clone();
        // The engine's first effects (every static route in the status) happen now.
        let run = task::run(engine, inputs, server, clock, cancel, gone);
        let inner = async move {
            let run = AssertUnwindSafe(run).catch_unwind();
            let ended = match run.await {
                Ok(ended) => ended,
                Err(panic) => Ended::Panicked {
                    message: tls_source::panic_message(panic.as_ref()),
                },
            };
            match &ended {
                Ended::Panicked { .. } => {
                    tracing::error!(ended = %ended, "certificate reloader stopped; serving the current certificates, but no rotation will be picked up: restart the process");
                    // Not ready: what is served will never rotate again.
                    crate::metrics::ready(false);
                }
                _ => tracing::info!(ended = %ended, "certificate reloader stopped; serving the current certificates"),
            }
            tx.send_modify(|s| {
                s.running = false;
                s.ended = Some(ended.clone());
            });
            ended_tx.send_replace(Some(ended.clone()));
            ended
        }
        .boxed();
        Ok((
            Reloader {
                resolver,
                provider,
                status: rx,
                ended: ended_rx,
                token,
                tls_config: tls_config
                    .as_ref()
                    .map(|(shared, _, _, _)| Arc::clone(shared)),
                revoked: tls_config
                    .as_ref()
                    .map(|(_, revoked, _, _)| revoked.clone()),
                rules: tls_config
                    .as_ref()
                    .and_then(|(_, _, _, rules)| rules.clone()),
                trust_now: tls_config.map(|(_, _, current, _)| current),
                ticketer,
                #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
                tickets: self.tickets,
                has_default,
            },
            ReloadTask { inner },
        ))
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .field(
                "routes",
                &self.named.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("keyed_sources", &self.keyed.len())
            .field("strict", &self.strict)
            .field("ready_before_lists", &self.ready_before_lists)
            .finish_non_exhaustive()
    }
}

// ===== impl ReloadTask =====

impl Future for ReloadTask {
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ReloadTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadTask").finish_non_exhaustive()
    }
}

// ===== impl Reloader =====

impl Reloader {
    /// Starts configuring a reloader.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Spawns a reloader for `source` with the defaults: the process crypto provider, the
    /// default [`Policy`], and a token of its own (stop it with [`stop`](Self::stop)).
    ///
    /// # Errors
    /// [`Error::NoCryptoProvider`], see [`Builder::spawn`].
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn<S: IntoCertSource>(source: S) -> Result<Self, Error> {
        Self::builder().spawn(source)
    }

    /// The rustls resolver to put in a `ServerConfig` (`with_cert_resolver`). The reload task
    /// runs while a resolver or a handle exists.
    pub fn resolver(&self) -> Arc<CertResolver> {
        Arc::clone(&self.resolver)
    }

    /// A `ServerConfig` with safe defaults and no client authentication, on this reloader's
    /// crypto provider and resolver. Set `alpn_protocols` on it as your server needs. With
    /// [`Builder::client_auth`], a copy of the current mTLS config, which does not follow later
    /// trust changes: use [`current_server_config`](Self::current_server_config) instead.
    ///
    /// # Errors
    /// If the provider supports no safe protocol version.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, rustls::Error> {
        match &self.tls_config {
            Some(config) => Ok(rustls::ServerConfig::clone(&config.load())),
            None => {
                let mut config = tls::server_config(Arc::clone(&self.provider), self.resolver())?;
                if let Some(ticketer) = &self.ticketer {
                    config.ticketer = Arc::clone(ticketer);
                    // Shared keys would let early data be replayed on another replica.
                    config.max_early_data_size = 0;
                }
                Ok(config)
            }
        }
    }

    /// What the session-ticket keys in use now are ([`Builder::session_tickets`]): where they
    /// come from, the current key's id and since when; `None` without session tickets.
    #[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
    pub fn session_tickets(&self) -> Option<crate::TicketsStatus> {
        self.tickets.as_ref().map(|t| t.status())
    }

    /// Whether `conn`, once its handshake is done, may be served: a resumed session restores
    /// the client's certificates without asking the verifier again, so with client
    /// authentication a resumed client is checked against the trust in force now (a session
    /// made under a CA that has since left is refused). `Ok` for a full handshake, and without
    /// client authentication. The accept stream ([`Incoming`](crate::Incoming)) does this
    /// itself; with an acceptor of your own, call it before serving a byte, and close the
    /// connection on `Err`.
    ///
    /// # Errors
    /// Why the resumed client's certificate is not trusted now.
    pub fn verify_resumed(&self, conn: &rustls::ServerConnection) -> Result<(), rustls::Error> {
        verify_resumed(self.trust_now.as_deref(), conn)
    }

    /// The verifier in force now, with client authentication (for the accept stream).
    #[cfg(feature = "accept")]
    pub(crate) fn trust_now(
        &self,
    ) -> Option<Arc<ArcSwap<Arc<dyn rustls::server::danger::ClientCertVerifier>>>> {
        self.trust_now.clone()
    }

    /// For an acceptor of your own: the config for a handshake the
    /// [`HandshakeHook`] takes over (an ACME CA's TLS-ALPN-01 validation), from the
    /// `ClientHello` rustls's `LazyConfigAcceptor` read; `None` when the hook does not take it
    /// (serve it as usual). Such a connection is closed once its handshake is done; it gets
    /// this config also before [`ready`](Self::ready). [`Incoming`](crate::Incoming) does all
    /// this by itself.
    ///
    /// ```no_run
    /// # async fn run(reloader: tls_reload::Reloader, tcp: tokio::net::TcpStream) -> std::io::Result<()> {
    /// use tokio_rustls::LazyConfigAcceptor;
    /// use tokio_rustls::rustls::server::Acceptor;
    ///
    /// let start = LazyConfigAcceptor::new(Acceptor::default(), tcp).await?;
    /// if let Some(config) = reloader.takeover_config(&start.client_hello()) {
    ///     let mut challenge = start.into_stream(config).await?;
    ///     tokio::io::AsyncWriteExt::shutdown(&mut challenge).await?;
    ///     return Ok(());
    /// }
    /// let config = std::sync::Arc::new(reloader.server_config().map_err(std::io::Error::other)?);
    /// let conn = start.into_stream(config).await?;
    /// // ... serve `conn`.
    /// # drop(conn); Ok(()) }
    /// ```
    pub fn takeover_config(
        &self,
        hello: &rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::ServerConfig>> {
        let takeover = self.resolver.takeover_hook()?.take_over(hello)?;
        match tls::takeover_config(Arc::clone(&self.provider), takeover) {
            Ok(config) => Some(config),
            Err(err) => {
                tracing::warn!(error = %err, "cannot build the config of a handshake a hook takes over");
                None
            }
        }
    }

    /// Whether the handshake hook takes handshakes over (the accept stream then reads each
    /// `ClientHello` first).
    #[cfg(feature = "accept")]
    pub(crate) fn takes_over(&self) -> bool {
        self.resolver.takeover_hook().is_some()
    }

    /// A config that fails every handshake with an alert.
    #[cfg(feature = "accept")]
    pub(crate) fn refusing_config(&self) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        tls::refusing_config(Arc::clone(&self.provider))
    }

    /// With [`Builder::client_auth`]: the `ServerConfig` for a new connection, with the client
    /// CAs trusted now (take it per connection: `TlsAcceptor::from(reloader
    /// .current_server_config())`). `None` without client authentication: then one
    /// [`server_config`](Self::server_config) serves every connection.
    pub fn current_server_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls_config.as_ref().map(|config| config.load_full())
    }

    /// The shared config that [`current_server_config`](Self::current_server_config) loads.
    #[cfg(feature = "accept")]
    pub(crate) fn tls_config(&self) -> Option<Arc<ArcSwap<rustls::ServerConfig>>> {
        self.tls_config.clone()
    }

    /// With client authentication: what open connections watch, the verifier after each
    /// removal of a CA.
    #[cfg_attr(not(feature = "accept"), allow(dead_code))]
    pub(crate) fn revocations(
        &self,
    ) -> Option<watch::Receiver<Arc<dyn rustls::server::danger::ClientCertVerifier>>> {
        self.revoked.clone()
    }

    /// With client authorization rules: a new value on every change of them.
    #[cfg_attr(not(feature = "accept"), allow(dead_code))]
    pub(crate) fn rule_changes(&self) -> Option<watch::Receiver<u64>> {
        self.rules.clone()
    }

    /// A receiver of the reloader's [`Status`], updated on every install, rejection, source
    /// error, expiry and stop.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Waits until every configured route has a certificate (see [`Status::ready`]). A server
    /// should not accept before.
    ///
    /// # Errors
    /// [`NotReady::Stopped`] when the reload task ends first.
    ///
    /// # Cancellation safety
    /// Cancellation safe.
    pub async fn ready(&self) -> Result<(), NotReady> {
        let mut rx = self.status.clone();
        let status = rx
            .wait_for(|s| s.ready || !s.running)
            .await
            .map(|s| s.clone())
            .unwrap_or_default();
        if status.ready {
            Ok(())
        } else {
            Err(NotReady::Stopped {
                last_error: first_error(&status),
            })
        }
    }

    /// Like [`ready`](Self::ready), giving up after `timeout`.
    ///
    /// # Errors
    /// [`NotReady::TimedOut`] carrying the last error (why nothing was installed),
    /// [`NotReady::RoutesMissing`] when some certificates are installed and others not (naming
    /// those routes, with the first one's error), [`NotReady::NoTrustedClientCa`] when only the
    /// client CAs are missing, or [`NotReady::Stopped`].
    pub async fn ready_timeout(&self, timeout: Duration) -> Result<(), NotReady> {
        match tokio::time::timeout(timeout, self.ready()).await {
            Ok(result) => result,
            Err(_) => {
                let status = self.status.borrow();
                let installed =
                    status.current.is_some() || status.routes.values().any(|r| r.current.is_some());
                // The routes still without a certificate, the default first.
                let mut missing: Vec<(String, Option<Arc<Error>>)> = Vec::new();
                if self.has_default && status.current.is_none() {
                    missing.push(("the default".to_owned(), status.last_error.clone()));
                }
                missing.extend(
                    status
                        .routes
                        .iter()
                        .filter(|(_, route)| route.current.is_none())
                        .map(|(name, route)| (format!("route {name}"), route.last_error.clone())),
                );
                Err(if installed && !missing.is_empty() {
                    let last_error = missing.iter().find_map(|(_, error)| error.clone());
                    NotReady::RoutesMissing {
                        waited: timeout,
                        missing: missing.into_iter().map(|(name, _)| name).collect(),
                        last_error,
                    }
                } else if self.tls_config.is_some() && installed {
                    NotReady::NoTrustedClientCa {
                        waited: timeout,
                        last_error: status.client_ca_error.clone(),
                    }
                } else {
                    NotReady::TimedOut {
                        waited: timeout,
                        last_error: first_error(&status),
                    }
                })
            }
        }
    }

    /// Like [`ready_timeout`](Self::ready_timeout), but gives up at the default route's first
    /// error: a rejected bundle or a source error before a certificate is installed, or one
    /// reported beside the first (a generator serving from memory because it cannot persist
    /// says so in the same breath). For a process that should fail fast rather than wait for
    /// good input (`serve --fail-fast`).
    ///
    /// # Errors
    /// [`NotReady::Failed`] with the error; otherwise as [`ready_timeout`](Self::ready_timeout).
    pub async fn ready_or_first_error(&self, timeout: Duration) -> Result<(), NotReady> {
        let mut status = self.status.clone();
        let failed = async {
            let status = status
                .wait_for(|s| s.ready || s.last_error.is_some() || !s.running)
                .await
                .map(|s| s.clone())
                .unwrap_or_default();
            match status.last_error {
                Some(error) => Err(NotReady::Failed { error }),
                None => Ok(()),
            }
        };
        tokio::select! {
            failed = failed => failed?,
            ready = self.ready_timeout(timeout) => return ready,
        }
        // Ready, or stopped without a certificate: which one, and why.
        self.ready_timeout(timeout).await
    }

    /// Stops the reload task (the sources are dropped). The certificates installed last keep
    /// being served.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// Waits until the reload task has ended and dropped its sources, and says how it ended.
    ///
    /// # Cancellation safety
    /// Cancellation safe.
    pub async fn stopped(&self) -> Ended {
        let mut rx = self.ended.clone();
        let ended = rx
            .wait_for(Option::is_some)
            .await
            .map(|ended| ended.clone());
        match ended {
            Ok(Some(ended)) => ended,
            _ => Ended::Dropped,
        }
    }
}

/// The default route's error, else the first route's, else the client CAs'.
fn first_error(status: &Status) -> Option<Arc<Error>> {
    status
        .last_error
        .clone()
        .or_else(|| status.routes.values().find_map(|r| r.last_error.clone()))
        .or_else(|| status.client_ca_error.clone())
}

/// [`Reloader::verify_resumed`], given the verifier in force (`None`: no client
/// authentication).
pub(crate) fn verify_resumed(
    trust: Option<&ArcSwap<Arc<dyn rustls::server::danger::ClientCertVerifier>>>,
    conn: &rustls::ServerConnection,
) -> Result<(), rustls::Error> {
    let (Some(trust), Some(rustls::HandshakeKind::Resumed)) = (trust, conn.handshake_kind()) else {
        return Ok(());
    };
    let Some((leaf, intermediates)) = conn.peer_certificates().and_then(<[_]>::split_first) else {
        // A resumed session of an mTLS server always had a client certificate.
        return Err(rustls::Error::NoCertificatesPresented);
    };
    trust
        .load()
        .verify_client_cert(leaf, intermediates, rustls::pki_types::UnixTime::now())
        .map(drop)
}
