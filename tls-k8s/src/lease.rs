//! [`LeaseLock`]: one leader among replicas, elected by a `coordination.k8s.io/v1` Lease the way
//! client-go's leader election does it, with the round (`leaseTransitions`) as a fencing token.

use std::fmt;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The default lease duration: 15 s (client-go's).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// The default renew deadline: 10 s (client-go's).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// The default retry period: 2 s (client-go's).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Who leads, as this replica last saw it: the fence its writes carry.
///
/// With the `serde` feature it serializes as `serve`'s status JSON shows it:
/// `{"holder": "web-0" | null, "round": 3, "leading": true}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Leadership {
    /// The Lease's holder (`holderIdentity`), if any.
    pub holder: Option<String>,
    /// The round: the Lease's `leaseTransitions`, raised on every change of holder. A write
    /// fenced by a round is refused once a later round exists.
    pub round: u64,
    /// Whether this replica is the holder and renewed within the renew deadline.
    pub leading: bool,
}

/// One leader among replicas, elected by a Lease, following client-go's algorithm:
///
/// - The Lease is created if missing. Another holder's lease counts as expired when the Lease
///   has not changed for `leaseDurationSeconds` **as observed on this process's monotonic
///   clock**: wall clocks of different machines are never compared.
/// - Taking over and renewing are a replace carrying the observed `resourceVersion` (the API
///   server's compare-and-swap): a 409 means another replica won, and nothing is assumed.
///   `leaseTransitions` is raised on every change of holder: it is the round.
/// - The leader renews every retry period and steps down (says it no longer leads) when it has
///   not renewed within the renew deadline, before its lease can expire for the others. An
///   attempt that hangs (a partition) is abandoned at that deadline.
/// - Followers watch the Lease (one watch, no periodic requests) and try to take over only
///   when it has been still for a lease duration.
///
/// Client-go says its leader election is not a fencing mechanism; the round is: writes that
/// carry it are refused once a later round exists (see the crate docs).
///
/// Needs `get`, `list`, `watch`, `create` and `update` on the Lease.
#[must_use = "a lease lock does nothing until spawned"]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    release_on_cancel: bool,
    candidate: Option<watch::Receiver<bool>>,
}

/// The longest a stopping leader waits to release its lease.
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

impl fmt::Debug for LeaseLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseLock")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease_duration", &self.lease_duration)
            .field("renew_deadline", &self.renew_deadline)
            .field("retry_period", &self.retry_period)
            .field("release_on_cancel", &self.release_on_cancel)
            .field("candidate", &self.candidate.as_ref().map(|c| *c.borrow()))
            .finish_non_exhaustive()
    }
}

/// The running lock: its leadership, and its end.
#[derive(Debug)]
pub struct LeaseHandle {
    leadership: watch::Receiver<Leadership>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseLock {
    /// A lock on the Lease `namespace/name` for this replica, `identity` (e.g. the pod name).
    pub fn new(
        client: Client,
        namespace: &str,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            release_on_cancel: true,
            candidate: None,
        }
    }

    /// Campaigns only while `candidate` holds `true`: while it is `false` this replica never
    /// takes the lease, and a leader that sees it turn `false` steps down at once and releases
    /// the lease (as on cancel), so another replica leads within a retry period. For a replica
    /// that could not do a leader's work (the shared store's state it cannot open). Default:
    /// always a candidate.
    pub fn candidate(mut self, candidate: watch::Receiver<bool>) -> Self {
        self.candidate = Some(candidate);
        self
    }

    /// Whether a leader stopped by its token releases the lease (client-go's
    /// `ReleaseOnCancel`), so a follower leads within one retry period rather than after a
    /// lease duration. Default: on. A leader that is killed, or cut off from the API, cannot
    /// release: the others take over when its lease expires.
    pub fn release_on_cancel(mut self, release: bool) -> Self {
        self.release_on_cancel = release;
        self
    }

    /// The lease duration, the renew deadline and the retry period (defaults 15 s, 10 s,
    /// 2 s). The renew deadline is kept below the lease duration and above the retry period.
    pub fn timing(mut self, lease: Duration, renew_deadline: Duration, retry: Duration) -> Self {
        self.lease_duration = lease.max(Duration::from_millis(10));
        self.retry_period = retry.max(Duration::from_millis(1));
        self.renew_deadline = renew_deadline
            .min(self.lease_duration.saturating_sub(Duration::from_millis(1)))
            .max(self.retry_period);
        self
    }

    /// Runs the election until `token` is cancelled (a leader then stops renewing and releases
    /// its lease, see [`release_on_cancel`](Self::release_on_cancel)).
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn(self, token: CancellationToken) -> LeaseHandle {
        let (tx, rx) = watch::channel(Leadership::default());
        let task = tokio::spawn(self.run(tx, token.clone()));
        LeaseHandle {
            leadership: rx,
            token,
            task,
        }
    }

