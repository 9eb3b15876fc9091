//! A fleet's shared self-signed store, its decisions, pure: given what is stored and `now`, what
//! the store must hold and when to look again. For the stores that keep one certificate (and CA)
//! for every replica, written by one elected writer (tls-k8s's Secrets, tls-etcd's keys): each
//! reads, asks these, writes fenced, counts and logs.
//!
//! The stored state is two objects of values and annotations: the leaf's (`tls.crt`, `tls.key`,
//! `ca.crt`; [`RENEW_AFTER`]) and, in CA mode, the CA's ([`CaState`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tls_source::clock::{Rfc3339, saturating_add};

use crate::{CaRotation, MIN_RENEWAL_GAP, SelfSigned, Unfit};

mod state;

pub use state::{CaState, first_certificate};

/// The annotation of the leaf's object saying when its certificate will be renewed (RFC 3339).
pub const RENEW_AFTER: &str = "tls-rotation.io/renew-after";
/// The annotation of the CA's object saying when leaves switch to the announced CA (RFC 3339).
pub const SWITCH_AFTER: &str = "tls-rotation.io/switch-after";
/// The leaf's certificate chain.
pub const TLS_CRT: &str = "tls.crt";
/// The leaf's private key.
pub const TLS_KEY: &str = "tls.key";
/// The CA certificates served with the leaf.
pub const CA_CRT: &str = "ca.crt";

/// An object's values, by key.
pub type Data = BTreeMap<String, Vec<u8>>;
/// An object's annotations.
pub type Annotations = BTreeMap<String, String>;
/// An object's values and annotations, as written.
pub type Content = (Data, Annotations);

/// The writer checks the stored state at least this often even when nothing is due.
pub const RECHECK: Duration = Duration::from_secs(3600);

/// What the CA's object holds, as read.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoredCa {
    /// There is none.
    Missing,
    /// It cannot be used, and why.
    Unreadable(String),
    /// Its state.
    Read(CaState),
}

/// What happened to the CA, for the log and the stats.
// Not `non_exhaustive`: every store logs each change, and a new one should be handled there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaChange {
    /// There was none: one was generated.
    Generated,
    /// The stored one could not be read and was replaced, as configured.
    ReplacedCorrupt {
        /// Why it could not be read.
        reason: String,
    },
    /// The announced CA signs from now on; the old one is served until it expires.
    Switched,
    /// The signing CA is due for renewal: the next one is announced in `ca.crt`.
    Announced {
        /// When leaves switch to it.
        switch_after: SystemTime,
    },
    /// The signing CA cannot sign any more (expired: no writer for too long): replaced with no
    /// overlap.
    ReplacedUnusable {
        /// Why it cannot sign.
        reason: String,
    },
}

impl CaChange {
    /// Whether a CA was generated for it.
    pub fn generated(&self) -> bool {
        !matches!(self, Self::Switched)
    }
}

/// What the CA's object must hold now.
#[derive(Debug)]
#[non_exhaustive]
pub struct CaPlan {
    /// The state to store.
    pub state: CaState,
    /// What changed, for the log and the counts.
    pub changes: Vec<CaChange>,
    /// When the CA needs looking at next: a switch, a renewal, the previous CA's expiry.
    pub next_check: SystemTime,
}

/// Why there is no plan.
// Not `non_exhaustive`: every store reports each, and a new one should be handled there.
#[derive(Debug)]
pub enum PlanError {
    /// The stored CA cannot be used and may not be replaced.
    CorruptCa(String),
    /// Generating failed.
    Generate(crate::Error),
}

impl From<crate::Error> for PlanError {
    fn from(err: crate::Error) -> Self {
        Self::Generate(err)
    }
}

