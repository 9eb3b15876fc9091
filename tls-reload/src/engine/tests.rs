//! The engine's decisions, driven by hand: real certificates from a test CA, a stepped `now`,
//! and the effects it returns. No runtime, no timers, no sleeps.

use std::time::{Duration, SystemTime};

use tls_source::{CertBundle, Keyed, KeyedUpdate};
use tls_test::TestCa;

use super::*;
use crate::status::RouteStatus;
use crate::testing::{bundle as bundle_of, provider};
use crate::{Policy, Purpose};

const DAY: Duration = Duration::from_secs(86_400);

/// The engine's "now" in these tests.
fn t0() -> SystemTime {
    tls_test::new_year(2030)
}

/// A bundle for `name`, valid from a day before [`t0`] for 30 days.
pub(crate) fn bundle(name: &str) -> CertBundle {
    valid(name, t0() - DAY, t0() + 30 * DAY)
}

fn valid(name: &str, not_before: SystemTime, not_after: SystemTime) -> CertBundle {
    valid_names(&[name], not_before, not_after)
}

fn valid_names(names: &[&str], not_before: SystemTime, not_after: SystemTime) -> CertBundle {
    bundle_of(
        &TestCa::new("engine").leaf_valid(names, not_before, not_after),
        None,
    )
}

fn validator() -> Validator {
    Validator::new(provider(), Policy::default())
}

fn default_engine() -> Engine {
    let mut engine = Engine::new(validator(), vec![Kind::Default], None);
    engine.start();
    engine
}

fn route(id: RouteId, bundle: CertBundle) -> Input {
    Input::Route(id, Ok(bundle))
}

fn keyed(key: &str, update: KeyedUpdate) -> Input {
    Input::Keyed(
        0,
        Ok(Keyed {
            key: key.to_owned(),
            update,
        }),
    )
}

/// The fingerprints installed, in order.
fn installs(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Install { validated, .. } => Some(validated.info().fingerprint_sha256.clone()),
            _ => None,
        })
        .collect()
}

fn publish(effects: &[Effect]) -> &Publish {
    match effects.last() {
        Some(Effect::Publish(publish)) => publish,
        other => panic!("a batch ends with its status, not {other:?}"),
    }
}

/// The published status of the default route (`None`) or a labelled one.
fn status<'a>(effects: &'a [Effect], label: Option<&str>) -> &'a RouteStatus {
    publish(effects)
        .routes
        .iter()
        .find(|(l, _)| l.as_deref() == label)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{label:?} is published"))
}

fn armed(effects: &[Effect]) -> Vec<(Due, SystemTime)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Arm(due, at) => Some((*due, *at)),
            _ => None,
        })
        .collect()
}

fn cancelled(effects: &[Effect]) -> Vec<Due> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Cancel(due) => Some(*due),
            _ => None,
        })
        .collect()
}

fn fingerprint(bundle: &CertBundle) -> String {
    tls_source::Digest::of(bundle.leaf().unwrap()).to_string()
}

fn error_of(status: &RouteStatus) -> &Error {
    status.last_error.as_deref().expect("an error is shown")
}

#[test]
fn a_good_bundle_is_installed_before_its_status_says_so() {
    let mut engine = Engine::new(validator(), vec![Kind::Default], None);
    let start = engine.start();
    assert!(!publish(&start).ready);
    let good = bundle("localhost");
    let effects = engine.batch(vec![route(0, good.clone())], t0());
    assert_eq!(installs(&effects), [fingerprint(&good)]);
    let install = effects
        .iter()
        .position(|e| matches!(e, Effect::Install { slot: None, .. }));
    assert!(
        install < Some(effects.len() - 1),
        "installed, then published"
    );
    let shown = status(&effects, None);
    assert_eq!(shown.generation, 1);
    assert_eq!(
        shown.current.as_ref().unwrap().fingerprint_sha256,
        fingerprint(&good)
    );
    assert!(publish(&effects).ready);
}