    async fn run(mut self, tx: watch::Sender<Leadership>, token: CancellationToken) {
        let mut candidate = self.candidate.take();
        let mut election = Election {
            observed: None,
            last_renew: None,
            written: None,
        };
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut changes = watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .boxed();
        let mut next_try = Instant::now();
        loop {
            if let Some(candidate) = candidate.as_mut().filter(|c| !*c.borrow()) {
                // Not a candidate: step down and release, then only follow the Lease.
                if tx.borrow().leading || election.written.is_some() {
                    tracing::info!(lease = %self.name, identity = %self.identity, "no longer a candidate; stepping down");
                    election.last_renew = None;
                    self.publish_leading(&tx, &election, false);
                    if let Some(mine) = election.written.take() {
                        self.release_bounded(mine).await;
                    }
                }
                tokio::select! {
                    () = token.cancelled() => break,
                    changed = candidate.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        next_try = Instant::now();
                    }
                    event = changes.next() => {
                        if let Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) = event
                            && lease.metadata.name.as_deref() == Some(self.name.as_str())
                        {
                            election.observe(&lease);
                            self.publish(&tx, &election);
                        }
                    }
                }
                continue;
            }
            let leading = tx.borrow().leading;
            // A follower tries when the lease can have expired; a leader at every retry.
            let wake = if leading {
                next_try
            } else {
                election
                    .observed
                    .as_ref()
                    .filter(|o| o.holder.as_deref().is_some_and(|h| h != self.identity))
                    .map_or(next_try, |o| later(o.at, self.lease_duration).max(next_try))
            };
            let no_longer_candidate = async {
                match candidate.as_mut() {
                    Some(candidate) => {
                        let _ = candidate.wait_for(|c| !*c).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = token.cancelled() => break,
                () = no_longer_candidate => continue,
                () = tokio::time::sleep_until(wake) => {}
                // Followers learn of renewals and take-overs from the watch, not by polling.
                event = changes.next() => {
                    if let Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) = event {
                        // Only our Lease: an API that ignores the field selector sends every
                        // Lease of the namespace, and another application's must never drive
                        // a take-over.
                        if lease.metadata.name.as_deref() != Some(self.name.as_str()) {
                            tracing::debug!(lease = %self.name, other = ?lease.metadata.name, "ignoring another Lease the API sent");
                            continue;
                        }
                        election.observe(&lease);
                        self.publish(&tx, &election);
                    }
                    continue;
                }
            }
            next_try = later(Instant::now(), self.retry_period);
            // An attempt is bounded: a leader's by its renew deadline (a partition that hangs
            // its requests must not keep it "leading"), a follower's by one renew deadline.
            let budget = match election.last_renew {
                Some(at) if leading => {
                    later(at, self.renew_deadline).saturating_duration_since(Instant::now())
                }
                _ => self.renew_deadline,
            };
            let attempt = tokio::time::timeout(budget, self.try_acquire_or_renew(&mut election));
            let acquired = tokio::select! {
                () = token.cancelled() => break,
                done = attempt => done.unwrap_or_else(|_| {
                    tracing::debug!(lease = %self.name, "reading or renewing the lease timed out");
                    false
                }),
            };
            if acquired {
                election.last_renew = Some(Instant::now());
            }
            let leading_now = election
                .last_renew
                .is_some_and(|at| at.elapsed() < self.renew_deadline)
                && election.holder_is(&self.identity);
            if leading && !leading_now {
                tracing::warn!(lease = %self.name, identity = %self.identity, "could not renew the lease within the renew deadline; stepping down");
                election.last_renew = None;
            }
            self.publish_leading(&tx, &election, leading_now);
        }
        // Not leading from here on: whatever follows this replica writes nothing.
        tx.send_modify(|l| {
            l.leading = false;
            crate::metrics::leadership(&self.name, l.leading, l.round);
        });
        if self.release_on_cancel
            && let Some(mine) = election.written.take()
        {
            self.release_bounded(mine).await;
        }
    }

    /// [`release`](Self::release), bounded: a stop must not hang on an API that does not
    /// answer.
    async fn release_bounded(&self, mine: Lease) {
        let budget = self.renew_deadline.min(RELEASE_BUDGET);
        if tokio::time::timeout(budget, self.release(mine))
            .await
            .is_err()
        {
            tracing::debug!(lease = %self.name, "releasing the lease timed out; it expires for the others");
        }
    }

    /// Gives up the lease (client-go's `ReleaseOnCancel`): no holder, a one-second duration,
    /// written with a compare-and-swap on the Lease this replica last wrote, so a follower
    /// takes over at its next retry instead of after a lease duration. If anything changed
    /// since (another replica took over), nothing is written.
    async fn release(&self, mine: Lease) {
        let Some(mut spec) = mine.spec.clone() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        let released = Lease {
            metadata: mine.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.name, identity = %self.identity, "lease released");
            }
            Err(err) => {
                tracing::debug!(lease = %self.name, error = %err, "releasing the lease failed; it expires for the others");
            }
        }
    }

    fn publish(&self, tx: &watch::Sender<Leadership>, election: &Election) {
        let leading = tx.borrow().leading && election.holder_is(&self.identity);
        self.publish_leading(tx, election, leading);
    }

    fn publish_leading(&self, tx: &watch::Sender<Leadership>, election: &Election, leading: bool) {
        let Some(observed) = &election.observed else {
            return;
        };
        let now = Leadership {
            holder: observed.holder.clone(),
            round: observed.transitions,
            leading,
        };
        tx.send_if_modified(|l| {
            if *l == now {
                false
            } else {
                if now.leading != l.leading {
                    tracing::info!(lease = %self.name, identity = %self.identity, round = now.round, leading = now.leading, "leadership changed");
                }
                crate::metrics::leadership(&self.name, now.leading, now.round);
                *l = now;
                true
            }
        });
    }

    /// One step of client-go's `tryAcquireOrRenew`: whether this replica holds the lease now.
    async fn try_acquire_or_renew(&self, election: &mut Election) -> bool {
        // A holder renews from the Lease its last write returned, without reading it first:
        // if anything changed since, the replace fails its compare-and-swap (409) and the
        // usual read-then-decide follows. Half the requests of a leader at steady state.
        if let Some(renewed) = election
            .written
            .take()
            .and_then(|mine| self.renewal_of(&mine))
        {
            match self
                .api
                .replace(&self.name, &PostParams::default(), &renewed)
                .await
            {
                Ok(replaced) => {
                    election.observe(&replaced);
                    election.written = Some(replaced);
                    return true;
                }
                Err(err) => {
                    tracing::debug!(lease = %self.name, error = %err, "renewing from the last write failed; reading the lease");
                }
            }
        }
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let lease = match self.api.get_opt(&self.name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds(self.lease_duration)),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        election.observe(&created);
                        election.written = Some(created);
                        true
                    }
                    Err(err) => {
                        tracing::debug!(lease = %self.name, error = %err, "creating the lease failed (another replica may have)");
                        false
                    }
                };
            }
            Err(err) => {
                tracing::debug!(lease = %self.name, error = %err, "reading the lease failed");
                return false;
            }
        };
        election.observe(&lease);
        let Some(observed) = election.observed.as_ref() else {
            return false;
        };
        let mine = observed.holder.as_deref() == Some(self.identity.as_str());
        let free = observed.holder.as_deref().is_none_or(str::is_empty);
        if !mine && !free && observed.at.elapsed() < self.lease_duration {
            return false; // Held by another, and not expired as observed here.
        }
        let mut spec = lease.spec.clone().unwrap_or_default();
        if !mine {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(seconds(self.lease_duration));
        spec.renew_time = Some(now);
        let replacement = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec),
        };
        // The replace carries the resourceVersion read: the API server's compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &replacement)
            .await
        {
            Ok(replaced) => {
                election.observe(&replaced);
                election.written = Some(replaced);
                true
            }
            Err(err) => {
                tracing::debug!(lease = %self.name, error = %err, "taking or renewing the lease failed (another replica may have won)");
                false
            }
        }
    }
}

