//! [`Acme`] and its builder, and the driver: the stored state first, then the account, then
//! each certificate's loop (renew when due, order, answer, finalize, store, serve).

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use instant_acme::{
    Account, AuthorizationStatus, ExternalAccountKey, Identifier, NewOrder, Order, OrderStatus,
    RetryPolicy,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::x509::LeafInfo;
use tls_source::{CertBundle, Decoder, Keyed, KeyedUpdate, Origin};
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::challenge::{ChallengeType, Challenges, Dns01Solver, Http01};
use crate::client::{self, RetryAfter, Trust, classify, problem_type};
use crate::status::{AcmeStatus, NameState, NameStatus};
use crate::store::{self, InFlight, Schedule, Store};

/// The shortest and the longest wait after a failed order (other than a refusal or a rate
/// limit): one minute, doubling, at most a day.
const BACKOFF_MIN: Duration = Duration::from_secs(60);
const BACKOFF_MAX: Duration = Duration::from_secs(24 * 3600);
/// How long after an order the CA refused (a failed validation) it is tried again, at least.
pub const REFUSED_BACKOFF: Duration = Duration::from_secs(3600);
/// Let's Encrypt's limit of new certificates per registered domain in seven days: the default
/// budget of first orders ([`AcmeBuilder::new_certificates_per_week`]).
pub const DEFAULT_NEW_CERTIFICATES_PER_WEEK: u32 = 50;
const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long the CA may take to validate, or to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(120));

/// Certificates from an ACME CA for many names: a keyed source of them (each certificate an SNI
/// route of the reload core), the TLS-ALPN-01 responder, the HTTP-01 responder and the status.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tls_acme::Acme;
///
/// let acme = Acme::builder("https://acme-staging-v02.api.letsencrypt.org/directory")
///     .contact("admin@example.com")
///     .name("example.com")
///     .name("www.example.com")
///     .state_dir("/var/lib/my-server/acme")
///     .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
///     .build()?;
/// let reloader = tls_reload::Reloader::builder()
///     .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
///     .routes(acme.source().expect("taken once"))
///     .handshake_hook(acme.challenges())
///     .sni_strict(true)
///     .spawn_routes()?;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:443").await?;
/// let incoming = reloader.incoming(listener)?; // answers TLS-ALPN-01 before ready, too
/// # drop(incoming); Ok(()) }
/// ```
pub struct Acme {
    #[cfg(feature = "k8s")]
    leadership: Option<(
        watch::Receiver<tls_k8s::Leadership>,
        tokio_util::sync::CancellationToken,
    )>,
    challenges: Arc<Challenges>,
    http01: Http01,
    status: watch::Receiver<AcmeStatus>,
    source: Mutex<Option<AcmeSource>>,
}

impl fmt::Debug for Acme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acme")
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl Acme {
    /// Starts configuring a client of the ACME directory at `directory` (its URL).
    pub fn builder(directory: impl Into<String>) -> AcmeBuilder {
        AcmeBuilder {
            directory: directory.into(),
            contact: Vec::new(),
            eab: None,
            groups: Vec::new(),
            state: None,
            challenge: ChallengeType::default(),
            dns01: None,
            trust: Ok(Trust::default()),
            provider: None,
            stagger: Duration::from_millis(200),
            per_week: DEFAULT_NEW_CERTIFICATES_PER_WEEK,
            #[cfg(feature = "k8s")]
            fleet: None,
        }
    }

    /// The keyed source of the certificates, for [`Builder::routes`](tls_reload::Builder::routes):
    /// `None` once taken. It starts working when first polled, and stops when dropped.
    pub fn source(&self) -> Option<AcmeSource> {
        self.source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The TLS-ALPN-01 responder, for
    /// [`Builder::handshake_hook`](tls_reload::Builder::handshake_hook).
    pub fn challenges(&self) -> Arc<Challenges> {
        Arc::clone(&self.challenges)
    }

    /// The HTTP-01 responder (a tower service).
    pub fn http01(&self) -> Http01 {
        self.http01.clone()
    }

    /// Who leads the fleet, as this replica sees it (`None` without
    /// [`kubernetes`](AcmeBuilder::kubernetes)).
    #[cfg(feature = "k8s")]
    pub fn leadership(&self) -> Option<watch::Receiver<tls_k8s::Leadership>> {
        self.leadership.as_ref().map(|(rx, _)| rx.clone())
    }

    /// With [`kubernetes`](AcmeBuilder::kubernetes): resolves once the started source has
    /// been dropped and this replica's Lease released (a leader releases it, so that another
    /// replica leads within a retry period rather than a lease duration). Without a fleet, at
    /// once.
    #[cfg(feature = "k8s")]
    pub fn released(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let released = self.leadership.as_ref().map(|(_, r)| r.clone());
        async move {
            if let Some(released) = released {
                released.cancelled().await;
            }
        }
    }

    /// The status, updated as each certificate's state changes (on a fleet's other replicas,
    /// as its leader publishes it).
    pub fn status(&self) -> watch::Receiver<AcmeStatus> {
        self.status.clone()
    }
}

/// Configures an [`Acme`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct AcmeBuilder {
    directory: String,
    contact: Vec<String>,
    eab: Option<(String, Vec<u8>)>,
    groups: Vec<Vec<String>>,
    state: Option<PathBuf>,
    challenge: ChallengeType,
    dns01: Option<Arc<dyn Dns01Solver>>,
    trust: Result<Trust, String>,
    provider: Option<Arc<CryptoProvider>>,
    stagger: Duration,
    per_week: u32,
    #[cfg(feature = "k8s")]
    fleet: Option<FleetSettings>,
}

/// [`AcmeBuilder::kubernetes`]'s settings.
#[cfg(feature = "k8s")]
struct FleetSettings {
    client: kube::Client,
    namespace: String,
    name: String,
    identity: String,
    lease: Option<String>,
    timing: Option<(Duration, Duration, Duration)>,
    propagation: Duration,
    seal: Arc<dyn tls_k8s::seal::Seal>,
}

/// How long the leader of a fleet waits after publishing a challenge before the CA is told to
/// validate: the other replicas' watch delivers it in milliseconds.
#[cfg(feature = "k8s")]
pub const DEFAULT_CHALLENGE_PROPAGATION: Duration = Duration::from_secs(1);

