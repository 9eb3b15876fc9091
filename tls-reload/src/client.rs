//! [`ClientTls`]: the client side of mTLS, rotating: the certificate an outbound client presents
//! and the roots it trusts, fed by a [`CertSource`], behind one `ClientConfig` that a whole
//! connection pool can keep.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt as _;
use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::IntoCertSource;
use tls_source::clock::Clock;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, Kind, Publish};
use crate::task::{self, Apply, Inputs};
use crate::tls::client::{Identity, Roots, Sessions, Verifier};
use crate::tls::{Slot, Table};
use crate::{CertInfo, Error, Policy, Purpose, Validator};

/// The client side of mTLS, rotating: a `ClientConfig` ([`client_config`](Self::client_config))
/// whose client certificate and trusted roots follow a [`CertSource`](tls_source::CertSource) of client bundles: the
/// chain and key the client presents, and in the bundle's CA certificates (`ca.crt`, the
/// `kubernetes.io/tls` convention, or `FileSource::ca`) the roots it trusts servers with
/// (and any [`roots`](ClientTlsBuilder::roots) added: the webpki or the platform's). One
/// config serves a whole connection pool (reqwest's `tls_backend_preconfigured`,
/// hyper-rustls's `with_tls_config`) across rotations.
///
/// **Pooled connections.** TLS authenticates a client once, at the handshake: a connection
/// kept in a pool goes on presenting the certificate it was made with. So that the request
/// after a rotation presents the new one, with pooling on:
/// - reqwest (HTTP/1.1 and HTTP/2), or any client: [`rebuilt`](ClientTls::rebuilt) builds
///   the client again on the first request after a rotation (a new, empty pool);
/// - hyper-util over HTTP/1.1: `connector` (feature `hyper`) makes
///   connections from before a rotation read as closed, and the pool drops them.
///
/// - Each bundle is validated first (key, validity, the `clientAuth` purpose, chain order and
///   size); a bad one changes nothing, is logged and shows in the [`ClientStatus`]. A bundle
///   not valid yet is tried again when its `notBefore` comes; the status says when the
///   presented certificate nears its end ([`ClientStatus::expiring`]) and once it has expired.
/// - After the identity or the trust changes, the client's session cache starts empty: a
///   resumed session would present the old identity (TLS 1.3 resumption sends no certificate)
///   and skip checking the server against the new roots.
/// - Until the first bundle is installed the client presents nothing and trusts no server.
/// - The task stops on the cancellation token or when every handle and config is gone.
///
/// # Example
/// ```no_run
/// use tls_reload::{ClientTls, FileSource};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let tls = ClientTls::builder().spawn(FileSource::kubernetes_dir("/etc/client-tls").build())?;
/// tls.ready().await?;
/// let config = tls.client_config()?; // for reqwest, hyper-rustls, tokio-rustls
/// # Ok(()) }
/// ```
///
/// With hyper-rustls (the `client` example of the repository does the same with reqwest and
/// [`rebuilt`](ClientTls::rebuilt)):
/// ```no_run
/// # async fn run(tls: tls_reload::ClientTls) -> Result<(), Box<dyn std::error::Error>> {
/// use http_body_util::Empty;
/// use hyper::body::Bytes;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
///
/// let https = hyper_rustls::HttpsConnectorBuilder::new()
///     .with_tls_config(tls.client_config()?)
///     .https_only()
///     .enable_http1()
///     .enable_http2()
///     .build();
/// let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
/// let response = client.get("https://api.internal:8443/".parse()?).await?;
/// println!("{}", response.status());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientTls {
    provider: Arc<CryptoProvider>,
    parts: Arc<Parts>,
    status: watch::Receiver<ClientStatus>,
    token: CancellationToken,
}

/// What the configs share with the task: the identity, the verifier, the sessions, and the
/// count of installs (raised before the status says so: what connections made before an
/// install compare against).
#[derive(Debug)]
struct Parts {
    identity: Arc<Identity>,
    verifier: Arc<Verifier>,
    sessions: Arc<Sessions>,
    installs: Arc<AtomicU64>,
}