#[test]
fn a_bad_bundle_changes_only_the_status() {
    let mut engine = default_engine();
    let good = bundle("localhost");
    engine.batch(vec![route(0, good.clone())], t0());
    let expired = valid("localhost", t0() - 10 * DAY, t0() - DAY);
    let effects = engine.batch(vec![route(0, expired)], t0());
    assert!(installs(&effects).is_empty());
    let shown = status(&effects, None);
    assert!(matches!(error_of(shown), Error::Expired { .. }));
    assert_eq!(
        shown.current.as_ref().unwrap().fingerprint_sha256,
        fingerprint(&good)
    );
    assert!(publish(&effects).ready, "still serving the good one");
}

#[test]
fn the_installed_bundle_again_after_an_error_is_a_recovery_not_a_rotation() {
    let mut engine = default_engine();
    let good = bundle("localhost");
    engine.batch(vec![route(0, good.clone())], t0());
    let failed = Input::Route(0, Err(tls_source::Error::source("test", "read failed")));
    let effects = engine.batch(vec![failed], t0());
    assert!(matches!(error_of(status(&effects, None)), Error::Source(_)));
    let effects = engine.batch(vec![route(0, good)], t0());
    assert!(installs(&effects).is_empty());
    let shown = status(&effects, None);
    assert!(shown.last_error.is_none());
    assert_eq!(shown.generation, 1);
}

/// The coalescing case a property test found: a bundle and an error for its route in one
/// batch; the bundle is installed and the error shown.
#[test]
fn a_bundle_and_then_an_error_in_one_batch_installs_the_bundle() {
    let mut engine = default_engine();
    let good = bundle("localhost");
    let failed = Input::Route(0, Err(tls_source::Error::source("test", "watch failed")));
    let effects = engine.batch(vec![route(0, good.clone()), failed], t0());
    assert_eq!(installs(&effects), [fingerprint(&good)]);
    assert!(matches!(error_of(status(&effects, None)), Error::Source(_)));
}

#[test]
fn of_two_bundles_in_one_batch_only_the_last_is_checked() {
    let mut engine = default_engine();
    let (first, second) = (bundle("localhost"), bundle("localhost"));
    let effects = engine.batch(vec![route(0, first), route(0, second.clone())], t0());
    assert_eq!(installs(&effects), [fingerprint(&second)]);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Event(Event::Superseded { .. })))
    );
    assert_eq!(status(&effects, None).generation, 1);
}

#[test]
fn a_bundle_not_valid_yet_is_tried_again_at_its_not_before_and_not_earlier() {
    let mut engine = default_engine();
    let later = valid("localhost", t0() + 1000 * DAY, t0() + 3000 * DAY);
    let not_before = t0() + 1000 * DAY;
    let effects = engine.batch(vec![route(0, later.clone())], t0());
    assert!(matches!(
        error_of(status(&effects, None)),
        Error::NotYetValid { .. }
    ));
    assert_eq!(armed(&effects), [(Due::Retry(0), not_before)]);

    let early = engine.due(Due::Retry(0), not_before - Duration::from_secs(1));
    assert!(installs(&early).is_empty());
    assert_eq!(armed(&early), [(Due::Retry(0), not_before)], "armed again");

    let effects = engine.due(Due::Retry(0), not_before);
    assert_eq!(installs(&effects), [fingerprint(&later)]);
    assert!(status(&effects, None).last_error.is_none());
}

#[test]
fn anything_newer_cancels_a_pending_retry() {
    let mut engine = default_engine();
    let later = valid("localhost", t0() + DAY, t0() + 30 * DAY);
    engine.batch(vec![route(0, later)], t0());
    let good = bundle("localhost");
    let effects = engine.batch(vec![route(0, good.clone())], t0());
    assert_eq!(cancelled(&effects), [Due::Retry(0)]);
    assert_eq!(installs(&effects), [fingerprint(&good)]);
    // A stale timer firing anyway does nothing.
    let stale = engine.due(Due::Retry(0), t0() + 2 * DAY);
    assert!(installs(&stale).is_empty());
}

