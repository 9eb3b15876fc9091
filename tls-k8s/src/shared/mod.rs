//! [`SharedSelfSigned`]: one self-signed certificate (and CA) for every replica. The Lease holder
//! alone checks and, only when needed, generates, writing through fenced compare-and-swap; every
//! replica serves the Secret through a [`SecretSource`].
//!
//! # How it works
//!
//! (Feature `self-signed`.) `SharedSelfSigned`, every replica's source: a `LeaseLock`, a
//! `SecretSource` to serve from, and a writer that runs only while this replica leads):
//! `plan.rs` (the fence) and `tls_selfsigned::fleet` (the rest) decide, pure, on what is stored
//! and `now` (unit tests step the time by hand): per Lease round one `fence` (the larger of the
//! round and one past any stored round of another holder, so a recreated Lease never turns it
//! back); the CA Secret's content (`NAME-ca`: signing
//! CA, an announced `next` with its `switch-after` time, the `previous` until it expires: kept,
//! announced, switched, replaced); the TLS Secret's (leaf reused while `SelfSigned::check` passes;
//! `ca.crt` the signing, next and previous CAs; `renew-after`); whether a write is needed; when to
//! look again (the earliest due time, or hourly, never sooner than `MIN_RENEWAL_GAP`).
//! `fleet::CaState` reads and writes the CA Secret's keys and annotations. `sealed.rs` puts a Secret's values
//! through the seal (the CA Secret whole; the TLS Secret's `tls.key` only with `seal_served_key`):
//! opened as read, noting whether any wants sealing again, and sealed as written. `writer.rs` does
//! the I/O: reads both Secrets and opens them, asks the plan, writes fenced (sealed), counts
//! (`WriterStats`) and logs, checks again at the plan's time, on a change of either Secret or when
//! the key files change; one clock throughout (the generator's), retries with `Backoff`; its
//! errors (a corrupt CA Secret, state that does not open) are `Err` items of the source. While it
//! does not lead it checks, on every change of what is sealed, that it could open it
//! (`StateAccess`), and only then is it a `candidate` for the Lease: a replica with the wrong key
//! never leads, and a leader that finds the state unopenable steps down.

mod plan;
mod sealed;
mod writer;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use kube::Client;
use tls_seal::{Plain, Seal};
use tls_selfsigned::SelfSigned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "fuzzing")]
pub(crate) use plan::fuzz_ca_state;
use tls_selfsigned::fleet::Candidacy;
pub use tls_selfsigned::fleet::{StateAccess, WriterStats};
use writer::Writer;

use crate::SecretSource;
use crate::store::{FencedSecret, Leadership, LeaseLock};

/// The annotation on the TLS Secret saying when its certificate will be renewed (RFC 3339).
pub const RENEW_AFTER_ANNOTATION: &str = tls_selfsigned::fleet::RENEW_AFTER;
/// The annotation on the CA Secret saying when leaves switch to the announced CA (RFC 3339).
pub const SWITCH_AFTER_ANNOTATION: &str = tls_selfsigned::fleet::SWITCH_AFTER;

