//! SNI: several certificates on one listener, each from its own source, chosen by server name,
//! rotating and failing independently; real handshakes against a real resolver.

mod common;

use common::{kube_source, route_installed, write_kube};
use tls_reload::Reloader;
use tls_test::served_as as served_for;
use tls_test::{PATIENCE, TestCa, TestCert, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_name_is_served_its_route_and_routes_rotate_and_fail_alone() {
    let ca = TestCa::new("sni");
    let dir = tempfile::tempdir().unwrap();
    let (api, www, wild, default) = (
        ca.leaf(&["api.example.com"]),
        ca.leaf(&["www.example.com"]),
        ca.leaf(&["*.example.com"]),
        ca.leaf(&["localhost"]),
    );
    let (api_dir, api_source) = kube_source(dir.path(), "api", &api);
    let (www_dir, www_source) = kube_source(dir.path(), "www", &www);
    let (_wild_dir, wild_source) = kube_source(dir.path(), "wild", &wild);
    let (_default_dir, default_source) = kube_source(dir.path(), "default", &default);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .route("api.example.com", api_source)
        .route("WWW.example.com", www_source)
        .route("*.example.com", wild_source)
        .spawn(default_source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    let addr = server.addr();

    let expect = [
        ("api.example.com", &api),
        ("API.EXAMPLE.COM", &api),
        ("www.example.com", &www),
        ("a.example.com", &wild),
        ("a.b.example.com", &default),
        ("example.com", &default),
        ("unknown.test", &default),
        ("127.0.0.1", &default), // an IP address: no SNI at all
    ];
    for (name, cert) in expect {
        assert_eq!(
            served_for(addr, name).await.unwrap(),
            cert.fingerprint,
            "{name}"
        );
    }
    let status = reloader.status().borrow().clone();
    assert_eq!(
        status.routes.keys().map(|k| &**k).collect::<Vec<_>>(),
        ["*.example.com", "api.example.com", "www.example.com"]
    );
    assert_eq!(status.routes["www.example.com"].names, ["www.example.com"]);

    // Rotating one route changes only that route.
    let api2 = ca.leaf(&["api.example.com"]);
    write_kube(&api_dir, &api2);
    let status = tls_test::wait_for(reloader.status(), "api rotated", |s| {
        route_installed(s, "api.example.com") == Some(api2.fingerprint.as_str())
    })
    .await;
    assert_eq!(
        served_for(addr, "api.example.com").await.unwrap(),
        api2.fingerprint
    );
    assert_eq!(
        served_for(addr, "www.example.com").await.unwrap(),
        www.fingerprint
    );
    assert_eq!(
        served_for(addr, "a.example.com").await.unwrap(),
        wild.fingerprint
    );
    assert_eq!(status.routes["api.example.com"].generation, 2);
    assert_eq!(status.routes["www.example.com"].generation, 1);
    assert_eq!(status.generation, 1, "the default route did not change");

    // A bad update to one route is reported for that route only; it keeps serving.
    www_dir
        .write(&[
            ("tls.crt", b"garbage".as_slice()),
            ("tls.key", www.key_pem.as_bytes()),
        ])
        .unwrap();
    let status = tls_test::wait_for(reloader.status(), "the www error", |s| {
        s.routes["www.example.com"].last_error.is_some()
    })
    .await;
    let err = status.routes["www.example.com"]
        .last_error
        .as_ref()
        .unwrap()
        .to_string();
    assert!(err.contains("www/tls.crt"), "{err}");
    assert!(
        status.last_error.is_none(),
        "the default route is not touched"
    );
    for route in ["api.example.com", "*.example.com"] {
        assert!(
            status.routes[route].last_error.is_none(),
            "{route} is not touched"
        );
    }
    assert_eq!(
        served_for(addr, "www.example.com").await.unwrap(),
        www.fingerprint
    );

    // And it recovers by itself.
    let www2 = ca.leaf(&["www.example.com"]);
    write_kube(&www_dir, &www2);
    tls_test::wait_for(reloader.status(), "www recovered", |s| {
        route_installed(s, "www.example.com") == Some(www2.fingerprint.as_str())
            && s.routes["www.example.com"].last_error.is_none()
    })
    .await;
    assert_eq!(
        served_for(addr, "www.example.com").await.unwrap(),
        www2.fingerprint
    );
}

/// A reloader serving `default` and one route `name` with `cert`, each from its own directory.
fn one_route(
    dir: &tempfile::TempDir,
    name: &str,
    cert: &TestCert,
    default: &TestCert,
    strict: bool,
) -> Reloader {
    let (_route_dir, route_source) = kube_source(dir.path(), "route", cert);
    let (_default_dir, default_source) = kube_source(dir.path(), "default", default);
    Reloader::builder()
        .crypto_provider(common::provider())
        .route(name, route_source)
        .sni_strict(strict)
        .spawn(default_source)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_refuses_unknown_and_missing_names() {
    let ca = TestCa::new("strict");
    let dir = tempfile::tempdir().unwrap();
    let (api, default) = (ca.leaf(&["api.example.com"]), ca.leaf(&["localhost"]));
    let reloader = one_route(&dir, "api.example.com", &api, &default, true);
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(
        served_for(server.addr(), "api.example.com").await.unwrap(),
        api.fingerprint
    );
    assert_eq!(
        served_for(server.addr(), "localhost").await.unwrap(),
        default.fingerprint,
        "the default is served to the names it covers, like a route"
    );
    // 127.0.0.1: a ClientHello without SNI.
    for name in ["unknown.test", "127.0.0.1"] {
        assert!(
            served_for(server.addr(), name).await.is_err(),
            "{name} is refused in strict mode"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_with_only_a_default_serves_it_by_its_names() {
    let ca = TestCa::new("strict-default");
    let dir = tempfile::tempdir().unwrap();
    let default = ca.leaf(&["localhost", "*.internal.test"]);
    let (_default_dir, source) = kube_source(dir.path(), "default", &default);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .sni_strict(true)
        .spawn(source)
        .unwrap();
    // Ready: nothing is waited for that will not be served.
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    for name in ["localhost", "api.internal.test"] {
        assert_eq!(
            served_for(server.addr(), name).await.unwrap(),
            default.fingerprint,
            "{name} is covered by the default"
        );
    }
    for name in ["other.test", "127.0.0.1"] {
        assert!(
            served_for(server.addr(), name).await.is_err(),
            "{name} is refused: the default does not cover it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_certificate_does_not_cover_its_name_is_refused_naming_both() {
    let ca = TestCa::new("cover");
    let dir = tempfile::tempdir().unwrap();
    let (wrong, default) = (ca.leaf(&["api.example.com"]), ca.leaf(&["localhost"]));
    let reloader = one_route(&dir, "www.example.com", &wrong, &default, false);
    // The route's error, and the default installed (they come from two sources, in any order).
    let status = tls_test::wait_for(reloader.status(), "the route's error", |s| {
        s.routes["www.example.com"].last_error.is_some() && s.current.is_some()
    })
    .await;
    let err = status.routes["www.example.com"]
        .last_error
        .as_ref()
        .unwrap()
        .to_string();
    assert!(
        err.contains("does not cover www.example.com (it is for api.example.com)"),
        "{err}"
    );
    assert!(status.routes["www.example.com"].current.is_none());
    assert!(!status.ready, "a route without a certificate is not ready");

    // The server still answers the other names, with the default.
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(
        served_for(server.addr(), "www.example.com").await.unwrap(),
        default.fingerprint
    );
}

#[tokio::test]
async fn a_route_name_that_is_not_a_dns_name_is_refused_at_spawn() {
    let err = Reloader::builder()
        .crypto_provider(common::provider())
        .route("a.*.example.com", futures::stream::pending())
        .spawn_routes()
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid SNI route name \"a.*.example.com\""),
        "{err}"
    );
    let err = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn_routes()
        .unwrap_err();
    assert!(err.to_string().contains("no certificate source"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_routes_come_and_go_by_the_names_in_their_certificates() {
    use tls_source::{Keyed, KeyedUpdate};
    let ca = TestCa::new("keyed");
    let (a, b, c) = (
        ca.leaf(&["a.example.com"]),
        ca.leaf(&["b.example.com", "*.b.example.com"]),
        ca.leaf(&["c.example.com"]),
    );
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let put = |key: &str, cert: &TestCert| {
        tx.unbounded_send(Ok(Keyed {
            key: key.into(),
            update: KeyedUpdate::Put(common::bundle(cert)),
        }))
        .unwrap();
    };
    put("k1", &a);
    put("k2", &b);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .routes(rx)
        .spawn_routes()
        .unwrap();
    tls_test::wait_for(reloader.status(), "two routes", |s| {
        route_installed(s, "k1").is_some() && route_installed(s, "k2").is_some()
    })
    .await;
    let server = TestServer::start(reloader.resolver()).await;
    let addr = server.addr();
    assert_eq!(
        served_for(addr, "a.example.com").await.unwrap(),
        a.fingerprint
    );
    assert_eq!(
        served_for(addr, "x.b.example.com").await.unwrap(),
        b.fingerprint
    );
    assert!(
        served_for(addr, "c.example.com").await.is_err(),
        "no route, no default"
    );

    // k1 goes, k3 comes (in k1's old place inside the driver): each name follows its key.
    tx.unbounded_send(Ok(Keyed {
        key: "k1".into(),
        update: KeyedUpdate::Remove,
    }))
    .unwrap();
    put("k3", &c);
    let status = tls_test::wait_for(reloader.status(), "k1 out, k3 in", |s| {
        !s.routes.contains_key("k1") && route_installed(s, "k3").is_some()
    })
    .await;
    assert_eq!(
        status.routes.keys().map(|k| &**k).collect::<Vec<_>>(),
        ["k2", "k3"]
    );
    assert_eq!(
        status.routes["k2"].names,
        ["b.example.com", "*.b.example.com"]
    );
    assert!(served_for(addr, "a.example.com").await.is_err());
    assert_eq!(
        served_for(addr, "c.example.com").await.unwrap(),
        c.fingerprint
    );
    assert_eq!(
        served_for(addr, "b.example.com").await.unwrap(),
        b.fingerprint
    );
}

/// A hook that claims handshakes for one name (as an ACME TLS-ALPN-01 responder claims the CA's
/// validation handshake), with a certificate of its own.
#[derive(Debug)]
struct Claims {
    name: &'static str,
    key: std::sync::Arc<rustls::sign::CertifiedKey>,
}

impl tls_reload::HandshakeHook for Claims {
    fn answer(
        &self,
        hello: &rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        (hello.server_name() == Some(self.name)).then(|| std::sync::Arc::clone(&self.key))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_hook_answers_what_it_claims_before_the_routes_and_nothing_else() {
    let ca = TestCa::new("hook");
    let dir = tempfile::tempdir().unwrap();
    let (api, default, claimed) = (
        ca.leaf(&["api.example.com"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["challenge.example.com"]),
    );
    let validated = tls_reload::Validator::new(common::provider(), tls_reload::Policy::default())
        .validate(&common::bundle(&claimed))
        .unwrap();
    let hook = Claims {
        name: "challenge.example.com",
        key: std::sync::Arc::clone(validated.certified_key()),
    };
    let (_route_dir, route) = kube_source(dir.path(), "route", &api);
    let (_default_dir, default_source) = kube_source(dir.path(), "default", &default);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .route("api.example.com", route)
        .sni_strict(true)
        .handshake_hook(std::sync::Arc::new(hook))
        .spawn(default_source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(
        served_for(server.addr(), "challenge.example.com")
            .await
            .unwrap(),
        claimed.fingerprint,
        "claimed by the hook, though no route serves it and SNI is strict"
    );
    assert_eq!(
        served_for(server.addr(), "api.example.com").await.unwrap(),
        api.fingerprint
    );
    assert!(
        served_for(server.addr(), "unknown.example.com")
            .await
            .is_err(),
        "what the hook leaves goes to the routes: refused in strict mode"
    );
}
