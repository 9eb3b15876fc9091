//! DNS-01 by RFC 2136 against a real BIND 9 (`named`, Debian package `bind9`), started per test
//! on a loopback port as the primary of `example.test` and `delegated.test`, whose
//! `update-policy` grants the test key only the challenge records. With Pebble (its validator
//! asking that BIND): a wildcard issued and served, nothing left in the zone, also after a
//! restart in the middle of an order.

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;

use tls_acme::rfc2136::{Rfc2136, TsigKey};
use tls_acme::{ChallengeType, Dns01Solver as _};
use tls_test::{Bind, PATIENCE, Pebble, UNGRANTED_KEY, UPDATE_KEY};
use tokio::net::TcpListener;

const RECORD: &str = "_acme-challenge.w.example.test";

async fn bind() -> Bind {
    Bind::builder()
        .zone(
            "example.test",
            &[
                "w IN A 127.0.0.1",
                "*.w IN A 127.0.0.1",
                "_acme-challenge.c IN CNAME c.delegated.test.",
                "_acme-challenge.other IN TXT \"someone-else\"",
            ],
        )
        .zone("delegated.test", &[])
        .grant("name _acme-challenge.w.example.test. TXT")
        .grant("name _acme-challenge.other.example.test. TXT")
        .grant("name c.delegated.test. TXT")
        .start()
        .await
        .expect("BIND is needed (the test is ignored where it is not installed)")
}

fn solver(bind: &Bind, key: &str) -> Rfc2136 {
    let key = TsigKey::from_file(bind.key_file(key)).expect("the key file");
    Rfc2136::new(bind.addr().to_string(), key)
        .expect("a solver")
        .propagation(PATIENCE, Duration::from_millis(50))
        // Hermetic: a name outside BIND's zones is asked of no resolver of the machine's.
        .resolvers(Vec::new())
}

/// The records of a zone, as an AXFR lists them, but its SOA (whose serial every update
/// changes).
async fn records(bind: &Bind, zone: &str) -> Vec<String> {
    bind.zone_records(zone)
        .await
        .into_iter()
        .filter(|r| !r.contains("\tSOA\t"))
        .collect()
}

#[cfg_attr(not(bind), ignore = "needs BIND 9 (apt install bind9 bind9-dnsutils)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_added_and_deleted_one_by_one_and_a_value_of_anyone_else_stays() {
    tokio::time::timeout(PATIENCE * 2, async {
        let bind = bind().await;
        let dns = solver(&bind, UPDATE_KEY);

        // An apex and its wildcard: two values at one name, both answered.
        dns.present(RECORD, "apex-value").await.expect("published");
        dns.present(RECORD, "wildcard-value")
            .await
            .expect("published");
        let mut values = bind.txt(RECORD).await;
        values.sort();
        assert_eq!(values, ["apex-value", "wildcard-value"]);
        dns.clean_up(RECORD, "apex-value").await.expect("removed");
        assert_eq!(bind.txt(RECORD).await, ["wildcard-value"]);
        dns.clean_up(RECORD, "wildcard-value")
            .await
            .expect("removed");
        assert!(bind.txt(RECORD).await.is_empty());
        // Removing what is not there is no error (a restart's clean-up of a finished order).
        dns.clean_up(RECORD, "wildcard-value")
            .await
            .expect("nothing to do");

        // A value someone else put there stays.
        let other = "_acme-challenge.other.example.test";
        dns.present(other, "ours").await.expect("published");
        let mut values = bind.txt(other).await;
        values.sort();
        assert_eq!(values, ["ours", "someone-else"]);
        dns.clean_up(other, "ours").await.expect("removed");
        assert_eq!(bind.txt(other).await, ["someone-else"]);
    })
    .await
    .expect("in time");
}

#[cfg_attr(not(bind), ignore = "needs BIND 9 (apt install bind9 bind9-dnsutils)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cname_is_followed_into_the_zone_it_names() {
    tokio::time::timeout(PATIENCE * 2, async {
        let bind = bind().await;
        let dns = solver(&bind, UPDATE_KEY);
        let record = "_acme-challenge.c.example.test";
        dns.present(record, "through-the-cname")
            .await
            .expect("published");
        assert_eq!(bind.txt("c.delegated.test").await, ["through-the-cname"]);
        // What a CA's resolver finds: the CNAME, which leads to the value.
        assert_eq!(bind.short("CNAME", record).await, ["c.delegated.test."]);
        assert!(
            !bind
                .zone_records("example.test")
                .await
                .iter()
                .any(|r| r.contains("\tTXT\t") && r.contains("through-the-cname")),
            "nothing is written beside the CNAME"
        );
        dns.clean_up(record, "through-the-cname")
            .await
            .expect("removed");
        assert!(bind.txt("c.delegated.test").await.is_empty());
    })
    .await
    .expect("in time");
}

