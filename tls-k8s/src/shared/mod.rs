//! [`SharedSelfSigned`]: one self-signed certificate (and CA) for every replica. The Lease holder
//! alone checks and, only when needed, generates, writing through fenced compare-and-swap; every
//! replica serves the Secret through a [`SecretSource`].

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::Client;
use kube::runtime::watcher;
use tls_selfsigned::{CaPem, MIN_RENEWAL_GAP, SelfSigned, Unfit};
use tls_source::x509::LeafInfo;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::fenced::Stored;
use crate::{Fence, FencedSecret, Leadership, LeaseLock, SecretSource, Written};

/// The annotation on the TLS Secret saying when its certificate will be renewed (RFC 3339).
pub const RENEW_AFTER_ANNOTATION: &str = "tls-rotation.io/renew-after";
/// The annotation on the CA Secret saying when leaves switch to the announced CA (RFC 3339).
pub const SWITCH_AFTER_ANNOTATION: &str = "tls-rotation.io/switch-after";

/// Keys of the CA Secret: the signing CA, the announced next one, the one it replaced.
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const NEXT_CRT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
const PREVIOUS_CRT: &str = "previous.crt";

/// The longest the writer waits before looking at the wall clock again.
const MAX_NAP: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The leader checks the Secrets at least this often even when nothing is due (two reads).
const RECHECK: Duration = Duration::from_secs(3600);

/// One self-signed certificate shared by every replica, kept in the `kubernetes.io/tls` Secret
/// `namespace/name`.
///
/// Every replica runs it, and every replica serves the Secret through a [`SecretSource`], so a
/// reader serves what the writer wrote within one watch event. The writer is the holder of a
/// Lease ([`LeaseLock`], default name `NAME-writer`). It alone checks the Secret and, only when
/// needed, generates:
///
/// - The material is **reused** unless it is missing, unparsable, its key does not match, its
///   names do not cover the wanted names, or it is inside the renewal window (the generator's
///   [`Renewal`](tls_selfsigned::Renewal), default a third of the lifetime). The Secret's
///   [`RENEW_AFTER_ANNOTATION`] says when it will be renewed. A restart of every replica, or a
///   new leader, regenerates nothing that still fits.
/// - **Writes are fenced** ([`FencedSecret`]): each carries the writer's round and identity,
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
}

impl fmt::Debug for SharedSelfSigned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSelfSigned")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease", &self.lease)
            .field("ca_secret", &self.ca_secret)
            .finish_non_exhaustive()
    }
}

/// What this replica's writer has done, for status and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// Leaves generated by this replica.
    pub generated_leaves: u64,
    /// CAs generated by this replica.
    pub generated_cas: u64,
    /// Fenced writes accepted.
    pub accepted: u64,
    /// Fenced writes refused (a later round had written).
    pub refused: u64,
    /// The round this replica last wrote with, if it ever wrote.
    pub round: Option<u64>,
    /// Checks of the Secrets completed while leading (whether or not they wrote).
    pub checks: u64,
}

