//! [`ClientAuth`]: servers that require client certificates, from a trust that rotates with the
//! served bundle; the trust state the reload task keeps, and the `ServerConfig` it rebuilds when
//! the trust changes.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::Stream;
use futures::stream::BoxStream;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};
use tokio::sync::watch;

use crate::CertResolver;
use crate::engine::{TrustItem, TrustSet};

/// How many resumable sessions the server keeps (rustls's own default for its cache).
const SESSIONS: usize = 256;

/// A hook that finishes each `ServerConfig` the reloader builds (ALPN, versions, key log).
type Configure = Arc<dyn Fn(&mut ServerConfig) + Send + Sync>;

/// Client authentication (mTLS) for a server: every client must present a certificate signed by
/// a trusted CA. The trusted CAs are the `ca.crt` of the served bundle (the `kubernetes.io/tls`
/// convention: cert-manager writes the issuing CA there), so they change together with the
/// certificate, and only once the bundle passed validation: a rejected bundle changes nothing.
/// Given to [`Builder::client_auth`](crate::Builder::client_auth).
///
/// - **Overlap.** A CA that leaves the bundle stays trusted for [`overlap`](Self::overlap)
///   (default none), then is dropped by a timer; [`Status::client_cas`](crate::Status::client_cas)
///   shows each trusted CA and when it leaves. Clients still holding certificates from it are
///   not cut off mid-rotation.
/// - **Resumption.** Resumed sessions skip the client certificate check, so a client whose CA is
///   no longer trusted could resume its way in. The reloader keeps one session store across
///   the configs it builds (resumption keeps working through ordinary rotations) and replaces
///   it when a CA leaves the trusted set: every session from before must then do a full
///   handshake. Stateless tickets cannot be revoked so: they are issued only with
///   `Builder::session_tickets` (features `aws-lc-rs` or `ring`), and the accept stream then
///   checks every resumed client against the trust in force, closing it before a byte is served
///   when it fails ([`Reloader::verify_resumed`](crate::Reloader::verify_resumed), yours to call
///   with an acceptor of your own). A ticketer set by [`configure`](Self::configure) is kept,
///   with a warning.
/// - **Your config.** [`configure`](Self::configure) finishes every `ServerConfig` built (ALPN:
///   `h2` and `http/1.1` unless it says otherwise). [`Reloader::current_server_config`] is the
///   one to use for each new connection; [`Incoming`](crate::Incoming) does that by itself.
///
/// [`Reloader::current_server_config`]: crate::Reloader::current_server_config
#[must_use = "client authentication is configured by passing it to Builder::client_auth"]
pub struct ClientAuth {
    overlap: Duration,
    configure: Option<Configure>,
    authorization: Option<crate::Authorization>,
    /// `None`: the served bundle's CA certificates; else a source of its own.
    source: Option<BoxStream<'static, TrustItem>>,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("overlap", &self.overlap)
            .field("configure", &self.configure.is_some())
            .field("authorization", &self.authorization)
            .field("from_bundle", &self.source.is_none())
            .finish()
    }
}

impl ClientAuth {
    /// Client certificates must chain to a CA in the served bundle's CA certificates
    /// ([`CertBundle::ca`](tls_source::CertBundle::ca): `ca.crt`). A bundle without any is
    /// refused ([`Error::NoClientCa`](crate::Error::NoClientCa)).
    pub fn from_bundle() -> Self {
        Self {
            overlap: Duration::ZERO,
            configure: None,
            authorization: None,
            source: None,
        }
    }

    /// Client certificates must chain to a CA that `source` yields last: a trust of its own,
    /// apart from the served certificate (a CA file, another Secret's `ca.crt`). Each item
    /// replaces the trusted set once every certificate in it parses; an empty set or an error
    /// changes nothing and is logged. For the CA certificates of any [`CertSource`]'s bundles:
    /// `source.map(|item| item.map(|bundle| bundle.ca().to_vec()))`.
    ///
    /// [`CertSource`]: tls_source::CertSource
    pub fn from_source(source: impl Stream<Item = TrustItem> + Send + 'static) -> Self {
        Self {
            overlap: Duration::ZERO,
            configure: None,
            authorization: None,
            source: Some(Box::pin(source)),
        }
    }