#[test]
fn the_warning_and_the_expiry_come_when_the_clock_says_so() {
    let mut engine = default_engine();
    let not_after = t0() + 1000 * DAY;
    let long = valid("localhost", t0() - DAY, not_after);
    let effects = engine.batch(vec![route(0, long)], t0());
    let warning = not_after - 7 * DAY;
    let end = not_after + Duration::from_millis(1);
    // One timer at a time per route: the warning's, then the expiry's.
    assert_eq!(armed(&effects), [(Due::Expiring(0), warning)]);
    assert!(!status(&effects, None).expiring);

    let effects = engine.due(Due::Expiring(0), warning);
    let shown = status(&effects, None);
    assert!(shown.expiring && !shown.expired);
    assert_eq!(armed(&effects), [(Due::Expired(0), end)]);

    let early = engine.due(Due::Expired(0), not_after - DAY);
    assert_eq!(armed(&early), [(Due::Expired(0), end)]);
    assert!(publish(&early).routes.is_empty(), "nothing changed");

    let effects = engine.due(Due::Expired(0), end);
    let shown = status(&effects, None);
    assert!(shown.expired && shown.expiring);
    assert!(matches!(error_of(shown), Error::ServedExpired { .. }));
}

/// RFC 5280's "no well-defined expiration" and a start in 1950: timers for 9999, no panic,
/// and the status formats both.
#[test]
fn a_certificate_from_1950_to_9999_is_served_and_timed() {
    let mut engine = default_engine();
    let end = tls_source::clock::latest();
    let forever = valid("localhost", tls_test::new_year(1950), end);
    let effects = engine.batch(vec![route(0, forever.clone())], t0());
    assert_eq!(installs(&effects), [fingerprint(&forever)]);
    assert_eq!(armed(&effects), [(Due::Expiring(0), end - 7 * DAY)]);
    let timers = armed(&engine.due(Due::Expiring(0), end - 7 * DAY));
    assert_eq!(timers[0].0, Due::Expired(0));
    assert!(timers[0].1 >= end);
    let info = status(&effects, None).current.clone().unwrap();
    assert_eq!(
        crate::Rfc3339(info.not_before).to_string(),
        "1950-01-01T00:00:00Z"
    );
}

#[test]
fn a_new_certificate_replaces_the_timers_of_the_old() {
    let mut engine = default_engine();
    engine.batch(vec![route(0, bundle("localhost"))], t0());
    // A certificate already in its warning window has no warning timer: it is cancelled.
    let short = valid("localhost", t0() - DAY, t0() + DAY);
    let effects = engine.batch(vec![route(0, short)], t0());
    assert_eq!(cancelled(&effects), [Due::Expiring(0)]);
    assert_eq!(armed(&effects)[0].0, Due::Expired(0));
    assert!(status(&effects, None).expiring);
}

#[test]
fn named_routes_are_checked_for_their_name_and_all_must_be_in_for_ready() {
    let names =
        ["a.example.com", "b.example.com"].map(|n| Kind::Named(RouteName::parse(n).unwrap()));
    let mut engine = Engine::new(validator(), names.into(), None);
    engine.start();
    let effects = engine.batch(vec![route(0, bundle("a.example.com"))], t0());
    assert!(!publish(&effects).ready, "b is missing");
    let wrong = engine.batch(vec![route(1, bundle("c.example.com"))], t0());
    assert!(matches!(
        error_of(status(&wrong, Some("b.example.com"))),
        Error::NameNotCovered { .. }
    ));
    let effects = engine.batch(vec![route(1, bundle("b.example.com"))], t0());
    assert!(publish(&effects).ready);
    assert_eq!(installs(&effects).len(), 1);
}

