//! Writers that are not atomic: whatever the writer, a verifying client never meets a chain read
//! half-way. (A leaf whose intermediate has not been written yet matches the new key, so only
//! waiting for the files to be quiet keeps it off the wire.)

mod common;

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Harness, Mode};
use tls_test::{TestCa, overwrite_in_place};

/// Rewrites `tls.key` in place, then `tls.crt` (leaf + intermediate) in place one line every
/// `per_line`, while a client that verifies against the root handshakes in a loop.
async fn line_by_line(per_line: Duration) {
    let root = TestCa::new("writer root");
    let intermediate = root.intermediate("writer intermediate");
    let (a, b) = (
        intermediate.leaf(&["localhost"]),
        intermediate.leaf(&["localhost"]),
    );
    let h = Harness::plain(&a, Mode::Notify).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (handshakes, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = {
        let (stop, handshakes, failures) = (stop.clone(), handshakes.clone(), failures.clone());
        let (addr, roots) = (h.server.addr(), vec![root.cert_der()]);
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match tls_test::probe_trusting(addr, "localhost", &roots).await {
                    Ok(served) => assert_eq!(served.chain.len(), 2, "a whole chain"),
                    Err(_) => {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
                handshakes.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    let (cert, key) = (h.kube.file("tls.crt"), h.kube.file("tls.key"));
    let chain = b.chain_pem.clone();
    overwrite_in_place(&key, b.key_pem.as_bytes()).unwrap();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&cert)
            .unwrap();
        for line in chain.lines() {
            file.write_all(format!("{line}\n").as_bytes()).unwrap();
            file.flush().unwrap();
            std::thread::sleep(per_line);
        }
    })
    .await
    .unwrap();
    h.expect_served(&b).await;
    stop.store(true, Ordering::SeqCst);
    client.await.unwrap();
    let (handshakes, failures) = (
        handshakes.load(Ordering::SeqCst),
        failures.load(Ordering::SeqCst),
    );
    assert!(handshakes > 10, "the client kept handshaking: {handshakes}");
    assert_eq!(
        failures, 0,
        "{failures} of {handshakes} verified handshakes failed"
    );
    let status = h.status();
    assert_eq!(status.generation, 2, "only the whole pair was installed");
    assert!(status.last_error.is_none(), "{:?}", status.last_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_written_a_line_every_3ms_is_never_served_half_way() {
    line_by_line(Duration::from_millis(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_written_a_line_every_10ms_is_never_served_half_way() {
    line_by_line(Duration::from_millis(10)).await;
}