/// The running shared source: a [`CertSource`](tls_source::CertSource) of the Secret (with the
/// writer's reports, such as a corrupt CA, as `Err` items), and this replica's leadership. The
/// writer and the election stop when it is dropped or the token is cancelled.
#[must_use = "streams do nothing unless polled"]
pub struct SharedSource {
    secret: SecretSource,
    reports: mpsc::UnboundedReceiver<tls_source::Error>,
    leadership: watch::Receiver<Leadership>,
    stats: watch::Receiver<WriterStats>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
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
        }
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

    /// The Lease's timing (see [`LeaseLock::timing`]; defaults 15 s, 10 s, 2 s).
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
        let mut lock = LeaseLock::new(
            self.client.clone(),
            &self.namespace,
            self.lease.clone(),
            self.identity.clone(),
        );
        if let Some((lease, renew, retry)) = self.timing {
            lock = lock.timing(lease, renew, retry);
        }
        let lease = lock.spawn(token.child_token());
        let leadership = lease.leadership();
        let secret =
            SecretSource::builder(self.client.clone(), &self.namespace, &self.name).build();
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let (stats_tx, stats) = watch::channel(WriterStats::default());
        let ca_mode = self.generator.is_ca_mode();
        let writer = Writer {
            tls: FencedSecret::new(self.client.clone(), &self.namespace, self.name.clone()),
            ca: ca_mode.then(|| {
                FencedSecret::new(self.client.clone(), &self.namespace, self.ca_secret.clone())
                    .secret_type("Opaque")
            }),
            ca_overlap: self
                .ca_overlap
                .unwrap_or_else(|| self.generator.ca_window() / 2),
            lease_duration: self.timing.map_or(crate::DEFAULT_LEASE_DURATION, |t| t.0),
            client: self.client,
            namespace: self.namespace,
            name: self.name,
            ca_secret: self.ca_secret,
            identity: self.identity,
            generator: self.generator,
            reports: reports_tx,
            stats: stats_tx,
        };
        let task = tokio::spawn(Arc::new(writer).run(lease, token.clone()));
        SharedSource {
            secret,
            reports,
            leadership,
            stats,
            token,
            task,
        }
    }
}

impl SharedSource {
    /// Who leads, as this replica sees it (the `leader` of `serve`'s status).
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// What this replica's writer has done.
    pub fn stats(&self) -> watch::Receiver<WriterStats> {
        self.stats.clone()
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
    fn drop(&mut self) {
        self.token.cancel();
        self.task.abort();
    }
}

// ===== the writer =====

struct Writer {
    client: Client,
    namespace: String,
    name: String,
    ca_secret: String,
    identity: String,
    generator: SelfSigned,
    tls: FencedSecret,
    ca: Option<FencedSecret>,
    ca_overlap: Duration,
    lease_duration: Duration,
    reports: mpsc::UnboundedSender<tls_source::Error>,
    stats: watch::Sender<WriterStats>,
}

/// Why the writer stopped leading a round, or failed a step.
enum Step {
    /// A later round has written: this replica is deposed.
    Refused(Fence),
    /// The API failed; retried with backoff.
    Api(kube::Error),
    /// The CA Secret cannot be read back and is not replaced; retried with backoff.
    CorruptCa(String),
    /// Generation failed.
    Generate(tls_selfsigned::Error),
}

impl From<kube::Error> for Step {
    fn from(err: kube::Error) -> Self {
        Self::Api(err)
    }
}

impl From<tls_selfsigned::Error> for Step {
    fn from(err: tls_selfsigned::Error) -> Self {
        Self::Generate(err)
    }
}

/// A problem the writer reports through the source, naming the Secret.
#[derive(Debug, thiserror::Error)]
enum Report {
    #[error("the shared writer could not reach the API: {0}")]
    Api(#[source] kube::Error),
    #[error(
        "the CA Secret {secret} cannot be used ({reason}); not replaced, as clients may pin it: fix or delete it, or allow a new CA with replace_corrupt_ca(true)"
    )]
    CorruptCa { secret: String, reason: String },
    #[error("the shared writer could not generate: {0}")]
    Generate(#[source] tls_selfsigned::Error),
}

impl Writer {
    fn report(&self, report: Report) {
        tracing::warn!(secret = %self.tls.id(), error = %report, "shared self-signed writer");
        let _ = self.reports.send(tls_source::Error::source(
            format!("shared self-signed secret {}", self.tls.id()),
            report,
        ));
    }

    /// Reports `report` and says when to try again (with a doubling backoff).
    fn retry(&self, report: Report, backoff: &mut Duration) -> SystemTime {
        self.report(report);
        let at = SystemTime::now() + *backoff;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        at
    }

    async fn run(self: Arc<Self>, lease: crate::LeaseHandle, token: CancellationToken) {
        let mut leadership = lease.leadership();
        loop {
            let round = tokio::select! {
                () = token.cancelled() => break,
                lead = leadership.wait_for(|l| l.leading) => match lead {
                    Ok(lead) => lead.round,
                    Err(_) => break,
                },
            };
            self.lead(round, &mut leadership, &token).await;
        }
        lease.stop().await;
    }

