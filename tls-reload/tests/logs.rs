//! What the log says, as a user of the README's program reads it (a `tracing` subscriber
//! writing text): a bad update before any certificate says nothing is served yet; one after
//! says the current certificate is kept, naming the input.

mod common;

use tls_test::{PATIENCE, TestCa};

#[tokio::test]
async fn bad_updates_are_logged_saying_what_is_served() {
    let captured = tls_test::Logs::global();

    let ca = TestCa::new("logs");
    let (good, other) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(rx)
        .unwrap();

    // Before any certificate: a pair whose key is another's.
    tx.unbounded_send(Ok(common::bundle(&good.with_key_of(&other))))
        .unwrap();
    let text = captured
        .wait_for("certificate rejected; no certificate is served yet")
        .await;
    assert!(!text.contains("keeping the current certificate"), "{text}");

    tx.unbounded_send(Ok(common::bundle(&good))).unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    captured.wait_for("certificate installed").await;

    // After: the current one is kept, and the line names the input.
    tx.unbounded_send(Ok(common::bundle(&other.with_key_of(&good))))
        .unwrap();
    let text = captured
        .wait_for("certificate rejected; keeping the current certificate")
        .await;
    let line = text
        .lines()
        .find(|l| l.contains("keeping the current certificate"))
        .unwrap();
    assert!(line.contains("test bundle"), "the input is named: {line}");
    tls_test::assert_no_key_material(&text, &good);
    tls_test::assert_no_key_material(&text, &other);
}
