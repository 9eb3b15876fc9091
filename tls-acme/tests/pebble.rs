//! tls-acme against Pebble, Let's Encrypt's ACME test server (Debian package `pebble`): each
//! test starts its own Pebble and DNS server (challtestsrv, which resolves every name to
//! 127.0.0.1 unless told otherwise), a real server of ours on loopback, and checks what a
//! client is served against Pebble's issuing root. Orders are counted in Pebble's log.
//!
//! Faults injected: a name whose validation the CA cannot complete (its name resolves to an
//! address where nothing answers), a directory URL that is not an ACME directory, a directory
//! whose HTTPS certificate is not trusted, a stored certificate that was damaged on disk. Pebble
//! 2.4 has neither ARI nor rate limits: a small HTTPS layer in front of it
//! ([`tls_test::AcmeLayer`]) adds a suggested renewal window, `alreadyReplaced`, a 429
//! `rateLimited` with `Retry-After`, and a certificate cut short.

mod common;

use common::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use tls_acme::{
    Acme, AcmeBuilder, AcmeStatus, ChallengeType, Dns01Solver, NameState, SolverFuture,
};
use tls_test::{PATIENCE, Pebble, probe_trusting};
use tokio::net::TcpListener;

fn client(pebble: &Pebble, state: &Path) -> AcmeBuilder {
    client_at(&pebble.directory_url(), pebble, state)
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_01_issues_every_name_and_a_restart_serves_what_is_stored_ordering_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let state = tempfile::tempdir().unwrap();
    let names = ["a.example.com", "b.example.com", "c.example.net"];
    let mut builder = client(&pebble, state.path());
    for name in names {
        builder = builder.name(name);
    }
    let server = Server::start(builder, listener);
    // Before anything is stored, the CA's validation gets through while other handshakes are
    // refused: the names are issued through the same port.
    let status = server
        .until("every name issued and scheduled", |s| {
            all_valid(s) && s.names.values().all(|n| n.renew_after.is_some())
        })
        .await;
    assert!(status.account.is_some(), "{status:#?}");
    let root = pebble.issuing_root().await;
    server.reloader.ready_timeout(PATIENCE).await.unwrap();
    assert_served(server.addr, &names, &root).await;
    assert!(
        probe_trusting(
            server.addr,
            "other.example.com",
            std::slice::from_ref(&root)
        )
        .await
        .is_err(),
        "a name that is not configured is refused (strict SNI)"
    );
    assert_eq!(pebble.orders(), 3, "{}", pebble.log());
    for name in names {
        let renew = status.names[name].renew_after.expect("a renewal time");
        let not_after = status.names[name].not_after.expect("an end");
        assert!(
            renew > SystemTime::now() && renew < not_after,
            "{name}: {status:#?}"
        );
    }
    let key = state.path().join("certs/a.example.com/tls.key");
    assert_eq!(
        mode(&key) & 0o077,
        0,
        "the key is readable by its owner only"
    );

    // Restart on the same state: served at once, nothing ordered.
    let addr = server.addr;
    drop(server);
    let listener = rebind(addr).await;
    let mut builder = client(&pebble, state.path());
    for name in names {
        builder = builder.name(name);
    }
    let server = Server::start(builder, listener);
    server.reloader.ready_timeout(PATIENCE).await.unwrap();
    assert_served(server.addr, &names, &root).await;
    let status = server
        .until("every name scheduled for renewal", |s| {
            all_valid(s) && s.names.values().all(|n| n.renew_after.is_some())
        })
        .await;
    assert!(
        status
            .names
            .values()
            .all(|n| n.renew_after.unwrap() > SystemTime::now()),
        "nothing due: {status:#?}"
    );
    assert_eq!(pebble.orders(), 3, "a restart orders nothing");
    assert_eq!(
        pebble.log_matching("POST /sign-me-up"),
        1,
        "the stored account is used"
    );
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_answered_by_the_tower_service_mounted_in_axum() {
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_port = http.local_addr().unwrap().port();
    let pebble = Pebble::builder()
        .http_port(http_port)
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(
        client(&pebble, state.path())
            .name("web.example.com")
            .challenge(ChallengeType::Http01),
        listener,
    );
    let app = axum::Router::new()
        .route_service("/.well-known/acme-challenge/{token}", server.acme.http01());
    let responder = tokio::spawn(async move { axum::serve(http, app).await });
    server.until("the name issued", all_valid).await;
    let root = pebble.issuing_root().await;
    assert_served(server.addr, &["web.example.com"], &root).await;
    assert_eq!(pebble.orders(), 1);
    responder.abort();
}

/// A DNS-01 solver publishing through challtestsrv's management API, as one would through a
/// DNS provider's.
#[derive(Debug)]
struct Challtestsrv(Arc<Pebble>);

impl Dns01Solver for Challtestsrv {
    fn present<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { Ok(self.0.set_txt(record, value).await?) })
    }

    fn clean_up<'a>(&'a self, record: &'a str, _value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { Ok(self.0.clear_txt(record).await?) })
    }
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_01_issues_a_wildcard_through_the_solver() {
    let pebble = Pebble::builder().start_required().await;
    let pebble = Arc::new(pebble);
    let state = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(
        client(&pebble, state.path())
            .group(["*.apps.example.com", "apps.example.com"])
            .challenge(ChallengeType::Dns01)
            .dns01_solver(Arc::new(Challtestsrv(Arc::clone(&pebble)))),
        listener,
    );
    let status = server.until("the wildcard issued", all_valid).await;
    assert!(
        status.names.contains_key("*.apps.example.com"),
        "{status:#?}"
    );
    let root = pebble.issuing_root().await;
    assert_served(
        server.addr,
        &[
            "one.apps.example.com",
            "two.apps.example.com",
            "apps.example.com",
        ],
        &root,
    )
    .await;
    assert_eq!(pebble.orders(), 1, "one certificate for the group");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_the_ca_cannot_validate_backs_off_with_its_reason_and_the_others_are_served() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    // The CA's validator is sent where nothing listens.
    pebble
        .add_a("broken.example.com", Ipv4Addr::new(127, 0, 0, 9))
        .await;
    let state = tempfile::tempdir().unwrap();
    let builder = || {
        client(&pebble, state.path())
            .name("good.example.com")
            .name("broken.example.com")
    };
    let server = Server::start(builder(), listener);
    let status = server
        .until("one issued, one backing off", |s| {
            s.names["good.example.com"].state == NameState::Valid
                && s.names["broken.example.com"].state == NameState::Backoff
        })
        .await;
    let broken = &status.names["broken.example.com"];
    let reason = broken.last_error.as_deref().unwrap();
    assert!(
        reason.contains("broken.example.com") && reason.contains("127.0.0.9"),
        "the CA's reason, naming the name: {reason}"
    );
    let retry_at = broken.retry_at.unwrap();
    let wait = retry_at.duration_since(SystemTime::now()).unwrap();
    assert!(
        wait > tls_acme::REFUSED_BACKOFF - Duration::from_secs(60),
        "an invalid order waits an hour at least: {wait:?}"
    );
    let root = pebble.issuing_root().await;
    assert_served(server.addr, &["good.example.com"], &root).await;
    assert!(
        probe_trusting(
            server.addr,
            "broken.example.com",
            std::slice::from_ref(&root)
        )
        .await
        .is_err()
    );
    assert_eq!(pebble.orders(), 2, "one order each, no retry loop");

    // A restart keeps the wait: the time to retry is stored.
    let addr = server.addr;
    drop(server);
    let server = Server::start(builder(), rebind(addr).await);
    let status = server
        .until("the stored schedule", |s| {
            s.names["broken.example.com"].state == NameState::Backoff
                && s.names["good.example.com"].renew_after.is_some()
        })
        .await;
    assert_eq!(
        status.names["broken.example.com"].retry_at.map(secs),
        Some(secs(retry_at)),
        "the same retry time, to the second"
    );
    assert_eq!(pebble.orders(), 2, "nothing ordered early after a restart");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_certificates_are_renewed_before_they_expire_with_no_failed_handshake() {
    let (listener, pebble) =
        pebble_at_listener(|pebble| pebble.validity(Duration::from_secs(12))).await;
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client(&pebble, state.path()).name("short.example.com"),
        listener,
    );
    let first = server.until("issued", all_valid).await;
    let first_end = first.names["short.example.com"].not_after.unwrap();
    let root = pebble.issuing_root().await;
    let addr = server.addr;
    // Handshakes all along, each verified against the root (validity included).
    let prober = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            let served = probe_trusting(addr, "short.example.com", std::slice::from_ref(&root))
                .await
                .expect("no failed handshake");
            if seen.last() != Some(&served.fingerprint) {
                seen.push(served.fingerprint);
            }
            if seen.len() == 3 {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let seen = tokio::time::timeout(Duration::from_secs(40), prober)
        .await
        .expect("renewed twice")
        .expect("no failed handshake");
    // Three certificates one after the other, never an earlier one again (a renewal that
    // flapped back would show here as a repeat).
    let distinct: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "{seen:?}");
    let status = server.acme.status().borrow().clone();
    assert!(
        status.names["short.example.com"].not_after.unwrap() > first_end,
        "{status:#?}"
    );
    assert!(pebble.orders() >= 3);
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_is_not_acme_or_not_trusted_is_reported_and_nothing_is_stored() {
    let pebble = Pebble::builder().start_required().await;
    // Pebble's own HTTPS, but not its directory.
    let state = tempfile::tempdir().unwrap();
    let not_acme = format!("https://localhost:{}/roots/0", pebble.addr().port());
    let acme = Acme::builder(&not_acme)
        .directory_roots(vec![pebble.https_ca_der()])
        .crypto_provider(provider())
        .state_dir(state.path())
        .name("a.example.com")
        .build()
        .unwrap();
    let mut source = acme.source().unwrap();
    let reported = tokio::spawn(async move { while source.next().await.is_some() {} });
    let status = until(acme.status(), "the account error", |s| {
        s.account_error.is_some()
    })
    .await;
    let error = status.account_error.unwrap();
    assert!(error.contains(&not_acme), "names the URL: {error}");
    assert!(error.contains("not an ACME directory"), "{error}");
    reported.abort();

    // The directory, over HTTPS whose CA is not trusted.
    let untrusted = tempfile::tempdir().unwrap();
    let acme = Acme::builder(pebble.directory_url())
        .crypto_provider(provider())
        .state_dir(untrusted.path())
        .name("a.example.com")
        .build()
        .unwrap();
    let mut source = acme.source().unwrap();
    let reported = tokio::spawn(async move { while source.next().await.is_some() {} });
    let status = until(acme.status(), "the account error", |s| {
        s.account_error.is_some()
    })
    .await;
    let error = status.account_error.unwrap();
    assert!(
        error.contains(&pebble.directory_url()) && error.to_lowercase().contains("certificate"),
        "names the URL and the certificate: {error}"
    );
    reported.abort();
    assert_eq!(pebble.orders(), 0);
    for dir in [state.path(), untrusted.path()] {
        assert!(
            !dir.join("account").exists(),
            "no account stored in {}",
            dir.display()
        );
    }
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_stored_certificate_is_reported_and_ordered_again() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client(&pebble, state.path()).name("d.example.com"),
        listener,
    );
    server.until("issued", all_valid).await;
    let addr = server.addr;
    drop(server);
    // Truncated on disk (a full volume, a hand edit).
    let cert = state.path().join("certs/d.example.com/tls.crt");
    let pem = std::fs::read_to_string(&cert).unwrap();
    let target = std::fs::canonicalize(&cert).unwrap();
    std::fs::write(&target, &pem[..pem.len() / 2]).unwrap();

    let server = Server::start(
        client(&pebble, state.path()).name("d.example.com"),
        rebind(addr).await,
    );
    server.until("issued again", all_valid).await;
    let root = pebble.issuing_root().await;
    assert_served(addr, &["d.example.com"], &root).await;
    assert_eq!(pebble.orders(), 2);
    let status = server.reloader.status().borrow().clone();
    let route = &status.routes["d.example.com"];
    assert!(route.current.is_some(), "{route:#?}");
}

