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
