//! What the log says, as a user of the README's program reads it (a `tracing` subscriber
//! writing text): a bad update before any certificate says nothing is served yet; one after
//! says the current certificate is kept, naming the input.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tls_test::{PATIENCE, TestCa};

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    async fn wait_for(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let text = self.text();
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} in the log:\n{text}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

// One thread: the subscriber set here sees the reload task's events.
#[tokio::test(flavor = "current_thread")]
async fn bad_updates_are_logged_saying_what_is_served() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

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