/// What [`ClientTls::status`] reports.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClientStatus {
    /// The client certificate presented now; `None` until the first is installed.
    pub current: Option<Arc<CertInfo>>,
    /// How many identities have been installed.
    pub generation: u64,
    /// The last rejected bundle or source error since the last install.
    pub last_error: Option<Arc<Error>>,
    /// SHA-256 fingerprints of the roots servers are trusted with now.
    pub root_fingerprints_sha256: Vec<String>,
    /// Whether the presented certificate is inside the expiry-warning window
    /// ([`Policy::expiry_warning`]) or past its end.
    pub expiring: bool,
    /// Whether the presented certificate has expired ([`Error::ServedExpired`] in
    /// [`last_error`](Self::last_error)).
    pub expired: bool,
    /// Whether the source panicked and was dropped: the identity keeps being presented and
    /// will not rotate.
    pub stopped: bool,
    /// Whether the task still runs.
    pub running: bool,
}

/// Configures a [`ClientTls`]; made by [`ClientTls::builder`].
#[must_use = "a builder does nothing until `spawn` is called"]
#[derive(Default)]
pub struct ClientTlsBuilder {
    provider: Option<Arc<CryptoProvider>>,
    policy: Option<Policy>,
    clock: Option<Arc<dyn Clock>>,
    token: Option<CancellationToken>,
    roots: Roots,
}

impl fmt::Debug for ClientTlsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTlsBuilder")
            .field("policy", &self.policy)
            .field("bundle_roots", &self.roots.bundle)
            .field("extra_roots", &self.roots.extra.len())
            .finish_non_exhaustive()
    }
}

impl ClientTlsBuilder {
    /// Also trusts servers with `roots`, besides the bundle's CA certificates (`ca.crt`):
    /// public CAs for a client that calls internal and public servers alike. A bundle with
    /// no `ca.crt` is then accepted. Repeatable (the roots add up).
    ///
    /// The webpki roots (Mozilla's, the `webpki-root-certs` crate), or the platform's
    /// (`rustls-native-certs`):
    /// ```ignore
    /// let tls = ClientTls::builder()
    ///     .roots(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned())
    ///     // or: .roots(rustls_native_certs::load_native_certs().certs)
    ///     .spawn(FileSource::kubernetes_dir("/etc/client-tls").build())?;
    /// ```
    pub fn roots(mut self, roots: impl IntoIterator<Item = CertificateDer<'static>>) -> Self {
        let mut all = self.roots.extra.to_vec();
        all.extend(roots);
        self.roots.extra = all.into();
        self
    }

    /// Whether the bundle's CA certificates are trusted (default: yes). Off, only
    /// [`roots`](Self::roots) are: the bundle is the identity alone.
    pub fn bundle_roots(mut self, trust: bool) -> Self {
        self.roots.bundle = trust;
        self
    }

    /// The crypto provider, chosen as for the server ([`Builder::crypto_provider`](crate::Builder::crypto_provider)).
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// What a client bundle must pass. Default: [`Policy::default`] with
    /// [`Purpose::ClientAuth`] (the purpose is always client authentication).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Judges validity, retries and expiry by `clock` instead of the system clock (as
    /// [`Builder::clock`](crate::Builder::clock)).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The token that stops the task (the last identity keeps being presented).
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Spawns the task that installs what `source` yields.
    ///
    /// # Errors
    /// [`Error::NoCryptoProvider`], as for the server.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn<S: IntoCertSource>(self, source: S) -> Result<ClientTls, Error> {
        let provider = self
            .provider
            .or_else(crate::tls::default_crypto_provider)
            .ok_or(Error::NoCryptoProvider)?;
        let policy = self.policy.unwrap_or_default().purpose(Purpose::ClientAuth);
        let mut validator = Validator::new(Arc::clone(&provider), policy);
        if let Some(clock) = self.clock {
            validator = validator.with_clock(clock);
        }
        let gone = CancellationToken::new();
        let parts = Arc::new(Parts {
            identity: Arc::new(Identity::new(gone.clone())),
            verifier: Arc::new(Verifier::new(&provider)),
            sessions: Arc::new(Sessions::default()),
            installs: Arc::new(AtomicU64::new(0)),
        });
        let token = self.token.unwrap_or_default().child_token();
        let (tx, rx) = watch::channel(ClientStatus {
            running: true,
            ..ClientStatus::default()
        });
        let mut inputs = Inputs::default();
        inputs.route(0, source.into_cert_source());
        let clock = Arc::clone(validator.clock());
        let engine = Engine::new(validator, vec![Kind::Client(self.roots.clone())], None);
        let client = Client {
            installs: Arc::clone(&parts.installs),
            roots_config: self.roots,
            identity: Arc::downgrade(&parts.identity),
            verifier: Arc::clone(&parts.verifier),
            sessions: Arc::clone(&parts.sessions),
            provider: Arc::clone(&provider),
            status: tx.clone(),
            roots: Vec::new(),
        };
        let cancel = token.clone();
        let run = task::run(engine, inputs, client, clock, cancel, gone);
        tokio::spawn(async move {
            let ended = AssertUnwindSafe(run).catch_unwind().await;
            if let Err(panic) = &ended {
                let message = tls_source::panic_message(panic.as_ref());
                tracing::error!(panic = %message, "client certificate task stopped; presenting the current identity, which will not rotate");
            }
            tx.send_modify(|s| s.running = false);
        });
        Ok(ClientTls {
            provider,
            parts,
            status: rx,
            token,
        })
    }
}