    /// Writes for the Lease round `lease_round` while this replica leads it.
    async fn lead(
        &self,
        lease_round: u64,
        leadership: &mut watch::Receiver<Leadership>,
        token: &CancellationToken,
    ) {
        let mut changes = self.changes();
        let mut fence = None;
        let mut backoff = Duration::from_secs(1);
        loop {
            let next = match self.step(lease_round, &mut fence).await {
                Ok(next) => {
                    backoff = Duration::from_secs(1);
                    self.stats.send_modify(|s| s.checks += 1);
                    next
                }
                Err(Step::Refused(stored)) => {
                    tracing::debug!(secret = %self.tls.id(), round = ?fence.as_ref().map(|f: &Fence| f.round), stored = stored.round, "deposed: a later round has written");
                    // The fence is fixed for the Lease round: wait for the election to catch up
                    // (a new round, or not leading). Only if this replica still holds the Lease
                    // a lease duration later (the Lease was recreated under a writer that is
                    // gone) does it take a fence past the stored one.
                    let caught_up = leadership.wait_for(|l| !l.leading || l.round != lease_round);
                    tokio::select! {
                        () = token.cancelled() => {}
                        _ = caught_up => {}
                        () = tokio::time::sleep(self.lease_duration) => {}
                    }
                    return;
                }
                Err(Step::Api(err)) => self.retry(Report::Api(err), &mut backoff),
                Err(Step::CorruptCa(reason)) => self.retry(
                    Report::CorruptCa {
                        secret: format!("{}/{}", self.namespace, self.ca_secret),
                        reason,
                    },
                    &mut backoff,
                ),
                Err(Step::Generate(err)) => self.retry(Report::Generate(err), &mut backoff),
            };
            tokio::select! {
                () = token.cancelled() => return,
                changed = leadership.changed() => {
                    let lead = leadership.borrow().clone();
                    if changed.is_err() || !lead.leading || lead.round != lease_round {
                        return;
                    }
                }
                () = wall_clock(next) => {}
                // Someone else changed or deleted a Secret: check again.
                _ = changes.next() => {}
            }
        }
    }

    /// Changes of the TLS Secret and the CA Secret, for the leader to check again.
    fn changes(&self) -> BoxStream<'static, ()> {
        let watch = |name: &str| {
            watcher::watch_object(
                crate::secret::api(self.client.clone(), &self.namespace),
                name,
            )
            .map(|_| ())
            .boxed()
        };
        let mut streams = vec![watch(&self.name)];
        if self.ca.is_some() {
            streams.push(watch(&self.ca_secret));
        }
        // The first event of each is the state as listed: skipped, the first step reads it.
        futures::stream::select_all(streams)
            .skip(1 + usize::from(self.ca.is_some()))
            .boxed()
    }

    /// One check: the fence for this round, the CA (in CA mode), the leaf; writes what must
    /// change. Returns when to check again.
    async fn step(&self, lease_round: u64, fence: &mut Option<Fence>) -> Result<SystemTime, Step> {
        let tls = self.tls.read().await?;
        let ca = match &self.ca {
            Some(secret) => Some((secret, secret.read().await?)),
            None => None,
        };
        let fence = fence.get_or_insert_with(|| {
            // Monotonic across a recreated Lease: past every stored round of another holder.
            let stored = tls
                .iter()
                .chain(ca.iter().filter_map(|(_, s)| s.as_ref()))
                .filter_map(|s| s.fence.as_ref());
            let round = stored.fold(lease_round, |round, f| {
                round.max(f.round + u64::from(f.holder != self.identity))
            });
            Fence {
                round,
                holder: self.identity.clone(),
            }
        });
        let now = SystemTime::now();
        let mut next = now + RECHECK;
        let (generator, served_ca) = match ca {
            Some((secret, stored)) => {
                let (generator, served_ca, ca_next) =
                    self.ca_step(secret, stored, fence, now).await?;
                next = next.min(ca_next);
                (generator, Some(served_ca))
            }
            None => (self.generator.clone(), None),
        };
        let leaf_next = self.leaf_step(&generator, tls, served_ca, fence).await?;
        Ok(next.min(leaf_next).max(now + MIN_RENEWAL_GAP))
    }