#[test]
fn keyed_routes_come_and_go_with_their_keys() {
    let mut engine = Engine::new(validator(), Vec::new(), None);
    let mut served = Table::default();
    apply_table(&mut served, &engine.start());
    let a = bundle("a.example.com");
    let effects = engine.batch(vec![keyed("ns/a", KeyedUpdate::Put(a.clone()))], t0());
    apply_table(&mut served, &effects);
    assert_eq!(served.len(), 1, "its one name");
    assert_eq!(served_for(&served, "a.example.com"), Some(fingerprint(&a)));
    assert_eq!(status(&effects, Some("ns/a")).names, ["a.example.com"]);
    assert!(publish(&effects).ready);

    let effects = engine.batch(vec![keyed("ns/a", KeyedUpdate::Remove)], t0());
    assert_eq!(
        cancelled(&effects),
        [Due::Expiring(0)],
        "one timer at a time"
    );
    assert_eq!(publish(&effects).removed, [Label::from("ns/a")]);
    apply_table(&mut served, &effects);
    assert_eq!(served.len(), 0);
    assert!(!publish(&effects).ready);
}

#[test]
fn a_keyed_certificate_for_an_address_is_served_by_it_and_one_with_no_name_is_refused() {
    let mut engine = Engine::new(validator(), Vec::new(), None);
    let mut served = Table::default();
    apply_table(&mut served, &engine.start());
    let ip_only = bundle("127.0.0.2");
    let effects = engine.batch(
        vec![keyed("ns/ip", KeyedUpdate::Put(ip_only.clone()))],
        t0(),
    );
    assert_eq!(installs(&effects), [fingerprint(&ip_only)]);
    assert_eq!(status(&effects, Some("ns/ip")).names, ["127.0.0.2"]);
    apply_table(&mut served, &effects);
    let by_address = served
        .lookup_addr("127.0.0.2".parse().unwrap())
        .map(|key| tls_source::Digest::of(&key.cert[0]).to_string());
    assert_eq!(by_address, Some(fingerprint(&ip_only)));
    assert_eq!(served_for(&served, "127.0.0.2"), None, "not a server name");

    let nameless = valid_names(&[], t0() - DAY, t0() + 30 * DAY);
    let effects = engine.batch(vec![keyed("ns/none", KeyedUpdate::Put(nameless))], t0());
    assert!(matches!(
        error_of(status(&effects, Some("ns/none"))),
        Error::NoNames { .. }
    ));
    assert!(installs(&effects).is_empty());
}

#[test]
fn a_keyed_source_error_is_shown_on_each_of_its_routes() {
    let mut engine = Engine::new(validator(), Vec::new(), None);
    engine.start();
    engine.batch(
        vec![
            keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com"))),
            keyed("ns/b", KeyedUpdate::Put(bundle("b.example.com"))),
        ],
        t0(),
    );
    let failed = Input::Keyed(0, Err(tls_source::Error::source("watch", "410 Gone")));
    let effects = engine.batch(vec![failed], t0());
    for key in ["ns/a", "ns/b"] {
        assert!(matches!(
            error_of(status(&effects, Some(key))),
            Error::Source(_)
        ));
    }
}

#[test]
fn a_panicked_source_stops_its_route_which_keeps_serving() {
    let mut engine = default_engine();
    let good = bundle("localhost");
    engine.batch(vec![route(0, good.clone())], t0());
    let effects = engine.batch(vec![Input::Panicked(Place::Route(0), "boom".into())], t0());
    let shown = status(&effects, None);
    assert!(shown.stopped);
    assert!(matches!(error_of(shown), Error::SourcePanicked { .. }));
    assert_eq!(
        shown.current.as_ref().unwrap().fingerprint_sha256,
        fingerprint(&good)
    );
    assert!(publish(&effects).ready);
}

fn mtls_engine(overlap: Duration) -> Engine {
    let trust = TrustSet::new(overlap, true);
    let mut engine = Engine::new(validator(), vec![Kind::Default], Some(trust));
    engine.start();
    engine
}

fn trust_effect(effects: &[Effect]) -> Option<(usize, bool)> {
    effects.iter().find_map(|e| match e {
        Effect::Trust { roots, invalidate } => Some((roots.len(), *invalidate)),
        _ => None,
    })
}

#[test]
fn with_client_auth_from_the_bundle_a_bundle_without_a_ca_is_refused() {
    let mut engine = mtls_engine(Duration::ZERO);
    let effects = engine.batch(vec![route(0, bundle("localhost"))], t0());
    assert!(matches!(
        error_of(status(&effects, None)),
        Error::NoClientCa { .. }
    ));
    assert!(!publish(&effects).ready);
}

