//! The reloader's own behaviour, with in-memory sources: latest wins, ready, not ready, stop.

mod common;

use std::time::Duration;

use futures::StreamExt as _;
use futures::stream;
use tls_reload::{NotReady, Reloader};
use tls_source::{CertBundle, Decoder, Origin};
use tls_test::{PATIENCE, TestCa, TestCert};

fn bundle(cert: &TestCert) -> CertBundle {
    Decoder::new()
        .bundle(
            ("crt", cert.chain_pem.as_bytes()),
            ("key", cert.key_pem.as_bytes()),
            None,
            Origin::Other("memory".into()),
        )
        .unwrap()
}

#[tokio::test]
async fn a_burst_installs_only_the_latest() {
    let ca = TestCa::new("burst");
    let certs: Vec<_> = (0..3).map(|_| ca.leaf(&["localhost"])).collect();
    let items: Vec<_> = certs.iter().map(|c| Ok(bundle(c))).collect();
    // The whole burst is ready at once; the source then stays open.
    let source = stream::iter(items).chain(stream::pending());
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let status = reloader.status().borrow().clone();
    assert_eq!(status.generation, 1, "only one swap for the burst");
    assert_eq!(
        status.current.unwrap().fingerprint_sha256,
        certs[2].fingerprint
    );
}

#[tokio::test]
async fn ready_timeout_says_why_nothing_was_installed() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let source = tls_source::FileSource::builder(&missing, dir.path().join("missing.key")).build();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    let err = reloader
        .ready_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, NotReady::TimedOut { .. }));
    let message = err.to_string();
    assert!(
        message.starts_with("no certificate installed after 300ms: last error: cannot read"),
        "{message}"
    );
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
}

#[tokio::test]
async fn ready_fails_when_the_source_ends_with_nothing_good() {
    let source = stream::iter(vec![Err(tls_source::Error::source("test", "broken"))]);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    let err = common::patiently("ready", reloader.ready())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the reloader stopped before any certificate was installed: last error: test: broken"
    );
}

#[tokio::test]
async fn the_same_material_after_an_error_clears_the_error_without_a_swap() {
    let cert = TestCa::new("recover").leaf(&["localhost"]);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(rx)
        .unwrap();
    tx.unbounded_send(Ok(bundle(&cert))).unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    tx.unbounded_send(Err(tls_source::Error::source("test", "blip")))
        .unwrap();
    tls_test::wait_for(reloader.status(), "the error", |s| s.last_error.is_some()).await;
    tx.unbounded_send(Ok(bundle(&cert))).unwrap();
    let status =
        tls_test::wait_for(reloader.status(), "recovery", |s| s.last_error.is_none()).await;
    assert_eq!(status.generation, 1);
}

#[tokio::test]
async fn stop_ends_the_task_but_not_the_callers_token() {
    let cert = TestCa::new("stop").leaf(&["localhost"]);
    let token = tokio_util::sync::CancellationToken::new();
    let source = stream::iter(vec![Ok(bundle(&cert))]).chain(stream::pending());
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .cancellation_token(token.clone())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    reloader.stop();
    common::patiently("stopped", reloader.stopped()).await;
    assert!(!token.is_cancelled());
    assert!(reloader.resolver().current().is_some(), "still serving");
}

/// Without a provider given or installed, the reloader uses the one its feature enables, or says
/// clearly that there is none: with neither feature, which features there are; with both
/// (`--all-features`), that neither is chosen. (`cargo test --workspace` unifies features: the
/// examples turn `ring` on.)
#[tokio::test]
async fn without_a_provider_the_feature_decides() {
    let cert = TestCa::new("provider").leaf(&["localhost"]);
    let source = stream::iter(vec![Ok(bundle(&cert))]).chain(stream::pending());
    let spawned = Reloader::spawn(source);
    let (ring, aws) = (cfg!(feature = "ring"), cfg!(feature = "aws-lc-rs"));
    if ring != aws {
        let reloader = spawned.expect("the feature's provider is used");
        reloader.ready_timeout(PATIENCE).await.unwrap();
        assert!(
            rustls::crypto::CryptoProvider::get_default().is_none(),
            "and not installed"
        );
    } else {
        let err = spawned.unwrap_err().to_string();
        assert!(err.starts_with("no rustls crypto provider"), "{err}");
        let fix = if ring {
            "neither is chosen: pass one to Builder::crypto_provider"
        } else {
            "enable one of tls-reload's features"
        };
        assert!(err.contains(fix), "{err}");
    }
}

#[tokio::test]
async fn nothing_is_served_before_the_first_certificate() {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(rx)
        .unwrap();
    let server = tls_test::TestServer::start(reloader.resolver()).await;
    assert!(reloader.resolver().current().is_none());
    let refused = tls_test::probe(server.addr(), "localhost").await;
    assert!(
        refused.is_err(),
        "a handshake before the first certificate fails cleanly"
    );
    let cert = TestCa::new("first").leaf(&["localhost"]);
    tx.unbounded_send(Ok(bundle(&cert))).unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let served = tls_test::probe(server.addr(), "localhost").await.unwrap();
    assert_eq!(served.fingerprint, cert.fingerprint);
}

/// Found by the Kubernetes property test: a watch delivered an update and failed right after,
/// and both reached the reload task in one batch. Only newer material supersedes a bundle: the
/// error after it is recorded, the bundle installed (before the fix, the error superseded it
/// and the update was never served).
#[tokio::test]
async fn a_bundle_followed_at_once_by_an_error_is_installed_and_the_error_reported() {
    let ca = TestCa::new("batch");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    // One batch: a, then b (which supersedes a), then a report.
    let items = vec![
        Ok(bundle(&a)),
        Ok(bundle(&b)),
        Err(tls_source::Error::source("watch", "the watch failed")),
    ];
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(stream::iter(items).chain(stream::pending()))
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.expect("b installed");
    let status =
        tls_test::wait_for(reloader.status(), "the report", |s| s.last_error.is_some()).await;
    assert_eq!(
        status.current.expect("installed").fingerprint_sha256,
        b.fingerprint,
        "the latest bundle, not the superseded one"
    );
    assert_eq!(status.generation, 1, "a was superseded, not installed");
    assert!(
        status
            .last_error
            .unwrap()
            .to_string()
            .contains("the watch failed"),
        "the error after it is recorded"
    );
}