    /// How long a CA that left the bundle stays trusted. Default: none. Any duration is taken:
    /// one that would end after 9999-12-31T23:59:59Z ends there (`Duration::MAX`: kept for
    /// good).
    pub fn overlap(mut self, overlap: Duration) -> Self {
        self.overlap = overlap;
        self
    }

    /// Which verified clients may connect: after a client's chain verifies against the trusted
    /// CAs, `authorization` is asked about its identity (common name, DNS and URI SANs); a
    /// refusal fails the handshake with the TLS alert `access_denied`, is logged with the
    /// client's identity and counted (`tls_reload_clients_refused_total`). A resumed session
    /// is checked again before it is served (by the accept stream, or
    /// [`Reloader::verify_resumed`](crate::Reloader::verify_resumed)), and when the rules
    /// change ([`Authorization::set`](crate::Authorization::set)) the accept stream closes
    /// every open connection they refuse, as when a CA leaves. Default: every verified client.
    ///
    /// ```
    /// use tls_reload::{AllowList, Authorization, ClientAuth, Rule};
    ///
    /// let rules = AllowList::new(["uri=spiffe://example.org/ns/prod/*".parse::<Rule>().unwrap()]);
    /// let auth = ClientAuth::from_bundle().authorize(Authorization::new(rules));
    /// # drop(auth);
    /// ```
    pub fn authorize(mut self, authorization: crate::Authorization) -> Self {
        self.authorization = Some(authorization);
        self
    }

    /// Finishes every `ServerConfig` the reloader builds: ALPN, protocol versions, key logging.
    /// The client verifier, the resolver and the session store are the reloader's.
    pub fn configure(
        mut self,
        configure: impl Fn(&mut ServerConfig) + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }
}

/// The config side of client authentication, owned by the reload task: builds the
/// `ServerConfig` for the CAs the engine's [`TrustSet`] trusts and stores it where every new
/// connection loads it.
pub(crate) struct TrustConfig {
    /// The verifier after each removal of a CA: open connections are checked again with it.
    revoked: watch::Sender<Arc<dyn ClientCertVerifier>>,
    configure: Option<Configure>,
    /// Asked after each verified chain.
    authorization: Option<crate::Authorization>,
    provider: Arc<CryptoProvider>,
    /// Weak, as everything the task holds: the task ends when the handles and resolver are gone.
    resolver: Weak<CertResolver>,
    sessions: Arc<dyn StoresServerSessions>,
    /// The config every new connection loads; the [`Reloader`](crate::Reloader) handles hold it.
    config: Weak<ArcSwap<ServerConfig>>,
    /// The verifier in force, stored with each config.
    current: Arc<ArcSwap<Arc<dyn ClientCertVerifier>>>,
    /// The session tickets of [`Builder::session_tickets`](crate::Builder::session_tickets).
    ticketer: Option<Arc<dyn ProducesTickets>>,
    warned_ticketer: bool,
}

/// What [`TrustParts::new`] makes: the config side, the set the engine keeps, the source of
/// its own (if any), and the config the handles share.
pub(crate) struct TrustParts {
    pub(crate) config: TrustConfig,
    pub(crate) set: TrustSet,
    pub(crate) source: Option<BoxStream<'static, TrustItem>>,
    pub(crate) shared: Arc<ArcSwap<ServerConfig>>,
    /// What open connections watch: the verifier after each removal of a CA.
    pub(crate) revoked: watch::Receiver<Arc<dyn ClientCertVerifier>>,
    /// The verifier in force now: what a resumed client is checked against.
    pub(crate) current: Arc<ArcSwap<Arc<dyn ClientCertVerifier>>>,
    /// With [`ClientAuth::authorize`]: a new value on every change of the rules.
    pub(crate) rules: Option<watch::Receiver<u64>>,
}