#[test]
fn a_client_ca_that_left_is_trusted_for_the_overlap_then_its_sessions_go() {
    let overlap = Duration::from_secs(60);
    let mut engine = mtls_engine(overlap);
    let (old, new) = (TestCa::new("old"), TestCa::new("new"));
    let leaf = |ca: &TestCa| {
        bundle_of(
            &ca.leaf_valid(&["localhost"], t0() - DAY, t0() + DAY),
            Some(ca),
        )
    };
    let effects = engine.batch(vec![route(0, leaf(&old))], t0());
    assert_eq!(trust_effect(&effects), Some((1, false)));
    assert!(publish(&effects).ready);
    assert_eq!(publish(&effects).trust.as_ref().unwrap().0.len(), 1);

    let effects = engine.batch(vec![route(0, leaf(&new))], t0());
    assert_eq!(trust_effect(&effects), Some((2, false)));
    let leaves = t0() + overlap + Duration::from_millis(1);
    assert!(armed(&effects).contains(&(Due::TrustLeaves, leaves)));

    let effects = engine.due(Due::TrustLeaves, leaves);
    assert_eq!(trust_effect(&effects), Some((1, true)));
    assert_eq!(cancelled(&effects), [Due::TrustLeaves]);
}

#[test]
fn a_client_identity_must_bring_the_roots_it_trusts_servers_with() {
    let policy = Policy::default().purpose(Purpose::Any);
    let validator = Validator::new(provider(), policy);
    let mut engine = Engine::new(
        validator,
        vec![Kind::Client(crate::tls::client::Roots::default())],
        None,
    );
    engine.start();
    let effects = engine.batch(vec![route(0, bundle("client"))], t0());
    assert!(matches!(
        error_of(status(&effects, None)),
        Error::Untrusted { .. }
    ));
    let ca = TestCa::new("servers");
    let with_roots = bundle_of(
        &ca.leaf_valid(&["client"], t0() - DAY, t0() + DAY),
        Some(&ca),
    );
    let effects = engine.batch(vec![route(0, with_roots.clone())], t0());
    assert_eq!(installs(&effects), [fingerprint(&with_roots)]);
}

/// The table a batch's effects install, if one.
fn table(effects: &[Effect]) -> Option<&Table> {
    effects.iter().find_map(|e| match e {
        Effect::Table(table) => Some(table),
        _ => None,
    })
}

/// An engine serving a default certificate, with one keyed source whose list gates readiness
/// (`gate`), or not.
fn listing_engine(gate: bool) -> Engine {
    let mut engine = Engine::new(validator(), vec![Kind::Default], None);
    engine.keyed_sources(1, gate);
    engine.serve_default_by_name();
    engine.start();
    engine
}

#[test]
fn a_listing_source_is_served_and_ready_only_once_its_list_is_in() {
    let mut engine = listing_engine(true);
    let mut served = Table::default();
    let effects = engine.batch(vec![route(0, bundle("localhost"))], t0());
    apply_table(&mut served, &effects);
    assert!(!publish(&effects).ready, "the list is not in yet");
    let effects = engine.batch(
        vec![
            Input::Keyed(0, Ok(Keyed::listing())),
            keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com"))),
        ],
        t0(),
    );
    assert!(!publish(&effects).ready);
    assert_eq!(
        installs(&effects).len(),
        1,
        "checked and stored as it comes"
    );
    apply_table(&mut served, &effects);
    assert_eq!(
        served_for(&served, "a.example.com"),
        None,
        "but not served before the list is in"
    );
    // One bad key among the list: reported, and it does not hold readiness back.
    let bad = valid("b.example.com", t0() - 30 * DAY, t0() - DAY);
    let effects = engine.batch(
        vec![
            keyed("ns/b", KeyedUpdate::Put(bad)),
            Input::Keyed(0, Ok(Keyed::listed())),
        ],
        t0(),
    );
    assert!(publish(&effects).ready, "every listed key considered");
    assert!(table(&effects).is_some(), "the whole list in one table");
    apply_table(&mut served, &effects);
    assert!(served_for(&served, "a.example.com").is_some());
    assert!(
        served_for(&served, "localhost").is_some(),
        "the default by its names"
    );
    assert!(status(&effects, Some("ns/b")).last_error.is_some());
    // A relist changes nothing: no table, still ready.
    let effects = engine.batch(
        vec![
            Input::Keyed(0, Ok(Keyed::listing())),
            keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com"))),
        ],
        t0(),
    );
    assert!(publish(&effects).ready);
    assert!(table(&effects).is_none(), "{effects:?}");
}