    /// The leaf: reused while it fits, else generated; written with `served_ca` as `ca.crt`.
    async fn leaf_step(
        &self,
        generator: &SelfSigned,
        stored: Option<Stored>,
        served_ca: Option<String>,
        fence: &Fence,
    ) -> Result<SystemTime, Step> {
        let data = stored.as_ref().map(|s| &s.data);
        let cert = data.and_then(|d| d.get(crate::TLS_CRT));
        let key = data.and_then(|d| d.get(crate::TLS_KEY));
        let (cert, key) = match generator.check(cert.map(Vec::as_slice), key.map(Vec::as_slice)) {
            Ok(()) => (
                cert.cloned().unwrap_or_default(),
                key.cloned().unwrap_or_default(),
            ),
            Err(unfit) => {
                self.log_unfit("leaf", &unfit, stored.is_some());
                let pem = generator.generate_pem()?;
                self.stats.send_modify(|s| s.generated_leaves += 1);
                (pem.cert_pem.into_bytes(), pem.key_pem.into_bytes())
            }
        };
        let leaf = first_certificate(&cert).ok_or_else(|| {
            Step::Generate(tls_selfsigned::Error::Config {
                reason: "the generated certificate does not parse".into(),
            })
        })?;
        let renew_after = leaf
            .not_after
            .checked_sub(generator.renewal_window())
            .unwrap_or(leaf.not_after);
        let mut wanted = BTreeMap::from([
            (crate::TLS_CRT.to_owned(), cert),
            (crate::TLS_KEY.to_owned(), key),
        ]);
        if let Some(ca) = served_ca {
            wanted.insert(crate::CA_CRT.to_owned(), ca.into_bytes());
        }
        let annotations =
            BTreeMap::from([(RENEW_AFTER_ANNOTATION.to_owned(), rfc3339(renew_after))]);
        self.write_if_changed(&self.tls, stored.as_ref(), fence, wanted, annotations)
            .await?;
        Ok(renew_after)
    }

    /// The CA: kept while it fits; the next one announced when it enters its renewal window,
    /// and signing after the overlap; the previous one served until it expires. Returns the
    /// generator signing with the current CA, the `ca.crt` to serve, and when to check again.
    async fn ca_step(
        &self,
        secret: &FencedSecret,
        stored: Option<Stored>,
        fence: &Fence,
        now: SystemTime,
    ) -> Result<(SelfSigned, String, SystemTime), Step> {
        let mut state = match &stored {
            None => {
                self.stats.send_modify(|s| s.generated_cas += 1);
                CaState {
                    signing: self.generator.generate_ca()?,
                    next: None,
                    previous: None,
                }
            }
            Some(stored) => match CaState::read(stored, &self.generator) {
                Ok(state) => state,
                Err(reason) if self.generator.replaces_corrupt_ca() => {
                    tracing::warn!(secret = %secret.id(), reason = %reason, "replacing the corrupt CA, as configured: clients that pinned it must trust the new one");
                    self.stats.send_modify(|s| s.generated_cas += 1);
                    CaState {
                        signing: self.generator.generate_ca()?,
                        next: None,
                        previous: None,
                    }
                }
                Err(reason) => return Err(Step::CorruptCa(reason)),
            },
        };
        let mut next_check = now + RECHECK;
        // Announced long enough: leaves switch to the new CA.
        if let Some((next, _)) = state.next.take_if(|(_, switch_after)| now >= *switch_after) {
            tracing::info!(secret = %secret.id(), "leaves are now signed by the renewed CA");
            state.previous = Some(std::mem::replace(&mut state.signing, next).cert_pem);
        }
        match self.generator.check_ca(state.signing.cert_pem.as_bytes()) {
            Ok(()) => {}
            Err(Unfit::RenewalDue { .. }) if state.next.is_none() => {
                let switch_after = tls_source::clock::saturating_add(now, self.ca_overlap);
                tracing::info!(secret = %secret.id(), switch_after = %rfc3339(switch_after), "the CA is due for renewal: announcing the next CA in ca.crt");
                self.stats.send_modify(|s| s.generated_cas += 1);
                state.next = Some((self.generator.generate_ca()?, switch_after));
            }
            Err(Unfit::RenewalDue { .. }) => {}
            Err(unfit) => {
                // Expired (no writer for too long) or broken: no overlap is possible any more.
                tracing::warn!(secret = %secret.id(), reason = %unfit, "the CA cannot sign any more; replacing it without an overlap");
                self.stats.send_modify(|s| s.generated_cas += 1);
                state.previous = None;
                state.next = None;
                state.signing = self.generator.generate_ca()?;
            }
        }
        if let Some(previous) = &state.previous {
            match first_certificate(previous.as_bytes()) {
                Some(info) if info.not_after > now => next_check = next_check.min(info.not_after),
                _ => state.previous = None,
            }
        }
        if let Some((_, switch_after)) = &state.next {
            next_check = next_check.min(*switch_after);
        }
        if let Some(info) = first_certificate(state.signing.cert_pem.as_bytes()) {
            let due = info
                .not_after
                .checked_sub(self.generator.ca_window())
                .unwrap_or(info.not_after);
            if state.next.is_none() {
                next_check = next_check.min(due);
            }
        }
        let (data, annotations) = state.write();
        self.write_if_changed(secret, stored.as_ref(), fence, data, annotations)
            .await?;
        let served = state.served();
        let generator = self.generator.with_ca(&state.signing)?;
        Ok((generator, served, next_check))
    }