/// The port of a server just dropped, once its listener is closed (the accept task ends
/// asynchronously).
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_added_at_a_restart_is_ordered_at_once_not_behind_the_stored_ones() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let state = tempfile::tempdir().unwrap();
    let stored = ["a.example.com", "b.example.com"];
    let mut builder = client(&pebble, state.path());
    for name in stored {
        builder = builder.name(name);
    }
    let server = Server::start(builder, listener);
    server.until("both names issued", all_valid).await;
    let addr = server.addr;
    drop(server);

    // Restarted with a third name and a stagger of an hour: the staggered start spaces the
    // names to order, and the two stored ones are not among them, so the new one goes first.
    let mut builder = client(&pebble, state.path()).stagger(Duration::from_secs(3600));
    for name in stored.into_iter().chain(["c.example.com"]) {
        builder = builder.name(name);
    }
    let server = Server::start(builder, rebind(addr).await);
    server.until("the new name issued", all_valid).await;
    let root = pebble.issuing_root().await;
    assert_served(
        server.addr,
        &["a.example.com", "b.example.com", "c.example.com"],
        &root,
    )
    .await;
    assert_eq!(
        pebble.orders(),
        3,
        "the stored names were not ordered again"
    );
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_deleted_is_registered_again_the_status_says_so_and_nothing_is_reordered() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let state = tempfile::tempdir().unwrap();
    let start = |listener| {
        Server::start(
            client(&pebble, state.path()).name("a.example.com"),
            listener,
        )
    };
    let server = start(listener);
    let first = server.until("issued", all_valid).await;
    assert!(
        first.account_replaced.is_none(),
        "a first start replaces nothing"
    );
    let addr = server.addr;
    drop(server);

    // The account deleted, the certificate kept.
    std::fs::remove_dir_all(state.path().join("account")).unwrap();
    let server = start(rebind(addr).await);
    let status = server
        .until("a new account", |s| {
            s.account.is_some() && s.account != first.account
        })
        .await;
    let why = status
        .account_replaced
        .clone()
        .expect("the status says the account was replaced");
    assert!(why.contains("1 certificate"), "{why}");
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["account_replaced"], why.as_str());
    let root = pebble.issuing_root().await;
    assert_served(server.addr, &["a.example.com"], &root).await;
    assert_eq!(
        pebble.orders(),
        1,
        "the stored certificate still fits: nothing ordered"
    );
    drop(server);

    // It stays said after another restart, with the same account.
    let server = start(rebind(addr).await);
    let again = server.until("the account", |s| s.account.is_some()).await;
    assert_eq!(again.account, status.account);
    assert_eq!(again.account_replaced.as_deref(), Some(why.as_str()));
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stagger_too_large_for_the_clock_waits_instead_of_stopping_the_driver() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let state = tempfile::tempdir().unwrap();
    // The second name's start is Duration::MAX away: saturated at the end of 9999.
    let builder = client(&pebble, state.path())
        .stagger(Duration::MAX)
        .name("a.example.com")
        .name("b.example.com");
    let server = Server::start(builder, listener);
    let status = server
        .until("the first name issued", |s| {
            s.names["a.example.com"].state == NameState::Valid
        })
        .await;
    assert_eq!(status.names["b.example.com"].state, NameState::Ordering);
    assert_eq!(pebble.orders(), 1);
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode()
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ari_renews_inside_the_suggested_window_replacing_and_once_more_without_on_already_replaced()
 {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let layer = pebble.layer().await;
    let now = SystemTime::now();
    let (start, end) = (now + Duration::from_secs(4), now + Duration::from_secs(6));
    layer.offer_ari(start, end, Duration::from_secs(3600));
    layer.answer_already_replaced(true);
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path()).name("ari.example.com"),
        listener,
    );
    let first = server
        .until("issued and scheduled", |s| {
            s.names["ari.example.com"].renew_after.is_some()
        })
        .await;
    let renew = first.names["ari.example.com"].renew_after.unwrap();
    // The window's ends are whole seconds on the wire.
    assert!(
        renew >= start - Duration::from_secs(1) && renew <= end,
        "inside the CA's window, not at 2/3 of the lifetime: {first:#?}"
    );
    assert!(layer.renewal_info_requests() >= 1);
    let first_end = first.names["ari.example.com"].not_after.unwrap();
    // Renewed, and not again: the layer suggests the same (now past) window for the new
    // certificate, which must not make a renewal loop (the lifetime decides instead).
    let day = SystemTime::now() + Duration::from_secs(24 * 3600);
    server
        .until("renewed, and scheduled by the lifetime", |s| {
            let n = &s.names["ari.example.com"];
            n.not_after.is_some_and(|t| t > first_end)
                && n.state == NameState::Valid
                && n.renew_after.is_some_and(|t| t > day)
        })
        .await;
    assert_eq!(
        layer.orders_replacing(),
        1,
        "the renewal said what it replaces"
    );
    assert_eq!(
        pebble.orders(),
        2,
        "the first order, and the renewal once more without replaces"
    );
    let root = pebble.issuing_root().await;
    assert_served(server.addr, &["ari.example.com"], &root).await;
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_waits_for_its_retry_after_across_a_restart_and_the_others_go_on() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let layer = pebble.layer().await;
    layer.rate_limit_next_order(Duration::from_secs(7200));
    let state = tempfile::tempdir().unwrap();
    let builder = || {
        client_at(&layer.directory_url(), &pebble, state.path())
            .name("limited.example.com")
            .name("other.example.com")
            .stagger(Duration::from_millis(500))
    };
    let server = Server::start(builder(), listener);
    let status = server
        .until("one limited, the other issued", |s| {
            s.names["limited.example.com"].state == NameState::Backoff
                && s.names["other.example.com"].state == NameState::Valid
        })
        .await;
    let limited = &status.names["limited.example.com"];
    let retry_at = limited.retry_at.unwrap();
    let wait = retry_at.duration_since(SystemTime::now()).unwrap();
    assert!(
        wait > Duration::from_secs(7100) && wait <= Duration::from_secs(7200),
        "the CA's Retry-After, not a default: {wait:?}"
    );
    let reason = limited.last_error.as_deref().unwrap();
    assert!(
        reason.contains("limited.example.com") && reason.contains("rate limited"),
        "{reason}"
    );
    assert_eq!(pebble.orders(), 1, "only the other name reached the CA");

    let addr = server.addr;
    drop(server);
    let server = Server::start(builder(), rebind(addr).await);
    let status = server
        .until("the stored wait", |s| {
            s.names["limited.example.com"].state == NameState::Backoff
                && s.names["other.example.com"].renew_after.is_some()
        })
        .await;
    assert_eq!(
        status.names["limited.example.com"].retry_at.map(secs),
        Some(secs(retry_at))
    );
    assert_eq!(pebble.orders(), 1, "a restart does not retry early");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_certificate_from_the_ca_is_refused_nothing_is_stored_and_nothing_served() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let layer = pebble.layer().await;
    layer.damage_next_certificate();
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path()).name("cut.example.com"),
        listener,
    );
    let status = server
        .until("the bad certificate refused", |s| {
            s.names["cut.example.com"].state == NameState::Backoff
        })
        .await;
    let reason = status.names["cut.example.com"]
        .last_error
        .as_deref()
        .unwrap();
    assert!(
        reason.contains("cut.example.com") && reason.contains("certificate"),
        "{reason}"
    );
    assert!(
        !state.path().join("certs/cut.example.com").exists(),
        "nothing stored"
    );
    assert!(
        !state.path().join("orders/cut.example.com").exists(),
        "the finalized order is forgotten: the next attempt orders anew"
    );
    let root = pebble.issuing_root().await;
    assert!(
        probe_trusting(server.addr, "cut.example.com", std::slice::from_ref(&root))
            .await
            .is_err(),
        "nothing served for it"
    );
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_orders_are_paced_by_a_weekly_budget_per_registered_domain_kept_across_restarts() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let state = tempfile::tempdir().unwrap();
    let names = [
        "a.example.co.uk",
        "b.example.co.uk",
        "c.www.example.co.uk",
        "a.example.org",
    ];
    let builder = || {
        names
            .iter()
            .fold(client(&pebble, state.path()), |b, n| b.name(*n))
            .new_certificates_per_week(2)
    };
    let server = Server::start(builder(), listener);
    let settled = |s: &AcmeStatus| {
        s.names.values().all(|n| {
            n.state == NameState::Backoff
                || (n.state == NameState::Valid && n.renew_after.is_some())
        })
    };
    let status = server.until("every name issued or waiting", settled).await;
    let waiting: Vec<_> = status
        .names
        .iter()
        .filter(|(_, n)| n.state == NameState::Backoff)
        .collect();
    assert_eq!(waiting.len(), 1, "{status:#?}");
    let (name, waits) = waiting[0];
    assert!(name.ends_with("example.co.uk"), "{status:#?}");
    let reason = waits.last_error.as_deref().unwrap();
    assert!(
        reason.contains("example.co.uk") && reason.contains("budget"),
        "{reason}"
    );
    let wait = waits
        .retry_at
        .unwrap()
        .duration_since(SystemTime::now())
        .unwrap();
    assert!(
        wait > Duration::from_secs(7 * 24 * 3600 - 120),
        "a week after the oldest of the two: {wait:?}"
    );
    assert!(
        status.names["a.example.org"].state == NameState::Valid,
        "another registered domain has its own budget"
    );
    assert_eq!(pebble.orders(), 3, "the CA was not asked for the fourth");

    let addr = server.addr;
    drop(server);
    let server = Server::start(builder(), rebind(addr).await);
    let again = server.until("the same after a restart", settled).await;
    assert_eq!(again.names[name.as_str()].state, NameState::Backoff);
    assert_eq!(pebble.orders(), 3, "the budget is stored");
}

