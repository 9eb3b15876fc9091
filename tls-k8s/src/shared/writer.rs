//! The shared store's writer: while this replica holds the Lease, it reads the Secrets (opening
//! what is sealed, `sealed.rs`), asks the plan (`plan.rs`) what they must hold, and writes that
//! (sealed) through fenced compare-and-swap; it counts, logs and reports what happened. While
//! it does not lead, it checks that it could open what is stored: only then is it a candidate
//! for the Lease. One clock throughout: the generator's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::Client;
use kube::runtime::{WatchStreamExt as _, watcher};
use tls_seal::Seal;
use tls_selfsigned::{CaRotation, Clock, SelfSigned, Unfit};
use tls_source::Backoff;
use tls_source::clock::Rfc3339;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tls_selfsigned::fleet::{
    self, CaChange, CaState, Candidacy, Content, KeyCheck, PlanError, StoredCa,
};

use super::WriterStats;
use super::plan;
use super::sealed::{self, Opened, Sealed};
use crate::fenced::Stored;
use crate::store::{Fence, FencedSecret, Leadership, LeaseHandle, Written};

/// The longest the writer waits before looking at the clock again.
const MAX_NAP: Duration = Duration::from_secs(30);
/// The backoff after a failed check: from 1 s, doubling, up to a minute.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Where the writer writes: the TLS Secret, and in CA mode the CA Secret with the rotation
/// vocabulary of the generator.
pub(crate) struct Writer {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) identity: String,
    pub(crate) generator: SelfSigned,
    pub(crate) tls: FencedSecret,
    pub(crate) ca: Option<(FencedSecret, CaRotation)>,
    pub(crate) ca_overlap: Duration,
    pub(crate) lease_duration: Duration,
    pub(crate) reports: mpsc::UnboundedSender<tls_source::Error>,
    pub(crate) stats: watch::Sender<WriterStats>,
    pub(crate) seal: Arc<dyn Seal>,
    /// What of the TLS Secret is sealed (its `tls.key`, when asked).
    pub(crate) tls_sealed: Sealed,
    /// Whether this replica can open what is stored, and so campaigns.
    pub(crate) candidacy: Candidacy,
}

/// The Secrets as read, opened.
struct Read<'a> {
    tls: Option<Opened>,
    ca: Option<(&'a FencedSecret, &'a CaRotation, Option<Opened>)>,
}

/// Why the Secrets could not be read.
enum ReadError {
    Api(kube::Error),
    /// What is stored does not open: this replica writes nothing and does not lead.
    Sealed(tls_seal::Error),
}

impl From<kube::Error> for ReadError {
    fn from(err: kube::Error) -> Self {
        Self::Api(err)
    }
}

impl From<tls_seal::Error> for ReadError {
    fn from(err: tls_seal::Error) -> Self {
        Self::Sealed(err)
    }
}

/// Why the writer stopped leading a round, or failed a step.
enum Step {
    /// A later round has written: this replica is deposed.
    Refused(Fence),
    /// The API failed; retried with backoff.
    Api(kube::Error),
    /// A plan could not be made (a corrupt CA, a generation that failed); retried with backoff.
    Plan(PlanError),
    /// What is stored cannot be opened, or what is written cannot be sealed: step down.
    Sealed(tls_seal::Error),
}

impl From<ReadError> for Step {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Api(err) => Self::Api(err),
            ReadError::Sealed(err) => Self::Sealed(err),
        }
    }
}

impl From<kube::Error> for Step {
    fn from(err: kube::Error) -> Self {
        Self::Api(err)
    }
}

impl From<PlanError> for Step {
    fn from(err: PlanError) -> Self {
        Self::Plan(err)
    }
}

impl From<tls_selfsigned::Error> for Step {
    fn from(err: tls_selfsigned::Error) -> Self {
        Self::Plan(PlanError::Generate(err))
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
    #[error(
        "the shared store's state cannot be opened ({0}); this replica writes nothing and does not lead: give it the seal key that sealed it, or restore the state"
    )]
    Sealed(#[source] tls_seal::Error),
}

