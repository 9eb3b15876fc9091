//! Two CAs: two Pebbles (each with its own root), the preferred one behind an
//! [`AcmeLayer`](tls_test::AcmeLayer) that can take it down (every connection closed) and bring
//! it back, both offering ARI through their layers.

mod common;

use common::*;
use std::time::{Duration, SystemTime};

use tls_acme::{Acme, FallbackCa};
use tls_test::Pebble;

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_ca_serves_while_the_first_is_down_and_renewals_go_back_to_the_first() {
    let (listener, first) = pebble_at_listener(|pebble| pebble).await;
    let port = listener.local_addr().unwrap().port();
    let second = Pebble::builder().tls_port(port).start_required().await;
    let (first_layer, second_layer) = (first.layer().await, second.layer().await);
    let (first_url, second_url) = (first_layer.directory_url(), second_layer.directory_url());
    // Both suggest renewing in a window a few seconds ahead, for every certificate.
    let now = SystemTime::now();
    let window = (now + Duration::from_secs(10), now + Duration::from_secs(12));
    for layer in [&first_layer, &second_layer] {
        layer.offer_ari(window.0, window.1, Duration::from_secs(3600));
    }
    let (first_root, second_root) = (first.issuing_root().await, second.issuing_root().await);
    first_layer.set_unreachable(true);

    let state = tempfile::tempdir().unwrap();
    let server = Server::start(
        Acme::builder(&first_url)
            .directory_roots(vec![first.https_ca_der()])
            .fallback(FallbackCa::new(&second_url).roots(vec![second.https_ca_der()]))
            .crypto_provider(provider())
            .state_dir(state.path())
            .stagger(Duration::from_millis(10))
            .name("a.example.com")
            .name("b.example.com"),
        listener,
    );

    // The first is down: every name from the second, saying why.
    let status = server
        .until("both issued by the second CA", |s| {
            all_valid(s) && s.names.values().all(|n| n.renew_after.is_some())
        })
        .await;
    for name in ["a.example.com", "b.example.com"] {
        let n = &status.names[name];
        assert_eq!(
            n.issuer.as_deref(),
            Some(second_url.as_str()),
            "{status:#?}"
        );
        let why = n.fallback_reason.as_deref().unwrap_or_default();
        assert!(why.contains(&first_url), "{status:#?}");
    }
    assert_served(
        server.addr,
        &["a.example.com", "b.example.com"],
        &second_root,
    )
    .await;
    assert!(
        status
            .account_error
            .as_deref()
            .is_some_and(|e| e.contains(&first_url)),
        "the preferred CA's account cannot be used, and the status says so: {status:#?}"
    );
    assert_eq!(first.orders(), 0);
    assert_eq!(second.orders(), 2);
    let second_ends: Vec<_> = status.names.values().map(|n| n.not_after).collect();

    // The first is back: the renewals (in the second's ARI window) go to it, and do not say
    // they replace a certificate it did not issue. It suggests a later window for what it
    // issues.
    let later = (now + Duration::from_secs(20), now + Duration::from_secs(22));
    first_layer.offer_ari(later.0, later.1, Duration::from_secs(3600));
    first_layer.set_unreachable(false);
    let status = server
        .until("both renewed by the first CA", |s| {
            s.names
                .values()
                .all(|n| n.issuer.as_deref() == Some(first_url.as_str()))
                && all_valid(s)
        })
        .await;
    for (n, second_end) in status.names.values().zip(&second_ends) {
        assert!(n.fallback_reason.is_none(), "{status:#?}");
        assert_ne!(&n.not_after, second_end, "a new certificate");
    }
    assert_served(
        server.addr,
        &["a.example.com", "b.example.com"],
        &first_root,
    )
    .await;
    assert_eq!(first.orders(), 2);
    assert_eq!(second.orders(), 2, "nothing more from the second");
    assert_eq!(
        first_layer.orders_replacing(),
        0,
        "no `replaces` across CAs"
    );
    assert_eq!(second_layer.orders_replacing(), 0);
    assert!(
        second_layer.renewal_info_requests() >= 2,
        "ARI was asked of the issuer"
    );

    // The first goes down during the run (its account connected): the renewals in its window
    // fall back to the second again (which now suggests renewing in an hour).
    assert!(
        first_layer.renewal_info_requests() >= 2,
        "ARI asked of the issuer"
    );
    let hour = SystemTime::now() + Duration::from_secs(3600);
    second_layer.offer_ari(
        hour,
        hour + Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    first_layer.set_unreachable(true);
    let first_ends: Vec<_> = status.names.values().map(|n| n.not_after).collect();
    let status = server
        .until("both renewed by the second CA again", |s| {
            s.names.values().zip(&first_ends).all(|(n, end)| {
                n.issuer.as_deref() == Some(second_url.as_str()) && n.not_after != *end
            }) && all_valid(s)
        })
        .await;
    for n in status.names.values() {
        let why = n.fallback_reason.as_deref().unwrap_or_default();
        assert!(why.contains(&first_url), "{status:#?}");
    }
    assert_served(
        server.addr,
        &["a.example.com", "b.example.com"],
        &second_root,
    )
    .await;
    assert_eq!(second.orders(), 4);
    assert_eq!(
        second_layer.orders_replacing(),
        0,
        "no `replaces` across CAs"
    );
}