/// The new user's case: a wrong listening port fails the validation; fixing it (the place the
/// challenge is answered is part of what a failure is kept with) tries the name at once
/// instead of an hour later, and a restart keeps the renewal time to the second.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_is_tried_at_once_after_the_configuration_changes() {
    let right = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = right.local_addr().unwrap().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    drop(right);
    let wrong = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wrong_addr = wrong.local_addr().unwrap();
    let state = tempfile::tempdir().unwrap();
    let builder = |answered_at: String| {
        client(&pebble, state.path())
            .name("fix.example.com")
            .answered_at(answered_at)
    };
    let server = Server::start(builder(wrong_addr.to_string()), wrong);
    let status = server
        .until("the validation failed", |s| {
            s.names["fix.example.com"].state == NameState::Backoff
        })
        .await;
    assert!(
        status.names["fix.example.com"].retry_at.unwrap()
            > SystemTime::now() + Duration::from_secs(3000),
        "a failed validation waits an hour under the same configuration"
    );
    drop(server);

    // The port fixed: tried at once, not an hour later.
    let right = rebind(SocketAddr::from(([127, 0, 0, 1], port))).await;
    let server = Server::start(builder(format!("127.0.0.1:{port}")), right);
    let issued = tokio::time::timeout(
        PATIENCE,
        server.until("issued after the fix", |s| {
            s.names["fix.example.com"].state == NameState::Valid
                && s.names["fix.example.com"].renew_after.is_some()
        }),
    )
    .await
    .expect("ordered at once, not after the hour's backoff");
    let name = &issued.names["fix.example.com"];
    assert!(name.last_error.is_none(), "{name:?}");
    assert_eq!(name.renew_reason, Some(tls_acme::RenewReason::Lifetime));
    assert_eq!(pebble.orders(), 2);

    // A restart keeps the renewal time (its jitter is stored, not drawn again).
    let renew_after = name.renew_after;
    drop(server);
    let server = Server::start(
        builder(format!("127.0.0.1:{port}")),
        rebind(SocketAddr::from(([127, 0, 0, 1], port))).await,
    );
    let again = server
        .until("served from the store", |s| {
            s.names["fix.example.com"].renew_after.is_some()
        })
        .await;
    assert_eq!(again.names["fix.example.com"].renew_after, renew_after);
    assert_eq!(pebble.orders(), 2, "nothing ordered at the restart");
}

