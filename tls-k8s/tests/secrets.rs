//! Many Secrets by label selector through one watch, each served for the names in its
//! certificate, on the Kubernetes API emulator with real handshakes.

mod common;

use tls_k8s::SecretsSource;
use tls_reload::Status;
use tls_test::{KubeApi, PATIENCE, TestCa, TestCert, TestServer};

fn route_fingerprint<'a>(status: &'a Status, key: &str) -> Option<&'a str> {
    status
        .routes
        .get(key)
        .and_then(|r| r.current.as_ref())
        .map(|c| c.fingerprint_sha256.as_str())
}

/// The fingerprint `server` serves for `name`, `None` if the handshake fails.
async fn served_for(server: &TestServer, name: &str) -> Option<String> {
    tls_test::served_as(server.addr(), name).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_secrets_by_label_are_served_by_their_names_through_one_watch() {
    let api = KubeApi::start().await;
    let ca = TestCa::new("secrets");
    let certs: Vec<TestCert> = (0..20)
        .map(|i| ca.leaf(&[&format!("host{i}.example.com")]))
        .collect();
    for (i, cert) in certs.iter().enumerate() {
        common::put_named(&api, &format!("web-{i}"), cert);
        api.set_label("secrets", "default", &format!("web-{i}"), "app", "web");
    }
    let other = ca.leaf(&["other.example.com"]);
    common::put_named(&api, "other", &other);
    api.set_label("secrets", "default", "other", "app", "other");

    let source = SecretsSource::builder(common::client(&api), "default")
        .selector("app=web")
        .build();
    let reloader = common::routes_reloader(source);
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let status = tls_test::wait_for(reloader.status(), "20 routes", |s| {
        s.routes.len() == 20 && s.routes.values().all(|r| r.current.is_some())
    })
    .await;
    assert_eq!(status.routes["default/web-3"].names, ["host3.example.com"]);
    let server = TestServer::start(reloader.resolver()).await;
    for (i, cert) in certs.iter().enumerate() {
        assert_eq!(
            served_for(&server, &format!("host{i}.example.com"))
                .await
                .as_deref(),
            Some(cert.fingerprint.as_str()),
            "host{i}"
        );
    }
    assert_eq!(
        served_for(&server, "other.example.com").await,
        None,
        "a Secret outside the selector is not served (and there is no default)"
    );

    // A rotation reaches only its route.
    let rotated = ca.leaf(&["host1.example.com"]);
    common::put_named(&api, "web-1", &rotated);
    tls_test::wait_for(reloader.status(), "web-1 rotated", |s| {
        route_fingerprint(s, "default/web-1") == Some(rotated.fingerprint.as_str())
    })
    .await;
    assert_eq!(
        served_for(&server, "host1.example.com").await.as_deref(),
        Some(rotated.fingerprint.as_str())
    );

    // A malformed Secret is reported for its route, which keeps its last good certificate.
    api.put_secret(
        "default",
        "web-5",
        &[
            ("tls.crt", b"garbage"),
            ("tls.key", certs[5].key_pem.as_bytes()),
        ],
    );
    let status = tls_test::wait_for(reloader.status(), "web-5 reported", |s| {
        s.routes["default/web-5"].last_error.is_some()
    })
    .await;
    let err = status.routes["default/web-5"]
        .last_error
        .as_ref()
        .unwrap()
        .to_string();
    assert!(err.contains("default/web-5 key tls.crt"), "{err}");
    assert_eq!(
        served_for(&server, "host5.example.com").await.as_deref(),
        Some(certs[5].fingerprint.as_str())
    );

    // A label removed, or the Secret deleted, removes the route.
    api.remove_label("secrets", "default", "web-3", "app");
    api.delete("secrets", "default", "web-7");
    tls_test::wait_for(reloader.status(), "routes removed", |s| {
        !s.routes.contains_key("default/web-3") && !s.routes.contains_key("default/web-7")
    })
    .await;
    assert_eq!(served_for(&server, "host3.example.com").await, None);
    assert_eq!(served_for(&server, "host7.example.com").await, None);
    assert!(served_for(&server, "host4.example.com").await.is_some());

    // One watch for all of it, never a request per Secret.
    let secrets: Vec<String> = api
        .request_log()
        .into_iter()
        .filter(|r| r.contains("/secrets"))
        .collect();
    let watches = secrets.iter().filter(|r| r.contains("watch=true")).count();
    assert_eq!(watches, 1, "{secrets:#?}");
    assert!(
        secrets
            .iter()
            .all(|r| r.starts_with("GET /api/v1/namespaces/default/secrets?")
                && r.contains("labelSelector=app")),
        "{secrets:#?}"
    );
}
