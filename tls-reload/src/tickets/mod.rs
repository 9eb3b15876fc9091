//! Session tickets (TLS 1.3) on keys we manage, so that a client resumes on any replica of a
//! fleet, not only on the one it first met: [`SessionTickets`], given to
//! [`Builder::session_tickets`](crate::Builder::session_tickets).
//!
//! - **Keys.** Each ticket is sealed (AES-256-GCM, from the crate of the provider feature:
//!   aws-lc-rs, or ring) under the current key and starts with that key's id, so the key that
//!   opens it is found at once. Three keys at a time: the next one (published a period ahead,
//!   it only opens, so no replica seals with a key another has not read yet), the current one
//!   (seals and opens) and the previous one (opens). A key opens tickets until two periods after
//!   it became current: no ticket lives longer, and [`lifetime`] says so.
//! - **Where they come from.** [`SessionTickets::from_secret`]: each period's key derived from
//!   a secret the processes share (HKDF-SHA256 over the period's number), so they share tickets
//!   with no store at all, at a price: whoever has the secret opens every period's tickets.
//!   [`SessionTickets::shared`]: the keys a fleet's writer publishes ([`next_schedule`]) into
//!   a [`SharedTicketKeys`] every replica reads (`tls-k8s`'s shared store does), with keys of
//!   this process's own until they are readable. [`SessionTickets::local`]: keys of this
//!   process only.
//! - **TLS 1.3 only.** A TLS 1.2 ticket carries the session's master secret, so a leaked key
//!   would open recorded sessions: TLS 1.2 handshakes get an empty ticket (they resume from
//!   this process's session cache as before). 0-RTT stays off: shared keys would let early data
//!   be replayed on another replica.
//! - **A ticket that does not open** (another fleet's, altered, too old, garbage) is a full
//!   handshake, never an error.
//! - **mTLS.** rustls restores a resumed client's certificates from the ticket without asking
//!   the verifier again: the accept stream ([`Incoming`](crate::Incoming)) checks every resumed
//!   client against the trust in force and closes it before a byte is served when it fails.
//!   With an acceptor of your own that check is yours:
//!   [`Reloader::verify_resumed`](crate::Reloader::verify_resumed).
//!
//! [`lifetime`]: rustls::server::ProducesTickets::lifetime

#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
mod crypto;
#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
mod ticketer;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use rustls::crypto::SecureRandom;
#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
use tls_source::clock::{Clock, SystemClock};

#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
pub(crate) use ticketer::Ticketer;

/// The length of a key id.
const ID_LEN: usize = 8;

/// How long each key is the current one by default: 6 hours (a ticket then lives at most 12).
pub const DEFAULT_ROTATION: Duration = Duration::from_secs(6 * 3600);

/// One session-ticket key: its id (the first bytes of every ticket it seals), when it becomes
/// the current one, and its secret. `Debug` shows the id and the time, never the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketKey {
    id: [u8; ID_LEN],
    from: u64,
    secret: [u8; 32],
}

impl TicketKey {
    /// A key with these parts (what a store read back).
    pub fn new(id: [u8; 8], from: SystemTime, secret: [u8; 32]) -> Self {
        Self {
            id,
            from: unix(from),
            secret,
        }
    }

    /// A new key from `random` (a crypto provider's `secure_random`), current from `from`.
    ///
    /// # Errors
    /// The random source failed.
    pub fn generate(from: SystemTime, random: &dyn SecureRandom) -> Result<Self, TicketsError> {
        let mut id = [0u8; ID_LEN];
        let mut secret = [0u8; 32];
        random.fill(&mut id).map_err(|_| TicketsError::Random)?;
        random.fill(&mut secret).map_err(|_| TicketsError::Random)?;
        Ok(Self {
            id,
            from: unix(from),
            secret,
        })
    }

    /// Its id.
    pub fn id(&self) -> [u8; 8] {
        self.id
    }

    /// Its id in hex, as the status shows it.
    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }

    /// When it becomes the current key.
    pub fn from(&self) -> SystemTime {
        at(self.from)
    }

    /// Its secret: for the store that keeps it (seal it there), never for a log.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }
}

impl fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketKey")
            .field("id", &self.id_hex())
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// The keys a fleet's writer publishes and every replica reads (each replica's
/// `SessionTickets::shared` follows it). Cheap to clone: clones share the keys.
#[derive(Clone, Default)]
pub struct SharedTicketKeys {
    keys: Arc<ArcSwapOption<Vec<TicketKey>>>,
}