#[cfg_attr(not(bind), ignore = "needs BIND 9 (apt install bind9 bind9-dnsutils)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_update_names_the_zone_the_server_and_why_and_changes_nothing() {
    tokio::time::timeout(PATIENCE * 2, async {
        let bind = bind().await;
        let server = bind.addr().to_string();

        // A key the server knows but whose policy grants nothing.
        let error = solver(&bind, UNGRANTED_KEY)
            .present(RECORD, "v")
            .await
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("example.test") && error.contains(&server) && error.contains("REFUSED"),
            "{error}"
        );

        // The right name with another secret: the server says the signature is wrong.
        let wrong = TsigKey::new(UPDATE_KEY, "hmac-sha256", vec![7; 32]).unwrap();
        let error = Rfc2136::new(server.clone(), wrong)
            .unwrap()
            .present(RECORD, "v")
            .await
            .expect_err("bad signature")
            .to_string();
        assert!(
            error.contains("BADSIG") && error.contains(&server),
            "{error}"
        );

        // The right key, signed by a clock an hour behind the server's.
        let behind = tls_source::clock::SteppedClock::starting_at(
            std::time::SystemTime::now() - Duration::from_secs(3600),
        );
        let error = solver(&bind, UPDATE_KEY)
            .clock(Arc::new(behind))
            .present(RECORD, "v")
            .await
            .expect_err("bad time")
            .to_string();
        assert!(
            error.contains("BADTIME") && error.contains(&server),
            "{error}"
        );

        // A key the server does not know.
        let unknown = TsigKey::new("nobody", "hmac-sha256", vec![7; 32]).unwrap();
        let error = Rfc2136::new(server.clone(), unknown)
            .unwrap()
            .present(RECORD, "v")
            .await
            .expect_err("unknown key")
            .to_string();
        assert!(error.contains("BADKEY"), "{error}");

        // A name in no zone of the server's.
        let error = solver(&bind, UPDATE_KEY)
            .present("_acme-challenge.elsewhere.invalid", "v")
            .await
            .expect_err("no zone")
            .to_string();
        assert!(
            error.contains("holds no zone") && error.contains(&server),
            "{error}"
        );

        assert!(bind.txt(RECORD).await.is_empty(), "nothing was written");
        assert!(
            !error.contains(&std::fs::read_to_string(bind.key_file(UPDATE_KEY)).unwrap()),
            "no key in errors"
        );
    })
    .await
    .expect("in time");
}

/// A Pebble whose validator resolves through `bind`.
async fn pebble(bind: &Bind) -> Pebble {
    Pebble::builder()
        .dns_server(bind.addr())
        .start_required()
        .await
}

fn client(
    directory: &str,
    pebble: &Pebble,
    state: &std::path::Path,
    bind: &Bind,
) -> tls_acme::AcmeBuilder {
    client_at(directory, pebble, state)
        .challenge(ChallengeType::Dns01)
        .dns01_solver(Arc::new(solver(bind, UPDATE_KEY)))
}

#[cfg_attr(
    not(all(pebble, bind)),
    ignore = "needs Pebble and BIND 9 (apt install pebble bind9 bind9-dnsutils)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_update_is_the_names_last_error_and_it_backs_off() {
    let bind = bind().await;
    let pebble = pebble(&bind).await;
    let state = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(
        client(&pebble.directory_url(), &pebble, state.path(), &bind)
            .dns01_solver(Arc::new(solver(&bind, UNGRANTED_KEY)))
            .name("*.w.example.test"),
        listener,
    );
    let status = server
        .until("the name backing off", |s| {
            s.names["*.w.example.test"].state == tls_acme::NameState::Backoff
        })
        .await;
    let name = &status.names["*.w.example.test"];
    let error = name.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("REFUSED")
            && error.contains("example.test")
            && error.contains(&bind.addr().to_string()),
        "{status:#?}"
    );
    assert!(name.retry_at.is_some(), "{status:#?}");
    assert!(bind.txt(RECORD).await.is_empty(), "nothing was published");
}

#[cfg_attr(
    not(all(pebble, bind)),
    ignore = "needs Pebble and BIND 9 (apt install pebble bind9 bind9-dnsutils)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_is_issued_through_bind_and_served_and_no_record_is_left() {
    let bind = bind().await;
    let pebble = pebble(&bind).await;
    let state = tempfile::tempdir().unwrap();
    let before = records(&bind, "example.test").await;
    assert!(
        before.iter().any(|r| r.contains("someone-else")),
        "{before:?}"
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(
        client(&pebble.directory_url(), &pebble, state.path(), &bind).name("*.w.example.test"),
        listener,
    );
    server.until("the wildcard issued", all_valid).await;
    let root = pebble.issuing_root().await;
    assert_served(
        server.addr,
        &["x.w.example.test", "y.w.example.test"],
        &root,
    )
    .await;
    assert_eq!(pebble.orders(), 1);
    assert_eq!(
        records(&bind, "example.test").await,
        before,
        "the zone as it was"
    );
}

#[cfg_attr(
    not(all(pebble, bind)),
    ignore = "needs Pebble and BIND 9 (apt install pebble bind9 bind9-dnsutils)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_dns_01_order_leaves_no_record_behind() {
    let bind = bind().await;
    let pebble = pebble(&bind).await;
    let layer = pebble.layer().await;
    let state = tempfile::tempdir().unwrap();

    let before = records(&bind, "example.test").await;
    // The first run publishes its record, and stops while the CA has not been told.
    layer.hold_next("/chalZ/", false);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let first = Server::start(
        client(&layer.directory_url(), &pebble, state.path(), &bind).name("*.w.example.test"),
        listener,
    );
    layer.until_held().await;
    let left = bind.txt(RECORD).await;
    assert_eq!(left.len(), 1, "published before the CA is told");
    drop(first);

    // The next run (the apex joined the certificate, so the order is a new one, with values of
    // its own) removes the value the first left: no one else would.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = Server::start(
        client(&layer.directory_url(), &pebble, state.path(), &bind)
            .group(["*.w.example.test", "w.example.test"]),
        listener,
    );
    second.until("the wildcard issued", all_valid).await;
    let root = pebble.issuing_root().await;
    assert_served(second.addr, &["x.w.example.test", "w.example.test"], &root).await;
    assert_eq!(pebble.orders(), 2);
    assert_eq!(
        records(&bind, "example.test").await,
        before,
        "the zone as it was"
    );
}