/// The CA: kept while it fits; the next one announced when it enters its renewal window, and
/// signing after `overlap`; the previous one served until it expires.
///
/// # Errors
/// A stored CA that cannot be used and may not be replaced; a failed generation.
pub fn ca(
    stored: StoredCa,
    rotation: &CaRotation,
    overlap: Duration,
    now: SystemTime,
) -> Result<CaPlan, PlanError> {
    let mut changes = Vec::new();
    let mut state = match stored {
        StoredCa::Read(state) => state,
        StoredCa::Missing => {
            changes.push(CaChange::Generated);
            CaState::new(rotation.generate()?)
        }
        StoredCa::Unreadable(reason) if rotation.replaces_corrupt() => {
            changes.push(CaChange::ReplacedCorrupt { reason });
            CaState::new(rotation.generate()?)
        }
        StoredCa::Unreadable(reason) => return Err(PlanError::CorruptCa(reason)),
    };
    // Announced long enough: leaves switch to the new CA.
    if let Some((next, _)) = state.next.take_if(|(_, switch_after)| now >= *switch_after) {
        changes.push(CaChange::Switched);
        state.previous = Some(std::mem::replace(&mut state.signing, next).cert_pem);
    }
    match rotation.check(state.signing.cert_pem.as_bytes(), now) {
        Ok(()) => {}
        Err(Unfit::RenewalDue { .. }) if state.next.is_none() => {
            let switch_after = saturating_add(now, overlap);
            changes.push(CaChange::Announced { switch_after });
            state.next = Some((rotation.generate()?, switch_after));
        }
        Err(Unfit::RenewalDue { .. }) => {}
        Err(unfit) => {
            changes.push(CaChange::ReplacedUnusable {
                reason: unfit.to_string(),
            });
            state = CaState::new(rotation.generate()?);
        }
    }
    let mut next_check = saturating_add(now, RECHECK);
    if let Some(previous) = &state.previous {
        match first_certificate(previous.as_bytes()) {
            Some(info) if info.not_after > now => next_check = next_check.min(info.not_after),
            _ => state.previous = None,
        }
    }
    match &state.next {
        Some((_, switch_after)) => next_check = next_check.min(*switch_after),
        None => {
            if let Some(info) = first_certificate(state.signing.cert_pem.as_bytes()) {
                let due = info
                    .not_after
                    .checked_sub(rotation.window())
                    .unwrap_or(info.not_after);
                next_check = next_check.min(due);
            }
        }
    }
    Ok(CaPlan {
        state,
        changes,
        next_check,
    })
}

/// What the leaf's object must hold now.
#[derive(Debug)]
#[non_exhaustive]
pub struct LeafPlan {
    /// The values and annotations to store.
    pub content: Content,
    /// When the leaf is renewed (the annotation [`RENEW_AFTER`]).
    pub renew_after: SystemTime,
    /// Why the stored leaf was not reused, when a new one was generated; `Some(None)`: there
    /// was none.
    pub generated: Option<Option<Unfit>>,
}

/// The leaf: reused while it fits `generator` (judged on its clock), else generated; with
/// `served_ca` as `ca.crt`.
///
/// # Errors
/// A failed generation.
pub fn leaf(
    generator: &SelfSigned,
    stored: Option<&Data>,
    served_ca: Option<String>,
) -> Result<LeafPlan, crate::Error> {
    let cert = stored.and_then(|d| d.get(TLS_CRT));
    let key = stored.and_then(|d| d.get(TLS_KEY));
    let (cert, key, generated) =
        match generator.check(cert.map(Vec::as_slice), key.map(Vec::as_slice)) {
            Ok(()) => (
                cert.cloned().unwrap_or_default(),
                key.cloned().unwrap_or_default(),
                None,
            ),
            Err(unfit) => {
                let pem = generator.generate_pem()?;
                let why = stored.is_some().then_some(unfit);
                (
                    pem.cert_pem.into_bytes(),
                    pem.key_pem.into_bytes(),
                    Some(why),
                )
            }
        };
    let leaf = first_certificate(&cert).ok_or_else(|| crate::Error::Config {
        reason: "the generated certificate does not parse".into(),
    })?;
    let renew_after = leaf
        .not_after
        .checked_sub(generator.renewal_window())
        .unwrap_or(leaf.not_after);
    let mut data = BTreeMap::from([(TLS_CRT.to_owned(), cert), (TLS_KEY.to_owned(), key)]);
    if let Some(ca) = served_ca {
        data.insert(CA_CRT.to_owned(), ca.into_bytes());
    }
    let annotations = BTreeMap::from([(RENEW_AFTER.to_owned(), Rfc3339(renew_after).to_string())]);
    Ok(LeafPlan {
        content: (data, annotations),
        renew_after,
        generated,
    })
}

/// When to check again: the earliest of the CA's and the leaf's times and the hourly recheck,
/// and never sooner than [`MIN_RENEWAL_GAP`] (a clock that jumps never makes a tight loop).
pub fn next_check(now: SystemTime, ca: Option<SystemTime>, leaf: SystemTime) -> SystemTime {
    let next = ca
        .into_iter()
        .fold(saturating_add(now, RECHECK).min(leaf), SystemTime::min);
    next.max(saturating_add(now, MIN_RENEWAL_GAP))
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
    /// Fenced writes refused (a later round had written, or holds the writer key).
    pub refused: u64,
    /// The round this replica last wrote with, if it ever wrote.
    pub round: Option<u64>,
    /// Checks of the stored state completed while leading (whether or not they wrote).
    pub checks: u64,
}

