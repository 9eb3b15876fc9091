//! [`WriterLease`]: one writer among replicas, elected on an etcd lease, its round the holder
//! key's `create_revision` (etcd's own fencing token: no counter to read and write).

use std::fmt;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Fence;
use crate::{Error, Etcd};

/// The default lease TTL: 15 s (as a Kubernetes Lease's default duration).
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// The default retry period: 2 s (keep-alives while leading, campaigns after a failure).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// The shortest and the longest lease TTL: etcd leases are whole seconds, and a writer that
/// stops without releasing its lease is replaced after at most a day (a longer TTL would only
/// delay that, and overflow timers for a TTL taken from outside input).
const MIN_TTL: Duration = Duration::from_secs(2);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The shortest retry period.
const MIN_RETRY: Duration = Duration::from_millis(10);
/// The longest a stopping writer waits to revoke its lease.
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// Who writes, as this replica last saw it: the fence its writes carry.
///
/// With the `serde` feature it serializes as `serve`'s status JSON shows it (as a Kubernetes
/// fleet's): `{"holder": "web-0" | null, "round": 3, "leading": true}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Leadership {
    /// The holder's identity, if any.
    pub holder: Option<String>,
    /// The round: the holder key's `create_revision`, new at every change of holder (and when
    /// the same replica takes the key again). A write fenced by a round is refused once the key
    /// was taken again.
    pub round: u64,
    /// Whether this replica holds the key and its lease was kept alive within the renew
    /// deadline.
    pub leading: bool,
}

impl Leadership {
    /// The fence of this replica's writes, while it leads.
    pub fn fence(&self) -> Option<Fence> {
        self.leading.then_some(Fence { round: self.round })
    }
}

/// One writer among replicas, elected on etcd:
///
/// - Each candidate grants itself a lease of [`ttl`](Self::ttl) and puts the holder key
///   `PREFIX/fleets/NAME/writer` with it in a transaction that requires the key absent
///   (`create_revision == 0`): one wins. Its round is the key's `create_revision`.
/// - The holder keeps its lease alive every [`retry_period`](Self::retry_period) and steps
///   down by itself (says it no longer leads, revokes its lease) when no keep-alive succeeded
///   within the renew deadline (the TTL less one retry period): before etcd lets the key expire
///   for the others. A holder cut off from a quorum writes nothing.
/// - The others watch the key (one watch, no periodic requests) and campaign when it is
///   deleted: released by a holder that stops (revoked lease), or expired with its lease.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_etcd::Etcd;
/// use tls_etcd::store::WriterLease;
///
/// let etcd = Etcd::builder(["127.0.0.1:2379"]).build()?;
/// let token = tokio_util::sync::CancellationToken::new();
/// let lease = WriterLease::new(etcd, "/tls-rotation/", "web", "web-0").spawn(&token);
/// let mut leadership = lease.leadership();
/// leadership.wait_for(|l| l.leading).await?;
/// # Ok(()) }
/// ```
#[must_use = "a writer lease does nothing until spawned"]
pub struct WriterLease {
    etcd: Etcd,
    key: String,
    identity: String,
    ttl: Duration,
    retry_period: Duration,
    release_on_cancel: bool,
    candidate: Option<watch::Receiver<bool>>,
}

impl fmt::Debug for WriterLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterLease")
            .field("key", &self.key)
            .field("identity", &self.identity)
            .field("ttl", &self.ttl)
            .field("retry_period", &self.retry_period)
            .field("release_on_cancel", &self.release_on_cancel)
            .finish_non_exhaustive()
    }
}

/// The running election: its leadership, and its end.
#[derive(Debug)]
pub struct LeaseHandle {
    leadership: watch::Receiver<Leadership>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl WriterLease {
    /// The election of fleet `name` under `prefix` (the holder key is
    /// `PREFIX/fleets/NAME/writer`), for this replica, `identity`.
    pub fn new(etcd: Etcd, prefix: &str, name: &str, identity: impl Into<String>) -> Self {
        let prefix = prefix.trim_end_matches('/');
        Self {
            etcd,
            key: format!("{prefix}/fleets/{name}/writer"),
            identity: identity.into(),
            ttl: DEFAULT_TTL,
            retry_period: DEFAULT_RETRY_PERIOD,
            release_on_cancel: true,
            candidate: None,
        }
    }

    /// Campaigns only while `candidate` holds `true`: while it is `false` this replica never
    /// takes the key, and a holder that sees it turn `false` steps down at once and revokes its
    /// lease, so another replica leads within a retry period. For a replica that could not do
    /// a writer's work (state it cannot open). Default: always a candidate.
    pub fn candidate(mut self, candidate: watch::Receiver<bool>) -> Self {
        self.candidate = Some(candidate);
        self
    }

    /// The lease's time to live, in whole seconds, from 2 s to a day (etcd's own minimum may
    /// be higher). Default: 15 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Duration::from_secs(ttl.clamp(MIN_TTL, MAX_TTL).as_secs());
        self
    }