impl SharedTicketKeys {
    /// Nothing published yet: replicas use keys of their own.
    pub fn new() -> Self {
        Self::default()
    }

    /// The keys to use from now on (in any order).
    pub fn publish(&self, mut keys: Vec<TicketKey>) {
        keys.sort_by_key(|k| k.from);
        self.keys.store(Some(Arc::new(keys)));
    }

    /// No keys readable (a seal this replica cannot open, the store gone): keys of its own.
    pub fn withdraw(&self) {
        self.keys.store(None);
    }

    /// The keys published, oldest first.
    pub fn keys(&self) -> Option<Arc<Vec<TicketKey>>> {
        self.keys.load_full()
    }
}

impl fmt::Debug for SharedTicketKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTicketKeys")
            .field("keys", &self.keys())
            .finish()
    }
}

/// What a fleet's writer publishes next, from the `keys` published and `now`, with keys
/// current for `rotation` each (new ones from `random`, a crypto provider's
/// `secure_random`); `None` when nothing is due. Keys that open nothing any more
/// (current more than two periods ago) are left out; a current key is made when there is none;
/// and while no key is the next one, one is made to become current when the last one's period
/// ends (a period from now if that has passed), so it is published a period before any replica
/// seals with it. Call it again at [`next_due`].
///
/// # Errors
/// The system's random source failed.
pub fn next_schedule(
    keys: &[TicketKey],
    now: SystemTime,
    rotation: Duration,
    random: &dyn SecureRandom,
) -> Result<Option<Vec<TicketKey>>, TicketsError> {
    // Where no later key can be made.
    let end = unix(tls_source::clock::latest());
    let (now, period) = (clamped(now), period_secs(rotation));
    let mut kept: Vec<TicketKey> = keys
        .iter()
        .filter(|k| k.from.saturating_add(period.saturating_mul(2)) > now)
        .cloned()
        .collect();
    kept.sort_by_key(|k| k.from);
    let mut changed = kept.len() != keys.len();
    if !kept.iter().any(|k| k.from <= now) {
        kept.insert(0, TicketKey::generate(at(now), random)?);
        changed = true;
    }
    let last = kept.last().map_or(now, |k| k.from);
    if last <= now {
        let from = match last.saturating_add(period) {
            from if from > now => from,
            _ => now.saturating_add(period),
        }
        .min(end);
        if from > now {
            kept.push(TicketKey::generate(at(from), random)?);
            changed = true;
        }
    }
    Ok(changed.then_some(kept))
}

/// When [`next_schedule`] has something to do for `keys`: when the newest key becomes
/// current, or when the oldest stops opening tickets, whichever is first.
pub fn next_due(keys: &[TicketKey], rotation: Duration) -> Option<SystemTime> {
    let period = period_secs(rotation);
    let newest = keys.iter().map(|k| k.from).max()?;
    let oldest_ends = keys
        .iter()
        .map(|k| k.from.saturating_add(period.saturating_mul(2)))
        .min()?;
    Some(at(newest.min(oldest_ends)))
}

/// Where a server's session-ticket keys come from; give it to
/// [`Builder::session_tickets`](crate::Builder::session_tickets).
///
/// ```
/// use std::time::Duration;
/// use tls_reload::{Reloader, SessionTickets};
///
/// # fn run(source: tls_reload::FileSource) -> Result<(), Box<dyn std::error::Error>> {
/// // Every process given this secret (32 bytes or more, e.g. from a file) shares tickets.
/// let secret = [7u8; 32];
/// let tickets = SessionTickets::from_secret(&secret)?.rotation(Duration::from_secs(3600));
/// let reloader = Reloader::builder().session_tickets(tickets);
/// # let _ = (reloader, source); Ok(()) }
/// ```
#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
#[derive(Clone)]
pub struct SessionTickets {
    pub(crate) source: Source,
    pub(crate) rotation: Duration,
    pub(crate) clock: Arc<dyn Clock>,
}

#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
#[derive(Clone)]
pub(crate) enum Source {
    /// Each period's key derived from this secret; `local`: a random one of this process.
    Derived { secret: [u8; 32], local: bool },
    /// A fleet's keys, and the secret of this process's own keys while there are none.
    Shared {
        keys: SharedTicketKeys,
        fallback: [u8; 32],
    },
}

