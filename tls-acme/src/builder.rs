//! [`Acme`] and its builder: the configuration checked once, then the driver (`driver.rs`)
//! started when the source is first polled, on its own or as a replica of a fleet
//! (`fleet.rs`).

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::Keyed;
use tls_source::clock::{Clock, SystemClock};
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::challenge::{ChallengeType, Challenges, Dns01Solver, Http01};
use crate::driver::Profile;
use crate::driver::{Driver, Tx};
use crate::fallback::{CaConfig, FallbackCa};
use crate::order::Trust;
use crate::status::{AcmeStatus, NameStatus};
use crate::store::AcmeStore;

/// Let's Encrypt's limit of new certificates per registered domain in seven days: the default
/// budget of first orders ([`AcmeBuilder::new_certificates_per_week`]).
pub const DEFAULT_NEW_CERTIFICATES_PER_WEEK: u32 = 50;

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
    leadership: Option<watch::Receiver<tls_k8s::Leadership>>,
    #[cfg(feature = "etcd")]
    etcd_leadership: Option<watch::Receiver<tls_etcd::store::Leadership>>,
    /// A fleet's: cancelled once the started source was dropped and the election released.
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    released: Option<tokio_util::sync::CancellationToken>,
    challenges: Arc<Challenges>,
    http01: Http01,
    status: watch::Receiver<AcmeStatus>,
    retry: watch::Sender<u64>,
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
            fallbacks: Vec::new(),
            groups: Vec::new(),
            state: None,
            challenge: ChallengeType::default(),
            dns01: None,
            trust: Ok(Trust::default()),
            provider: None,
            stagger: Duration::from_millis(200),
            per_week: DEFAULT_NEW_CERTIFICATES_PER_WEEK,
            answered_at: None,
            profile: None,
            clock: Arc::new(SystemClock),
            #[cfg(feature = "k8s")]
            fleet: None,
            #[cfg(feature = "etcd")]
            etcd: None,
            #[cfg(any(feature = "k8s", feature = "etcd"))]
            propagation: DEFAULT_CHALLENGE_PROPAGATION,
            #[cfg(any(feature = "k8s", feature = "etcd"))]
            seal: Arc::new(tls_seal::Plain),
        }
    }

    /// Tries every certificate that is waiting after a failure now, as far as the CA's limits
    /// allow: no sooner than a minute after its last attempt, never before a rate limit's
    /// `Retry-After` or the weekly budget's refill, and not beyond the CA's failed validations
    /// per name and hour (Let's Encrypt: 5); one that may not be tried yet is tried as soon as
    /// it may ([`NameStatus::retry_at`] says when). For after fixing what made validations
    /// fail, where the configuration the failure is kept with did not change (a firewall, a DNS
    /// record); a changed configuration (the names, the challenge type,
    /// [`AcmeBuilder::answered_at`], the directory) is tried at once anyway. `serve` does this
    /// on SIGHUP.
    ///
    /// In a fleet, only the leader orders: ask it (a follower's request does nothing).
    pub fn retry_now(&self) {
        self.retry.send_modify(|n| *n = n.wrapping_add(1));
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
        self.leadership.clone()
    }

    /// Who writes for the fleet on etcd, as this replica sees it (`None` without
    /// [`etcd`](AcmeBuilder::etcd)).
    #[cfg(feature = "etcd")]
    pub fn etcd_leadership(&self) -> Option<watch::Receiver<tls_etcd::store::Leadership>> {
        self.etcd_leadership.clone()
    }

    /// With a fleet ([`kubernetes`](AcmeBuilder::kubernetes), [`etcd`](AcmeBuilder::etcd)):
    /// resolves once the started source has been dropped and this replica's election released
    /// (a leader releases its Lease, or revokes its etcd lease, so that another replica leads
    /// at once rather than after a lease duration). Without a fleet, at once.
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    pub fn released(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let released = self.released.clone();
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
    fallbacks: Vec<FallbackCa>,
    groups: Vec<Vec<String>>,
    state: Option<PathBuf>,
    challenge: ChallengeType,
    dns01: Option<Arc<dyn Dns01Solver>>,
    trust: Result<Trust, String>,
    provider: Option<Arc<CryptoProvider>>,
    stagger: Duration,
    per_week: u32,
    answered_at: Option<String>,
    profile: Option<Profile>,
    clock: Arc<dyn Clock>,
    #[cfg(feature = "k8s")]
    fleet: Option<FleetSettings>,
    #[cfg(feature = "etcd")]
    etcd: Option<EtcdSettings>,
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    propagation: Duration,
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    seal: Arc<dyn tls_seal::Seal>,
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
}

