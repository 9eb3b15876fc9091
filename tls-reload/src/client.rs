//! [`ClientTls`]: the client side of mTLS, rotating: the certificate an outbound client presents
//! and the roots it trusts, fed by a [`CertSource`], behind one `ClientConfig` that a whole
//! connection pool can keep.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};

use futures::FutureExt as _;
use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::clock::Clock;
use tls_source::{CertSource, CertSourceExt as _};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, Kind, Publish};
use crate::task::{self, Apply, Inputs};
use crate::tls::client::{Identity, Sessions, Verifier};
use crate::tls::{Slot, Table};
use crate::{CertInfo, Error, Policy, Purpose, Validator};

/// The client side of mTLS, rotating: a `ClientConfig` ([`client_config`](Self::client_config))
/// whose client certificate and trusted roots follow a [`CertSource`] of client bundles: the
/// chain and key the client presents, and in the bundle's CA certificates (`ca.crt`, the
/// `kubernetes.io/tls` convention, or `FileSource::ca`) the roots it trusts servers with. One
/// config serves a whole connection pool (reqwest's `use_preconfigured_tls`, hyper-rustls's
/// `with_tls_config`) across rotations.
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
/// With hyper-rustls (the `client` example of the repository does the same with reqwest's
/// `tls_backend_preconfigured`):
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

/// What the configs share with the task: the identity, the verifier, the sessions.
#[derive(Debug)]
struct Parts {
    identity: Arc<Identity>,
    verifier: Arc<Verifier>,
    sessions: Arc<Sessions>,
}

/// What [`ClientTls::status`] reports.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClientStatus {
    /// The client certificate presented now; `None` until the first is installed.
    pub current: Option<CertInfo>,
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
}

impl fmt::Debug for ClientTlsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTlsBuilder")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ClientTlsBuilder {
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
    pub fn spawn<S: CertSource + 'static>(self, source: S) -> Result<ClientTls, Error> {
        let provider = self
            .provider
            .or_else(crate::tls::default_provider)
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
        });
        let token = self.token.unwrap_or_default().child_token();
        let (tx, rx) = watch::channel(ClientStatus {
            running: true,
            ..ClientStatus::default()
        });
        let mut inputs = Inputs::default();
        inputs.route(0, source.boxed_source());
        let clock = Arc::clone(validator.clock());
        let engine = Engine::new(validator, vec![Kind::Client], None);
        let client = Client {
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

    /// Stops the task; the last identity and roots stay in use.
    pub fn stop(&self) {
        self.token.cancel();
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

    fn install(&mut self, _slot: Option<&Arc<Slot>>, validated: &crate::Validated) {
        let Some(identity) = self.identity.upgrade() else {
            return;
        };
        // The engine checked that the roots make a verifier (`Rule::ServerRoots`).
        match Verifier::for_roots(validated.ca(), &self.provider) {
            Ok((verifier, fingerprints)) => {
                identity.store(Arc::clone(validated.certified_key()));
                self.verifier.store(verifier);
                // Nothing resumed from before: old identity, old roots.
                self.sessions.clear();
                tracing::info!(fingerprint = %validated.info().fingerprint_sha256, roots = fingerprints.len(), "client certificate and roots installed");
                self.roots = fingerprints;
            }
            Err(reason) => {
                tracing::error!(error = %reason, "client roots cannot be used; keeping the current identity");
            }
        }
    }

    fn table(&mut self, _table: Table) {}

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
            s.current = route.current;
            s.generation = route.generation;
            s.last_error = route.last_error;
            s.expiring = route.expiring;
            s.expired = route.expired;
            s.stopped = route.stopped;
            s.root_fingerprints_sha256.clone_from(roots);
            true
        });
    }
}
