//! The fleet's writer on etcd: while this replica holds the writer key, it reads the fleet's
//! objects (opening what is sealed), asks `tls_selfsigned::fleet` what they must hold, and
//! writes what changed, the CA and the leaf in one fenced transaction; it counts, logs and
//! reports what happened. While it does not lead, it checks that it could open what is stored:
//! only then is it a candidate. One clock throughout: the generator's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use etcd_client::Client;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use tls_seal::Seal;
use tls_selfsigned::fleet::{
    self, CaChange, CaState, Candidacy, Content, KeyCheck, PlanError, StoredCa,
};
use tls_selfsigned::{CaRotation, Clock, SelfSigned, Unfit};
use tls_source::Backoff;
use tls_source::clock::Rfc3339;
use tokio::sync::{Mutex, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::WriterStats;
use crate::store::object::{self, Opened, Unreadable};
use crate::store::{Fence, FencedError, FencedKeys, Leadership, LeaseHandle};
use crate::watch::{Event, Range, Watch};
use crate::{Error, Etcd};

/// The longest the writer waits before looking at the clock again.
const MAX_NAP: Duration = Duration::from_secs(30);
/// The backoff after a failed check: from 1 s, doubling, up to a minute.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The values sealed in each object (with a seal key): the private keys.
pub(crate) const TLS_SEALED: &[&str] = &[fleet::TLS_KEY];
pub(crate) const CA_SEALED: &[&str] = &["ca.key", "next.key"];

pub(crate) struct Writer {
    pub(crate) etcd: Etcd,
    /// `PREFIX/fleets/NAME/`: the writer key, the leaf's and the CA's objects.
    pub(crate) fleet: String,
    pub(crate) tls_key: String,
    pub(crate) ca_key: String,
    pub(crate) generator: SelfSigned,
    pub(crate) rotation: Option<CaRotation>,
    pub(crate) ca_overlap: Duration,
    pub(crate) fenced: FencedKeys,
    pub(crate) seal: Arc<dyn Seal>,
    pub(crate) sealing: bool,
    pub(crate) client: Mutex<Option<Client>>,
    pub(crate) reports: mpsc::UnboundedSender<tls_source::Error>,
    pub(crate) stats: watch::Sender<WriterStats>,
    /// Whether this replica can open what is stored, and so campaigns.
    pub(crate) candidacy: Candidacy,
}

/// What a check found wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Report {
    #[error(transparent)]
    Etcd(#[from] Error),
    #[error(
        "the CA at {key} cannot be used and is not replaced (see replace_corrupt_ca): {reason}"
    )]
    CorruptCa { key: String, reason: String },
    #[error("generating failed: {0}")]
    Generate(#[from] tls_selfsigned::Error),
    #[error(
        "the stored state does not open with the seal key: {0}; this replica serves, writes nothing and does not lead"
    )]
    Sealed(tls_seal::Error),
}

/// Why a check ended without its writes.
enum Step {
    Report(Report),
    /// Another round holds the writer key.
    Refused,
    /// What is stored does not open.
    Sealed(tls_seal::Error),
}

impl From<Error> for Step {
    fn from(err: Error) -> Self {
        Self::Report(Report::Etcd(err))
    }
}

impl From<tls_selfsigned::Error> for Step {
    fn from(err: tls_selfsigned::Error) -> Self {
        Self::Report(Report::Generate(err))
    }
}

/// The fleet's objects as read: each absent, opened, or not readable (why).
struct Read {
    tls: Option<Result<Opened, String>>,
    ca: Option<Result<Opened, String>>,
}

/// Why the fleet's objects could not be read.
enum ReadError {
    Etcd(Error),
    /// A sealed value does not open: this replica writes nothing and does not lead.
    Sealed(tls_seal::Error),
}

impl From<ReadError> for Step {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Etcd(err) => err.into(),
            ReadError::Sealed(err) => Self::Sealed(err),
        }
    }
}