/// `retry_now` after fixing what the configuration does not show (here the server was not
/// reachable where the CA looked, as behind a firewall): the failed name is tried again a
/// minute after its attempt, not an hour.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_tries_a_failed_name_again_once_the_cas_limits_allow() {
    let right = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = right.local_addr().unwrap().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    drop(right);
    let clock = Arc::new(tls_source::clock::SteppedClock::starting_at(
        SystemTime::now(),
    ));
    let state = tempfile::tempdir().unwrap();
    let builder = || {
        client(&pebble, state.path())
            .name("later.example.com")
            .clock(clock.clone())
    };
    let unreachable = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::start(builder(), unreachable);
    let failed = server
        .until("the validation failed", |s| {
            s.names["later.example.com"].state == NameState::Backoff
        })
        .await;
    drop(server);
    // Reachable now, the configuration unchanged: the wait is kept.
    let server = Server::start(
        builder(),
        rebind(SocketAddr::from(([127, 0, 0, 1], port))).await,
    );
    server
        .until("the stored wait", |s| {
            s.names["later.example.com"].retry_at == failed.names["later.example.com"].retry_at
        })
        .await;
    // Asked too soon: moved to a minute after the attempt, not the hour.
    server.acme.retry_now();
    let soon = server
        .until("the retry moved forward", |s| {
            s.names["later.example.com"]
                .retry_at
                .is_some_and(|t| t < clock_now(&clock) + Duration::from_secs(61))
        })
        .await;
    assert_eq!(soon.names["later.example.com"].state, NameState::Backoff);
    assert_eq!(pebble.orders(), 1);
    clock.step(Duration::from_secs(61));
    server.acme.retry_now();
    server
        .until("issued", |s| {
            s.names["later.example.com"].state == NameState::Valid
        })
        .await;
    assert_eq!(pebble.orders(), 2);
}