    /// A fenced write of `data` and `annotations`, unless the Secret already holds them under
    /// this fence.
    async fn write_if_changed(
        &self,
        secret: &FencedSecret,
        stored: Option<&Stored>,
        fence: &Fence,
        data: BTreeMap<String, Vec<u8>>,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), Step> {
        let same = stored.is_some_and(|s| {
            s.fence.as_ref() == Some(fence)
                && s.data == data
                && annotations
                    .iter()
                    .all(|(k, v)| s.annotations.get(k) == Some(v))
        });
        if same {
            return Ok(());
        }
        match secret.write_with(fence, Some(&data), &annotations).await? {
            Written::Accepted { .. } => {
                crate::metrics::fenced_write(&secret.id(), true);
                self.stats.send_modify(|s| {
                    s.accepted += 1;
                    s.round = Some(fence.round);
                });
                tracing::debug!(secret = %secret.id(), round = fence.round, "fenced write accepted");
                Ok(())
            }
            Written::Refused { stored } => {
                crate::metrics::fenced_write(&secret.id(), false);
                self.stats.send_modify(|s| s.refused += 1);
                Err(Step::Refused(stored))
            }
        }
    }

    fn log_unfit(&self, what: &str, unfit: &Unfit, present: bool) {
        if present && unfit.is_broken() {
            tracing::warn!(secret = %self.tls.id(), reason = %unfit, "the shared {what} cannot be used; generating a new one");
        } else if present {
            tracing::info!(secret = %self.tls.id(), reason = %unfit, "renewing the shared {what}");
        } else {
            tracing::info!(secret = %self.tls.id(), "generating the shared {what}");
        }
    }
}

/// Returns once the wall clock reaches `at`, looking at it at least every [`MAX_NAP`] (so a
/// suspend or a clock step delays a renewal by at most that).
async fn wall_clock(at: SystemTime) {
    while let Ok(remaining) = at.duration_since(SystemTime::now()) {
        if remaining.is_zero() {
            return;
        }
        tokio::time::sleep(remaining.min(MAX_NAP)).await;
    }
}

/// The CA Secret's content.
struct CaState {
    signing: CaPem,
    next: Option<(CaPem, SystemTime)>,
    previous: Option<String>,
}