/// Whether this replica can open the state its fleet's store keeps (what is sealed: on
/// Kubernetes the CA Secret, and the TLS Secret's key when it is sealed; on etcd every private
/// key), and so may lead.
///
/// With the `serde` feature it serializes as `serve`'s status JSON shows it under `seal`:
/// `{"state": "unknown" | "open" | "refused", "reason": "…" | null}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateAccess {
    /// Not read yet: this replica does not campaign.
    #[default]
    Unknown,
    /// It opens (or there is none yet): this replica campaigns to write.
    Open,
    /// It cannot be opened: this replica serves, writes nothing and does not campaign.
    Refused {
        /// Why (the place and the seal's reason; never any key material).
        reason: String,
    },
}

#[cfg(feature = "serde")]
impl serde::Serialize for StateAccess {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let (state, reason) = match self {
            Self::Unknown => ("unknown", None),
            Self::Open => ("open", None),
            Self::Refused { reason } => ("refused", Some(reason)),
        };
        let mut s = serializer.serialize_struct("StateAccess", 2)?;
        s.serialize_field("state", state)?;
        s.serialize_field("reason", &reason)?;
        s.end()
    }
}

/// A replica's access to its fleet's stored state and, with it, whether it is a candidate for
/// the writer (a Kubernetes Lease, an etcd writer key): what both stores' writers keep. It
/// starts [`Unknown`](StateAccess::Unknown), not a candidate; a candidate exactly while
/// [`Open`](StateAccess::Open).
#[derive(Debug)]
pub struct Candidacy {
    access: tokio::sync::watch::Sender<StateAccess>,
    candidate: tokio::sync::watch::Sender<bool>,
}

impl Default for Candidacy {
    fn default() -> Self {
        Self {
            access: tokio::sync::watch::Sender::new(StateAccess::Unknown),
            candidate: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Candidacy {
    /// The access, as the status shows it.
    pub fn access(&self) -> tokio::sync::watch::Receiver<StateAccess> {
        self.access.subscribe()
    }

    /// Whether this replica campaigns (an election's `candidate`).
    pub fn candidate(&self) -> tokio::sync::watch::Receiver<bool> {
        self.candidate.subscribe()
    }

    /// Whether the state opens now.
    pub fn is_open(&self) -> bool {
        *self.access.borrow() == StateAccess::Open
    }

    /// The state opens (or there is none yet): a candidate. Returns whether it had been
    /// refused (for the caller to say, naming its store, that it opens again).
    pub fn open(&self) -> bool {
        let reopened = matches!(*self.access.borrow(), StateAccess::Refused { .. });
        self.set(StateAccess::Open);
        reopened
    }

    /// The state does not open, for `reason`: not a candidate (a leader steps down). Returns
    /// whether the reason is new (for the caller to report it once).
    pub fn refuse(&self, reason: String) -> bool {
        self.set(StateAccess::Refused { reason })
    }

    fn set(&self, access: StateAccess) -> bool {
        let candidate = access == StateAccess::Open;
        let changed = self.access.send_if_modified(|now| {
            let changed = *now != access;
            *now = access;
            changed
        });
        self.candidate
            .send_if_modified(|now| std::mem::replace(now, candidate) != candidate);
        changed
    }
}

/// How often a writer re-reads the seal's key files ([`KeyCheck`]): a changed key set makes it
/// look at what is stored again (a leader seals again what a key that no longer seals had
/// sealed; a replica refused may open it now).
pub const KEY_RECHECK: Duration = Duration::from_secs(10);

/// The seal's keys, looked at every [`KEY_RECHECK`] by a fleet's writer: a change is seen by
/// the ids, not by what `reload` returns (a source sharing the seal may have reloaded it first).
#[derive(Debug)]
pub struct KeyCheck {
    ids: Vec<tls_seal::KeyId>,
    interval: tokio::time::Interval,
}

impl KeyCheck {
    /// Starts looking at `seal`'s keys, the first look a [`KEY_RECHECK`] from now.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn new(seal: &dyn tls_seal::Seal) -> Self {
        let start = tokio::time::Instant::now() + KEY_RECHECK;
        let mut interval = tokio::time::interval_at(start, KEY_RECHECK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            ids: seal.key_ids(),
            interval,
        }
    }

    /// Waits for the next look.
    pub async fn tick(&mut self) {
        self.interval.tick().await;
    }

    /// Re-reads the keys; whether they differ from the last look.
    pub fn changed(&mut self, seal: &dyn tls_seal::Seal) -> bool {
        seal.reload();
        let ids = seal.key_ids();
        ids != std::mem::replace(&mut self.ids, ids.clone())
    }
}

#[cfg(test)]
mod tests;