impl fmt::Debug for AcmeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcmeBuilder")
            .field("directory", &self.directory)
            .field("groups", &self.groups)
            .field("state", &self.state)
            .field("challenge", &self.challenge)
            .finish_non_exhaustive()
    }
}

impl AcmeBuilder {
    /// A contact address for the account (`mailto:` is added if missing). Repeatable.
    pub fn contact(mut self, email: impl Into<String>) -> Self {
        let email = email.into();
        self.contact.push(if email.starts_with("mailto:") {
            email
        } else {
            format!("mailto:{email}")
        });
        self
    }

    /// External account binding (a CA that requires one: `ZeroSSL`, Google): the key id and
    /// the HMAC key (decoded from its base64url).
    pub fn external_account(mut self, key_id: impl Into<String>, hmac_key: Vec<u8>) -> Self {
        self.eab = Some((key_id.into(), hmac_key));
        self
    }

    /// A name with a certificate of its own (the default: one certificate per name).
    pub fn name(self, name: impl Into<String>) -> Self {
        self.group([name.into()])
    }

    /// Names that share one certificate (fewer orders against a CA's limits); it is keyed,
    /// stored and shown by its first name.
    pub fn group(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.groups.push(
            names
                .into_iter()
                .map(|n| n.into().to_ascii_lowercase())
                .collect(),
        );
        self
    }