impl Writer {
    fn clock(&self) -> &dyn Clock {
        &**self.generator.clock()
    }

    fn report(&self, report: Report) {
        tracing::warn!(secret = %self.tls.id(), error = %report, "shared self-signed writer");
        let _ = self.reports.send(tls_source::Error::source(
            format!("shared self-signed secret {}", self.tls.id()),
            report,
        ));
    }

    pub(crate) async fn run(self: Arc<Self>, lease: LeaseHandle, token: CancellationToken) {
        let mut leadership = lease.leadership();
        // What is sealed (the CA Secret; the TLS Secret when its key is sealed) is checked
        // before campaigning, again on every change of it and when the key files change; a
        // failed read is retried with backoff. With nothing sealed there is nothing to open,
        // and this replica may always lead.
        let sealed = self.watched(self.tls_sealed != Sealed::Nothing);
        let anything_sealed = !sealed.is_empty();
        if !anything_sealed {
            self.may_lead();
        }
        let mut probes = futures::stream::select_all(sealed);
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut retry: Option<Instant> = None;
        let mut keys = KeyCheck::new(&*self.seal);
        /// What woke the writer while it does not lead.
        enum Wake {
            /// It leads this Lease round.
            Lead(u64),
            /// What is sealed changed, or a failed read is due again: look at it.
            Probe,
            /// Nothing to do (the key files did not change).
            Nothing,
        }
        loop {
            let open = self.candidacy.is_open();
            // The branches only say what woke it (a `watch::Ref` is not held across an await).
            let wake = tokio::select! {
                () = token.cancelled() => break,
                lead = leadership.wait_for(|l| l.leading), if open => match lead {
                    Ok(lead) => Wake::Lead(lead.round),
                    Err(_) => break,
                },
                Some(()) = probes.next(), if anything_sealed => Wake::Probe,
                () = sleep_until(retry) => Wake::Probe,
                _ = keys.tick() => {
                    if keys.changed(&*self.seal) { Wake::Probe } else { Wake::Nothing }
                }
            };
            match wake {
                Wake::Probe => retry = self.probe(&mut backoff).await,
                Wake::Nothing => {}
                Wake::Lead(round) => self.lead(round, &mut leadership, &token).await,
            }
        }
        lease.stop().await;
    }

