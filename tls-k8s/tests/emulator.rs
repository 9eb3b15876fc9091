//! The Secret source against the Kubernetes API emulator: the production kube client and watcher
//! talk the wire protocol; real handshakes check what is served.

mod common;

use common::{Served, client, put};
use futures::StreamExt as _;
use tls_k8s::SecretSource;
use tls_test::{KubeApi, TestCa};

/// Writes a new certificate into the Secret: it is served, and the status has no error left.
async fn serves_a_new_certificate_and_recovers(api: &KubeApi, ca: &TestCa, served: &Served) {
    let next = ca.leaf(&["localhost"]);
    put(api, &next);
    served.expect_served(&next).await;
    served.expect_recovered().await;
}

async fn setup() -> (KubeApi, TestCa, tls_test::TestCert, Served) {
    let api = KubeApi::start().await;
    let ca = TestCa::new("k8s");
    let first = ca.leaf(&["localhost"]);
    put(&api, &first);
    let served = Served::start(client(&api), "default", "tls").await;
    assert_eq!(served.served().await, first.fingerprint);
    (api, ca, first, served)
}

#[tokio::test]
async fn an_updated_secret_is_served_and_the_origin_names_it() {
    let (api, ca, _, served) = setup().await;
    let next = ca.leaf(&["localhost"]);
    let rv = put(&api, &next);
    served.expect_served(&next).await;
    let origin = served.status().current.unwrap().origin.to_string();
    assert_eq!(
        origin,
        format!("secret default/tls at resourceVersion {rv}")
    );
}

#[tokio::test]
async fn a_label_change_causes_no_swap() {
    let (api, ca, _, served) = setup().await;
    let generation = served.status().generation;
    api.set_label("secrets", "default", "tls", "team", "web");
    let next = ca.leaf(&["localhost"]);
    put(&api, &next);
    served.expect_served(&next).await;
    assert_eq!(
        served.status().generation,
        generation + 1,
        "only the data change swapped"
    );
}

#[tokio::test]
async fn the_source_yields_nothing_for_metadata_changes() {
    let api = KubeApi::start().await;
    let ca = TestCa::new("k8s");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    put(&api, &a);
    let mut source = SecretSource::builder(client(&api), "default", "tls").build();
    let first = source.next().await.unwrap().unwrap();
    api.set_label("secrets", "default", "tls", "a", "1");
    api.set_label("secrets", "default", "tls", "b", "2");
    put(&api, &b);
    let next = source.next().await.unwrap().unwrap();
    assert_ne!(
        next.digest(),
        first.digest(),
        "the label changes were skipped: the next item is the data change"
    );
    assert_eq!(next.leaf().unwrap().as_ref(), b.cert_der.as_ref());
}

#[tokio::test]
async fn deleted_then_recreated() {
    let (api, ca, first, served) = setup().await;
    assert!(api.delete("secrets", "default", "tls"));
    served
        .expect_reported("secret default/tls: the Secret was deleted", &first)
        .await;
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

#[tokio::test]
async fn bad_data_is_rejected_and_reported() {
    let (api, ca, first, served) = setup().await;
    let generation = served.status().generation;
    api.put_secret(
        "default",
        "tls",
        &[
            ("tls.crt", b"garbage"),
            ("tls.key", first.key_pem.as_bytes()),
        ],
    );
    served
        .expect_reported("malformed default/tls key tls.crt", &first)
        .await;
    let other = ca.leaf(&["localhost"]);
    api.put_secret(
        "default",
        "tls",
        &[
            ("tls.crt", first.chain_pem.as_bytes()),
            ("tls.key", other.key_pem.as_bytes()),
        ],
    );
    served
        .expect_reported("does not match the leaf certificate", &first)
        .await;
    api.put_secret("default", "tls", &[("tls.crt", first.chain_pem.as_bytes())]);
    served
        .expect_reported("the Secret has no tls.key", &first)
        .await;
    assert_eq!(
        served.status().generation,
        generation,
        "nothing bad was installed"
    );
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

/// A watch that the server ends cleanly (as every API server does after `timeoutSeconds`) is
/// routine, not trouble: the watcher resumes from its resourceVersion and nothing is missed.
#[tokio::test]
async fn a_dropped_watch_resumes() {
    let (api, ca, _, served) = setup().await;
    api.close_watches();
    let next = ca.leaf(&["localhost"]);
    put(&api, &next);
    served.expect_served(&next).await;
}

#[tokio::test]
async fn gone_410_relists() {
    let (api, ca, first, served) = setup().await;
    let next = ca.leaf(&["localhost"]);
    // The watch drops, and while the client reconnects the Secret changes and the history is
    // compacted: the resume answers 410 Gone, and the watcher lists again.
    api.set_delay(std::time::Duration::from_millis(300));
    let before = api.requests();
    api.close_watches();
    wait_until(|| api.requests() > before).await;
    put(&api, &next);
    api.compact();
    api.set_delay(std::time::Duration::ZERO);
    // Only a new list can deliver it: the event itself was compacted away.
    served.expect_served(&next).await;
    assert_eq!(api.answered_gone(), 1);
    served.expect_recovered().await;
    assert_ne!(served.served().await, first.fingerprint);
}

/// Polls a condition on the emulator (its request counter) with a generous time-out.
async fn wait_until(mut condition: impl FnMut() -> bool) {
    tokio::time::timeout(tls_test::PATIENCE, async {
        while !condition() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("condition in time");
}

/// The API server goes away mid-watch (every connection cut) and comes back with its state:
/// the cut watch is reported, the certificate kept, and updates flow again.
#[tokio::test]
async fn api_server_restart_keeping_state() {
    let (api, ca, first, served) = setup().await;
    api.restart(true).await;
    served
        .expect_reported("watching the Secret failed", &first)
        .await;
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

/// An API server that comes back without the Secret: the relist no longer has it, which is
/// said as a deletion (it was there before).
#[tokio::test]
async fn api_server_restart_losing_state() {
    let (api, ca, first, served) = setup().await;
    api.restart(false).await;
    served
        .expect_reported("the Secret was deleted", &first)
        .await;
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

/// While the API answers 500, the error is reported and the certificate kept; afterwards the
/// watch resumes and updates flow again. (The error stays in the status until the next load:
/// it is "the last error since the last successful load".)
#[tokio::test]
async fn server_errors_for_a_while() {
    let (api, ca, first, served) = setup().await;
    api.fail_all(Some(500));
    served
        .expect_reported("secret default/tls: watching the Secret failed", &first)
        .await;
    api.fail_all(None);
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

#[tokio::test]
async fn forbidden_names_the_missing_permission() {
    let (api, ca, first, served) = setup().await;
    api.fail_all(Some(403));
    let status = served
        .expect_reported("the service account needs get, list and watch on secrets named tls in namespace default", &first)
        .await;
    assert!(
        status.last_error.unwrap().to_string().contains("cannot"),
        "the API server's words are kept"
    );
    api.fail_all(None);
    serves_a_new_certificate_and_recovers(&api, &ca, &served).await;
}

#[tokio::test]
async fn a_missing_secret_at_start_is_reported_then_picked_up() {
    let api = KubeApi::start().await;
    let source = SecretSource::builder(client(&api), "default", "tls").build();
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .spawn(source)
        .unwrap();
    let err = reloader
        .ready_timeout(std::time::Duration::from_millis(1500))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("secret default/tls: the Secret does not exist"),
        "{err}"
    );
    let cert = TestCa::new("late").leaf(&["localhost"]);
    put(&api, &cert);
    reloader.ready_timeout(tls_test::PATIENCE).await.unwrap();
}