/// One self-signed certificate shared by every replica, kept in the `kubernetes.io/tls` Secret
/// `namespace/name`.
///
/// Every replica runs it, and every replica serves the Secret through a [`SecretSource`], so a
/// reader serves what the writer wrote within one watch event. The writer is the holder of a
/// Lease ([`LeaseLock`](crate::store::LeaseLock), default name `NAME-writer`). It alone checks the Secret and, only when
/// needed, generates:
///
/// - The material is **reused** unless it is missing, unparsable, its key does not match, its
///   names do not cover the wanted names, or it is inside the renewal window (the generator's
///   [`Renewal`](tls_selfsigned::Renewal), default a third of the lifetime). The Secret's
///   [`RENEW_AFTER_ANNOTATION`] says when it will be renewed. A restart of every replica, or a
///   new leader, regenerates nothing that still fits.
/// - **Writes are fenced** ([`FencedSecret`](crate::store::FencedSecret)): each carries the writer's round and identity,
///   and is a compare-and-swap on the resourceVersion read; a write whose round is behind the
///   stored one (a leader paused past its lease) is refused. A new leader's first write stamps
///   its round. The round stays monotonic when the Lease is deleted and recreated (which
///   restarts `leaseTransitions`): it is the larger of the Lease's and one past the stored one.
/// - **CA mode** (the generator built with [`ca`](tls_selfsigned::Builder::ca)): one CA for the
///   fleet, its key in a second Secret (`NAME-ca`, type `Opaque`) that only the writer's Role
///   can read; leaves signed by it; `ca.crt` served with every leaf. When the CA enters its
///   renewal window, the next CA is announced: `ca.crt` carries both, and leaves switch to the
///   new CA only after [`ca_overlap`](Self::ca_overlap), so clients that refresh their trust
///   from `ca.crt` never fail. The old CA stays in `ca.crt` until it expires. A CA Secret that
///   cannot be read back is reported (an `Err` item) and not replaced, unless the generator
///   allows it ([`replace_corrupt_ca`](tls_selfsigned::Builder::replace_corrupt_ca)).
///
/// The store never falls back to per-replica state: a replica that cannot reach the API keeps
/// serving what it last read, and never generates unless it holds the Lease.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_k8s::SharedSelfSigned;
/// use tls_reload::Reloader;
/// use tls_selfsigned::SelfSigned;
/// use tokio_util::sync::CancellationToken;
///
/// let client = kube::Client::try_default().await?;
/// let generator = SelfSigned::builder().dns_name("web.web.svc").ca().build()?;
/// let identity = std::env::var("POD_NAME")?;
/// let shared = SharedSelfSigned::new(client, "web", "web-tls", identity, generator)
///     .start(&CancellationToken::new());
/// let leadership = shared.leadership(); // who writes, and this replica's part
/// let reloader = Reloader::spawn(shared)?;
/// reloader.ready().await?;
/// # Ok(()) }
/// ```
///
/// # Permissions
/// Every replica reads the TLS Secret (`get`, `list`, `watch`). A replica that may become the
/// writer also needs `create`, `update` on the TLS Secret and the Lease (plus `get`, `watch`
/// on the Lease), and in CA mode `get`, `list`, `watch`, `create`, `update` on the CA Secret;
/// see the crate docs for the Roles.
#[must_use = "nothing is shared until `start`"]
pub struct SharedSelfSigned {
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    generator: SelfSigned,
    lease: String,
    ca_secret: String,
    timing: Option<(Duration, Duration, Duration)>,
    ca_overlap: Option<Duration>,
    seal: Arc<dyn Seal>,
    seal_served_key: bool,
}

impl fmt::Debug for SharedSelfSigned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSelfSigned")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease", &self.lease)
            .field("ca_secret", &self.ca_secret)
            .field("seal", &self.seal)
            .field("seal_served_key", &self.seal_served_key)
            .finish_non_exhaustive()
    }
}

/// The running shared source: a [`CertSource`](tls_source::CertSource) of the Secret (with the
/// writer's reports, such as a corrupt CA, as `Err` items), and this replica's leadership. The
/// writer and the election stop when it is dropped or the token is cancelled (see
/// [`stopped`](SharedSource::stopped)).
#[must_use = "streams do nothing unless polled"]
pub struct SharedSource {
    secret: SecretSource,
    reports: mpsc::UnboundedReceiver<tls_source::Error>,
    leadership: watch::Receiver<Leadership>,
    stats: watch::Receiver<WriterStats>,
    token: CancellationToken,
    /// Cancelled once the writer and the election have ended (the lease released).
    done: CancellationToken,
    access: watch::Receiver<StateAccess>,
}