impl ClientTls {
    /// Starts configuring the client side.
    pub fn builder() -> ClientTlsBuilder {
        ClientTlsBuilder::default()
    }

    /// A `ClientConfig` presenting the current identity and trusting the current roots, both
    /// following rotations, with its session cache cleared on each. Set ALPN on it as needed.
    ///
    /// # Errors
    /// If the provider supports no safe protocol version.
    pub fn client_config(&self) -> Result<ClientConfig, rustls::Error> {
        crate::tls::client::client_config(
            &self.provider,
            &self.parts.identity,
            &self.parts.verifier,
            &self.parts.sessions,
        )
    }

    /// The status: the identity presented, the roots, the last error.
    pub fn status(&self) -> watch::Receiver<ClientStatus> {
        self.status.clone()
    }

    /// Waits until an identity is installed.
    ///
    /// # Errors
    /// [`crate::NotReady::Stopped`] when the task ends first.
    pub async fn ready(&self) -> Result<(), crate::NotReady> {
        let mut rx = self.status.clone();
        let status = rx
            .wait_for(|s| s.current.is_some() || !s.running)
            .await
            .map(|s| s.clone())
            .unwrap_or_default();
        if status.current.is_some() {
            Ok(())
        } else {
            Err(crate::NotReady::Stopped {
                last_error: status.last_error,
            })
        }
    }

    /// As [`ready`](Self::ready), for at most `timeout`.
    ///
    /// # Errors
    /// [`crate::NotReady::Stopped`] when the task ends first; [`crate::NotReady::TimedOut`]
    /// with the last error (a rejected bundle, naming its file) when the time is up.
    pub async fn ready_timeout(&self, timeout: Duration) -> Result<(), crate::NotReady> {
        match tokio::time::timeout(timeout, self.ready()).await {
            Ok(ready) => ready,
            Err(_) => Err(crate::NotReady::TimedOut {
                waited: timeout,
                last_error: self.status.borrow().last_error.clone(),
            }),
        }
    }

    /// How many identities (with their roots) have been installed; raised before the status
    /// says so.
    fn installs(&self) -> u64 {
        self.parts.installs.load(Ordering::Acquire)
    }

