//! [`FleetTickets`]: the session-ticket keys of a fleet, in the Secret `NAME-tickets`, written
//! by the holder of the fleet's Lease with fenced writes and read by every replica, so that a
//! client resumes on any of them (`tls_reload::SessionTickets::shared`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use kube::Client;
use rustls::crypto::SecureRandom;
use serde_json::{Value, json};
use tls_reload::{SharedTicketKeys, TicketKey};
use tls_seal::{Location, Seal};
use tls_source::clock::{Clock, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Leadership;
use crate::fenced::{Fence, FencedSecret, Written};

/// Why the keys were not read: the API failed (`api`), or what is stored is not keys this
/// replica can read.
struct Unread {
    api: bool,
    reason: String,
}

/// How soon a replica without keys reads again.
const UNTIL_READ: Duration = Duration::from_secs(2);

/// The data key of the keys in the Secret (a JSON list; sealed whole with a seal).
pub const TICKETS_KEY: &str = "tickets.json";

/// The session-ticket keys of a fleet. The holder of the fleet's Lease (the replica that writes
/// its certificates) publishes a new key a period before it becomes current, and drops keys
/// two periods after they became current (they open nothing then), into the Secret
/// `NAME-tickets` (`Opaque`),
/// every write fenced by its round (a deposed writer's is refused, logged and not tried again
/// in that round); every replica reads it (at once, every two seconds while it has no keys,
/// then every eighth of the rotation, between a second and five minutes) into
/// [`keys`](Self::keys), for its
/// `SessionTickets::shared`. With a seal, the keys are sealed in the Secret: no ticket key is
/// readable there. A replica that cannot read them (no Secret yet, a seal it cannot open) has
/// its keys withdrawn: its `SessionTickets` uses keys of its own and says so.
///
/// Needs `get`, `create` and `update` on the Secret.
///
/// On the Lease of a shared self-signed fleet (feature `self-signed`; any fleet's
/// `Leadership` does):
///
/// ```no_run
/// # #[cfg(feature = "self-signed")]
/// # async fn run(
/// #     client: kube::Client,
/// #     shared: tls_k8s::SharedSource,
/// #     token: tokio_util::sync::CancellationToken,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use tls_k8s::FleetTickets;
/// use tls_reload::{Reloader, SessionTickets};
///
/// let random = rustls::crypto::aws_lc_rs::default_provider().secure_random;
/// let tickets = FleetTickets::new(client, "default", "web", random);
/// let keys = tickets.keys();
/// tickets.start(shared.leadership(), "web-0".into(), token);
/// let reloader = Reloader::builder()
///     .session_tickets(SessionTickets::shared(keys)?)
///     .spawn(shared)?;
/// # let _ = reloader; Ok(()) }
/// ```
pub struct FleetTickets {
    secret: FencedSecret,
    namespace: String,
    name: String,
    seal: Option<Arc<dyn Seal>>,
    rotation: Duration,
    random: &'static dyn SecureRandom,
    keys: SharedTicketKeys,
    writes: watch::Sender<TicketWrites>,
    clock: Arc<dyn Clock>,
}

/// This replica's writes of the keys so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TicketWrites {
    /// Accepted.
    pub accepted: u64,
    /// Refused by the fence: a later writer exists.
    pub refused: u64,
}

impl std::fmt::Debug for FleetTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetTickets")
            .field("secret", &self.secret.id())
            .field("sealed", &self.seal.is_some())
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

impl FleetTickets {
    /// The keys of the fleet `fleet` in `namespace` (the Secret `FLEET-tickets`), new ones made
    /// with `random` (a crypto provider's `secure_random`).
    pub fn new(
        client: Client,
        namespace: &str,
        fleet: &str,
        random: &'static dyn SecureRandom,
    ) -> Self {
        let name = format!("{fleet}-tickets");
        Self {
            secret: FencedSecret::new(client, namespace, name.clone()).secret_type("Opaque"),
            namespace: namespace.to_owned(),
            name,
            seal: None,
            rotation: tls_reload::DEFAULT_TICKET_ROTATION,
            random,
            keys: SharedTicketKeys::new(),
            writes: watch::channel(TicketWrites::default()).0,
            clock: Arc::new(SystemClock),
        }
    }

