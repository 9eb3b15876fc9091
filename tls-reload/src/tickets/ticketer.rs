//! The `ProducesTickets` of a [`SessionTickets`]: the keys in force at each moment, prepared
//! once per change of them (a period's end, a new schedule), then read lock-free.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::server::ProducesTickets;
use tls_source::clock::Clock;

use super::crypto::{self, Sealer};
use super::{SessionTickets, Source, TicketKey, TicketsStatus, at, clamped};

/// The ticketer a [`SessionTickets`] makes; one per reloader, in every config it builds.
pub(crate) struct Ticketer {
    source: Source,
    /// Seconds each key is current.
    period: u64,
    clock: Arc<dyn Clock>,
    prepared: ArcSwapOption<Prepared>,
}

/// The keys in force over `[from, until)`, ready to use.
struct Prepared {
    from: u64,
    until: u64,
    /// The fleet's schedule they were made from (none: derived keys).
    schedule: Option<Arc<Vec<TicketKey>>>,
    /// The current key, which seals.
    seal: Option<Sealer>,
    /// Every key that opens tickets at some time in `[from, until)`, with when it does.
    open: Vec<Opener>,
    status: TicketsStatus,
}

struct Opener {
    sealer: Sealer,
    /// Published a period before it becomes current.
    from: u64,
    /// Two periods after it became current.
    until: u64,
}

impl Ticketer {
    pub(crate) fn new(tickets: SessionTickets) -> Self {
        Self {
            source: tickets.source,
            period: super::period_secs(tickets.rotation),
            clock: tickets.clock,
            prepared: ArcSwapOption::const_empty(),
        }
    }

    /// What the status shows now.
    pub(crate) fn status(&self) -> TicketsStatus {
        let (now, prepared) = self.prepared();
        let mut status = prepared.status.clone();
        // On this ticketer's clock, as the keys are.
        status.age = at(now).duration_since(status.since).unwrap_or_default();
        status
    }

    /// The keys in force now, and now (seconds since the epoch).
    fn prepared(&self) -> (u64, Arc<Prepared>) {
        let now = clamped(self.clock.now());
        let schedule = match &self.source {
            Source::Shared { keys, .. } => keys.keys(),
            Source::Derived { .. } => None,
        };
        if let Some(prepared) = self.prepared.load_full()
            && (prepared.from..prepared.until).contains(&now)
            && same(prepared.schedule.as_ref(), schedule.as_ref())
        {
            return (now, prepared);
        }
        let prepared = Arc::new(self.prepare(now, schedule));
        self.prepared.store(Some(Arc::clone(&prepared)));
        (now, prepared)
    }

    fn prepare(&self, now: u64, schedule: Option<Arc<Vec<TicketKey>>>) -> Prepared {
        let fleet = schedule
            .as_ref()
            .filter(|keys| keys.iter().any(|k| k.from <= now));
        let (keys, source, note) = match (&self.source, fleet) {
            (Source::Shared { .. }, Some(keys)) => (keys.to_vec(), "fleet", None),
            (Source::Shared { fallback, .. }, None) => (
                self.derived(fallback, now),
                "local",
                Some(if schedule.is_some() {
                    "no key of the fleet's is current yet: this process's own keys (a ticket resumes only here)"
                } else {
                    "the fleet's keys are not readable: this process's own keys (a ticket resumes only here)"
                }.to_owned()),
            ),
            (Source::Derived { secret, local }, _) => (
                self.derived(secret, now),
                if *local { "local" } else { "secret" },
                None,
            ),
        };
        let twice = self.period.saturating_mul(2);
        let mut boundaries = Vec::with_capacity(keys.len() * 3);
        let mut open = Vec::new();
        let mut current: Option<&TicketKey> = None;
        for key in &keys {
            let (opens, ends) = (
                key.from.saturating_sub(self.period),
                key.from.saturating_add(twice),
            );
            boundaries.extend([opens, key.from, ends]);
            if key.from <= now && current.is_none_or(|c| c.from <= key.from) {
                current = Some(key);
            }
            if ends > now
                && let Some(sealer) = Sealer::new(key.id, &key.secret)
            {
                open.push(Opener {
                    sealer,
                    from: opens,
                    until: ends,
                });
            }
        }
        let from = boundaries
            .iter()
            .copied()
            .filter(|b| *b <= now)
            .max()
            .unwrap_or(0);
        let until = boundaries
            .iter()
            .copied()
            .filter(|b| *b > now)
            .min()
            .unwrap_or(u64::MAX);
        let status = TicketsStatus {
            source,
            key_id: current.map(TicketKey::id_hex).unwrap_or_default(),
            since: at(current.map_or(now, |c| c.from)),
            rotation: std::time::Duration::from_secs(self.period),
            age: std::time::Duration::ZERO,
            note,
        };
        Prepared {
            from,
            until,
            schedule,
            seal: current.and_then(|c| Sealer::new(c.id, &c.secret)),
            open,
            status,
        }
    }

    /// The previous, current and next keys derived from `secret` at `now`.
    fn derived(&self, secret: &[u8; 32], now: u64) -> Vec<TicketKey> {
        let n = now / self.period;
        [n.checked_sub(1), Some(n), n.checked_add(1)]
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let number = m.to_be_bytes();
                let id = crypto::derive(secret, &[b"id", &number])?;
                Some(TicketKey {
                    id: id[..crypto::ID_LEN].try_into().ok()?,
                    from: m.saturating_mul(self.period),
                    secret: crypto::derive(secret, &[b"key", &number])?,
                })
            })
            .collect()
    }
}

/// Whether both are the same schedule (or both none).
fn same(a: Option<&Arc<Vec<TicketKey>>>, b: Option<&Arc<Vec<TicketKey>>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Whether `plain`, a session rustls asks us to seal (or we opened), is a TLS 1.3 one. rustls
/// writes it as: a byte saying whether a server name follows, the name (a length byte and its
/// bytes), then the protocol version. A TLS 1.2 session carries its master secret: never in
/// a ticket of shared keys. (The tests fail if rustls changes this layout.)
fn is_tls13(plain: &[u8]) -> bool {
    let rest = match plain.split_first() {
        Some((0, rest)) => rest,
        Some((1, rest)) => match rest.split_first() {
            Some((len, rest)) => rest.get(usize::from(*len)..).unwrap_or_default(),
            None => return false,
        },
        _ => return false,
    };
    rest.get(..2) == Some(&[0x03, 0x04][..])
}

impl ProducesTickets for Ticketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(self.period.saturating_mul(2)).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        if !is_tls13(plain) {
            return None;
        }
        self.prepared().1.seal.as_ref()?.seal(plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let id = crypto::id_of(cipher)?;
        let (now, prepared) = self.prepared();
        let opener = prepared
            .open
            .iter()
            .find(|o| o.sealer.id() == id && (o.from..o.until).contains(&now))?;
        opener.sealer.open(cipher).filter(|plain| is_tls13(plain))
    }
}

impl fmt::Debug for Ticketer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.status();
        f.debug_struct("Ticketer")
            .field("source", &status.source)
            .field("key_id", &status.key_id)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}