    /// A value built from [`client_config`](Self::client_config) (a `reqwest::Client`),
    /// built again on the first [`Rebuilt::get`] after each rotation of the identity or the
    /// roots: an HTTP client's pool keeps its connections, and a connection made before a
    /// rotation would go on presenting the old certificate (TLS authenticates the client
    /// once, at the handshake). Each new value starts with an empty pool; the old one's
    /// connections close when its last clone is dropped.
    ///
    /// ```no_run
    /// # async fn run(tls: tls_reload::ClientTls) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let http = tls.rebuilt(|mut config| {
    ///     config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    ///     reqwest::Client::builder().tls_backend_preconfigured(config).build()
    /// })?;
    /// let response = http.get()?.get("https://api.internal:8443/").send().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// What `build` returns, or the provider supporting no safe protocol version.
    pub fn rebuilt<T, E, F>(&self, build: F) -> Result<Rebuilt<T>, BoxError>
    where
        T: Clone,
        E: Into<BoxError>,
        F: Fn(ClientConfig) -> Result<T, E> + Send + Sync + 'static,
    {
        let build: Build<T> = Box::new(move |config| build(config).map_err(Into::into));
        let installs = self.installs();
        let value = build(self.client_config()?)?;
        Ok(Rebuilt {
            tls: self.clone(),
            build,
            current: Mutex::new((installs, value)),
        })
    }

    /// Stops the task; the last identity and roots stay in use.
    pub fn stop(&self) {
        self.token.cancel();
    }
}

/// A boxed error, as [`ClientTls::rebuilt`] returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Build<T> = Box<dyn Fn(ClientConfig) -> Result<T, BoxError> + Send + Sync>;

/// A value built from a [`ClientTls`]'s config, rebuilt after each rotation; made by
/// [`ClientTls::rebuilt`].
pub struct Rebuilt<T> {
    tls: ClientTls,
    build: Build<T>,
    /// The value, and the installs it was built after.
    current: Mutex<(u64, T)>,
}

impl<T: Clone> Rebuilt<T> {
    /// The value for the identity and roots installed now: the same one until the next
    /// rotation, then a new one, built on this call.
    ///
    /// # Errors
    /// What the build function returns when rebuilding fails (the next call tries again).
    pub fn get(&self) -> Result<T, BoxError> {
        let installs = self.tls.installs();
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.0 != installs {
            let value = (self.build)(self.tls.client_config()?)?;
            *current = (installs, value);
        }
        Ok(current.1.clone())
    }
}

impl<T> fmt::Debug for Rebuilt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rebuilt")
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

/// The client side's effects: the identity, the roots, the sessions, the status.
struct Client {
    installs: Arc<AtomicU64>,
    roots_config: Roots,
    /// Weak: every handle and config holds the identity; when it is gone, nothing presents
    /// what the task would install.
    identity: Weak<Identity>,
    verifier: Arc<Verifier>,
    sessions: Arc<Sessions>,
    provider: Arc<CryptoProvider>,
    status: watch::Sender<ClientStatus>,
    /// The fingerprints of the roots trusted now.
    roots: Vec<String>,
}

impl Apply for Client {
    const METRICS: bool = false;

    fn install(&mut self, _slot: Option<&Arc<Slot>>, validated: &crate::Validated, _: bool) {
        let Some(identity) = self.identity.upgrade() else {
            return;
        };
        // The engine checked that the roots make a verifier (`Rule::ServerRoots`).
        match Verifier::for_roots(validated.ca(), &self.roots_config, &self.provider) {
            Ok((verifier, fingerprints)) => {
                identity.store(Arc::clone(validated.certified_key()));
                self.verifier.store(verifier);
                // Nothing resumed from before: old identity, old roots.
                self.sessions.clear();
                // Before the status says so: a connection made before this install is stale
                // for whoever reads the status next.
                self.installs.fetch_add(1, Ordering::AcqRel);
                tracing::info!(fingerprint = %validated.info().fingerprint_sha256, roots = fingerprints.len(), "client certificate and roots installed");
                self.roots = fingerprints;
            }
            Err(reason) => {
                tracing::error!(error = %reason, "client roots cannot be used; keeping the current identity");
            }
        }
    }

    fn table(&mut self, _table: Table) {}

    fn table_edit(&mut self, _edits: &[crate::tls::TableEdit]) {}

