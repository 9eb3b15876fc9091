//! The shared store's decisions, pure: given what is stored and `now`, what to write and when to
//! look again. The writer (`writer.rs`) reads, asks these, writes, counts and logs.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tls_selfsigned::{CaRotation, MIN_RENEWAL_GAP, SelfSigned, Unfit};
use tls_source::clock::{Rfc3339, saturating_add};

use super::RENEW_AFTER_ANNOTATION;
use super::state::{CaState, Content, first_certificate};
use crate::fenced::Stored;
use crate::store::Fence;

/// The leader checks the Secrets at least this often even when nothing is due (two reads).
pub(crate) const RECHECK: Duration = Duration::from_secs(3600);

/// The fence for Lease round `lease_round`, for the writer `identity`: monotonic across a
/// recreated Lease (which restarts `leaseTransitions`), past every stored round of another
/// holder.
pub(crate) fn fence<'a>(
    lease_round: u64,
    identity: &str,
    stored: impl IntoIterator<Item = &'a Fence>,
) -> Fence {
    let round = stored.into_iter().fold(lease_round, |round, f| {
        round.max(f.round + u64::from(f.holder != identity))
    });
    Fence {
        round,
        holder: identity.to_owned(),
    }
}

/// What the CA Secret holds, as read.
#[derive(Debug)]
pub(crate) enum StoredCa {
    Missing,
    /// It cannot be used, and why.
    Unreadable(String),
    Read(CaState),
}

/// What happened to the CA, for the log and the stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CaChange {
    /// There was none: one was generated.
    Generated,
    /// The stored one could not be read and was replaced, as configured.
    ReplacedCorrupt { reason: String },
    /// The announced CA signs from now on; the old one is served until it expires.
    Switched,
    /// The signing CA is due for renewal: the next one is announced in `ca.crt`.
    Announced { switch_after: SystemTime },
    /// The signing CA cannot sign any more (expired: no writer for too long): replaced with no
    /// overlap.
    ReplacedUnusable { reason: String },
}

impl CaChange {
    /// Whether a CA was generated for it.
    pub(crate) fn generated(&self) -> bool {
        !matches!(self, Self::Switched)
    }
}

/// What the CA Secret must hold now.
#[derive(Debug)]
pub(crate) struct CaPlan {
    pub(crate) state: CaState,
    pub(crate) changes: Vec<CaChange>,
    /// When the CA needs looking at next: a switch, a renewal, the previous CA's expiry.
    pub(crate) next_check: SystemTime,
}

/// Why there is no plan.
#[derive(Debug)]
pub(crate) enum PlanError {
    /// The stored CA cannot be used and may not be replaced.
    CorruptCa(String),
    /// Generating failed.
    Generate(tls_selfsigned::Error),
}

impl From<tls_selfsigned::Error> for PlanError {
    fn from(err: tls_selfsigned::Error) -> Self {
        Self::Generate(err)
    }
}