impl fmt::Debug for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSource")
            .field("secret", &self.secret)
            .field("leadership", &*self.leadership.borrow())
            .finish_non_exhaustive()
    }
}

impl SharedSelfSigned {
    /// The certificate of `generator` (its names, validity, renewal, CA mode), shared through
    /// the Secret `namespace/name`, for the replica `identity` (e.g. the pod name).
    pub fn new(
        client: Client,
        namespace: &str,
        name: impl Into<String>,
        identity: impl Into<String>,
        generator: SelfSigned,
    ) -> Self {
        let name = name.into();
        Self {
            client,
            namespace: namespace.to_owned(),
            lease: format!("{name}-writer"),
            ca_secret: format!("{name}-ca"),
            name,
            identity: identity.into(),
            generator,
            timing: None,
            ca_overlap: None,
            seal: Arc::new(Plain),
            seal_served_key: false,
        }
    }

    /// Seals what the store keeps for itself: every value of the CA Secret (the CA's private
    /// key, and its certificates, so none can be planted), each bound to its Secret and key.
    /// Default: [`Plain`] (stored as base64, readable by whoever may `get` the Secret).
    ///
    /// A replica that cannot open what is stored (a missing or wrong key, a tampered value,
    /// state stored unsealed, see [`KeyRing::adopt_unsealed`](tls_seal::KeyRing::adopt_unsealed))
    /// serves the TLS Secret, writes nothing, reports why ([`SharedSource::access`], an `Err`
    /// item, the log) and does not campaign for the Lease; a leader that finds it so steps
    /// down. A [`KeyRing`](tls_seal::KeyRing)'s key files are re-read every 10 s: a leader
    /// then seals again what a key that no longer seals had sealed.
    ///
    /// ```no_run
    /// # async fn run(client: kube::Client, generator: tls_selfsigned::SelfSigned) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use tls_seal::KeyRing;
    ///
    /// // The first key seals, both open: the second step of rolling a new key.
    /// let ring = KeyRing::from_files(["/etc/seal/new.key", "/etc/seal/old.key"])?;
    /// let shared = tls_k8s::SharedSelfSigned::new(client, "web", "web-tls", "pod-0", generator)
    ///     .seal(Arc::new(ring));
    /// # Ok(()) }
    /// ```
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.seal = seal;
        self
    }

    /// Also seals the served TLS Secret's `tls.key` (default: off). The Secret stays a
    /// `kubernetes.io/tls` Secret, but only readers with the seal can use its key: for fleets
    /// that only tls-rotation reads (every replica's [`SecretSource`] gets the seal).
    pub fn seal_served_key(mut self, on: bool) -> Self {
        self.seal_served_key = on;
        self
    }

    /// The Lease's name (default `NAME-writer`).
    pub fn lease(mut self, name: impl Into<String>) -> Self {
        self.lease = name.into();
        self
    }

    /// The CA Secret's name in CA mode (default `NAME-ca`).
    pub fn ca_secret(mut self, name: impl Into<String>) -> Self {
        self.ca_secret = name.into();
        self
    }

    /// The Lease's timing (see [`LeaseLock::timing`](crate::store::LeaseLock::timing); defaults 15 s, 10 s, 2 s).
    pub fn lease_timing(
        mut self,
        lease: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> Self {
        self.timing = Some((lease, renew_deadline, retry));
        self
    }

    /// In CA mode, how long `ca.crt` announces a renewed CA before leaves are signed by it
    /// (default: half the CA's renewal window).
    pub fn ca_overlap(mut self, overlap: Duration) -> Self {
        self.ca_overlap = Some(overlap);
        self
    }

    /// Joins the election and starts serving the Secret; runs until `token` is cancelled or the
    /// source is dropped.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn start(self, token: &CancellationToken) -> SharedSource {
        let token = token.child_token();
        let candidacy = Candidacy::default();
        let access = candidacy.access();
        let mut lock = LeaseLock::new(
            self.client.clone(),
            &self.namespace,
            self.lease.clone(),
            self.identity.clone(),
        )
        .candidate(candidacy.candidate());
        if let Some((lease, renew, retry)) = self.timing {
            lock = lock.timing(lease, renew, retry);
        }
        let lease = lock.spawn(token.child_token());
        let leadership = lease.leadership();
        let mut secret = SecretSource::builder(self.client.clone(), &self.namespace, &self.name);
        if self.seal_served_key {
            secret = secret.seal(self.seal.clone());
        }
        let secret = secret.build();
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let (stats_tx, stats) = watch::channel(WriterStats::default());
        let rotation = self.generator.ca_rotation();
        let writer = Writer {
            tls: FencedSecret::new(self.client.clone(), &self.namespace, self.name.clone()),
            ca_overlap: self
                .ca_overlap
                .unwrap_or_else(|| rotation.as_ref().map_or(Duration::ZERO, |r| r.window() / 2)),
            ca: rotation.map(|rotation| {
                let secret =
                    FencedSecret::new(self.client.clone(), &self.namespace, self.ca_secret.clone())
                        .secret_type("Opaque");
                (secret, rotation)
            }),
            lease_duration: self
                .timing
                .map_or(crate::store::DEFAULT_LEASE_DURATION, |t| t.0),
            client: self.client,
            namespace: self.namespace,
            identity: self.identity,
            generator: self.generator,
            reports: reports_tx,
            stats: stats_tx,
            seal: self.seal,
            tls_sealed: if self.seal_served_key {
                sealed::Sealed::Only(crate::TLS_KEY)
            } else {
                sealed::Sealed::Nothing
            },
            candidacy,
        };
        let done = CancellationToken::new();
        let ended = done.clone().drop_guard();
        tokio::spawn({
            let token = token.clone();
            async move {
                let _ended = ended;
                Arc::new(writer).run(lease, token).await;
            }
        });
        SharedSource {
            secret,
            reports,
            leadership,
            stats,
            token,
            done,
            access,
        }
    }
}

