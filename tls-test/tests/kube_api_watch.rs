//! The API emulator's watch, asked over plain HTTP as a client would.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A watch asked for the largest `timeoutSeconds` a client can send stays open and delivers
/// what is written (the deadline saturates instead of overflowing the clock).
#[tokio::test]
async fn a_watch_with_the_largest_timeout_stays_open_and_delivers_events() {
    let api = tls_test::KubeApi::start().await;
    let addr = api.url().trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "GET /api/v1/namespaces/default/secrets?watch=true&timeoutSeconds={} HTTP/1.1\r\nHost: {addr}\r\n\r\n",
        u64::MAX
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        let mut written = false;
        loop {
            if !written && String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                // The stream is open: what is written now comes as a live event.
                tokio::time::sleep(Duration::from_millis(100)).await;
                api.put_secret("default", "web", &[("tls.crt", b"x")]);
                written = true;
            }
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "the watch ended: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen);
            if text.contains("\"ADDED\"") && text.contains("\"web\"") {
                return text.into_owned();
            }
        }
    })
    .await
    .expect("the ADDED event within 10 s");
    assert!(found.starts_with("HTTP/1.1 200"), "{found}");
}