    /// Seals the keys in the Secret with `seal` (every replica needs a key that opens them).
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.seal = Some(seal);
        self
    }

    /// How long each key is the current one (the replicas' `SessionTickets` must say the
    /// same). Default: `tls_reload::DEFAULT_TICKET_ROTATION`, 6 hours.
    pub fn rotation(mut self, rotation: Duration) -> Self {
        self.rotation = rotation.max(Duration::from_secs(1));
        self
    }

    /// The clock the writer decides by (the replicas' `SessionTickets` read theirs; a test
    /// steps both). Default: the system's. The waits are on tokio's time, at most the poll.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The keys read, for `tls_reload::SessionTickets::shared`.
    pub fn keys(&self) -> SharedTicketKeys {
        self.keys.clone()
    }

    /// This replica's writes of the keys, counted.
    pub fn writes(&self) -> watch::Receiver<TicketWrites> {
        self.writes.subscribe()
    }

    /// Runs: reads the keys on every replica; writes them while `leadership` says this replica
    /// (`identity`) leads. Ends when `token` is cancelled.
    pub fn start(
        self,
        leadership: watch::Receiver<Leadership>,
        identity: String,
        token: CancellationToken,
    ) -> JoinHandle<()> {
        tokio::spawn(self.run(leadership, identity, token))
    }

    async fn run(
        self,
        mut leadership: watch::Receiver<Leadership>,
        identity: String,
        token: CancellationToken,
    ) {
        let poll = (self.rotation / 8).clamp(Duration::from_secs(1), Duration::from_secs(300));
        // The round whose write was refused: a later one exists, so this replica does not lead.
        let mut refused = None;
        let mut said: Option<String> = None;
        let mut lease_open = true;
        loop {
            // What the writer starts from: the keys read; none when what is stored is not
            // keys this replica can read (it writes new ones); nothing when the API failed.
            let start = match self.read().await {
                Ok(keys) => {
                    if said.take().is_some() {
                        tracing::info!(secret = %self.secret.id(), "the fleet's session-ticket keys are readable again");
                    }
                    if !keys.is_empty() {
                        self.keys.publish(keys.clone());
                    }
                    Some(keys)
                }
                Err(Unread { api, reason }) => {
                    if said.as_deref() != Some(reason.as_str()) {
                        tracing::warn!(secret = %self.secret.id(), %reason, "cannot read the fleet's session-ticket keys; this replica uses its own");
                        said = Some(reason);
                    }
                    self.keys.withdraw();
                    (!api).then(Vec::new)
                }
            };
            let now = self.clock.now();
            // Without keys yet (a replica that started before the writer wrote): soon again.
            let mut sleep = match &start {
                Some(keys) if !keys.is_empty() => poll,
                _ => poll.min(UNTIL_READ),
            };
            let lead = leadership.borrow_and_update().clone();
            if let Some(keys) = start.filter(|_| lead.leading && refused != Some(lead.round)) {
                let fence = Fence {
                    round: lead.round,
                    holder: identity.clone(),
                };
                match self.keep(&keys, now, &fence).await {
                    Ok(Some(Written::Refused { stored })) => {
                        tracing::warn!(secret = %self.secret.id(), round = fence.round, stored = stored.round, "a write of the session-ticket keys was refused: a later writer exists");
                        crate::metrics::fenced_write(&self.name, false);
                        self.writes.send_modify(|w| w.refused += 1);
                        refused = Some(lead.round);
                    }
                    Ok(Some(Written::Accepted { .. })) => {
                        crate::metrics::fenced_write(&self.name, true);
                        self.writes.send_modify(|w| w.accepted += 1);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(secret = %self.secret.id(), error = %e, "cannot write the session-ticket keys");
                    }
                }
                if let Some(due) = tls_reload::next_ticket_due(
                    &self.keys.keys().unwrap_or_default(),
                    self.rotation,
                ) {
                    // Not sooner than a second: a write that failed is not retried in a loop.
                    let until_due = due.duration_since(now).unwrap_or_default();
                    sleep = sleep.min(until_due.max(Duration::from_secs(1)));
                }
            }
            tokio::select! {
                () = token.cancelled() => return,
                changed = leadership.changed(), if lease_open => {
                    // The Lease gone: read on, write no more.
                    lease_open = changed.is_ok();
                }
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// What the writer does with the keys read: the next schedule, written fenced and then
    /// published here; `None` when nothing is due.
    async fn keep(
        &self,
        keys: &[TicketKey],
        now: SystemTime,
        fence: &Fence,
    ) -> Result<Option<Written>, String> {
        let Some(next) = tls_reload::next_ticket_schedule(keys, now, self.rotation, self.random)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let value = self.encode(&next)?;
        let data = BTreeMap::from([(TICKETS_KEY.to_owned(), value)]);
        let written = self
            .secret
            .write(fence, Some(&data))
            .await
            .map_err(|e| e.to_string())?;
        if matches!(written, Written::Accepted { .. }) {
            tracing::info!(secret = %self.secret.id(), current = %next.iter().rev().find(|k| k.from() <= now).map(TicketKey::id_hex).unwrap_or_default(), "session-ticket keys written");
            self.keys.publish(next);
        }
        Ok(Some(written))
    }

    /// The keys stored (none: no Secret, or none written yet).
    async fn read(&self) -> Result<Vec<TicketKey>, Unread> {
        let stored = self.secret.read().await.map_err(|e| Unread {
            api: true,
            reason: e.to_string(),
        })?;
        let Some(value) = stored
            .as_ref()
            .and_then(|s| s.data.get(TICKETS_KEY))
            .filter(|v| !v.is_empty())
        else {
            return Ok(Vec::new());
        };
        let unread = |reason: String| Unread { api: false, reason };
        let plain = match &self.seal {
            Some(seal) => seal
                .open(self.location(), value)
                .map_err(|e| unread(e.to_string()))?
                .into_plaintext(),
            None => value.clone(),
        };
        decode(&plain).ok_or_else(|| unread(format!("{TICKETS_KEY} is not a list of ticket keys")))
    }

    fn encode(&self, keys: &[TicketKey]) -> Result<Vec<u8>, String> {
        let plain = encode(keys);
        match &self.seal {
            Some(seal) => seal
                .seal(self.location(), &plain)
                .map_err(|e| e.to_string()),
            None => Ok(plain),
        }
    }

    fn location(&self) -> Location<'_> {
        Location::new(&self.namespace, &self.name, TICKETS_KEY)
    }
}

/// `keys` as written (before any seal): a JSON list of `{"id": hex, "from": seconds since the
/// epoch, "secret": base64}`.
fn encode(keys: &[TicketKey]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let list: Vec<Value> = keys
        .iter()
        .map(|k| {
            json!({
                "id": k.id_hex(),
                "from": k.from().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
                "secret": b64.encode(k.secret()),
            })
        })
        .collect();
    Value::Array(list).to_string().into_bytes()
}

/// The keys in `plain` (what [`encode`] wrote), or `None` if it is not that.
fn decode(plain: &[u8]) -> Option<Vec<TicketKey>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let list: Vec<Value> = serde_json::from_slice(plain).ok()?;
    list.iter()
        .map(|k| {
            let id = k.get("id")?.as_str()?;
            let id: Vec<u8> = (0..id.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(id.get(i..i + 2)?, 16).ok())
                .collect::<Option<_>>()?;
            let from = k.get("from")?.as_u64()?;
            let secret = b64.decode(k.get("secret")?.as_str()?).ok()?;
            Some(TicketKey::new(
                id.try_into().ok()?,
                tls_source::clock::saturating_add(
                    SystemTime::UNIX_EPOCH,
                    Duration::from_secs(from),
                ),
                secret.try_into().ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_and_anything_else_is_not_keys() {
        let random = rustls::crypto::aws_lc_rs::default_provider().secure_random;
        let keys = tls_reload::next_ticket_schedule(
            &[],
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            Duration::from_secs(3600),
            random,
        )
        .unwrap()
        .unwrap();
        assert_eq!(decode(&encode(&keys)), Some(keys));
        for bad in [
            &b"garbage"[..],
            b"[{\"id\":\"zz\",\"from\":1,\"secret\":\"\"}]",
            b"[{\"id\":\"0011\",\"from\":1,\"secret\":\"AAAA\"}]",
        ] {
            assert_eq!(decode(bad), None);
        }
    }
}