    /// How often the holder keeps its lease alive. Default: 2 s. At most a third of the TTL.
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period.clamp(MIN_RETRY, MAX_TTL);
        self
    }

    /// Whether a holder stopped by its token revokes its lease, so that another replica leads
    /// at once rather than after the TTL. Default: on. A holder that is killed cannot: the
    /// others take over when its lease expires.
    pub fn release_on_cancel(mut self, release: bool) -> Self {
        self.release_on_cancel = release;
        self
    }

    /// The holder key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Runs the election until `token` is cancelled (or the handle dropped and stopped).
    pub fn spawn(self, token: &CancellationToken) -> LeaseHandle {
        let token = token.child_token();
        let (tx, rx) = watch::channel(Leadership::default());
        let task = tokio::spawn(run(self, tx, token.clone()));
        LeaseHandle {
            leadership: rx,
            token,
            task,
        }
    }

    fn retry(&self) -> Duration {
        self.retry_period.min(self.ttl / 3).max(MIN_RETRY)
    }

    /// The holder steps down when no keep-alive succeeded for this long: the TTL less one retry
    /// period, so that it stops before etcd can let the key expire for the others.
    fn renew_deadline(&self) -> Duration {
        self.ttl.saturating_sub(self.retry())
    }
}

impl LeaseHandle {
    /// Who leads, as this replica last saw it.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Stops the election (a holder revokes its lease, unless told not to).
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// Waits until the election has stopped.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }

    /// Stops the task at once, as a killed process would: nothing is revoked.
    pub fn abort(&self) {
        self.task.abort();
    }
}

async fn run(mut lock: WriterLease, tx: watch::Sender<Leadership>, token: CancellationToken) {
    while !token.is_cancelled() {
        if let Some(candidate) = &mut lock.candidate {
            tokio::select! {
                () = token.cancelled() => break,
                ready = candidate.wait_for(|c| *c) => if ready.is_err() { break },
            }
        }
        // Not raced against the token: a holder told to stop revokes its lease on the way out.
        if let Err(err) = round(&lock, &tx, &token).await {
            tracing::debug!(key = %lock.key, error = %err, "etcd election: retrying");
            tx.send_if_modified(|l| std::mem::replace(&mut l.leading, false));
            tokio::select! {
                () = token.cancelled() => break,
                () = tokio::time::sleep(lock.retry()) => {}
            }
        }
    }
    tx.send_if_modified(|l| std::mem::replace(&mut l.leading, false));
}

/// One campaign: leads until it steps down or stops, or follows until the key goes.
async fn round(
    lock: &WriterLease,
    tx: &watch::Sender<Leadership>,
    token: &CancellationToken,
) -> Result<(), Error> {
    let request = |what: &str| {
        let what = format!("{what} ({})", lock.key);
        move |source| Error::Request { what, source }
    };
    let mut client = lock.etcd.connect().await?;
    let ttl = i64::try_from(lock.ttl.as_secs()).unwrap_or(i64::MAX);
    lock.etcd.count("lease_grant");
    let lease = client
        .lease_grant(ttl, None)
        .await
        .map_err(request("lease grant"))?
        .id();
    let take = Txn::new()
        .when([Compare::create_revision(
            lock.key.as_str(),
            CompareOp::Equal,
            0,
        )])
        .and_then([TxnOp::put(
            lock.key.as_str(),
            lock.identity.as_str(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(lock.key.as_str(), None)]);
    lock.etcd.count("txn");
    let taken = client.txn(take).await.map_err(request("campaign"))?;
    let revision = taken
        .header()
        .map_or(0, etcd_client::ResponseHeader::revision);
    if taken.succeeded() {
        let round = u64::try_from(revision).unwrap_or(0);
        tracing::info!(key = %lock.key, identity = %lock.identity, round, "leading: this replica writes");
        tx.send_replace(Leadership {
            holder: Some(lock.identity.clone()),
            round,
            leading: true,
        });
        crate::metrics::leadership(&lock.key, true, round);
        let outcome = lead(lock, &mut client, lease, revision, tx, token).await;
        tx.send_if_modified(|l| std::mem::replace(&mut l.leading, false));
        crate::metrics::leadership(&lock.key, false, round);
        // Revoked: the key goes with the lease, and a follower leads at once. Not when a
        // killed process stops (it cannot), nor when cancelled without release.
        if outcome.is_ok() && (!token.is_cancelled() || lock.release_on_cancel) {
            lock.etcd.count("lease_revoke");
            let _ = tokio::time::timeout(RELEASE_BUDGET, client.lease_revoke(lease)).await;
        }
        return outcome;
    }
    // Another holds it: the lease granted is not needed.
    lock.etcd.count("lease_revoke");
    let _ = client.lease_revoke(lease).await;
    let holder = taken.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        }),
        _ => None,
    });
    let Some((holder, created)) = holder else {
        return Ok(()); // gone meanwhile: campaign again
    };
    tx.send_replace(Leadership {
        holder: Some(holder),
        round: u64::try_from(created).unwrap_or(0),
        leading: false,
    });
    // Follow: one watch on the key, until it is deleted (released, or expired).
    lock.etcd.count("watch");
    let mut watch = client
        .watch_client()
        .watch(
            lock.key.as_str(),
            Some(WatchOptions::new().with_start_revision(revision.saturating_add(1))),
        )
        .await
        .map_err(request("watch"))?;
    loop {
        let message = tokio::select! {
            () = token.cancelled() => return Ok(()),
            message = watch.message() => message.map_err(request("watch"))?,
        };
        let Some(message) = message else {
            return Ok(());
        };
        if message.canceled() {
            return Ok(());
        }
        if message
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            return Ok(());
        }
    }
}

