//! Against an API that does not apply selectors (as kmock in its resourceVersion mode does not):
//! every object of the namespace is listed and watched, and each source checks what it
//! receives. The emulator's `ignore_selectors` mode; without the checks these tests fail (round
//! 1's Secret source served another Secret's certificate, then reported its own as deleted).

mod common;

use std::time::Duration;

use common::{Served, client, installed, put_named, routes_reloader};
use tls_k8s::SecretsSource;
use tls_k8s::store::LeaseLock;
use tls_test::{KubeApi, PATIENCE, TestCa, TestServer};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_secret_source_ignores_every_other_secret_of_the_namespace() {
    let api = KubeApi::start().await;
    api.ignore_selectors(true);
    let ca = TestCa::new("unfiltered");
    let (ours, other) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    // Listed before ours and after it: neither is taken for ours.
    put_named(&api, "aaa-other", &other);
    put_named(&api, "tls", &ours);
    put_named(&api, "zzz-other", &other);
    let served = Served::start(client(&api), "default", "tls").await;
    assert_eq!(served.served().await, ours.fingerprint);

    // Another Secret is created, updated and deleted; then ours changes. The watch is ordered:
    // once ours is served, the others' events were all seen.
    let another = ca.leaf(&["localhost"]);
    put_named(&api, "another", &another);
    put_named(&api, "another", &ca.leaf(&["localhost"]));
    assert!(api.delete("secrets", "default", "another"));
    assert!(api.delete("secrets", "default", "zzz-other"));
    let next = ca.leaf(&["localhost"]);
    put_named(&api, "tls", &next);
    served.expect_served(&next).await;
    let status = served.status();
    assert_eq!(
        status.generation, 2,
        "only ours was ever installed: {status:#?}"
    );
    assert!(
        status.last_error.is_none(),
        "ours was never said deleted: {status:#?}"
    );

    // A relist (the watch dropped) that holds other Secrets but not ours says ours is gone.
    assert!(api.delete("secrets", "default", "tls"));
    api.close_watches();
    let status = served.expect_reported("deleted", &next).await;
    assert_eq!(installed(&status), Some(next.fingerprint.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_by_selector_serve_only_what_the_selector_selects() {
    let api = KubeApi::start().await;
    api.ignore_selectors(true);
    let ca = TestCa::new("unfiltered");
    let prod = ca.leaf(&["prod.example.com"]);
    let staging = ca.leaf(&["staging.example.com"]);
    let legacy = ca.leaf(&["legacy.example.com"]);
    let unlabelled = ca.leaf(&["unlabelled.example.com"]);
    for (name, cert, env) in [
        ("prod", &prod, Some("prod")),
        ("staging", &staging, Some("staging")),
        ("legacy", &legacy, Some("prod")),
        ("unlabelled", &unlabelled, None),
    ] {
        put_named(&api, name, cert);
        if let Some(env) = env {
            api.set_label("secrets", "default", name, "env", env);
        }
    }
    api.set_label("secrets", "default", "legacy", "legacy", "true");

    let source = SecretsSource::builder(client(&api), "default")
        .selector("env in (prod, staging),!legacy")
        .build();
    let reloader = routes_reloader(source);
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let status = tls_test::wait_for(reloader.status(), "two routes", |s| {
        s.routes.len() == 2 && s.routes.values().all(|r| r.current.is_some())
    })
    .await;
    let keys: Vec<&str> = status.routes.keys().map(|k| &**k).collect();
    assert_eq!(keys, ["default/prod", "default/staging"]);
    let server = TestServer::start(reloader.resolver()).await;
    for (name, cert) in [("prod", &prod), ("staging", &staging)] {
        let served = tls_test::served_as(server.addr(), &format!("{name}.example.com")).await;
        assert_eq!(served.unwrap(), cert.fingerprint);
    }

    // A Secret labelled out of the selection leaves it; an unselected one that changes stays
    // out. Then a selected one changes: once it is served, the earlier events were seen.
    api.set_label("secrets", "default", "staging", "env", "dev");
    put_named(&api, "unlabelled", &ca.leaf(&["unlabelled.example.com"]));
    let next = ca.leaf(&["prod.example.com"]);
    put_named(&api, "prod", &next);
    let status = tls_test::wait_for(reloader.status(), "prod rotated, staging gone", |s| {
        s.routes.len() == 1
            && s.routes["default/prod"]
                .current
                .as_ref()
                .is_some_and(|c| c.fingerprint_sha256 == next.fingerprint)
    })
    .await;
    assert!(!status.routes.contains_key("default/unlabelled"));
    for name in ["staging", "legacy", "unlabelled"] {
        assert!(
            tls_test::served_as(server.addr(), &format!("{name}.example.com"))
                .await
                .is_err(),
            "{name} is not served (strict SNI off: no default route either)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_applications_lease_never_holds_off_a_take_over() {
    let api = KubeApi::start().await;
    api.ignore_selectors(true);
    let timing = |lock: LeaseLock| {
        lock.timing(
            Duration::from_millis(600),
            Duration::from_millis(400),
            Duration::from_millis(100),
        )
    };
    // Another application's Lease in the namespace, renewed every 100 ms.
    let _intruder = timing(LeaseLock::new(
        client(&api),
        "default",
        "other-app",
        "intruder",
    ))
    .spawn(CancellationToken::new());
    let a_token = CancellationToken::new();
    let a =
        timing(LeaseLock::new(client(&api), "default", "tls-writer", "a")).spawn(a_token.clone());
    tls_test::wait_for(a.leadership(), "a leads", |l| l.leading).await;
    let b = timing(LeaseLock::new(client(&api), "default", "tls-writer", "b"))
        .spawn(CancellationToken::new());
    // Every holder b ever publishes, until it leads.
    let mut views = b.leadership();
    let seen = tokio::spawn(async move {
        let mut holders = Vec::new();
        loop {
            let view = views.borrow_and_update().clone();
            holders.extend(view.holder.clone());
            if view.leading || views.changed().await.is_err() {
                return holders;
            }
        }
    });
    let view = tls_test::wait_for(b.leadership(), "b sees a", |l| l.holder.is_some()).await;
    assert_eq!(view.holder.as_deref(), Some("a"), "{view:?}");

    // a stops renewing: b takes over once the lease expires, while the other Lease keeps
    // changing. Read as ours, it would show "intruder" as the holder.
    a_token.cancel();
    let view = tls_test::wait_for(b.leadership(), "b takes over", |l| l.leading).await;
    assert_eq!(view.holder.as_deref(), Some("b"));
    let holders = tokio::time::timeout(PATIENCE, seen).await.unwrap().unwrap();
    assert!(
        holders.iter().all(|h| h == "a" || h == "b"),
        "only our Lease's holders: {holders:?}"
    );
}