    /// The state directory (needed: the account, the certificates and the orders in flight
    /// are kept there, so that a restart serves what is stored and orders nothing that still
    /// fits).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state = Some(dir.into());
        self
    }

    /// The challenge type answered. Default: TLS-ALPN-01.
    pub fn challenge(mut self, challenge: ChallengeType) -> Self {
        self.challenge = challenge;
        self
    }

    /// The DNS-01 solver (needed for [`ChallengeType::Dns01`], the only type for wildcards).
    pub fn dns01_solver(mut self, solver: Arc<dyn Dns01Solver>) -> Self {
        self.dns01 = Some(solver);
        self
    }

    /// Trusts the CA certificates of this PEM file for the directory's HTTPS, besides the web
    /// PKI's roots (a private CA, or a test server such as Pebble).
    pub fn directory_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        self.trust = Trust::with_file(&path).map_err(|e| e.to_string());
        self
    }

    /// Trusts these CA certificates for the directory's HTTPS, besides the web PKI's roots.
    pub fn directory_roots(mut self, roots: Vec<CertificateDer<'static>>) -> Self {
        self.trust = Ok(Trust::Extra(roots));
        self
    }

    /// The crypto provider of the directory's HTTPS and the challenge certificates. Default: the
    /// reloader's ([`tls_reload::default_crypto_provider`]: the `aws-lc-rs` or `ring` feature's,
    /// else the process default); none is ever installed.
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The pause between the first orders of successive certificates at start (a CA sees a
    /// ramp, not a burst). Only the certificates to order at start are spaced: one stored
    /// that still fits does not delay the next, so a name added to many stored ones, or the
    /// rest after a failover, is ordered at once. Default: 200 ms.
    pub fn stagger(mut self, stagger: Duration) -> Self {
        self.stagger = stagger;
        self
    }

    /// How many certificates for names not yet held may be ordered per registered domain
    /// (`example.co.uk` for `a.b.example.co.uk`, by the public suffix list) in any seven days;
    /// beyond it, a name waits (`backoff`, with `retry_at` and why) without asking the CA.
    /// Renewals do not count. Default: 50, Let's Encrypt's limit of new certificates per
    /// registered domain per week ([`DEFAULT_NEW_CERTIFICATES_PER_WEEK`]); a CA with other
    /// limits, or names in many certificates ([`group`](Self::group)), may need another.
    pub fn new_certificates_per_week(mut self, count: u32) -> Self {
        self.per_week = count;
        self
    }

    /// Shares the state with a fleet of replicas in Kubernetes Secrets of `namespace`, instead
    /// of a state directory (feature `k8s`): the replica holding the Lease `NAME-acme` (see
    /// [`lease`](Self::lease)) orders
    /// and renews, every write fenced by its round; every replica serves each certificate from
    /// its Secret (`NAME-acme-<first name>`, `kubernetes.io/tls`, labelled
    /// [`CERTIFICATE_LABEL`](crate::CERTIFICATE_LABEL)`=NAME`) and answers the CA's
    /// challenges (the TLS-ALPN-01 ones published in `NAME-acme-challenges`, HTTP-01 from the
    /// account's thumbprint on `NAME-acme-account`). An order in flight is stored (in
    /// `NAME-acme-state`) before a challenge is answered: a new leader resumes it instead of
    /// placing another. `identity` names this replica in the Lease (e.g. the pod name).
    ///
    /// The service account needs `get`, `list`, `watch`, `create` and `update` on Secrets and
    /// Leases of the namespace.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = kube::Client::try_default().await?;
    /// let acme = tls_acme::Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
    ///     .contact("admin@example.com")
    ///     .name("example.com")
    ///     .kubernetes(client, "web", "web", std::env::var("POD_NAME")?)
    ///     .crypto_provider(std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
    ///     .build()?;
    /// # drop(acme); Ok(()) }
    /// ```
    #[cfg(feature = "k8s")]
    pub fn kubernetes(
        mut self,
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        self.fleet = Some(FleetSettings {
            client,
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease: None,
            timing: None,
            propagation: DEFAULT_CHALLENGE_PROPAGATION,
            seal: Arc::new(tls_k8s::seal::Plain),
        });
        self
    }

    /// The fleet's Lease (default `NAME-acme`). Only with [`kubernetes`](Self::kubernetes).
    #[cfg(feature = "k8s")]
    pub fn lease(mut self, lease: impl Into<String>) -> Self {
        if let Some(fleet) = &mut self.fleet {
            fleet.lease = Some(lease.into());
        }
        self
    }

    /// The fleet's Lease timing: its duration, the renew deadline, the retry period (default
    /// client-go's 15 s, 10 s, 2 s; see [`tls_k8s::store::LeaseLock::timing`]). Only with
    /// [`kubernetes`](Self::kubernetes).
    #[cfg(feature = "k8s")]
    pub fn lease_timing(
        mut self,
        lease: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> Self {
        if let Some(fleet) = &mut self.fleet {
            fleet.timing = Some((lease, renew_deadline, retry));
        }
        self
    }

    /// How long the fleet's leader waits after publishing a challenge before it tells the CA
    /// to validate, so that whichever replica the CA reaches answers it. Default: one second
    /// ([`DEFAULT_CHALLENGE_PROPAGATION`]). Only with [`kubernetes`](Self::kubernetes).
    #[cfg(feature = "k8s")]
    pub fn challenge_propagation(mut self, wait: Duration) -> Self {
        if let Some(fleet) = &mut self.fleet {
            fleet.propagation = wait;
        }
        self
    }

    /// Seals what only the leader reads: the account's credentials (`account.json` of the
    /// account Secret) and the new key of each order in flight (in the state Secret), each
    /// bound to its Secret and key (see `tls_k8s::seal`). Every replica that may lead needs
    /// the seal. Default: nothing sealed. Only with [`kubernetes`](Self::kubernetes).
    ///
    /// The certificates' Secrets stay `kubernetes.io/tls` Secrets with a plain `tls.key`
    /// (every replica serves them through one label-selector watch, as any other
    /// `kubernetes.io/tls` Secret). A value stored unsealed while a seal is given is refused
    /// (the status's `account_error` says so) unless the ring adopts unsealed state
    /// ([`KeyRing::adopt_unsealed`](tls_k8s::seal::KeyRing::adopt_unsealed)); the leader then
    /// stores the account sealed.
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use tls_k8s::seal::KeyRing;
    ///
    /// let acme = tls_acme::Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
    ///     .name("example.com")
    ///     .kubernetes(client, "web", "web", std::env::var("POD_NAME")?)
    ///     .seal(Arc::new(KeyRing::from_files(["/etc/seal/seal.key"])?))
    ///     .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
    ///     .build()?;
    /// # drop(acme); Ok(()) }
    /// ```
    #[cfg(feature = "k8s")]
    pub fn seal(mut self, seal: Arc<dyn tls_k8s::seal::Seal>) -> Self {
        if let Some(fleet) = &mut self.fleet {
            fleet.seal = seal;
        }
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::Config`]: no names, a name that is not a DNS name (or appears twice), a
    /// wildcard without DNS-01, DNS-01 without a solver, no state directory, an unreadable
    /// trust file, no crypto provider.
    pub fn build(self) -> Result<Acme, Error> {
        let config = |reason: String| Error::Config(reason);
        let trust = self.trust.map_err(config)?;
        let provider = self
            .provider
            .or_else(tls_reload::default_crypto_provider)
            .ok_or_else(|| {
                config("no crypto provider: enable tls-reload's (or tls-rotation's) feature `aws-lc-rs` or `ring`, give one with crypto_provider, or install a process default".into())
            })?;
        #[cfg(feature = "k8s")]
        let fleet = self.fleet;
        #[cfg(not(feature = "k8s"))]
        let fleet: Option<std::convert::Infallible> = None;
        let store: (Store, Option<FleetOf>) = match (self.state, fleet) {
            (Some(_), Some(_)) => {
                return Err(config(
                    "both a state directory and a fleet's Secrets: choose one".into(),
                ));
            }
            (Some(dir), None) => (Store::Dir(store::DirStore::new(dir)), None),
            #[cfg(feature = "k8s")]
            (None, Some(fleet)) => {
                let (tx, _) = watch::channel(tls_k8s::Leadership::default());
                let kube = Arc::new(crate::fleet::KubeStore::new(
                    fleet.client.clone(),
                    &fleet.namespace,
                    &fleet.name,
                    fleet.propagation,
                    fleet.seal,
                ));
                (
                    Store::Kube(kube),
                    Some(crate::fleet::FleetConfig {
                        client: fleet.client,
                        namespace: fleet.namespace,
                        lease: fleet
                            .lease
                            .unwrap_or_else(|| format!("{}-acme", fleet.name)),
                        name: fleet.name,
                        identity: fleet.identity,
                        timing: fleet.timing,
                        leadership: Arc::new(tx),
                        released: tokio_util::sync::CancellationToken::new(),
                    }),
                )
            }
            (None, _) => {
                return Err(config("a state directory is needed (state_dir): without one, every restart orders every certificate again".into()));
            }
        };
        let (store, fleet) = store;
        if self.groups.is_empty() {
            return Err(config("no names to order certificates for".into()));
        }
        if self.challenge == ChallengeType::Dns01 && self.dns01.is_none() {
            return Err(config("dns-01 needs a DNS-01 solver (dns01_solver)".into()));
        }
        let mut seen = HashSet::new();
        for name in self.groups.iter().flatten() {
            check_name(name)?;
            if name.starts_with("*.") && self.challenge != ChallengeType::Dns01 {
                return Err(config(format!(
                    "{name}: a wildcard name can only be validated by dns-01 (the challenge is {})",
                    self.challenge
                )));
            }
            if !seen.insert(name.clone()) {
                return Err(config(format!("{name} is configured twice")));
            }
        }
        if self.groups.iter().any(Vec::is_empty) {
            return Err(config("a group of names is empty".into()));
        }
        let challenges = Arc::new(Challenges::default());
        let thumbprint = Arc::new(RwLock::new(None));
        let http01 = Http01::new(seen, Arc::clone(&thumbprint));
        let (status_tx, status) = watch::channel(AcmeStatus {
            directory: self.directory.clone(),
            names: self
                .groups
                .iter()
                .map(|g| (g[0].clone(), NameStatus::default()))
                .collect(),
            ..AcmeStatus::default()
        });
        let driver = Driver {
            directory: self.directory,
            contact: self.contact,
            eab: self.eab,
            groups: self.groups,
            store,
            challenge: self.challenge,
            dns01: self.dns01,
            trust,
            provider,
            stagger: self.stagger,
            per_week: self.per_week,
            budget: tokio::sync::Mutex::new(None),
            budget_stored: tokio::sync::Mutex::new(0),
            challenges: Arc::clone(&challenges),
            thumbprint,
            status: status_tx,
            retry_after: RetryAfter::default(),
            #[cfg(feature = "k8s")]
            fleet: fleet.clone(),
        };
        #[cfg(not(feature = "k8s"))]
        let _ = fleet;
        Ok(Acme {
            #[cfg(feature = "k8s")]
            leadership: fleet
                .as_ref()
                .map(|f| (f.leadership.subscribe(), f.released.clone())),
            challenges,
            http01,
            status,
            source: Mutex::new(Some(AcmeSource {
                driver: Some(driver),
                rx: None,
                task: None,
            })),
        })
    }
}

/// A DNS name as a CA takes it: at most 253 characters, labels of letters, digits and
/// hyphens, a leading `*.` for a wildcard; not an IP address.
fn check_name(name: &str) -> Result<(), Error> {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    let ok = bare.len() <= 253
        && bare.contains('.')
        && bare.parse::<std::net::IpAddr>().is_err()
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{name:?} is not a DNS name a CA issues for"
        )))
    }
}

/// The keyed source of an [`Acme`]'s certificates: first what is stored (its initial list,
/// for readiness), then each new or renewed certificate. Dropping it stops the ACME work.
pub struct AcmeSource {
    driver: Option<Driver>,
    rx: Option<mpsc::UnboundedReceiver<Result<Keyed, tls_source::Error>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for AcmeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcmeSource")
            .field("started", &self.task.is_some())
            .finish()
    }
}

impl Drop for AcmeSource {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Stream for AcmeSource {
    type Item = Result<Keyed, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(driver) = self.driver.take() {
            let (tx, rx) = mpsc::unbounded_channel();
            self.rx = Some(rx);
            self.task = Some(driver.spawn(tx));
        }
        match self.rx.as_mut() {
            Some(rx) => rx.poll_recv(cx),
            None => Poll::Ready(None),
        }
    }
}

/// A fleet's election and Secrets, when built with them.
#[cfg(feature = "k8s")]
type FleetOf = crate::fleet::FleetConfig;
#[cfg(not(feature = "k8s"))]
type FleetOf = std::convert::Infallible;

pub(crate) type Tx = mpsc::UnboundedSender<Result<Keyed, tls_source::Error>>;

pub(crate) struct Driver {
    directory: String,
    contact: Vec<String>,
    eab: Option<(String, Vec<u8>)>,
    pub(crate) groups: Vec<Vec<String>>,
    store: Store,
    challenge: ChallengeType,
    dns01: Option<Arc<dyn Dns01Solver>>,
    trust: Trust,
    pub(crate) provider: Arc<CryptoProvider>,
    stagger: Duration,
    per_week: u32,
    /// First orders per registered domain (loaded from the store on first use).
    budget: tokio::sync::Mutex<Option<Budget>>,
    /// The latest budget version stored (writers of the budget queue here, and one write
    /// covers every spend made before it: a group commit).
    budget_stored: tokio::sync::Mutex<u64>,
    pub(crate) challenges: Arc<Challenges>,
    pub(crate) thumbprint: Arc<RwLock<Option<String>>>,
    pub(crate) status: watch::Sender<AcmeStatus>,
    retry_after: RetryAfter,
    /// A fleet's: the election and the Secrets (the store is then `Store::Kube`).
    #[cfg(feature = "k8s")]
    fleet: Option<crate::fleet::FleetConfig>,
}

/// A certificate being served: what renewal needs of it.
#[derive(Clone)]
struct Held {
    leaf: CertificateDer<'static>,
    not_before: SystemTime,
    not_after: SystemTime,
}

/// First orders per registered domain (seconds since the epoch, the last week's), and a
/// version counting the spends made in this process.
#[derive(Default)]
struct Budget {
    spent: std::collections::BTreeMap<String, Vec<u64>>,
    version: u64,
}

/// A certificate issued and checked.
struct Issued {
    bundle: CertBundle,
    held: Held,
    chain_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl Driver {
    /// Runs it: on its own with a state directory, or as a replica of a fleet.
    #[allow(unused_mut)] // mut only with the k8s feature
    fn spawn(mut self, tx: Tx) -> tokio::task::JoinHandle<()> {
        #[cfg(feature = "k8s")]
        if let (Some(fleet), Store::Kube(store)) = (self.fleet.take(), self.store.clone()) {
            return tokio::spawn(crate::fleet::run(self, fleet, store, tx));
        }
        tokio::spawn(async move { self.run(&tx).await })
    }

    pub(crate) async fn run(&self, tx: &Tx) {
        let _ = tx.send(Ok(Keyed::listing()));
        let mut held = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let name = &group[0];
            match self.stored(group).await {
                Ok(Some((bundle, h))) => {
                    tracing::info!(name = %name, not_after = %tls_source::clock::Rfc3339(h.not_after), "serving the stored ACME certificate");
                    let _ = tx.send(Ok(Keyed {
                        key: name.clone(),
                        update: KeyedUpdate::Put(bundle),
                    }));
                    self.set(name, |s| {
                        s.state = NameState::Valid;
                        s.not_after = Some(h.not_after);
                    });
                    held.push(Some(h));
                }
                Ok(None) => held.push(None),
                Err(e) => {
                    tracing::warn!(name = %name, error = %e, "the stored ACME certificate cannot be used; ordering a new one");
                    let _ = tx.send(Err(tls_source::Error::source(format!("acme:{name}"), e)));
                    held.push(None);
                }
            }
        }
        let _ = tx.send(Ok(Keyed::listed()));
        let stored = held.iter().filter(|h| h.is_some()).count();
        let account = self.account(stored).await;
        let this = self;
        // The staggered start spaces the names to order now (nothing stored, or due): one
        // that is stored and fits does not delay the others (after a failover, most).
        let mut to_order = 0u32;
        let now = SystemTime::now();
        let loops = self.groups.iter().zip(held).map(|(group, held)| {
            let tx = tx.clone();
            let account = account.clone();
            let start = if held.as_ref().is_none_or(|h| two_thirds(h) <= now) {
                to_order = to_order.saturating_add(1);
                this.stagger.saturating_mul(to_order - 1)
            } else {
                Duration::ZERO
            };
            async move { this.keep(&account, group, held, start, &tx).await }
        });
        futures::future::join_all(loops).await;
    }

    fn set(&self, name: &str, change: impl FnOnce(&mut NameStatus)) {
        self.status.send_modify(|s| {
            if let Some(entry) = s.names.get_mut(name) {
                change(entry);
            }
            crate::metrics::status(s);
        });
    }

    /// What is stored for `group`, checked as a new certificate is.
    async fn stored(&self, group: &[String]) -> Result<Option<(CertBundle, Held)>, Error> {
        let Some(stored) = self.store.cert(&group[0]).await? else {
            return Ok(None);
        };
        let issued = self.check(group, stored.chain_pem, stored.key_pem)?;
        Ok(Some((issued.bundle, issued.held)))
    }

    /// The account, retried with backoff until it can be used (`stored`: how many
    /// certificates are stored, which a missing account does not explain).
    async fn account(&self, stored: usize) -> Account {
        let mut backoff =
            tls_source::Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        loop {
            match self.try_account(stored).await {
                Ok(account) => {
                    *self
                        .thumbprint
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) =
                        Some(account.key_thumbprint().to_owned());
                    self.status.send_modify(|s| {
                        s.account = Some(account.id().to_owned());
                        s.account_error = None;
                    });
                    return account;
                }
                Err(e) => {
                    let wait = backoff.next().unwrap_or(Duration::from_secs(300));
                    tracing::error!(error = %e, retry_in = ?wait, "the ACME account cannot be used");
                    self.status
                        .send_modify(|s| s.account_error = Some(e.to_string()));
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn try_account(&self, certificates: usize) -> Result<Account, Error> {
        let (stored, note) = self.store.account(&self.directory).await?.unzip();
        let had = stored.is_some();
        let http = client::http(
            Arc::clone(&self.provider),
            &self.trust,
            self.retry_after.clone(),
        )?;
        let eab = self
            .eab
            .as_ref()
            .map(|(id, key)| ExternalAccountKey::new(id.clone(), key));
        let (account, new) =
            client::account(http, &self.directory, &self.contact, eab.as_ref(), stored).await?;
        let replaced = if let Some(credentials) = new {
            // Certificates without their account: it was deleted (or the directory changed).
            let replaced = (certificates > 0).then(|| {
                format!(
                    "{}: registered a new account: no account for {} was stored while {certificates} certificate(s) were (deleted, or the directory changed)",
                    tls_source::clock::Rfc3339(SystemTime::now()),
                    self.directory
                )
            });
            self.store
                .save_account(
                    &self.directory,
                    &credentials,
                    (account.id(), account.key_thumbprint()),
                    replaced.as_deref(),
                )
                .await?;
            match &replaced {
                Some(why) => {
                    tracing::warn!(account = account.id(), directory = %self.directory, stored_certificates = certificates, "the stored ACME account is missing: {why}");
                }
                None => {
                    tracing::info!(account = account.id(), directory = %self.directory, stored_before = had, "registered a new ACME account");
                }
            }
            replaced
        } else {
            note.flatten()
        };
        self.status.send_modify(|s| s.account_replaced = replaced);
        Ok(account)
    }

    /// One certificate, for ever: wait until it is due, order, serve; on failure wait as the
    /// failure says.
    async fn keep(
        &self,
        account: &Account,
        group: &[String],
        mut held: Option<Held>,
        start: Duration,
        tx: &Tx,
    ) {
        let name = &group[0];
        let signature = format!("{}|{}", group.join(","), self.challenge);
        let mut first = true;
        // The ARI window the last renewal was made in.
        let mut renewed_under = None;
        loop {
            let schedule = self.store.schedule(name).await.unwrap_or_default();
            if schedule.failed && schedule.failed_for.as_deref() == Some(signature.as_str()) {
                self.set(name, |s| {
                    s.state = NameState::Failed;
                    s.last_error.clone_from(&schedule.last_error);
                });
                tracing::warn!(name = %name, error = ?schedule.last_error, "not ordering: the CA will not issue for it (change the configuration)");
                return std::future::pending().await;
            }
            let now = SystemTime::now();
            let (renew_at, recheck, window) = match &held {
                Some(h) => {
                    let (mut at, recheck, window) = self.renew_at(account, h).await;
                    if window.is_some() && window == renewed_under {
                        // The CA suggests, for the new certificate, the window the last one
                        // was renewed in: stale (or a CA answering every certificate alike).
                        // Renewing again would loop; the lifetime decides until it moves.
                        at = two_thirds(h);
                    }
                    (Some(at), recheck, window)
                }
                None => (None, None, None),
            };
            let retry_at = schedule.retry_at.map(store::from_unix).filter(|t| *t > now);
            let due = match (retry_at, renew_at) {
                (Some(retry), _) => {
                    self.set(name, |s| {
                        s.state = NameState::Backoff;
                        s.retry_at = Some(retry);
                        s.renew_after = renew_at;
                        s.last_error.clone_from(&schedule.last_error);
                    });
                    retry
                }
                (None, Some(renew)) if renew > now => {
                    self.set(name, |s| {
                        s.state = NameState::Valid;
                        s.renew_after = Some(renew);
                        s.retry_at = None;
                    });
                    renew
                }
                // A stagger of the user's times many names may be far ahead: saturated.
                _ if first => tls_source::clock::saturating_add(now, start),
                _ => now,
            };
            first = false;
            // With ARI, the window is asked again when the CA says (it moves, e.g. ahead of a
            // revocation), before it is due.
            if let Some(recheck) = recheck
                && retry_at.is_none()
                && now + recheck < due
            {
                sleep_until(now + recheck).await;
                continue;
            }
            sleep_until(due).await;
            self.set(name, |s| {
                s.state = NameState::Ordering;
                s.retry_at = None;
            });
            // With ARI, the order says which certificate it replaces.
            let replaces = held.as_ref().filter(|_| recheck.is_some());
            if held.is_some() {
                renewed_under = window;
            }
            let obtained = self.obtain(account, group, replaces, held.is_some()).await;
            crate::metrics::order(name, crate::metrics::outcome(obtained.as_ref().map(drop)));
            match obtained {
                Ok(issued) => {
                    if let Err(e) = self
                        .store
                        .save_cert(name, &issued.chain_pem, &issued.key_pem)
                        .await
                    {
                        tracing::error!(name = %name, error = %e, "cannot store the new ACME certificate; serving it from memory");
                    }
                    let _ = self.store.forget_order(name).await;
                    if !schedule.is_clear() {
                        let _ = self.store.save_schedule(name, &Schedule::default()).await;
                    }
                    tracing::info!(name = %name, not_after = %tls_source::clock::Rfc3339(issued.held.not_after), "ACME certificate issued");
                    let _ = tx.send(Ok(Keyed {
                        key: name.clone(),
                        update: KeyedUpdate::Put(issued.bundle),
                    }));
                    self.set(name, |s| {
                        s.state = NameState::Valid;
                        s.not_after = Some(issued.held.not_after);
                        s.last_error = None;
                    });
                    held = Some(issued.held);
                }
                Err(e) => {
                    let failures = schedule.failures.saturating_add(1);
                    let now = SystemTime::now();
                    let (retry_at, failed) = match &e {
                        Error::Rejected { .. } => (None, true),
                        Error::RateLimited { until, .. } => (Some(*until), false),
                        Error::Refused { .. } => {
                            (Some(now + REFUSED_BACKOFF.max(backoff(failures))), false)
                        }
                        _ => (Some(now + backoff(failures)), false),
                    };
                    tracing::warn!(name = %name, error = %e, retry_at = ?retry_at.map(tls_source::clock::Rfc3339), "ACME order failed");
                    let next = Schedule {
                        retry_at: retry_at.map(store::to_unix),
                        failures,
                        last_error: Some(e.to_string()),
                        failed,
                        failed_for: failed.then(|| signature.clone()),
                    };
                    if let Err(e) = self.store.save_schedule(name, &next).await {
                        tracing::error!(name = %name, error = %e, "cannot store when to retry");
                    }
                    self.set(name, |s| {
                        s.state = if failed {
                            NameState::Failed
                        } else {
                            NameState::Backoff
                        };
                        s.retry_at = retry_at;
                        s.last_error = Some(e.to_string());
                    });
                }
            }
        }
    }

    /// When `held` is renewed: inside the CA's suggested window (ARI, RFC 9773) when it
    /// offers one (then with when to ask again: its `Retry-After`, one minute to a day), else
    /// at two thirds of its lifetime, a little earlier by chance.
    /// (With ARI, also the window.)
    async fn renew_at(
        &self,
        account: &Account,
        held: &Held,
    ) -> (
        SystemTime,
        Option<Duration>,
        Option<(SystemTime, SystemTime)>,
    ) {
        if let Ok(id) = instant_acme::CertificateIdentifier::try_from(&held.leaf)
            && let Ok((info, recheck)) = account.renewal_info(&id).await
        {
            let start = SystemTime::from(info.suggested_window.start);
            let end = SystemTime::from(info.suggested_window.end);
            let span = end.duration_since(start).unwrap_or_default();
            let recheck = recheck.clamp(Duration::from_secs(60), Duration::from_secs(24 * 3600));
            return (
                start + span.mul_f64(random_fraction()),
                Some(recheck),
                Some((start, end)),
            );
        }
        (two_thirds(held), None, None)
    }

    /// One order for `group`, resumed if one is in flight; a new one says it `replaces` the
    /// held certificate (ARI), once more without if the CA answers `alreadyReplaced`.
    async fn obtain(
        &self,
        account: &Account,
        group: &[String],
        replaces: Option<&Held>,
        renewal: bool,
    ) -> Result<Issued, Error> {
        let name = &group[0];
        let order_error = |e: instant_acme::Error| classify(name, &e, &self.retry_after);
        let resumed = match self.store.order(name).await? {
            Some((in_flight, key_pem)) => match account.order(in_flight.url.clone()).await {
                Ok(mut order) => {
                    if order.state().status == OrderStatus::Invalid {
                        self.store.forget_order(name).await?;
                        None
                    } else {
                        tracing::info!(name = %name, order = %in_flight.url, "resuming the stored ACME order");
                        Some((order, key_pem))
                    }
                }
                Err(_) => {
                    self.store.forget_order(name).await?;
                    None
                }
            },
            None => None,
        };
        let (mut order, key_pem) = match resumed {
            Some(resumed) => resumed,
            None => {
                if !renewal {
                    self.spend_budget(name).await?;
                }
                let key =
                    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| {
                        Error::Order {
                            name: name.clone(),
                            reason: e.to_string(),
                        }
                    })?;
                let key_pem = key.serialize_pem().into_bytes();
                let identifiers: Vec<Identifier> =
                    group.iter().map(|n| Identifier::Dns(n.clone())).collect();
                let replaced = replaces.and_then(|held| {
                    instant_acme::CertificateIdentifier::try_from(&held.leaf).ok()
                });
                let order = match replaced {
                        Some(id) => {
                            match account
                                .new_order(&NewOrder::new(&identifiers).replaces(id))
                                .await
                            {
                                Err(e) if problem_type(&e) == Some("alreadyReplaced") => {
                                    tracing::info!(name = %name, "the CA says the certificate was already replaced; ordering without replaces");
                                    account.new_order(&NewOrder::new(&identifiers)).await
                                }
                                other => other,
                            }
                        }
                        None => account.new_order(&NewOrder::new(&identifiers)).await,
                    }
                    .map_err(order_error)?;
                // Before any challenge is answered: whoever comes next resumes it.
                self.store
                    .save_order(
                        name,
                        &InFlight {
                            url: order.url().to_owned(),
                        },
                        &key_pem,
                    )
                    .await?;
                tracing::info!(name = %name, order = order.url(), "placed an ACME order");
                (order, key_pem)
            }
        };
        if order.state().status == OrderStatus::Pending {
            let mut presented = Vec::new();
            let answered = self.answer(&mut order, name, &mut presented).await;
            let ready = match answered {
                Ok(()) => order.poll_ready(&POLL).await.map_err(order_error),
                Err(e) => Err(e),
            };
            self.withdraw(presented).await;
            match ready? {
                OrderStatus::Invalid => {
                    let reason = why_invalid(&mut order).await;
                    self.store.forget_order(name).await?;
                    return Err(Error::Refused {
                        name: name.clone(),
                        reason,
                    });
                }
                OrderStatus::Pending => {
                    return Err(Error::Order {
                        name: name.clone(),
                        reason: "the CA is still validating".into(),
                    });
                }
                _ => {}
            }
        }
        if order.state().status == OrderStatus::Ready {
            let key = rcgen::KeyPair::from_pem(std::str::from_utf8(&key_pem).unwrap_or_default())
                .map_err(|e| Error::Order {
                name: name.clone(),
                reason: format!("the stored order's key: {e}"),
            })?;
            let csr = rcgen::CertificateParams::new(group.to_vec())
                .and_then(|params| params.serialize_request(&key))
                .map_err(|e| Error::Order {
                    name: name.clone(),
                    reason: e.to_string(),
                })?;
            order.finalize_csr(csr.der()).await.map_err(order_error)?;
        }
        let chain_pem = order.poll_certificate(&POLL).await.map_err(order_error)?;
        let issued = self.check(group, chain_pem.into_bytes(), key_pem);
        if issued.is_err() {
            // Finalized with this key: the order cannot give anything else.
            self.store.forget_order(name).await?;
        }
        issued
    }

    /// Takes one first order for `name` from its registered domain's weekly budget, or says
    /// until when it is spent (the CA is not asked).
    ///
    /// The spend is stored before this returns (a restart does not forget it), but many spends
    /// at once share one write: the first waiting writer stores the latest budget, and those
    /// whose spend it includes return without writing (at start, 100 names cost two writes,
    /// not 100 in a row).
    async fn spend_budget(&self, name: &str) -> Result<(), Error> {
        let domain = registered_domain(name);
        let version = {
            let mut guard = self.budget.lock().await;
            if guard.is_none() {
                *guard = Some(Budget {
                    spent: self.store.budget().await?,
                    version: 0,
                });
            }
            let budget = guard.get_or_insert_with(Budget::default);
            let now = store::to_unix(SystemTime::now());
            let week = WEEK.as_secs();
            let spent = budget.spent.entry(domain.clone()).or_default();
            spent.retain(|t| t.saturating_add(week) > now);
            if spent.len() >= usize::try_from(self.per_week).unwrap_or(usize::MAX) {
                let until = spent
                    .iter()
                    .min()
                    .map_or(now + week, |t| t.saturating_add(week));
                return Err(Error::RateLimited {
                    name: name.to_owned(),
                    until: store::from_unix(until),
                    reason: format!(
                        "the budget of {} new certificates a week for {domain} is spent (new_certificates_per_week)",
                        self.per_week
                    ),
                });
            }
            spent.push(now);
            budget.spent.retain(|_, spent| !spent.is_empty());
            budget.version += 1;
            budget.version
        };
        let mut stored = self.budget_stored.lock().await;
        if *stored >= version {
            return Ok(());
        }
        let (latest, version) = {
            let guard = self.budget.lock().await;
            let budget = guard.as_ref().expect("loaded above");
            (budget.spent.clone(), budget.version)
        };
        self.store.save_budget(&latest).await?;
        *stored = version;
        Ok(())
    }

    /// Answers every pending authorization of `order` with the configured challenge.
    async fn answer(
        &self,
        order: &mut Order,
        name: &str,
        presented: &mut Vec<(String, String)>,
    ) -> Result<(), Error> {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization =
                authorization.map_err(|e| classify(name, &e, &self.retry_after))?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => {
                    return Err(Error::Refused {
                        name: name.to_owned(),
                        reason: format!("an authorization is {other:?}"),
                    });
                }
            }
            let identifier = authorization.identifier().to_string();
            let Some(mut challenge) = authorization.challenge(self.challenge.acme()) else {
                return Err(Error::Rejected {
                    name: name.to_owned(),
                    reason: format!(
                        "the CA offers no {} challenge for {identifier}",
                        self.challenge
                    ),
                });
            };
            let key_authorization = challenge.key_authorization();
            match self.challenge {
                ChallengeType::TlsAlpn01 => {
                    let digest = key_authorization.digest();
                    self.challenges
                        .present(&self.provider, &identifier, digest.as_ref())?;
                    presented.push((identifier.clone(), String::new()));
                    // A fleet's other replicas answer it too.
                    self.store
                        .publish_challenge(&identifier, Some(digest.as_ref()))
                        .await?;
                }
                ChallengeType::Http01 => {}
                ChallengeType::Dns01 => {
                    let record = format!("_acme-challenge.{}", identifier.trim_start_matches("*."));
                    let value = key_authorization.dns_value();
                    let solver = self
                        .dns01
                        .as_ref()
                        .ok_or_else(|| Error::Config("no DNS-01 solver".into()))?;
                    solver
                        .present(&record, &value)
                        .await
                        .map_err(|e| Error::Order {
                            name: name.to_owned(),
                            reason: format!("the DNS-01 solver could not publish {record}: {e}"),
                        })?;
                    presented.push((record, value));
                }
            }
            if self.challenge != ChallengeType::Dns01 {
                // Every replica the CA may reach has it before it is asked to validate.
                tokio::time::sleep(self.store.propagation()).await;
            }
            challenge
                .set_ready()
                .await
                .map_err(|e| classify(name, &e, &self.retry_after))?;
        }
        Ok(())
    }

    /// Withdraws what `answer` published.
    async fn withdraw(&self, presented: Vec<(String, String)>) {
        for (what, value) in presented {
            match self.challenge {
                ChallengeType::TlsAlpn01 => {
                    self.challenges.clean_up(&what);
                    if let Err(e) = self.store.publish_challenge(&what, None).await {
                        tracing::warn!(name = %what, error = %e, "could not withdraw the published challenge");
                    }
                }
                ChallengeType::Dns01 => {
                    if let Some(solver) = &self.dns01
                        && let Err(e) = solver.clean_up(&what, &value).await
                    {
                        tracing::warn!(record = %what, error = %e, "the DNS-01 solver could not remove the record");
                    }
                }
                ChallengeType::Http01 => {}
            }
        }
    }

    /// Checks what the CA issued (or what is stored): PEM, for every name of the group, for
    /// the key.
    fn check(
        &self,
        group: &[String],
        chain_pem: Vec<u8>,
        key_pem: Vec<u8>,
    ) -> Result<Issued, Error> {
        let name = &group[0];
        let bad = |reason: String| Error::BadCertificate {
            name: name.clone(),
            reason,
        };
        let bundle = Decoder::default()
            .bundle(
                ("the certificate chain", &chain_pem),
                ("the key", &key_pem),
                None,
                Origin::Other(format!("acme:{name}")),
            )
            .map_err(|e| bad(e.to_string()))?;
        let leaf = bundle
            .leaf()
            .cloned()
            .ok_or_else(|| bad("no certificate".into()))?;
        let info = LeafInfo::parse(&leaf).map_err(|e| bad(e.to_string()))?;
        if let Some(missing) = group.iter().find(|n| !info.covers(n)) {
            return Err(bad(format!("it does not cover {missing}")));
        }
        let key = self
            .provider
            .key_provider
            .load_private_key(bundle.key().clone_key())
            .map_err(|e| bad(format!("the key cannot be loaded: {e}")))?;
        if key
            .public_key()
            .is_some_and(|spki| spki.as_ref() != info.spki_der.as_slice())
        {
            return Err(bad("it is not for the order's key".into()));
        }
        Ok(Issued {
            bundle,
            held: Held {
                leaf,
                not_before: info.not_before,
                not_after: info.not_after,
            },
            chain_pem,
            key_pem,
        })
    }
}

/// Two thirds into `held`'s lifetime, a little earlier by chance.
fn two_thirds(held: &Held) -> SystemTime {
    let lifetime = held
        .not_after
        .duration_since(held.not_before)
        .unwrap_or_default();
    held.not_before + lifetime * 2 / 3 - (lifetime / 30).mul_f64(random_fraction())
}

/// The registered domain of `name` (its public suffix and one label more, by the public
/// suffix list), or the name itself when the list does not say.
fn registered_domain(name: &str) -> String {
    let bare = name.trim_start_matches("*.");
    psl::domain_str(bare).unwrap_or(bare).to_owned()
}

/// The CA's reason an order became invalid: the first failed challenge's error.
async fn why_invalid(order: &mut Order) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authorization)) = authorizations.next().await {
        if let Ok(state) = authorization.refresh().await {
            for challenge in &state.challenges {
                if let Some(problem) = &challenge.error {
                    reasons.push(problem.to_string());
                }
            }
        }
    }
    if reasons.is_empty()
        && let Some(problem) = &order.state().error
    {
        reasons.push(problem.to_string());
    }
    if reasons.is_empty() {
        "the order became invalid (the CA gave no reason)".into()
    } else {
        reasons.join("; ")
    }
}

/// The wait after `failures` failed attempts: one minute, doubling, at most a day, less up
/// to a tenth by chance (replicas and names do not retry in step).
fn backoff(failures: u32) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20))
        .min(BACKOFF_MAX);
    base - (base / 10).mul_f64(random_fraction())
}

/// A number in [0, 1).
fn random_fraction() -> f64 {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

/// Sleeps until the wall clock reaches `at` (in steps, so a clock that jumps is followed and
/// tokio's timer is never armed decades ahead).
async fn sleep_until(at: SystemTime) {
    loop {
        let Ok(left) = at.duration_since(SystemTime::now()) else {
            return;
        };
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(3600))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> AcmeBuilder {
        Acme::builder("https://acme.invalid/directory")
            .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .state_dir("/nonexistent/state")
    }

    fn config_error(builder: AcmeBuilder) -> String {
        match builder.build() {
            Err(Error::Config(reason)) => reason,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn names_a_ca_does_not_issue_for_are_refused_by_build_naming_them() {
        for bad in [
            "localhost",
            "127.0.0.1",
            "-a.example.com",
            "a..example.com",
            "a_b.example.com",
            "*.*.example.com",
            "",
        ] {
            let reason = config_error(builder().name(bad));
            assert!(reason.contains(&format!("{bad:?}")), "{bad}: {reason}");
        }
        assert!(
            builder().name("A.Example.com").build().is_ok(),
            "case folded"
        );
    }

    #[test]
    fn build_says_what_is_missing_or_inconsistent() {
        let reason = config_error(builder().name("*.example.com"));
        assert!(
            reason.contains("*.example.com") && reason.contains("dns-01"),
            "{reason}"
        );
        let reason = config_error(
            builder()
                .name("a.example.com")
                .challenge(ChallengeType::Dns01),
        );
        assert!(reason.contains("solver"), "{reason}");
        let reason = config_error(builder().name("a.example.com").name("A.example.com"));
        assert!(reason.contains("twice"), "{reason}");
        let reason = config_error(builder());
        assert!(reason.contains("no names"), "{reason}");
        let reason = config_error(
            Acme::builder("https://acme.invalid/directory")
                .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                .name("a.example.com"),
        );
        assert!(reason.contains("state directory"), "{reason}");
        let reason = config_error(
            builder()
                .name("a.example.com")
                .directory_ca_file("/nonexistent/ca.pem"),
        );
        assert!(reason.contains("/nonexistent/ca.pem"), "{reason}");
    }

    #[test]
    fn registered_domains_follow_the_public_suffix_list() {
        for (name, domain) in [
            ("a.b.example.com", "example.com"),
            ("*.apps.example.co.uk", "example.co.uk"),
            ("www.example.co.uk", "example.co.uk"),
            ("user.github.io", "user.github.io"),
            ("example.com", "example.com"),
        ] {
            assert_eq!(registered_domain(name), domain, "{name}");
        }
    }

    #[test]
    fn backoff_doubles_from_a_minute_to_a_day_and_is_jittered_down_by_at_most_a_tenth() {
        for (failures, base) in [
            (1, 60),
            (2, 120),
            (3, 240),
            (11, 61_440),
            (12, 86_400),
            (40, 86_400),
        ] {
            let base = Duration::from_secs(base);
            for _ in 0..20 {
                let wait = backoff(failures);
                assert!(
                    wait <= base && wait >= base - base / 10,
                    "{failures}: {wait:?}"
                );
            }
        }
    }
}