    fn trust(&mut self, _roots: &[CertificateDer<'static>], _invalidate: bool) {}

    fn publish(&mut self, publish: Publish) {
        let roots = &self.roots;
        self.status.send_if_modified(|s| {
            let Some((_, route)) = publish
                .routes
                .into_iter()
                .find(|(label, _)| label.is_none())
            else {
                return false;
            };
            s.current.clone_from(&route.current);
            s.generation = route.generation;
            s.last_error.clone_from(&route.last_error);
            s.expiring = route.expiring;
            s.expired = route.expired;
            s.stopped = route.stopped;
            s.root_fingerprints_sha256.clone_from(roots);
            true
        });
    }
}

#[cfg(feature = "hyper")]
mod connector {
    //! [`Connector`]: hyper-util's pool drops connections made before a rotation.

    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;
    use hyper::Uri;
    use hyper::rt::{Read, ReadBufCursor, Write};
    use hyper_util::client::legacy::connect::{Connected, Connection};

    use super::ClientTls;

    /// A connector for hyper-util's `Client` whose connections, once the [`ClientTls`] they
    /// were made under has rotated (identity or roots), read as closed: over HTTP/1.1 the
    /// next request finds the connection closed before it is sent and goes out on a new one
    /// (hyper-util retries such requests), presenting the new certificate. An HTTP/2
    /// connection notices only when it next reads, so a request may race it: for HTTP/2 use
    /// [`ClientTls::rebuilt`]. Made by
    /// [`ClientTls::connector`]; wraps any connector (hyper-rustls's `HttpsConnector` on
    /// [`ClientTls::client_config`]).
    #[derive(Debug, Clone)]
    pub struct Connector<C> {
        inner: C,
        installs: Arc<AtomicU64>,
    }

    /// A connection of a [`Connector`]: reads as closed after a rotation.
    #[derive(Debug)]
    pub struct Fresh<T> {
        io: T,
        /// The installs when the connection was started (before its handshake).
        made: u64,
        installs: Arc<AtomicU64>,
    }

    impl<T> Fresh<T> {
        fn stale(&self) -> bool {
            self.installs.load(Ordering::Acquire) != self.made
        }

        /// The connection itself.
        pub fn into_inner(self) -> T {
            self.io
        }
    }

    impl ClientTls {
        /// Wraps `inner` (a connector whose TLS config is this one's
        /// [`client_config`](Self::client_config)) so that hyper-util's pool never sends a
        /// request on a connection made with an old identity or old roots.
        ///
        /// ```no_run
        /// # async fn run(tls: tls_reload::ClientTls) -> Result<(), Box<dyn std::error::Error>> {
        /// use http_body_util::Empty;
        /// use hyper::body::Bytes;
        /// use hyper_util::client::legacy::Client;
        /// use hyper_util::rt::TokioExecutor;
        ///
        /// let https = hyper_rustls::HttpsConnectorBuilder::new()
        ///     .with_tls_config(tls.client_config()?)
        ///     .https_only()
        ///     .enable_http1()
        ///     .build();
        /// let client: Client<_, Empty<Bytes>> =
        ///     Client::builder(TokioExecutor::new()).build(tls.connector(https));
        /// let response = client.get("https://api.internal:8443/".parse()?).await?;
        /// # Ok(()) }
        /// ```
        pub fn connector<C>(&self, inner: C) -> Connector<C> {
            Connector {
                inner,
                installs: Arc::clone(&self.parts.installs),
            }
        }
    }

    impl<C> tower_service::Service<Uri> for Connector<C>
    where
        C: tower_service::Service<Uri>,
        C::Future: Send + 'static,
    {
        type Response = Fresh<C::Response>;
        type Error = C::Error;
        type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, uri: Uri) -> Self::Future {
            // Before the handshake: a rotation during it makes the connection stale at once.
            let made = self.installs.load(Ordering::Acquire);
            let installs = Arc::clone(&self.installs);
            let connecting = self.inner.call(uri);
            Box::pin(async move {
                let io = connecting.await?;
                Ok(Fresh { io, made, installs })
            })
        }
    }

    impl<T: Read + Unpin> Read for Fresh<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: ReadBufCursor<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.stale() {
                // End of stream: the connection closes, the pool forgets it.
                return Poll::Ready(Ok(()));
            }
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl<T: Write + Unpin> Write for Fresh<T> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.io).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }

        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
        }
    }

    impl<T: Connection> Connection for Fresh<T> {
        fn connected(&self) -> Connected {
            self.io.connected()
        }
    }
}

#[cfg(feature = "hyper")]
pub use connector::{Connector, Fresh};