impl CaState {
    /// The CA Secret as written, each CA loaded as a signing CA (parsable, a CA, its key its
    /// own), or why it cannot be used.
    fn read(stored: &Stored, generator: &SelfSigned) -> Result<Self, String> {
        let text = |key: &str| -> Result<Option<String>, String> {
            stored
                .data
                .get(key)
                .map(|b| {
                    String::from_utf8(b.clone()).map_err(|_| format!("{key} is not UTF-8 PEM"))
                })
                .transpose()
        };
        let pair = |crt: &str, key: &str| -> Result<Option<CaPem>, String> {
            match (text(crt)?, text(key)?) {
                (Some(cert_pem), Some(key_pem)) => {
                    let pem = CaPem { cert_pem, key_pem };
                    generator
                        .with_ca(&pem)
                        .map_err(|e| format!("{crt}/{key}: {e}"))?;
                    Ok(Some(pem))
                }
                (None, None) => Ok(None),
                (Some(_), None) => Err(format!("{key} is missing beside {crt}")),
                (None, Some(_)) => Err(format!("{crt} is missing beside {key}")),
            }
        };
        let signing =
            pair(CA_CRT, CA_KEY)?.ok_or_else(|| format!("{CA_CRT} and {CA_KEY} are missing"))?;
        let next = match pair(NEXT_CRT, NEXT_KEY)? {
            Some(next) => {
                let at = stored
                    .annotations
                    .get(SWITCH_AFTER_ANNOTATION)
                    .and_then(|t| parse_rfc3339(t))
                    .unwrap_or_else(SystemTime::now);
                Some((next, at))
            }
            None => None,
        };
        Ok(Self {
            signing,
            next,
            previous: text(PREVIOUS_CRT)?,
        })
    }

    fn write(&self) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
        let mut data = BTreeMap::from([
            (
                CA_CRT.to_owned(),
                self.signing.cert_pem.clone().into_bytes(),
            ),
            (CA_KEY.to_owned(), self.signing.key_pem.clone().into_bytes()),
        ]);
        let mut annotations = BTreeMap::new();
        if let Some((next, at)) = &self.next {
            data.insert(NEXT_CRT.to_owned(), next.cert_pem.clone().into_bytes());
            data.insert(NEXT_KEY.to_owned(), next.key_pem.clone().into_bytes());
            annotations.insert(SWITCH_AFTER_ANNOTATION.to_owned(), rfc3339(*at));
        }
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS_CRT.to_owned(), previous.clone().into_bytes());
        }
        (data, annotations)
    }

    /// The `ca.crt` served with every leaf: the signing CA, then the announced and the
    /// previous one.
    fn served(&self) -> String {
        let mut served = self.signing.cert_pem.clone();
        for extra in self
            .next
            .iter()
            .map(|(n, _)| n.cert_pem.as_str())
            .chain(self.previous.as_deref())
        {
            if !served.ends_with('\n') {
                served.push('\n');
            }
            served.push_str(extra);
        }
        served
    }
}

/// For the fuzz target: reads a CA Secret's content as the writer does.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_ca_state(data: &[(String, Vec<u8>)], switch_after: Option<&str>) {
    let stored = Stored {
        fence: None,
        data: data.iter().cloned().collect(),
        annotations: switch_after
            .map(|t| BTreeMap::from([(SWITCH_AFTER_ANNOTATION.to_owned(), t.to_owned())]))
            .unwrap_or_default(),
    };
    static GENERATOR: std::sync::OnceLock<SelfSigned> = std::sync::OnceLock::new();
    let generator = GENERATOR.get_or_init(|| {
        SelfSigned::builder()
            .dns_name("fuzz")
            .ca()
            .build()
            .expect("a fixed configuration")
    });
    if let Ok(state) = CaState::read(&stored, generator) {
        let _ = state.served();
        let _ = state.write();
    }
}

fn first_certificate(pem: &[u8]) -> Option<LeafInfo> {
    let chain = tls_source::Decoder::new()
        .certificates("certificate", pem)
        .ok()?;
    LeafInfo::parse(chain.first()?).ok()
}

fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| {
            t.round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(t)
                .to_string()
        })
        .unwrap_or_default()
}

fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}