fn clock_now(clock: &tls_source::clock::SteppedClock) -> SystemTime {
    tls_source::clock::Clock::now(clock)
}

/// A `badNonce` is the protocol's hiccup: with Pebble rejecting a fifth of all nonces, every
/// name is issued and none waits in backoff (instant-acme's own two retries leave about one
/// order in twelve failed; each step is retried here).
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_nonces_cost_a_name_nothing() {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble.nonce_reject(20)).await;
    let names: Vec<String> = (0..20).map(|i| format!("n{i}.example.com")).collect();
    let state = tempfile::tempdir().unwrap();
    let mut builder = client(&pebble, state.path());
    for name in &names {
        builder = builder.name(name.clone());
    }
    let server = Server::start(builder, listener);
    let mut status = server.acme.status();
    let mut waited = std::collections::BTreeSet::new();
    tokio::time::timeout(PATIENCE * 3, async {
        loop {
            {
                let now = status.borrow_and_update();
                for (name, n) in &now.names {
                    if matches!(n.state, NameState::Backoff | NameState::Failed) {
                        waited.insert((name.clone(), n.last_error.clone()));
                    }
                }
                if all_valid(&now) {
                    return;
                }
            }
            status.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not every name issued: {:#?}", *status.borrow()));
    assert!(waited.is_empty(), "names that waited: {waited:?}");
    assert_eq!(
        pebble.log_matching("Configured to reject 20% of good nonces"),
        1,
        "Pebble rejects nonces"
    );
    // (Pebble logs every new-order request, those it refused for their nonce too: its count
    // of orders is not the number created here.)
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_is_asked_for_on_the_first_order_and_on_every_renewal() {
    // Short certificates, so that a renewal comes within the test.
    let (listener, pebble) =
        pebble_at_listener(|pebble| pebble.validity(Duration::from_secs(12))).await;
    let layer = pebble.layer().await;
    layer.advertise_profiles(&["classic", "shortlived", "tlsserver"]);
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path())
            .name("profile.example.com")
            .profile("shortlived"),
        listener,
    );
    let first = server.until("issued", all_valid).await;
    let name = &first.names["profile.example.com"];
    assert_eq!(name.profile.as_deref(), Some("shortlived"), "{first:#?}");
    assert!(name.profile_note.is_none(), "{first:#?}");
    let first_end = name.not_after.unwrap();
    server
        .until("renewed", |s| {
            s.names["profile.example.com"]
                .not_after
                .is_some_and(|t| t > first_end)
        })
        .await;
    let asked = layer.order_profiles();
    assert!(asked.len() >= 2, "a first order and a renewal: {asked:?}");
    assert!(
        asked.iter().all(|p| p.as_deref() == Some("shortlived")),
        "every order asks for the profile: {asked:?}"
    );
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_the_ca_does_not_offer_is_the_cas_default_when_preferred_and_no_order_when_required()
 {
    let (listener, pebble) = pebble_at_listener(|pebble| pebble).await;
    let layer = pebble.layer().await;
    layer.advertise_profiles(&["classic", "shortlived"]);
    // Preferred: ordered with the CA's default, and the status says why.
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path())
            .name("preferred.example.com")
            .profile("nosuch"),
        listener,
    );
    let issued = server.until("issued", all_valid).await;
    let name = &issued.names["preferred.example.com"];
    assert_eq!(name.profile, None, "{issued:#?}");
    let note = name.profile_note.as_deref().unwrap_or_default();
    assert!(
        note.contains("nosuch") && note.contains("classic, shortlived"),
        "{note}"
    );
    assert_eq!(layer.order_profiles(), [None]);
    drop(server);

    // Required: no order at all, and the error names what the directory advertises.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap(); // no order: no validation
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path())
            .name("required.example.com")
            .require_profile("nosuch"),
        listener,
    );
    let failed = server
        .until("refused", |s| {
            s.names
                .get("required.example.com")
                .is_some_and(|n| n.state == NameState::Failed)
        })
        .await;
    let error = failed.names["required.example.com"]
        .last_error
        .clone()
        .unwrap_or_default();
    assert!(
        error.contains("nosuch") && error.contains("classic, shortlived"),
        "{error}"
    );
    assert_eq!(
        layer.order_profiles().len(),
        1,
        "no order for the required one"
    );
}

