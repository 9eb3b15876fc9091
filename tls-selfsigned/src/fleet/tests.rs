//! The fleet plan, stepped by hand.

use std::sync::Arc;

use crate::Clock;

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
    let info = first_certificate(&data[TLS_CRT]).unwrap();
    assert_eq!(plan.renew_after, info.not_after - DAY, "a third of 3 days");
    assert_eq!(
        annotations[RENEW_AFTER],
        Rfc3339(plan.renew_after).to_string()
    );
    let stored = data.clone();
    let again = leaf(&generator, Some(&stored), Some("CA".into())).unwrap();
    assert!(again.generated.is_none());
    assert_eq!(again.content.0[TLS_CRT], data[TLS_CRT]);
    assert_eq!(again.content.0[CA_CRT], b"CA");

    let due = plan.renew_after + Duration::from_secs(1);
    let renewed = leaf(&leaves(due), Some(&stored), None).unwrap();
    assert!(matches!(
        renewed.generated,
        Some(Some(Unfit::RenewalDue { .. }))
    ));
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

#[test]
fn a_candidacy_follows_whether_the_state_opens_and_says_what_is_new() {
    let candidacy = Candidacy::default();
    let (access, candidate) = (candidacy.access(), candidacy.candidate());
    assert_eq!(*access.borrow(), StateAccess::Unknown);
    assert!(
        !*candidate.borrow(),
        "not a candidate before the state is read"
    );
    assert!(!candidacy.open(), "nothing was refused");
    assert!(*candidate.borrow() && candidacy.is_open());
    assert!(candidacy.refuse("does not open".into()), "a new reason");
    assert!(!candidacy.refuse("does not open".into()), "reported once");
    assert!(
        candidacy.refuse("another key".into()),
        "another reason is new"
    );
    assert!(!*candidate.borrow() && !candidacy.is_open());
    assert_eq!(
        *access.borrow(),
        StateAccess::Refused {
            reason: "another key".into()
        }
    );
    assert!(candidacy.open(), "opens again after a refusal");
    assert!(*candidate.borrow());
}