#[test]
fn a_source_that_never_lists_counts_as_listed_at_its_first_item() {
    let mut engine = listing_engine(true);
    let mut served = Table::default();
    apply_table(
        &mut served,
        &engine.batch(vec![route(0, bundle("localhost"))], t0()),
    );
    let effects = engine.batch(
        vec![keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com")))],
        t0(),
    );
    assert!(publish(&effects).ready);
    apply_table(&mut served, &effects);
    assert!(served_for(&served, "a.example.com").is_some());
}

#[test]
fn a_source_that_has_said_nothing_keeps_the_engine_unready_unless_told_otherwise() {
    let mut waiting = listing_engine(true);
    let effects = waiting.batch(vec![route(0, bundle("localhost"))], t0());
    assert!(!publish(&effects).ready, "the route source is unheard of");
    let mut serving = listing_engine(false);
    let mut served = Table::default();
    let effects = serving.batch(vec![route(0, bundle("localhost"))], t0());
    apply_table(&mut served, &effects);
    assert!(
        publish(&effects).ready,
        "ready before the lists: the default serves"
    );
    assert!(served_for(&served, "localhost").is_some());
    let effects = serving.batch(
        vec![
            Input::Keyed(0, Ok(Keyed::listing())),
            keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com"))),
        ],
        t0(),
    );
    assert!(publish(&effects).ready);
    apply_table(&mut served, &effects);
    assert_eq!(
        served_for(&served, "a.example.com"),
        None,
        "the routes join when their list is in"
    );
    let effects = serving.batch(vec![Input::Keyed(0, Ok(Keyed::listed()))], t0());
    apply_table(&mut served, &effects);
    assert!(served_for(&served, "a.example.com").is_some());
}

#[test]
fn a_source_that_panics_while_listing_has_its_listed_routes_served() {
    let mut engine = listing_engine(true);
    let mut served = Table::default();
    let effects = engine.batch(
        vec![
            route(0, bundle("localhost")),
            Input::Keyed(0, Ok(Keyed::listing())),
            keyed("ns/a", KeyedUpdate::Put(bundle("a.example.com"))),
        ],
        t0(),
    );
    apply_table(&mut served, &effects);
    let effects = engine.batch(
        vec![Input::Panicked(Place::Keyed(0), "boom".to_owned())],
        t0(),
    );
    assert!(publish(&effects).ready);
    apply_table(&mut served, &effects);
    assert!(served_for(&served, "a.example.com").is_some());
}

/// What a resolver would serve after `effects`: the table replaced or edited, and each
/// certificate stored into its slot.
fn apply_table(served: &mut Table, effects: &[Effect]) {
    for effect in effects {
        match effect {
            Effect::Install {
                slot: Some(slot),
                validated,
                ..
            } => slot.store(Some(Arc::clone(validated.certified_key()))),
            Effect::Table(table) => *served = table.clone(),
            Effect::TableEdit(edits) => served.edit(edits),
            _ => {}
        }
    }
}

fn served_for(table: &Table, name: &str) -> Option<String> {
    table
        .lookup(name)
        .map(|key| tls_source::Digest::of(&key.cert[0]).to_string())
}

#[test]
fn a_change_edits_only_its_names_and_a_shared_name_goes_to_the_smallest_key() {
    let mut engine = Engine::new(validator(), Vec::new(), None);
    let mut served = Table::default();
    apply_table(&mut served, &engine.start());
    let (a, b) = (bundle("x.example.com"), bundle("x.example.com"));
    let only_b = bundle("y.example.com");
    let effects = engine.batch(
        vec![
            keyed("ns/b", KeyedUpdate::Put(b.clone())),
            keyed("ns/c", KeyedUpdate::Put(only_b.clone())),
        ],
        t0(),
    );
    apply_table(&mut served, &effects);
    assert_eq!(served_for(&served, "x.example.com"), Some(fingerprint(&b)));
    // A smaller key claims the same name: it takes it, with an edit of that one name, and the
    // key that lost it is told.
    let effects = engine.batch(vec![keyed("ns/a", KeyedUpdate::Put(a.clone()))], t0());
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Table(_))),
        "no rebuild for one change"
    );
    let edited: Vec<String> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::TableEdit(edits) => Some(edits.iter().map(|(n, _)| n.to_string())),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(edited, ["x.example.com"]);
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::Event(Event::NameTaken { route: Some(r), .. }) if &**r == "ns/b"
    )));
    apply_table(&mut served, &effects);
    assert_eq!(served_for(&served, "x.example.com"), Some(fingerprint(&a)));
    assert_eq!(
        served_for(&served, "y.example.com"),
        Some(fingerprint(&only_b))
    );
    // It goes: the name passes back to the next claimant.
    let effects = engine.batch(vec![keyed("ns/a", KeyedUpdate::Remove)], t0());
    apply_table(&mut served, &effects);
    assert_eq!(served_for(&served, "x.example.com"), Some(fingerprint(&b)));
    // A rotation to other names: the old name is no longer served by it.
    let moved = bundle("z.example.com");
    let effects = engine.batch(vec![keyed("ns/c", KeyedUpdate::Put(moved.clone()))], t0());
    apply_table(&mut served, &effects);
    assert_eq!(served_for(&served, "y.example.com"), None);
    assert_eq!(
        served_for(&served, "z.example.com"),
        Some(fingerprint(&moved))
    );
}