impl LeaseLock {
    /// `mine` (a Lease this replica wrote) with its renew time set to now, if this replica
    /// still holds it.
    fn renewal_of(&self, mine: &Lease) -> Option<Lease> {
        let mut spec = mine.spec.clone()?;
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return None;
        }
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(seconds(self.lease_duration));
        Some(Lease {
            metadata: mine.metadata.clone(),
            spec: Some(spec),
        })
    }
}

impl LeaseHandle {
    /// Who leads, as this replica sees it; updated on every change.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Stops the election and waits for its task (a leader stops renewing and releases its
    /// lease, at most 5 s or the renew deadline).
    pub async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }
}

/// What this replica knows of the Lease: the record last seen and when it was first seen so
/// (on the monotonic clock), and when it last renewed.
struct Election {
    observed: Option<Observed>,
    last_renew: Option<Instant>,
    /// The Lease as this replica's last successful write returned it.
    written: Option<Lease>,
}

struct Observed {
    resource_version: Option<String>,
    holder: Option<String>,
    transitions: u64,
    at: Instant,
}

impl Election {
    /// Records the Lease; the observation time moves only when the record changed.
    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let resource_version = lease.metadata.resource_version.clone();
        if self
            .observed
            .as_ref()
            .is_some_and(|o| o.resource_version == resource_version)
        {
            return;
        }
        self.observed = Some(Observed {
            resource_version,
            holder: spec.holder_identity,
            transitions: u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0),
            at: Instant::now(),
        });
    }

    fn holder_is(&self, identity: &str) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.holder.as_deref() == Some(identity))
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// `at + d`, or about thirty years from `at` when that cannot be represented: durations given
/// to the builder (`Duration::MAX` included) never panic in instant arithmetic.
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(at)
}