impl TrustParts {
    /// The trust before any bundle: nothing trusted, so every client is refused until the first
    /// bundle is installed (no server accepts before that anyway). Returns the set for the
    /// engine, the source of its own and the config to share.
    pub(crate) fn new(
        auth: ClientAuth,
        provider: Arc<CryptoProvider>,
        resolver: &Arc<CertResolver>,
        ticketer: Option<Arc<dyn ProducesTickets>>,
    ) -> Result<Self, rustls::Error> {
        let sessions: Arc<dyn StoresServerSessions> = ServerSessionMemoryCache::new(SESSIONS);
        let (config, verifier) = crate::tls::mtls_server_config(
            &provider,
            resolver,
            &[],
            &sessions,
            auth.authorization.as_ref(),
        )?;
        let shared = Arc::new(ArcSwap::from_pointee(config.clone()));
        let current = Arc::new(ArcSwap::from_pointee(Arc::clone(&verifier)));
        let (revoked_tx, revoked) = watch::channel(verifier);
        let set = TrustSet::new(auth.overlap, auth.source.is_none());
        let rules = auth
            .authorization
            .as_ref()
            .map(crate::Authorization::changes);
        let mut trust = TrustConfig {
            revoked: revoked_tx,
            configure: auth.configure,
            authorization: auth.authorization,
            provider,
            resolver: Arc::downgrade(resolver),
            sessions,
            config: Arc::downgrade(&shared),
            current: Arc::clone(&current),
            ticketer,
            warned_ticketer: false,
        };
        trust.finish_and_store(config);
        Ok(Self {
            config: trust,
            set,
            source: auth.source,
            shared,
            revoked,
            current,
            rules,
        })
    }
}

impl TrustConfig {
    /// Builds the config for `roots`. With `invalidate` (a CA left) the session store is
    /// replaced: no session from before can be resumed.
    pub(crate) fn apply(
        &mut self,
        roots: &[CertificateDer<'static>],
        invalidate: bool,
    ) -> Result<(), rustls::Error> {
        if invalidate {
            self.sessions = ServerSessionMemoryCache::new(SESSIONS);
        }
        let Some(resolver) = self.resolver.upgrade() else {
            return Ok(()); // Nothing is served any more.
        };
        let (config, verifier) = crate::tls::mtls_server_config(
            &self.provider,
            &resolver,
            roots,
            &self.sessions,
            self.authorization.as_ref(),
        )?;
        self.finish_and_store(config);
        self.current.store(Arc::new(Arc::clone(&verifier)));
        // Its own event: the server's certificate (and its generation) did not change.
        tracing::info!(trusted = roots.len(), "client CAs changed");
        crate::metrics::client_cas_changed();
        if invalidate {
            // After the new config is stored: a connection checked against this verifier and
            // closed cannot be replaced by one the old config let in.
            self.revoked.send_replace(verifier);
        }
        Ok(())
    }

    fn finish_and_store(&mut self, mut config: ServerConfig) {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        if let Some(configure) = &self.configure {
            configure(&mut config);
        }
        // The store that can be invalidated, whatever the hook did.
        config.session_storage = Arc::clone(&self.sessions);
        if let Some(ticketer) = &self.ticketer {
            config.ticketer = Arc::clone(ticketer);
            // Shared keys would let early data be replayed on another replica.
            config.max_early_data_size = 0;
        } else if config.ticketer.enabled() && !self.warned_ticketer {
            self.warned_ticketer = true;
            tracing::warn!(
                "a ticketer was configured: its tickets survive the removal of a client CA; the \
                 accept stream checks each resumed client against the trust in force, an \
                 acceptor of your own must (Reloader::verify_resumed)"
            );
        }
        if let Some(shared) = self.config.upgrade() {
            shared.store(Arc::new(config));
        }
    }
}