/// While leading: keep-alives every retry period; steps down at the renew deadline without
/// one, when etcd says the lease is gone, or when the key is no longer the one it created in
/// `round` (deleted by hand, say). `Ok` when stopped or stepped down.
async fn lead(
    lock: &WriterLease,
    client: &mut Client,
    lease: i64,
    round: i64,
    tx: &watch::Sender<Leadership>,
    token: &CancellationToken,
) -> Result<(), Error> {
    let mut last_ok = Instant::now();
    let deadline = lock.renew_deadline();
    let mut keeper = None;
    let mut candidate = lock.candidate.clone();
    // The key itself, watched from the round on: a holder whose key went does not lead.
    let mut own: Option<etcd_client::WatchStream> = None;
    let mut next_keep_alive = Instant::now() + lock.retry();
    loop {
        if own.is_none() {
            lock.etcd.count("watch");
            let options = WatchOptions::new().with_start_revision(round.saturating_add(1));
            own = client
                .watch_client()
                .watch(lock.key.as_str(), Some(options))
                .await
                .ok();
        }
        let key_gone = async {
            let Some(stream) = &mut own else {
                return std::future::pending().await;
            };
            match stream.message().await {
                Ok(Some(message)) => message.events().iter().any(|e| {
                    e.event_type() == EventType::Delete
                        || e.kv().is_some_and(|kv| kv.create_revision() != round)
                }),
                // Broken: opened again on the next turn.
                Ok(None) | Err(_) => {
                    own = None;
                    false
                }
            }
        };
        let no_longer = async {
            match &mut candidate {
                Some(candidate) => {
                    let _ = candidate.wait_for(|c| !*c).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            () = no_longer => {
                tracing::info!(key = %lock.key, "no longer a candidate: stepping down");
                return Ok(());
            }
            gone = key_gone => {
                if gone {
                    tracing::warn!(key = %lock.key, "the writer key was deleted or taken again: no longer leading");
                    tx.send_if_modified(|l| std::mem::replace(&mut l.leading, false));
                    return Ok(());
                }
                continue;
            }
            () = tokio::time::sleep_until(next_keep_alive) => {}
        }
        next_keep_alive = Instant::now() + lock.retry();
        let attempt = async {
            if keeper.is_none() {
                keeper = Some(client.lease_keep_alive(lease).await?);
            }
            let (keeper, stream) = keeper.as_mut().expect("just set");
            lock.etcd.count("keep_alive");
            keeper.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(lock.retry(), attempt).await {
            Ok(Ok(Some(response))) if response.ttl() > 0 => last_ok = Instant::now(),
            Ok(Ok(Some(_))) => {
                tracing::warn!(key = %lock.key, "the lease expired in etcd: no longer leading");
                return Ok(());
            }
            Ok(Ok(None) | Err(_)) | Err(_) => keeper = None, // a new stream next time
        }
        if last_ok.elapsed() >= deadline {
            tracing::warn!(key = %lock.key, deadline = ?deadline, "no keep-alive succeeded within the renew deadline: no longer leading");
            tx.send_if_modified(|l| std::mem::replace(&mut l.leading, false));
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> WriterLease {
        let etcd = Etcd::builder(["127.0.0.1:2379"]).build().unwrap();
        WriterLease::new(etcd, "/p/", "web", "a")
    }

    #[test]
    fn the_timing_is_bounded_whatever_it_is_given() {
        let huge = lease().ttl(Duration::MAX).retry_period(Duration::MAX);
        assert_eq!(huge.ttl, MAX_TTL);
        assert_eq!(huge.retry(), MAX_TTL / 3, "at most a third of the TTL");
        assert!(huge.renew_deadline() < huge.ttl);
        // The deadlines a holder arms do not overflow.
        let _ = Instant::now() + huge.retry() + huge.renew_deadline();
        let tiny = lease().ttl(Duration::ZERO).retry_period(Duration::ZERO);
        assert_eq!((tiny.ttl, tiny.retry()), (MIN_TTL, MIN_RETRY));
        assert_eq!(tiny.renew_deadline(), MIN_TTL - MIN_RETRY);
        let whole = lease().ttl(Duration::from_millis(5500));
        assert_eq!(
            whole.ttl,
            Duration::from_secs(5),
            "etcd leases are whole seconds"
        );
    }
}