/// [`AcmeBuilder::etcd`]'s settings.
#[cfg(feature = "etcd")]
struct EtcdSettings {
    etcd: tls_etcd::Etcd,
    prefix: String,
    name: String,
    identity: String,
    timing: Option<(Duration, Duration)>,
}

/// How long the leader of a fleet waits after publishing a challenge before the CA is told to
/// validate: the other replicas' watch delivers it in milliseconds.
#[cfg(any(feature = "k8s", feature = "etcd"))]
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

    /// Another CA, asked when the ones before it fail for a reason of theirs (unreachable, a
    /// 5xx, `serverInternal`, `rateLimited`): repeatable, in order of preference after the
    /// directory of [`Acme::builder`]. A failure of the name's own (a validation, `caa`,
    /// `rejectedIdentifier`) is no reason to ask another CA. Each certificate records its
    /// issuer ([`NameStatus::issuer`], [`NameStatus::fallback_reason`]); ARI is asked of it,
    /// `replaces` is sent only to it, and every renewal starts with the preferred CA again.
    /// See [`FallbackCa`].
    pub fn fallback(mut self, ca: FallbackCa) -> Self {
        self.fallbacks.push(ca);
        self
    }

    /// A name with a certificate of its own (the default: one certificate per name): a DNS
    /// name, a wildcard (`*.example.com`, DNS-01 only) or an IP address (`192.0.2.7`,
    /// `2001:db8::7`: RFC 8738, TLS-ALPN-01 or HTTP-01 only; kept and shown in its canonical
    /// text).
    pub fn name(self, name: impl Into<String>) -> Self {
        self.group([name.into()])
    }

    /// Names that share one certificate (fewer orders against a CA's limits); it is keyed,
    /// stored and shown by its first name.
    pub fn group(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.groups.push(
            names
                .into_iter()
                .map(|n| crate::ip::normalize(&n.into()))
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

    /// Asks the CA for certificates of the profile `name` (draft-ietf-acme-profiles: Let's
    /// Encrypt's `classic`, `tlsserver`, `shortlived`), when its directory advertises it; when
    /// it does not, orders get the CA's default profile and each name's status says so
    /// (`profile_note`). Every order asks again, renewals included; a change applies at the next
    /// order. See [`require_profile`](Self::require_profile) to refuse the default instead.
    /// Default: none (the CA's default).
    pub fn profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(Profile {
            name: name.into(),
            required: false,
        });
        self
    }

    /// As [`profile`](Self::profile), but a CA that does not advertise `name` gets no order:
    /// the name fails (state `failed`, not retried until the configuration changes) with an
    /// error naming the profiles the directory advertises.
    pub fn require_profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(Profile {
            name: name.into(),
            required: true,
        });
        self
    }

    /// Where the challenges are answered, as the user would name it (for TLS-ALPN-01 the
    /// address the server listens on, for HTTP-01 the HTTP listener's): a failure is kept
    /// with the configuration it was made with, this included, so after a change of it a
    /// failed name is tried at once instead of waiting out its backoff. Only compared, never
    /// used to reach anything. Default: none.
    pub fn answered_at(mut self, place: impl Into<String>) -> Self {
        self.answered_at = Some(place.into());
        self
    }

    /// The clock renewals, backoffs and rate limits are timed by. Default: the system's
    /// ([`SystemClock`]); a test can step one (`tls_source::clock::SteppedClock`).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
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
    /// `NAME-acme--<first name>`, with the certificate's record) before a challenge is answered: a new leader resumes it instead of
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
        });
        self
    }

    /// Shares the state with a fleet of replicas in etcd under `PREFIX/fleets/NAME/acme/`
    /// instead of a state directory (feature `etcd`), as [`kubernetes`](Self::kubernetes)
    /// does in Secrets: the replica holding the writer key `PREFIX/fleets/NAME/writer`
    /// (`tls_etcd::store::WriterLease`, see [`etcd_lease_timing`](Self::etcd_lease_timing))
    /// orders and renews, every write one transaction fenced by its round; every replica
    /// serves each certificate from `acme/certs/<first name>` and answers the CA's challenges
    /// (TLS-ALPN-01 published under `acme/state/challenges/`, HTTP-01 from the account's
    /// thumbprint). An order in flight is stored (`acme/state/orders/<first name>`) before a
    /// challenge is answered: a new leader resumes it instead of placing another. With a
    /// [`seal`](Self::seal), every private key is sealed: the account's, each order's and
    /// each certificate's (every replica opens the certificates' with it); a replica that
    /// cannot open the stored account (no seal key, a value altered in etcd) serves what it
    /// has, never campaigns, and says why in [`AcmeStatus::account_error`] (it reconsiders
    /// when the account changes or it restarts). `identity` names this replica (e.g. the host
    /// name).
    ///
    /// A fleet name is for one fleet: a self-signed fleet (`tls_etcd::SharedSelfSigned`) of
    /// the same name would share its writer key.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let etcd = tls_etcd::Etcd::builder(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]).build()?;
    /// let acme = tls_acme::Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
    ///     .contact("admin@example.com")
    ///     .name("example.com")
    ///     .etcd(etcd, "/tls-rotation/", "web", "web-0")
    ///     .crypto_provider(std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
    ///     .build()?;
    /// # drop(acme); Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd(
        mut self,
        etcd: tls_etcd::Etcd,
        prefix: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        self.etcd = Some(EtcdSettings {
            etcd,
            prefix: prefix.into(),
            name: name.into(),
            identity: identity.into(),
            timing: None,
        });
        self
    }

    /// The etcd writer lease's TTL and retry period (default 15 s and 2 s; see
    /// `tls_etcd::store::WriterLease`). Only with [`etcd`](Self::etcd).
    #[cfg(feature = "etcd")]
    pub fn etcd_lease_timing(mut self, ttl: Duration, retry: Duration) -> Self {
        if let Some(etcd) = &mut self.etcd {
            etcd.timing = Some((ttl, retry));
        }
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
    /// ([`DEFAULT_CHALLENGE_PROPAGATION`]). Only with a fleet ([`kubernetes`](Self::kubernetes),
    /// [`etcd`](Self::etcd)).
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    pub fn challenge_propagation(mut self, wait: Duration) -> Self {
        self.propagation = wait;
        self
    }

    /// Seals what only the leader reads: the account's credentials (`account.json` of the
    /// account Secret) and the new key of each order in flight (in the state Secret), each
    /// bound to its Secret and key (see `tls_k8s::seal`). Every replica that may lead needs
    /// the seal. Default: nothing sealed. Only with a fleet ([`kubernetes`](Self::kubernetes),
    /// or [`etcd`](Self::etcd), where each certificate's key is sealed too and every replica
    /// needs the seal).
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
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    pub fn seal(mut self, seal: Arc<dyn tls_seal::Seal>) -> Self {
        self.seal = seal;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::Config`]: no names, a name that is not a DNS name (or appears twice), a
    /// wildcard without DNS-01, DNS-01 without a solver, no state directory (or the state in
    /// more than one place), an unreadable trust file, no crypto provider.
    pub fn build(mut self) -> Result<Acme, Error> {
        let (store, fleet) = self.store()?;
        let config = |reason: String| Error::Config(reason);
        let trust = self.trust.map_err(config)?;
        let mut fallbacks = Vec::new();
        for ca in self.fallbacks {
            let trust = ca
                .trust
                .map_err(|e| config(format!("the fallback CA {}: {e}", ca.url)))?;
            if ca.url == self.directory || fallbacks.iter().any(|f: &CaConfig| f.url == ca.url) {
                return Err(config(format!("the CA {} is configured twice", ca.url)));
            }
            fallbacks.push(CaConfig {
                url: ca.url,
                eab: ca.eab,
                trust,
            });
        }
        let provider = self
            .provider
            .or_else(tls_reload::default_crypto_provider)
            .ok_or_else(|| {
                config("no crypto provider: enable tls-reload's (or tls-rotation's) feature `aws-lc-rs` or `ring`, give one with crypto_provider, or install a process default".into())
            })?;
        if self.groups.is_empty() {
            return Err(config("no names to order certificates for".into()));
        }
        if self.challenge == ChallengeType::Dns01 && self.dns01.is_none() {
            return Err(config("dns-01 needs a DNS-01 solver (dns01_solver)".into()));
        }
        let mut seen = HashSet::new();
        for name in self.groups.iter().flatten() {
            check_name(name)?;
            if self.challenge == ChallengeType::Dns01 && crate::ip::address(name).is_some() {
                return Err(config(format!(
                    "{name}: an IP address cannot be proven by dns-01 (RFC 8738): use tls-alpn-01 or http-01"
                )));
            }
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
        let http01_tokens = Arc::default();
        let http01 = Http01::new(seen, Arc::clone(&thumbprint), Arc::clone(&http01_tokens));
        let (status_tx, status) = watch::channel(AcmeStatus {
            directory: self.directory.clone(),
            names: self
                .groups
                .iter()
                .map(|g| (g[0].clone(), NameStatus::default()))
                .collect(),
            ..AcmeStatus::default()
        });
        let (retry, retry_rx) = watch::channel(0);
        let driver = Driver {
            directory: self.directory,
            contact: self.contact,
            eab: self.eab,
            fallbacks,
            groups: self.groups,
            store,
            challenge: self.challenge,
            answered_at: self.answered_at,
            profile: self.profile,
            dns01: self.dns01,
            trust,
            provider,
            stagger: self.stagger,
            per_week: self.per_week,
            challenges: Arc::clone(&challenges),
            thumbprint,
            http01_tokens,
            status: status_tx,
            clock: self.clock,
            random: crate::driver::system_random(),
            retry: retry_rx,
        };
        Ok(Acme {
            #[cfg(feature = "k8s")]
            leadership: match &fleet {
                Some(FleetOf::Kube(f)) => Some(f.leadership.subscribe()),
                _ => None,
            },
            #[cfg(feature = "etcd")]
            etcd_leadership: match &fleet {
                Some(FleetOf::Etcd(f)) => Some(f.leadership.subscribe()),
                _ => None,
            },
            #[cfg(any(feature = "k8s", feature = "etcd"))]
            released: fleet.as_ref().map(FleetOf::released),
            challenges,
            http01,
            status,
            retry,
            source: Mutex::new(Some(AcmeSource {
                driver: Some((driver, fleet)),
                rx: None,
                task: None,
            })),
        })
    }
}

impl AcmeBuilder {
    /// Where the state is kept: a directory, or a fleet's store and how it is elected.
    fn store(&mut self) -> Result<(Arc<dyn AcmeStore>, Option<FleetOf>), Error> {
        let config = |reason: &str| Err(Error::Config(reason.to_owned()));
        let dir = self.state.take();
        #[cfg(feature = "k8s")]
        let kube = self.fleet.take();
        #[cfg(not(feature = "k8s"))]
        let kube: Option<std::convert::Infallible> = None;
        #[cfg(feature = "etcd")]
        let etcd = self.etcd.take();
        #[cfg(not(feature = "etcd"))]
        let etcd: Option<std::convert::Infallible> = None;
        match (dir, kube, etcd) {
            (Some(dir), None, None) => Ok((Arc::new(crate::store::dir::DirStore::new(dir)), None)),
            (None, None, None) => config(
                "a state directory is needed (state_dir): without one, every restart orders every certificate again",
            ),
            #[cfg(feature = "k8s")]
            (None, Some(fleet), None) => {
                let (tx, _) = watch::channel(tls_k8s::Leadership::default());
                let kube = Arc::new(crate::store::kube::KubeStore::new(
                    fleet.client.clone(),
                    &fleet.namespace,
                    &fleet.name,
                    &self.directory,
                    self.propagation,
                    Arc::clone(&self.seal),
                ));
                let config = crate::fleet::kube::FleetConfig {
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
                };
                Ok((kube, Some(FleetOf::Kube(config))))
            }
            #[cfg(feature = "etcd")]
            (None, None, Some(fleet)) => {
                let (tx, _) = watch::channel(tls_etcd::store::Leadership::default());
                let mut lease = tls_etcd::store::WriterLease::new(
                    fleet.etcd.clone(),
                    &fleet.prefix,
                    &fleet.name,
                    fleet.identity.clone(),
                );
                if let Some((ttl, retry)) = fleet.timing {
                    lease = lease.ttl(ttl).retry_period(retry);
                }
                let keys = crate::store::etcd::Keys::new(&fleet.prefix, &fleet.name);
                let store = Arc::new(crate::store::etcd::EtcdStore::new(
                    fleet.etcd.clone(),
                    keys.clone(),
                    lease.key().to_owned(),
                    self.propagation,
                    Arc::clone(&self.seal),
                ));
                let config = crate::fleet::etcd::FleetConfig {
                    etcd: fleet.etcd,
                    keys,
                    name: fleet.name,
                    identity: fleet.identity,
                    lease,
                    seal: Arc::clone(&self.seal),
                    leadership: Arc::new(tx),
                    released: tokio_util::sync::CancellationToken::new(),
                };
                Ok((store, Some(FleetOf::Etcd(config))))
            }
            _ => config(
                "the state in more than one place (a state directory, Kubernetes Secrets, etcd): choose one",
            ),
        }
    }
}

/// A name as a CA takes it: an IP address (in the canonical text the builder keeps), or a DNS
/// name of at most 253 characters, labels of letters, digits and hyphens, a leading `*.` for a
/// wildcard.
fn check_name(name: &str) -> Result<(), Error> {
    if crate::ip::address(name).is_some() {
        return Ok(());
    }
    let bare = name.strip_prefix("*.").unwrap_or(name);
    let ok = bare.len() <= 253
        && bare.contains('.')
        && bare.parse::<std::net::IpAddr>().is_err()
        // No top-level domain is all digits (RFC 3696 §2): `10.0.0.256` is a mistyped address.
        && !bare
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
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
            "{name:?} is not a DNS name or IP address a CA issues for"
        )))
    }
}

/// The keyed source of an [`Acme`]'s certificates: first what is stored (its initial list,
/// for readiness), then each new or renewed certificate. Dropping it stops the ACME work.
pub struct AcmeSource {
    driver: Option<(Driver, Option<FleetOf>)>,
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
        if let Some((driver, fleet)) = self.driver.take() {
            let (tx, rx) = mpsc::unbounded_channel();
            self.rx = Some(rx);
            self.task = Some(spawn(driver, fleet, tx));
        }
        match self.rx.as_mut() {
            Some(rx) => rx.poll_recv(cx),
            None => Poll::Ready(None),
        }
    }
}

/// A fleet's election and store, when built with one.
enum FleetOf {
    #[cfg(feature = "k8s")]
    Kube(crate::fleet::kube::FleetConfig),
    #[cfg(feature = "etcd")]
    Etcd(crate::fleet::etcd::FleetConfig),
}

impl FleetOf {
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    fn released(&self) -> tokio_util::sync::CancellationToken {
        match self {
            #[cfg(feature = "k8s")]
            Self::Kube(f) => f.released.clone(),
            #[cfg(feature = "etcd")]
            Self::Etcd(f) => f.released.clone(),
        }
    }
}

/// Runs the driver: one term for ever with a state directory, or as a replica of a fleet.
#[cfg_attr(
    not(any(feature = "k8s", feature = "etcd")),
    allow(clippy::needless_pass_by_value) // without a fleet's feature, `FleetOf` has no value
)]
fn spawn(driver: Driver, fleet: Option<FleetOf>, tx: Tx) -> tokio::task::JoinHandle<()> {
    match fleet {
        #[cfg(feature = "k8s")]
        Some(FleetOf::Kube(config)) => {
            return tokio::spawn(crate::fleet::kube::run(driver, config, tx));
        }
        #[cfg(feature = "etcd")]
        Some(FleetOf::Etcd(config)) => {
            return tokio::spawn(crate::fleet::etcd::run(driver, config, tx));
        }
        None => {}
    }
    tokio::spawn(async move {
        // One term, for ever: its writes need no fence.
        let term = crate::store::Term {
            round: 0,
            holder: String::new(),
        };
        if let Err(e) = driver.store.begin_term(term).await {
            tracing::warn!(error = %e, "cannot begin the ACME term");
        }
        driver.run_term(&tx).await;
    })
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
            "*.192.0.2.7",
            "*.::1",
            "10.0.0.256",
            "[192.0.2.7",
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
    fn ip_addresses_are_names_kept_in_their_canonical_text_and_not_proven_by_dns_01() {
        #[derive(Debug)]
        struct NoDns;
        impl Dns01Solver for NoDns {
            fn present<'a>(&'a self, _: &'a str, _: &'a str) -> crate::SolverFuture<'a> {
                Box::pin(async { Ok(()) })
            }
            fn clean_up<'a>(&'a self, _: &'a str, _: &'a str) -> crate::SolverFuture<'a> {
                Box::pin(async { Ok(()) })
            }
        }
        let acme = builder()
            .name("192.0.2.7")
            .name("[2001:DB8:0::7]")
            .build()
            .expect("addresses are names");
        let names: Vec<String> = acme.status().borrow().names.keys().cloned().collect();
        assert_eq!(names, ["192.0.2.7", "2001:db8::7"]);
        let reason = config_error(builder().name("2001:db8::7").name("2001:DB8::7"));
        assert!(
            reason.contains("2001:db8::7 is configured twice"),
            "{reason}"
        );
        let reason = config_error(
            builder()
                .name("a.example.com")
                .name("192.0.2.7")
                .challenge(ChallengeType::Dns01)
                .dns01_solver(Arc::new(NoDns)),
        );
        assert!(
            reason.contains("192.0.2.7") && reason.contains("cannot be proven by dns-01"),
            "{reason}"
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn the_state_is_kept_in_one_place() {
        let etcd = || tls_etcd::Etcd::builder(["127.0.0.1:2379"]).build().unwrap();
        let reason = config_error(builder().name("a.example.com").etcd(
            etcd(),
            "/p/",
            "web",
            "web-0",
        ));
        assert!(reason.contains("more than one place"), "{reason}");
        let fleet = Acme::builder("https://acme.invalid/directory")
            .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .name("a.example.com")
            .etcd(etcd(), "/p/", "web", "web-0")
            .build()
            .expect("a fleet on etcd needs no directory");
        assert!(fleet.etcd_leadership().is_some());
        #[cfg(feature = "k8s")]
        assert!(fleet.leadership().is_none(), "not a fleet in Kubernetes");
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
}
