//! The shared store's writer: while this replica holds the Lease, it reads the Secrets, asks the
//! plan (`plan.rs`) what they must hold, and writes that through fenced compare-and-swap; it
//! counts, logs and reports what happened. One clock throughout: the generator's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::Client;
use kube::runtime::watcher;
use tls_selfsigned::{CaRotation, Clock, SelfSigned, Unfit};
use tls_source::Backoff;
use tls_source::clock::Rfc3339;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::WriterStats;
use super::plan::{self, CaChange, PlanError, StoredCa};
use super::state::{CaState, Content};
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
}

/// Why the writer stopped leading a round, or failed a step.
enum Step {
    /// A later round has written: this replica is deposed.
    Refused(Fence),
    /// The API failed; retried with backoff.
    Api(kube::Error),
    /// A plan could not be made (a corrupt CA, a generation that failed); retried with backoff.
    Plan(PlanError),
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
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
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
            };
            let next = report.unwrap_or_else(|report| {
                self.report(report);
                let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                tls_source::clock::saturating_add(self.clock().now(), wait)
            });
            tokio::select! {
                () = token.cancelled() => return,
                changed = leadership.changed() => {
                    let lead = leadership.borrow().clone();
                    if changed.is_err() || !lead.leading || lead.round != lease_round {
                        return;
                    }
                }
                () = until(self.clock(), next) => {}
                // Someone else changed or deleted a Secret: check again.
                _ = changes.next() => {}
            }
        }
    }

    /// Changes of the TLS Secret and the CA Secret, for the leader to check again.
    fn changes(&self) -> BoxStream<'static, ()> {
        let watch = |secret: &FencedSecret| {
            watcher::watch_object(
                crate::secret::api(self.client.clone(), &self.namespace),
                secret.name(),
            )
            .map(|_| ())
            .boxed()
        };
        let mut streams = vec![watch(&self.tls)];
        if let Some((secret, _)) = &self.ca {
            streams.push(watch(secret));
        }
        // The first event of each is the state as listed: skipped, the first step reads it.
        let listed = streams.len();
        futures::stream::select_all(streams).skip(listed).boxed()
    }

    /// One check: the fence for this round, the CA (in CA mode), the leaf; writes what must
    /// change. Returns when to check again.
    async fn step(&self, lease_round: u64, fence: &mut Option<Fence>) -> Result<SystemTime, Step> {
        let tls = self.tls.read().await?;
        let ca = match &self.ca {
            Some((secret, rotation)) => Some((secret, rotation, secret.read().await?)),
            None => None,
        };
        let fence = fence.get_or_insert_with(|| {
            let stored = tls
                .iter()
                .chain(ca.iter().filter_map(|(_, _, s)| s.as_ref()))
                .filter_map(|s| s.fence.as_ref());
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
        let leaf = plan::leaf(&generator, tls.as_ref(), served_ca)?;
        if let Some(unfit) = &leaf.generated {
            self.stats.send_modify(|s| s.generated_leaves += 1);
            self.log_unfit(unfit.as_ref());
        }
        self.write(&self.tls, tls.as_ref(), fence, leaf.content)
            .await?;
        Ok(plan::next_check(now, ca_next, leaf.renew_after))
    }

    /// The CA Secret: planned, written, logged. Returns the generator signing with the CA, the
    /// `ca.crt` to serve, and when to look at the CA again.
    async fn ca_step(
        &self,
        secret: &FencedSecret,
        rotation: &CaRotation,
        stored: Option<Stored>,
        fence: &Fence,
        now: SystemTime,
    ) -> Result<(SelfSigned, String, SystemTime), Step> {
        let read = match &stored {
            None => StoredCa::Missing,
            Some(stored) => match CaState::read(stored, rotation, now) {
                Ok(state) => StoredCa::Read(state),
                Err(reason) => StoredCa::Unreadable(reason),
            },
        };
        let ca = plan::ca(read, rotation, self.ca_overlap, now)?;
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
        self.write(secret, stored.as_ref(), fence, ca.state.write())
            .await?;
        let generator = rotation.signer(&ca.state.signing)?;
        Ok((generator, ca.state.served(), ca.next_check))
    }

    /// A fenced write of `content`, unless the Secret already holds it under this fence.
    async fn write(
        &self,
        secret: &FencedSecret,
        stored: Option<&Stored>,
        fence: &Fence,
        content: Content,
    ) -> Result<(), Step> {
        if plan::unchanged(stored, fence, &content) {
            return Ok(());
        }
        let (data, annotations) = content;
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

/// Returns once `clock` reaches `at`, looking at it at least every [`MAX_NAP`] (so a suspend or
/// a clock step delays a renewal by at most that).
async fn until(clock: &dyn Clock, at: SystemTime) {
    while let Ok(remaining) = at.duration_since(clock.now()) {
        if remaining.is_zero() {
            return;
        }
        tokio::time::sleep(remaining.min(MAX_NAP)).await;
    }
}