impl Writer {
    fn clock(&self) -> &dyn Clock {
        &**self.generator.clock()
    }

    fn report(&self, report: Report) {
        tracing::warn!(key = %self.tls_key, error = %report, "shared self-signed writer on etcd");
        let _ = self.reports.send(tls_source::Error::source(
            format!("shared self-signed etcd {}", self.tls_key),
            report,
        ));
    }

    pub(crate) async fn run(self: Arc<Self>, lease: LeaseHandle, token: CancellationToken) {
        let mut leadership = lease.leadership();
        if !self.sealing {
            self.may_lead();
        }
        let mut changes = self.changes();
        let mut keys = KeyCheck::new(&*self.seal);
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut retry: Option<Instant> = self.sealing.then(Instant::now);
        loop {
            let open = self.candidacy.is_open();
            enum Wake {
                Lead(u64),
                Probe,
                Nothing,
            }
            let wake = tokio::select! {
                () = token.cancelled() => break,
                lead = leadership.wait_for(|l| l.leading), if open => match lead {
                    Ok(lead) => Wake::Lead(lead.round),
                    Err(_) => break,
                },
                Some(()) = changes.next(), if self.sealing => Wake::Probe,
                () = sleep_until(retry) => Wake::Probe,
                () = keys.tick() => if keys.changed(&*self.seal) { Wake::Probe } else { Wake::Nothing },
            };
            match wake {
                Wake::Nothing => {}
                Wake::Probe => {
                    retry = None;
                    match self.read().await {
                        Ok(_) => {
                            backoff.reset();
                            self.may_lead();
                        }
                        Err(ReadError::Sealed(err)) => {
                            backoff.reset();
                            self.refuse(err);
                        }
                        Err(ReadError::Etcd(err)) => {
                            tracing::debug!(key = %self.tls_key, error = %err, "reading the fleet's state failed; retrying");
                            retry = Some(Instant::now() + backoff.next().unwrap_or(MAX_BACKOFF));
                        }
                    }
                }
                Wake::Lead(round) => {
                    self.lead(round, &mut leadership, &mut changes, &token)
                        .await;
                }
            }
        }
        lease.stop();
        lease.stopped().await;
    }