impl SharedSource {
    /// Who leads, as this replica sees it (the `leader` of `serve`'s status).
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Completes once the writer and the election have ended, after the source is dropped or
    /// its token cancelled: a leader has then released its Lease (at most 5 s), so a follower
    /// leads within one retry period. Take it before handing the source to the reloader, and
    /// await it before the process exits:
    ///
    /// ```no_run
    /// # async fn run(shared: tls_k8s::SharedSource, token: tls_reload::CancellationToken) -> Result<(), tls_reload::Error> {
    /// let released = shared.stopped();
    /// let reloader = tls_reload::Reloader::builder().cancellation_token(token.clone()).spawn(shared)?;
    /// // ... serve until `token` is cancelled (SIGTERM) ...
    /// reloader.stopped().await; // the source is dropped
    /// released.await;
    /// # Ok(()) }
    /// ```
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.done.clone().cancelled_owned()
    }

    /// What this replica's writer has done.
    pub fn stats(&self) -> watch::Receiver<WriterStats> {
        self.stats.clone()
    }

    /// Whether this replica can open the stored state (see [`SharedSelfSigned::seal`]), and
    /// why not.
    pub fn access(&self) -> watch::Receiver<StateAccess> {
        self.access.clone()
    }
}

impl Stream for SharedSource {
    type Item = Result<tls_source::CertBundle, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Poll::Ready(Some(report)) = self.reports.poll_recv(cx) {
            return Poll::Ready(Some(Err(report)));
        }
        Pin::new(&mut self.secret).poll_next(cx)
    }
}

impl Drop for SharedSource {
    /// Stops the writer and the election; they end by themselves (a leader releases its Lease
    /// first), which [`stopped`](SharedSource::stopped) tells.
    fn drop(&mut self) {
        self.token.cancel();
    }
}