/// An IP address (RFC 8738), with no profile configured: `shortlived` is asked for when the
/// directory advertises it (the one Let's Encrypt issues addresses under), the CA's default
/// when it does not; validated by TLS-ALPN-01 at the address, and served under strict SNI to a
/// handshake without a server name, for its IP SAN.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_address_asks_for_shortlived_when_advertised_and_is_served_without_a_server_name() {
    let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pebble = Pebble::builder()
        .tls_port(addr.port())
        .start_required()
        .await;
    let layer = pebble.layer().await;
    layer.advertise_profiles(&["classic", "shortlived"]);
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path()).name("127.0.0.2"),
        listener,
    );
    let issued = server.until("issued", all_valid).await;
    assert_eq!(
        issued.names["127.0.0.2"].profile.as_deref(),
        Some("shortlived")
    );
    assert_eq!(layer.order_profiles(), [Some("shortlived".to_owned())]);
    let root = pebble.issuing_root().await;
    assert_served(addr, &["127.0.0.2"], &root).await;
    drop(server);

    // A directory without shortlived: the CA's default, and no note (none was asked for).
    layer.advertise_profiles(&["classic"]);
    let listener = rebind(addr).await;
    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        client_at(&layer.directory_url(), &pebble, state.path()).name("127.0.0.2"),
        listener,
    );
    let issued = server.until("issued", all_valid).await;
    let name = &issued.names["127.0.0.2"];
    assert!(
        name.profile.is_none() && name.profile_note.is_none(),
        "{name:#?}"
    );
    assert_eq!(
        layer.order_profiles(),
        [Some("shortlived".to_owned()), None]
    );
    assert_served(addr, &["127.0.0.2"], &root).await;
}