    /// Changes of the fleet's objects (the leaf's and the CA's), after the first list.
    fn changes(&self) -> BoxStream<'static, ()> {
        let (tls, ca) = (self.tls_key.clone(), self.ca_key.clone());
        let mut listed = false;
        Watch::new(self.etcd.clone(), Range::Prefix(self.fleet.clone()))
            .into_stream()
            .filter_map(move |event| {
                let changed = match event {
                    Event::Listed => {
                        let first = !listed;
                        listed = true;
                        !first
                    }
                    Event::Put { key, .. } | Event::Delete { key } => {
                        listed && (key == tls || key == ca)
                    }
                    Event::Listing | Event::Failed(_) => false,
                };
                futures::future::ready(changed.then_some(()))
            })
            .boxed()
    }

    async fn client(&self) -> Result<Client, Error> {
        let mut guard = self.client.lock().await;
        if let Some(client) = &*guard {
            return Ok(client.clone());
        }
        let client = self.etcd.connect().await?;
        *guard = Some(client.clone());
        Ok(client)
    }

    /// The leaf's and the CA's objects as stored, opened.
    async fn read(&self) -> Result<Read, ReadError> {
        let mut client = self.client().await.map_err(ReadError::Etcd)?;
        self.etcd.count("read");
        let response = client
            .get(
                self.fleet.as_str(),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await;
        let response = match response {
            Ok(response) => response,
            Err(source) => {
                *self.client.lock().await = None;
                return Err(ReadError::Etcd(Error::Request {
                    what: format!("read of {}", self.fleet),
                    source,
                }));
            }
        };
        let mut read = Read {
            tls: None,
            ca: None,
        };
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let (slot, sealed) = if key == self.tls_key {
                (&mut read.tls, TLS_SEALED)
            } else if key == self.ca_key {
                (&mut read.ca, CA_SEALED)
            } else {
                continue;
            };
            *slot = Some(
                match object::decode(&key, kv.value(), &*self.seal, sealed) {
                    Ok(opened) => Ok(opened),
                    Err(Unreadable::Malformed(reason)) => Err(reason),
                    Err(Unreadable::Sealed(err)) => return Err(ReadError::Sealed(err)),
                },
            );
        }
        Ok(read)
    }

    /// This replica can open what is stored: it campaigns.
    fn may_lead(&self) {
        if self.candidacy.open() {
            tracing::info!(key = %self.tls_key, "the fleet's state opens again; this replica may lead");
        }
    }

    /// What is stored cannot be opened: reported (once per reason), and this replica stops
    /// campaigning (a leader steps down and gives up the writer).
    fn refuse(&self, err: tls_seal::Error) {
        if self.candidacy.refuse(err.to_string()) {
            self.report(Report::Sealed(err));
        }
    }

    async fn lead(
        &self,
        round: u64,
        leadership: &mut watch::Receiver<Leadership>,
        changes: &mut BoxStream<'static, ()>,
        token: &CancellationToken,
    ) {
        let fence = Fence { round };
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut keys = KeyCheck::new(&*self.seal);
        loop {
            let next = match self.step(fence).await {
                Ok(next) => {
                    backoff.reset();
                    self.stats.send_modify(|s| s.checks += 1);
                    next
                }
                Err(Step::Refused) => {
                    // Deposed: wait for the election to say so.
                    let caught_up = leadership.wait_for(|l| !l.leading || l.round != round);
                    tokio::select! {
                        () = token.cancelled() => {}
                        _ = caught_up => {}
                    }
                    return;
                }
                Err(Step::Sealed(err)) => {
                    self.refuse(err);
                    return;
                }
                Err(Step::Report(report)) => {
                    self.report(report);
                    let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                    tls_source::clock::saturating_add(self.clock().now(), wait)
                }
            };
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    changed = leadership.changed() => {
                        let lead = leadership.borrow().clone();
                        if changed.is_err() || !lead.leading || lead.round != round {
                            return;
                        }
                    }
                    () = until(self.clock(), next) => break,
                    // Someone changed or deleted an object: check again.
                    Some(()) = changes.next() => break,
                    () = keys.tick() => if keys.changed(&*self.seal) { break },
                }
            }
        }
    }

    /// One check: the CA (in CA mode), the leaf; what must change written in one fenced
    /// transaction. Returns when to check again.
    async fn step(&self, fence: Fence) -> Result<SystemTime, Step> {
        self.seal.reload();
        let read = self.read().await?;
        let now = self.clock().now();
        let mut writes: Vec<(String, Vec<u8>)> = Vec::new();
        let (generator, served_ca, ca_next) = match &self.rotation {
            Some(rotation) => {
                let stored = match &read.ca {
                    None => StoredCa::Missing,
                    Some(Err(reason)) => StoredCa::Unreadable(reason.clone()),
                    Some(Ok(opened)) => {
                        match CaState::read(&opened.data, &opened.annotations, rotation, now) {
                            Ok(state) => StoredCa::Read(state),
                            Err(reason) => StoredCa::Unreadable(reason),
                        }
                    }
                };
                let plan = match fleet::ca(stored, rotation, self.ca_overlap, now) {
                    Ok(plan) => plan,
                    Err(PlanError::CorruptCa(reason)) => {
                        return Err(Step::Report(Report::CorruptCa {
                            key: self.ca_key.clone(),
                            reason,
                        }));
                    }
                    Err(PlanError::Generate(err)) => return Err(err.into()),
                };
                self.log_ca(&plan.changes);
                let content = plan.state.write();
                let stored = read.ca.as_ref().and_then(|r| r.as_ref().ok());
                if needs_write(stored, &content) {
                    writes.push((
                        self.ca_key.clone(),
                        self.encode(&self.ca_key, &content, CA_SEALED)?,
                    ));
                }
                let generator = rotation.signer(&plan.state.signing)?;
                (generator, Some(plan.state.served()), Some(plan.next_check))
            }
            None => (self.generator.clone(), None, None),
        };
        let stored_tls = match &read.tls {
            Some(Ok(opened)) => Some(opened),
            Some(Err(reason)) => {
                tracing::warn!(key = %self.tls_key, %reason, "the stored leaf is not readable; replacing it");
                None
            }
            None => None,
        };
        let leaf = fleet::leaf(&generator, stored_tls.map(|o| &o.data), served_ca)?;
        if let Some(unfit) = &leaf.generated {
            self.stats.send_modify(|s| s.generated_leaves += 1);
            self.log_unfit(unfit.as_ref());
        }
        if needs_write(stored_tls, &leaf.content) {
            writes.push((
                self.tls_key.clone(),
                self.encode(&self.tls_key, &leaf.content, TLS_SEALED)?,
            ));
        }
        if !writes.is_empty() {
            match self.fenced.put(fence, writes).await {
                Ok(_) => {
                    self.stats.send_modify(|s| {
                        s.accepted += 1;
                        s.round = Some(fence.round);
                    });
                    tracing::debug!(key = %self.tls_key, round = fence.round, "fenced write accepted");
                }
                Err(FencedError::Fenced { .. }) => {
                    self.stats.send_modify(|s| s.refused += 1);
                    return Err(Step::Refused);
                }
                Err(FencedError::Etcd(err)) => return Err(err.into()),
            }
        }
        Ok(fleet::next_check(now, ca_next, leaf.renew_after))
    }

    fn encode(&self, key: &str, content: &Content, sealed: &[&str]) -> Result<Vec<u8>, Step> {
        object::encode(key, &content.0, &content.1, &*self.seal, sealed).map_err(Step::Sealed)
    }

    fn log_ca(&self, changes: &[CaChange]) {
        for change in changes {
            if change.generated() {
                self.stats.send_modify(|s| s.generated_cas += 1);
            }
            let key = &self.ca_key;
            match change {
                CaChange::Generated => tracing::info!(%key, "generated the shared CA"),
                CaChange::ReplacedCorrupt { reason } => {
                    tracing::warn!(%key, %reason, "replacing the corrupt CA, as configured: clients that pinned it must trust the new one");
                }
                CaChange::Switched => {
                    tracing::info!(%key, "leaves are now signed by the renewed CA");
                }
                CaChange::Announced { switch_after } => {
                    tracing::info!(%key, switch_after = %Rfc3339(*switch_after), "the CA is due for renewal: announcing the next CA in ca.crt");
                }
                CaChange::ReplacedUnusable { reason } => {
                    tracing::warn!(%key, %reason, "the CA cannot sign any more; replacing it without an overlap");
                }
            }
        }
    }

    fn log_unfit(&self, unfit: Option<&Unfit>) {
        let key = &self.tls_key;
        match unfit {
            Some(unfit) if unfit.is_broken() => {
                tracing::warn!(%key, reason = %unfit, "the shared leaf cannot be used; generating a new one");
            }
            Some(unfit) => tracing::info!(%key, reason = %unfit, "renewing the shared leaf"),
            None => tracing::info!(%key, "generating the shared leaf"),
        }
    }
}

/// Whether `content` differs from what is stored, or what is stored wants sealing again.
fn needs_write(stored: Option<&Opened>, content: &Content) -> bool {
    let (data, annotations) = content;
    !stored.is_some_and(|s| {
        !s.reseal
            && &s.data == data
            && annotations
                .iter()
                .all(|(k, v)| s.annotations.get(k) == Some(v))
    })
}

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
