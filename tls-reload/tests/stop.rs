//! Cancelling the token ends the reload task and drops the source: no task or watcher is left.
//! (One test in this binary, on a current-thread runtime, so that the process's thread count is
//! the watcher's and the file reads' to change.)

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tls_reload::Reloader;
use tls_source::{CertBundle, FileSource};
use tls_test::{KubeDir, PATIENCE, TestCa, TestServer};
use tokio_util::sync::CancellationToken;

/// A source wrapper that records when it is dropped.
struct DropFlag<S> {
    inner: S,
    dropped: Arc<AtomicBool>,
}

impl<S: Stream<Item = Result<CertBundle, tls_source::Error>> + Unpin> Stream for DropFlag<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl<S> Drop for DropFlag<S> {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap()
}

async fn threads_become(n: usize) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if threads() == n {
            return true;
        }
        tokio::task::yield_now().await;
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

#[test]
fn cancelling_stops_the_task_drops_the_source_and_the_watcher() {
    // The file source reads on the runtime's blocking threads, which linger for the keep-alive
    // once idle: keep it short so that only the watcher's thread is counted.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(std::time::Duration::from_millis(10))
        .build()
        .unwrap()
        .block_on(cancelling_stops());
}

async fn cancelling_stops() {
    let cert = TestCa::new("stop").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    common::write_kube(&kube, &cert);

    let before = threads();
    let dropped = Arc::new(AtomicBool::new(false));
    let source = DropFlag {
        inner: FileSource::kubernetes_dir(kube.path()).build().into_inner(),
        dropped: dropped.clone(),
    };
    let token = CancellationToken::new();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .cancellation_token(token.clone())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    assert!(
        threads() > before,
        "the notify watcher runs a thread while the source lives"
    );
    assert!(reloader.status().borrow().running);

    token.cancel();
    common::patiently("the reload task ends", reloader.stopped()).await;
    assert!(dropped.load(Ordering::SeqCst), "the source was dropped");
    assert!(!reloader.status().borrow().running);
    assert!(
        threads_become(before).await,
        "the watcher thread ended: {} threads, {before} before",
        threads()
    );

    // The last certificate keeps serving after the stop.
    let server = TestServer::start(reloader.resolver()).await;
    let served = tls_test::probe(server.addr(), "localhost").await.unwrap();
    assert_eq!(served.fingerprint, cert.fingerprint);
}
