//! The reload task is owned: it ends when nothing can use it any more, says how it ended (a
//! panic included), and can be handed to the caller to run.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt as _;
use tls_reload::{Ended, Reloader};
use tls_test::{PATIENCE, TestCa, TestServer};

/// Sets its flag when dropped: tells a test that the source was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Item = Result<tls_source::CertBundle, tls_source::Error>;

/// A channel-fed source that raises `dropped` when the reload task drops it.
fn flagged_source() -> (
    futures::channel::mpsc::UnboundedSender<Item>,
    impl futures::Stream<Item = Item> + Send + 'static,
    Arc<AtomicBool>,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let source = rx.map(move |item| {
        let _alive = &flag;
        item
    });
    (tx, source, dropped)
}

#[tokio::test]
async fn dropping_every_handle_and_resolver_stops_the_task_and_drops_the_source() {
    let cert = TestCa::new("owned").leaf(&["localhost"]);
    let (tx, source, dropped) = flagged_source();
    tx.unbounded_send(Ok(common::bundle(&cert))).unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let status = reloader.status();
    let resolver = reloader.resolver();
    let second_handle = reloader.clone();
    drop(reloader);
    drop(second_handle);

    // The resolver alone keeps the task alive: a rotation still reaches it.
    let next = TestCa::new("owned 2").leaf(&["localhost"]);
    tx.unbounded_send(Ok(common::bundle(&next))).unwrap();
    let server = TestServer::start(resolver.clone()).await;
    tls_test::wait_for(status.clone(), "the rotation", |s| {
        common::installed(s) == Some(next.fingerprint.as_str())
    })
    .await;
    assert_eq!(tls_test::served(server.addr()).await, next.fingerprint);
    assert!(!dropped.load(Ordering::SeqCst));

    drop(server);
    drop(resolver);
    let status = tls_test::wait_for(status, "the task to end", |s| !s.running).await;
    assert_eq!(status.ended, Some(Ended::HandlesDropped));
    assert!(dropped.load(Ordering::SeqCst), "the source was dropped");
}

#[tokio::test]
async fn a_panicking_source_is_reported_by_stopped_and_the_certificate_keeps_serving() {
    let cert = TestCa::new("panic").leaf(&["localhost"]);
    let (tx, rx) = futures::channel::mpsc::unbounded::<Item>();
    let source = rx.map(|item| match item {
        Err(e) if e.to_string().contains("explode") => panic!("the source exploded"),
        other => other,
    });
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    tx.unbounded_send(Ok(common::bundle(&cert))).unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    tx.unbounded_send(Err(tls_source::Error::source("test", "explode")))
        .unwrap();
    // The source is dropped and the route says so; it was the only source, so the task ends.
    let ended = common::patiently("the task to end", reloader.stopped()).await;
    assert_eq!(ended, Ended::SourcesEnded);
    let status = reloader.status().borrow().clone();
    assert!(!status.running);
    assert!(status.stopped);
    assert!(matches!(status.last_error.as_deref(),
        Some(tls_reload::Error::SourcePanicked { message, .. }) if message == "the source exploded"));
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(tls_test::served(server.addr()).await, cert.fingerprint);
}

#[tokio::test]
async fn the_task_can_be_run_by_the_caller_and_ends_on_stop() {
    let cert = TestCa::new("build").leaf(&["localhost"]);
    let (tx, source, dropped) = flagged_source();
    tx.unbounded_send(Ok(common::bundle(&cert))).unwrap();
    let (reloader, task) = Reloader::builder()
        .crypto_provider(common::provider())
        .build(source)
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(task);
    reloader.ready_timeout(PATIENCE).await.unwrap();
    reloader.stop();
    let ended = common::patiently("join", tasks.join_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::Cancelled);
    assert_eq!(
        common::patiently("stopped", reloader.stopped()).await,
        Ended::Cancelled
    );
    assert!(dropped.load(Ordering::SeqCst));

    // A task that is never run: the status says so instead of hanging.
    let (reloader, task) = Reloader::builder()
        .crypto_provider(common::provider())
        .build(futures::stream::pending())
        .unwrap();
    drop(task);
    assert_eq!(
        common::patiently("stopped", reloader.stopped()).await,
        Ended::Dropped
    );
    assert!(reloader.ready().await.is_err());
}

#[tokio::test]
async fn a_source_that_ends_ends_the_task_and_says_so() {
    let cert = TestCa::new("end").leaf(&["localhost"]);
    let source = futures::stream::iter(vec![Ok(common::bundle(&cert))]);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    assert_eq!(
        common::patiently("stopped", reloader.stopped()).await,
        Ended::SourcesEnded
    );
    assert_eq!(
        common::installed(&reloader.status().borrow()),
        Some(cert.fingerprint.as_str())
    );
}

/// Any source can hand its items over on its own thread ([`tls_source::inline::Inline`]): the
/// reload core installs each there (served before `offer` returns) and the stream never yields
/// it, so every item is delivered once. While something that went down the stream has not
/// landed, later items go the same way: an older item never replaces a newer one.
#[tokio::test]
async fn an_inline_source_delivers_each_item_once_on_its_own_thread_and_in_order() {
    use std::sync::atomic::AtomicUsize;
    use tls_source::inline::{Handoff, Inline};

    let ca = TestCa::new("inline");
    let [first, second, third] = ca.leaves::<3>(&["localhost"]);
    let handoff = Handoff::new();
    let (tx, rx) = futures::channel::mpsc::unbounded::<Item>();
    let yielded = Arc::new(AtomicUsize::new(0));
    let counted = rx.inspect({
        let yielded = yielded.clone();
        move |_| {
            yielded.fetch_add(1, Ordering::SeqCst);
        }
    });
    let offer = |cert: &tls_test::TestCert| {
        let (bundle, handoff) = (common::bundle(cert), handoff.clone());
        std::thread::spawn(move || handoff.offer(Ok(bundle)))
            .join()
            .unwrap()
    };
    // Offered before the reloader exists (no hook): it goes down the stream, but not yet.
    let early = offer(&first).expect("no hook: handed back");
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(Inline::new(counted, handoff.clone()))
        .unwrap();
    // The task runs (this test's runtime has one thread: a yield lets it start and wait).
    tokio::task::yield_now().await;
    // The first is still on its way: the second follows it down the stream.
    let behind = offer(&second).expect("handed back behind the first");
    tx.unbounded_send(early).unwrap();
    tx.unbounded_send(behind).unwrap();
    // (They may land in one batch, which installs the newer alone.)
    let served = |s: &tls_reload::Status| s.current.as_ref().map(|c| c.fingerprint_sha256.clone());
    let status = tls_test::wait_for(reloader.status(), "the second, after the first", |s| {
        served(s) == Some(second.fingerprint.clone())
    })
    .await;
    let installed = status.generation;
    assert_eq!(yielded.load(Ordering::SeqCst), 2);

    // Nothing on its way: taken on the producer's thread, served before `offer` returns.
    let server = TestServer::start(reloader.resolver()).await;
    assert!(offer(&third).is_none(), "taken on the producer's thread");
    assert_eq!(tls_test::served(server.addr()).await, third.fingerprint);
    assert_eq!(yielded.load(Ordering::SeqCst), 2, "never yielded as well");
    let status = tls_test::wait_for(reloader.status(), "the inline install", |s| {
        served(s) == Some(third.fingerprint.clone())
    })
    .await;
    assert_eq!(status.generation, installed + 1, "installed once");
    drop(tx);
}