    /// The Secrets this writer watches, each a stream whose first event is the state as
    /// listed: the TLS Secret (`with_tls`) and the CA Secret in CA mode.
    fn watched(&self, with_tls: bool) -> Vec<BoxStream<'static, ()>> {
        let tls = with_tls.then(|| self.watch(&self.tls));
        let ca = self.ca.as_ref().map(|(secret, _)| self.watch(secret));
        tls.into_iter().chain(ca).collect()
    }

    /// Reads what is sealed and tries to open it: whether this replica may lead. Returns when
    /// to try again after an API error.
    async fn probe(&self, backoff: &mut Backoff) -> Option<Instant> {
        match self.read().await {
            Ok(_) => {
                backoff.reset();
                self.may_lead();
                None
            }
            Err(ReadError::Sealed(err)) => {
                backoff.reset();
                self.refuse(err);
                None
            }
            Err(ReadError::Api(err)) => {
                tracing::debug!(secret = %self.tls.id(), error = %err, "reading the shared store's state failed; retrying");
                Some(Instant::now() + backoff.next().unwrap_or(MAX_BACKOFF))
            }
        }
    }

    /// The Secrets as stored, their sealed values opened.
    async fn read(&self) -> Result<Read<'_>, ReadError> {
        let tls = match self.tls.read().await? {
            Some(stored) => Some(self.open(&self.tls, self.tls_sealed, stored)?),
            None => None,
        };
        let ca = match &self.ca {
            Some((secret, rotation)) => {
                let stored = match secret.read().await? {
                    Some(stored) => Some(self.open(secret, Sealed::All, stored)?),
                    None => None,
                };
                Some((secret, rotation, stored))
            }
            None => None,
        };
        Ok(Read { tls, ca })
    }

    fn open(
        &self,
        secret: &FencedSecret,
        which: Sealed,
        stored: Stored,
    ) -> Result<Opened, tls_seal::Error> {
        sealed::open(
            &*self.seal,
            secret.namespace(),
            secret.name(),
            which,
            stored,
        )
    }

    /// This replica can open what is stored: it campaigns.
    fn may_lead(&self) {
        if self.candidacy.open() {
            tracing::info!(secret = %self.tls.id(), "the shared store's state opens again; this replica may lead");
        }
    }

    /// What is stored cannot be opened: reported (once per reason), and this replica stops
    /// campaigning (a leader steps down and gives up the writer).
    fn refuse(&self, err: tls_seal::Error) {
        if self.candidacy.refuse(err.to_string()) {
            self.report(Report::Sealed(err));
        }
    }

    /// The changes of `secret`, the first event being its state as listed.
    fn watch(&self, secret: &FencedSecret) -> BoxStream<'static, ()> {
        watcher::watch_object(
            crate::secret::api(self.client.clone(), &self.namespace),
            secret.name(),
        )
        .default_backoff()
        .map(|_| ())
        .boxed()
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
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut keys = KeyCheck::new(&*self.seal);
        loop {
            let report = match self.step(lease_round, &mut fence).await {
                Ok(next) => {
                    backoff.reset();
                    self.stats.send_modify(|s| s.checks += 1);
                    Ok(next)
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
                Err(Step::Api(err)) => Err(Report::Api(err)),
                Err(Step::Plan(PlanError::CorruptCa(reason))) => Err(Report::CorruptCa {
                    secret: self.ca.as_ref().map(|(s, _)| s.id()).unwrap_or_default(),
                    reason,
                }),
                Err(Step::Plan(PlanError::Generate(err))) => Err(Report::Generate(err)),
                Err(Step::Sealed(err)) => {
                    // Nothing is written over what cannot be opened: this replica steps down
                    // (the lock releases the Lease) until it can open it.
                    self.refuse(err);
                    return;
                }
            };
            let next = report.unwrap_or_else(|report| {
                self.report(report);
                let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                tls_source::clock::saturating_add(self.clock().now(), wait)
            });
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    changed = leadership.changed() => {
                        let lead = leadership.borrow().clone();
                        if changed.is_err() || !lead.leading || lead.round != lease_round {
                            return;
                        }
                        break;
                    }
                    () = until(self.clock(), next) => break,
                    // Someone else changed or deleted a Secret: check again.
                    _ = changes.next() => break,
                    // A new key set: what a key that no longer seals sealed is sealed again.
                    _ = keys.tick() => {
                        if keys.changed(&*self.seal) {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Changes of the TLS Secret and the CA Secret, for the leader to check again.
    fn changes(&self) -> BoxStream<'static, ()> {
        let streams = self.watched(true);
        // The first event of each is the state as listed: skipped, the first step reads it.
        let listed = streams.len();
        futures::stream::select_all(streams).skip(listed).boxed()
    }

    /// One check: the fence for this round, the CA (in CA mode), the leaf; writes what must
    /// change. Returns when to check again.
    async fn step(&self, lease_round: u64, fence: &mut Option<Fence>) -> Result<SystemTime, Step> {
        self.seal.reload();
        let Read { tls, ca } = self.read().await?;
        let fence = fence.get_or_insert_with(|| {
            let stored = tls
                .iter()
                .chain(ca.iter().filter_map(|(_, _, s)| s.as_ref()))
                .filter_map(|s| s.stored.fence.as_ref());
            plan::fence(lease_round, &self.identity, stored)
        });
        let now = self.clock().now();
        let (generator, served_ca, ca_next) = match ca {
            Some((secret, rotation, stored)) => {
                let (generator, served, next) =
                    self.ca_step(secret, rotation, stored, fence, now).await?;
                (generator, Some(served), Some(next))
            }
            None => (self.generator.clone(), None, None),
        };
        let leaf = fleet::leaf(&generator, tls.as_ref().map(|t| &t.stored.data), served_ca)?;
        if let Some(unfit) = &leaf.generated {
            self.stats.send_modify(|s| s.generated_leaves += 1);
            self.log_unfit(unfit.as_ref());
        }
        self.write(
            &self.tls,
            self.tls_sealed,
            tls.as_ref(),
            fence,
            leaf.content,
        )
        .await?;
        Ok(fleet::next_check(now, ca_next, leaf.renew_after))
    }

    /// The CA Secret: planned, written, logged. Returns the generator signing with the CA, the
    /// `ca.crt` to serve, and when to look at the CA again.
    async fn ca_step(
        &self,
        secret: &FencedSecret,
        rotation: &CaRotation,
        stored: Option<Opened>,
        fence: &Fence,
        now: SystemTime,
    ) -> Result<(SelfSigned, String, SystemTime), Step> {
        let read = match &stored {
            None => StoredCa::Missing,
            Some(opened) => match CaState::read(
                &opened.stored.data,
                &opened.stored.annotations,
                rotation,
                now,
            ) {
                Ok(state) => StoredCa::Read(state),
                Err(reason) => StoredCa::Unreadable(reason),
            },
        };
        let ca = fleet::ca(read, rotation, self.ca_overlap, now)?;
        for change in &ca.changes {
            if change.generated() {
                self.stats.send_modify(|s| s.generated_cas += 1);
            }
            let id = secret.id();
            match change {
                CaChange::Generated => {
                    tracing::info!(secret = %id, "generated the shared CA");
                }
                CaChange::ReplacedCorrupt { reason } => {
                    tracing::warn!(secret = %id, %reason, "replacing the corrupt CA, as configured: clients that pinned it must trust the new one");
                }
                CaChange::Switched => {
                    tracing::info!(secret = %id, "leaves are now signed by the renewed CA");
                }
                CaChange::Announced { switch_after } => {
                    tracing::info!(secret = %id, switch_after = %Rfc3339(*switch_after), "the CA is due for renewal: announcing the next CA in ca.crt");
                }
                CaChange::ReplacedUnusable { reason } => {
                    tracing::warn!(secret = %id, %reason, "the CA cannot sign any more; replacing it without an overlap");
                }
            }
        }
        self.write(
            secret,
            Sealed::All,
            stored.as_ref(),
            fence,
            ca.state.write(),
        )
        .await?;
        let generator = rotation.signer(&ca.state.signing)?;
        Ok((generator, ca.state.served(), ca.next_check))
    }

    /// A fenced write of `content` (its `which` values sealed), unless the Secret already holds
    /// it under this fence and nothing of it wants sealing again.
    async fn write(
        &self,
        secret: &FencedSecret,
        which: Sealed,
        stored: Option<&Opened>,
        fence: &Fence,
        content: Content,
    ) -> Result<(), Step> {
        let reseal = stored.is_some_and(|s| s.reseal);
        if !reseal && plan::unchanged(stored.map(|s| &s.stored), fence, &content) {
            return Ok(());
        }
        if reseal {
            let key = self.seal.key_ids().first().map(ToString::to_string);
            tracing::info!(secret = %secret.id(), key = ?key, "sealing the stored state again with the sealing key");
        }
        let (data, annotations) = sealed::seal(
            &*self.seal,
            secret.namespace(),
            secret.name(),
            which,
            content,
        )
        .map_err(Step::Sealed)?;
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

    /// Why the leaf was generated: `None`, there was none.
    fn log_unfit(&self, unfit: Option<&Unfit>) {
        match unfit {
            Some(unfit) if unfit.is_broken() => {
                tracing::warn!(secret = %self.tls.id(), reason = %unfit, "the shared leaf cannot be used; generating a new one");
            }
            Some(unfit) => {
                tracing::info!(secret = %self.tls.id(), reason = %unfit, "renewing the shared leaf");
            }
            None => tracing::info!(secret = %self.tls.id(), "generating the shared leaf"),
        }
    }
}

/// Sleeps until `at`, forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Returns once `clock` reaches `at`, looking at it at least every [`MAX_NAP`] (so a suspend or
/// a clock step delays a renewal by at most that).
async fn until(clock: &dyn Clock, at: SystemTime) {
    tls_source::clock::sleep_until(clock, at, MAX_NAP).await;
}