#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
impl SessionTickets {
    /// Keys derived from `secret` (at least 32 bytes; HKDF-SHA256 over each period's number):
    /// every process given the same secret, and the same [`rotation`](Self::rotation), seals
    /// and opens the same tickets. Whoever holds the secret opens every period's tickets: keep
    /// it as you keep a private key.
    ///
    /// # Errors
    /// [`TicketsError::ShortSecret`].
    pub fn from_secret(secret: &[u8]) -> Result<Self, TicketsError> {
        if secret.len() < 32 {
            return Err(TicketsError::ShortSecret { len: secret.len() });
        }
        let secret = crypto::derive(secret, &[b"secret"]).ok_or(TicketsError::Random)?;
        Ok(Self::with(Source::Derived {
            secret,
            local: false,
        }))
    }

    /// Keys of this process only (random): resumption works on this process alone, as with
    /// rustls's own ticketer, but on the rotation and the rules here.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn local() -> Result<Self, TicketsError> {
        let secret = crypto::random_secret().ok_or(TicketsError::Random)?;
        Ok(Self::with(Source::Derived {
            secret,
            local: true,
        }))
    }

    /// The keys `keys` holds, as a fleet's writer publishes them ([`next_schedule`]); until
    /// some are readable, and whenever none is current, keys of this process's own (the status
    /// says so: resumption then works only here, and every handshake still succeeds).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn shared(keys: SharedTicketKeys) -> Result<Self, TicketsError> {
        let fallback = crypto::random_secret().ok_or(TicketsError::Random)?;
        Ok(Self::with(Source::Shared { keys, fallback }))
    }

    fn with(source: Source) -> Self {
        Self {
            source,
            rotation: DEFAULT_ROTATION,
            clock: Arc::new(SystemClock),
        }
    }

    /// How long each key is the current one ([`DEFAULT_ROTATION`], 6 hours, by default); a
    /// ticket lives at most twice that. At least a second. Processes that share keys must
    /// agree on it.
    pub fn rotation(mut self, rotation: Duration) -> Self {
        self.rotation = rotation.max(Duration::from_secs(1));
        self
    }

    /// The clock the periods are read from (tests step one). Default: the system's.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
impl fmt::Debug for SessionTickets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Derived { local: false, .. } => "secret",
            Source::Derived { local: true, .. } => "local",
            Source::Shared { .. } => "fleet",
        };
        f.debug_struct("SessionTickets")
            .field("source", &source)
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

/// What `Reloader::session_tickets` says of the keys in use now (features `aws-lc-rs` or
/// `ring`): never a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TicketsStatus {
    /// Where the keys come from: `secret` (derived from a shared secret), `fleet` (the
    /// fleet's), `local` (this process's own; with a fleet configured, see `note`).
    pub source: &'static str,
    /// The current key's id (hex): what every replica sharing keys shows alike.
    pub key_id: String,
    /// Since when it is the current key.
    pub since: SystemTime,
    /// How long it has been the current key, on the clock the keys are read by.
    pub age: Duration,
    /// How long each key is current.
    pub rotation: Duration,
    /// Why the keys are not the configured ones (a fleet's not readable yet).
    pub note: Option<String>,
}

/// What cannot make session tickets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TicketsError {
    /// The secret is shorter than 32 bytes.
    #[error("a session-ticket secret needs at least 32 bytes (this one has {len})")]
    ShortSecret {
        /// Its length.
        len: usize,
    },
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
}

fn period_secs(rotation: Duration) -> u64 {
    rotation.as_secs().max(1)
}

/// Seconds since the epoch; a time before it is the epoch.
fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `t` in seconds since the epoch, between the epoch and the end of 9999
/// (`tls_source::clock::latest`): a clock before or past those reads as them.
fn clamped(t: SystemTime) -> u64 {
    unix(t).min(unix(tls_source::clock::latest()))
}

/// The time `secs` after the epoch, at most the end of 9999.
fn at(secs: u64) -> SystemTime {
    tls_source::clock::saturating_add(SystemTime::UNIX_EPOCH, Duration::from_secs(secs))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(all(test, any(feature = "aws-lc-rs", feature = "ring")))]
mod tests;