/// A batch of many keyed bundles is checked ahead on every core (`ahead`): what is installed,
/// refused and published is what checking them one by one gives, in the batch's order, and
/// material a route already serves is not installed again.
#[test]
fn a_large_batch_checked_ahead_installs_and_refuses_as_one_by_one() {
    const KEYS: usize = 40;
    let ca = TestCa::new("ahead");
    let bundles: Vec<CertBundle> = (0..KEYS)
        .map(|i| {
            let name = format!("h{i}.example.com");
            if i % 10 == 3 {
                // Expired: refused.
                bundle_of(&ca.leaf_valid(&[&name], t0() - 30 * DAY, t0() - DAY), None)
            } else {
                bundle_of(&ca.leaf_valid(&[&name], t0() - DAY, t0() + 30 * DAY), None)
            }
        })
        .collect();
    let batch = |bundles: &[CertBundle]| -> Vec<Input> {
        bundles
            .iter()
            .enumerate()
            .map(|(i, b)| keyed(&format!("ns/{i}"), KeyedUpdate::Put(b.clone())))
            .collect()
    };
    let mut ahead = Engine::new(validator(), Vec::new(), None);
    ahead.start();
    let together = ahead.batch(batch(&bundles), t0());
    let mut alone = Engine::new(validator(), Vec::new(), None);
    alone.start();
    let mut one_by_one = Vec::new();
    for input in batch(&bundles) {
        one_by_one.extend(alone.batch(vec![input], t0()));
    }
    let expected: Vec<String> = bundles
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 3)
        .map(|(_, b)| fingerprint(b))
        .collect();
    assert_eq!(installs(&together), expected, "in the batch's order");
    assert_eq!(installs(&one_by_one), expected);
    for i in (3..KEYS).step_by(10) {
        let label = format!("ns/{i}");
        assert!(matches!(
            error_of(status(&together, Some(&label))),
            Error::Expired { .. }
        ));
    }
    assert_eq!(status(&together, Some("ns/0")).generation, 1);
    // The same list again (a relist): nothing is installed anew.
    let again = ahead.batch(batch(&bundles), t0());
    assert!(installs(&again).is_empty(), "{again:?}");
}