/// The CA: kept while it fits; the next one announced when it enters its renewal window, and
/// signing after `overlap`; the previous one served until it expires.
pub(crate) fn ca(
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

/// What the TLS Secret must hold now.
#[derive(Debug)]
pub(crate) struct LeafPlan {
    pub(crate) content: Content,
    /// When the leaf is renewed (the Secret's [`RENEW_AFTER_ANNOTATION`]).
    pub(crate) renew_after: SystemTime,
    /// Why the stored leaf was not reused, when a new one was generated; `Some(None)`: there
    /// was none.
    pub(crate) generated: Option<Option<Unfit>>,
}

/// The leaf: reused while it fits `generator` (judged on its clock), else generated; with
/// `served_ca` as `ca.crt`.
pub(crate) fn leaf(
    generator: &SelfSigned,
    stored: Option<&Stored>,
    served_ca: Option<String>,
) -> Result<LeafPlan, tls_selfsigned::Error> {
    let data = stored.map(|s| &s.data);
    let cert = data.and_then(|d| d.get(crate::TLS_CRT));
    let key = data.and_then(|d| d.get(crate::TLS_KEY));
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
    let leaf = first_certificate(&cert).ok_or_else(|| tls_selfsigned::Error::Config {
        reason: "the generated certificate does not parse".into(),
    })?;
    let renew_after = leaf
        .not_after
        .checked_sub(generator.renewal_window())
        .unwrap_or(leaf.not_after);
    let mut data = BTreeMap::from([
        (crate::TLS_CRT.to_owned(), cert),
        (crate::TLS_KEY.to_owned(), key),
    ]);
    if let Some(ca) = served_ca {
        data.insert(crate::CA_CRT.to_owned(), ca.into_bytes());
    }
    let annotations = BTreeMap::from([(
        RENEW_AFTER_ANNOTATION.to_owned(),
        Rfc3339(renew_after).to_string(),
    )]);
    Ok(LeafPlan {
        content: (data, annotations),
        renew_after,
        generated,
    })
}

/// Whether the Secret already holds `content` under `fence` (so nothing is written).
pub(crate) fn unchanged(stored: Option<&Stored>, fence: &Fence, content: &Content) -> bool {
    let (data, annotations) = content;
    stored.is_some_and(|s| {
        s.fence.as_ref() == Some(fence)
            && &s.data == data
            && annotations
                .iter()
                .all(|(k, v)| s.annotations.get(k) == Some(v))
    })
}

/// When to check again: the earliest of the CA's and the leaf's times and the hourly recheck,
/// and never sooner than [`MIN_RENEWAL_GAP`] (a clock that jumps never makes a tight loop).
pub(crate) fn next_check(now: SystemTime, ca: Option<SystemTime>, leaf: SystemTime) -> SystemTime {
    let next = ca
        .into_iter()
        .fold(saturating_add(now, RECHECK).min(leaf), SystemTime::min);
    next.max(saturating_add(now, MIN_RENEWAL_GAP))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tls_selfsigned::Clock;

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// A clock that says one time.
    #[derive(Debug)]
    struct At(SystemTime);

    impl Clock for At {
        fn now(&self) -> SystemTime {
            self.0
        }
    }

    fn t0() -> SystemTime {
        tls_test::new_year(2030)
    }

    /// A generator in CA mode whose CAs live 30 days (renewed 10 days before the end), on a
    /// clock reading `at`.
    fn generator(at: SystemTime) -> SelfSigned {
        SelfSigned::builder()
            .dns_name("web.web.svc")
            .validity(3 * DAY)
            .ca()
            .ca_validity(30 * DAY)
            .clock(Arc::new(At(at)))
            .build()
            .unwrap()
    }

    fn rotation(at: SystemTime) -> CaRotation {
        generator(at).ca_rotation().unwrap()
    }

    fn certificates(pem: &str) -> usize {
        pem.matches("BEGIN CERTIFICATE").count()
    }

    #[test]
    fn a_fence_passes_every_round_stored_by_another_holder() {
        let theirs = Fence {
            round: 7,
            holder: "b".into(),
        };
        let mine = Fence {
            round: 9,
            holder: "a".into(),
        };
        assert_eq!(fence(3, "a", [&theirs]).round, 8);
        assert_eq!(fence(3, "a", [&mine]).round, 9, "its own round is its own");
        assert_eq!(fence(12, "a", [&theirs, &mine]).round, 12);
        assert_eq!(fence(0, "a", []).holder, "a");
    }

    #[test]
    fn a_missing_ca_is_generated_and_looked_at_again_when_due() {
        let plan = ca(StoredCa::Missing, &rotation(t0()), DAY, t0()).unwrap();
        assert_eq!(plan.changes, [CaChange::Generated]);
        assert!(plan.state.next.is_none() && plan.state.previous.is_none());
        assert_eq!(
            plan.next_check,
            t0() + RECHECK,
            "its renewal is 20 days away"
        );
        assert_eq!(certificates(&plan.state.served()), 1);
    }

    #[test]
    fn an_unreadable_ca_is_refused_unless_replacing_it_is_allowed() {
        let refused = ca(
            StoredCa::Unreadable("ca.key is missing".into()),
            &rotation(t0()),
            DAY,
            t0(),
        );
        assert!(matches!(refused, Err(PlanError::CorruptCa(reason)) if reason.contains("ca.key")));
        let allowed = SelfSigned::builder()
            .dns_name("web")
            .ca()
            .replace_corrupt_ca(true)
            .build()
            .unwrap()
            .ca_rotation()
            .unwrap();
        let plan = ca(StoredCa::Unreadable("garbage".into()), &allowed, DAY, t0()).unwrap();
        assert!(matches!(
            &plan.changes[..],
            [CaChange::ReplacedCorrupt { .. }]
        ));
    }

    /// The whole rotation of a CA, stepped by hand: kept, announced beside the old one,
    /// switched to after the overlap, the old one served until it expires, then dropped.
    #[test]
    fn a_ca_is_announced_then_switched_to_then_the_old_one_leaves() {
        let overlap = Duration::from_secs(1800);
        let old = rotation(t0()).generate().unwrap();
        let state = CaState::new(old.clone());

        let fits = t0() + 5 * DAY;
        let plan = ca(
            StoredCa::Read(state.clone()),
            &rotation(fits),
            overlap,
            fits,
        )
        .unwrap();
        assert!(plan.changes.is_empty());
        assert_eq!(plan.state, state);

        let due = t0() + 25 * DAY;
        let plan = ca(StoredCa::Read(state), &rotation(due), overlap, due).unwrap();
        let switch_after = due + overlap;
        assert_eq!(plan.changes, [CaChange::Announced { switch_after }]);
        assert_eq!(plan.next_check, switch_after);
        assert_eq!(plan.state.signing, old, "still signing with the old CA");
        assert_eq!(
            certificates(&plan.state.served()),
            2,
            "ca.crt announces the next"
        );

        let later = switch_after;
        let plan = ca(StoredCa::Read(plan.state), &rotation(later), overlap, later).unwrap();
        assert_eq!(plan.changes, [CaChange::Switched]);
        assert_ne!(plan.state.signing, old);
        assert_eq!(plan.state.previous.as_deref(), Some(old.cert_pem.as_str()));
        assert_eq!(
            certificates(&plan.state.served()),
            2,
            "the old CA is still served"
        );
        let old_end = first_certificate(old.cert_pem.as_bytes())
            .unwrap()
            .not_after;
        assert_eq!(
            plan.next_check,
            later + RECHECK,
            "nothing is due within the hour"
        );
        let last_hour = old_end - Duration::from_secs(600);
        let plan = ca(
            StoredCa::Read(plan.state),
            &rotation(last_hour),
            overlap,
            last_hour,
        )
        .unwrap();
        assert_eq!(
            plan.next_check, old_end,
            "looked at again when the old CA expires"
        );

        let gone = old_end + Duration::from_secs(1);
        let plan = ca(StoredCa::Read(plan.state), &rotation(gone), overlap, gone).unwrap();
        assert!(plan.state.previous.is_none());
        assert_eq!(certificates(&plan.state.served()), 1);
    }

    #[test]
    fn an_expired_ca_is_replaced_without_an_overlap() {
        let old = rotation(t0()).generate().unwrap();
        let late = t0() + 40 * DAY;
        let plan = ca(
            StoredCa::Read(CaState::new(old.clone())),
            &rotation(late),
            DAY,
            late,
        )
        .unwrap();
        assert!(matches!(
            &plan.changes[..],
            [CaChange::ReplacedUnusable { .. }]
        ));
        assert_ne!(plan.state.signing, old);
        assert!(plan.state.previous.is_none() && plan.state.next.is_none());
    }

    /// A generator of self-signed leaves living 3 days (renewed a day before the end), on a
    /// clock reading `at`.
    fn leaves(at: SystemTime) -> SelfSigned {
        SelfSigned::builder()
            .dns_name("web.web.svc")
            .validity(3 * DAY)
            .clock(Arc::new(At(at)))
            .build()
            .unwrap()
    }

    #[test]
    fn a_fitting_leaf_is_reused_and_a_missing_one_generated() {
        let generator = leaves(t0());
        let plan = leaf(&generator, None, None).unwrap();
        assert!(matches!(plan.generated, Some(None)), "there was none");
        let (data, annotations) = &plan.content;
        let info = first_certificate(&data[crate::TLS_CRT]).unwrap();
        assert_eq!(plan.renew_after, info.not_after - DAY, "a third of 3 days");
        assert_eq!(
            annotations[RENEW_AFTER_ANNOTATION],
            Rfc3339(plan.renew_after).to_string()
        );
        let stored = Stored {
            fence: None,
            data: data.clone(),
            annotations: annotations.clone(),
        };
        let again = leaf(&generator, Some(&stored), Some("CA".into())).unwrap();
        assert!(again.generated.is_none());
        assert_eq!(again.content.0[crate::TLS_CRT], data[crate::TLS_CRT]);
        assert_eq!(again.content.0[crate::CA_CRT], b"CA");

        let due = plan.renew_after + Duration::from_secs(1);
        let renewed = leaf(&leaves(due), Some(&stored), None).unwrap();
        assert!(matches!(
            renewed.generated,
            Some(Some(Unfit::RenewalDue { .. }))
        ));
    }

    #[test]
    fn only_the_same_content_under_the_same_fence_is_unchanged() {
        let fence = Fence {
            round: 2,
            holder: "a".into(),
        };
        let content: Content = (
            BTreeMap::from([("tls.crt".into(), b"x".to_vec())]),
            BTreeMap::from([(RENEW_AFTER_ANNOTATION.into(), "t".into())]),
        );
        let stored = Stored {
            fence: Some(fence.clone()),
            data: content.0.clone(),
            annotations: BTreeMap::from([
                (RENEW_AFTER_ANNOTATION.into(), "t".into()),
                ("other".into(), "kept".into()),
            ]),
        };
        assert!(unchanged(Some(&stored), &fence, &content));
        let later = Fence { round: 3, ..fence };
        assert!(!unchanged(Some(&stored), &later, &content));
        assert!(!unchanged(None, &later, &content));
    }

    #[test]
    fn the_next_check_is_the_earliest_due_and_never_a_tight_loop() {
        let now = t0();
        assert_eq!(next_check(now, None, now + 2 * RECHECK), now + RECHECK);
        assert_eq!(
            next_check(now, Some(now + DAY), now + 2 * DAY),
            now + RECHECK
        );
        let soon = now + Duration::from_secs(5);
        assert_eq!(
            next_check(now, Some(soon), now + DAY),
            soon.max(now + MIN_RENEWAL_GAP)
        );
        assert_eq!(next_check(now, None, now - DAY), now + MIN_RENEWAL_GAP);
        let end = tls_source::clock::latest();
        assert_eq!(
            next_check(end, None, end),
            end,
            "the year 9999 does not overflow"
        );
    }
}
