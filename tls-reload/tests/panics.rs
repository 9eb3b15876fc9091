//! A panic never freezes rotation silently: one in checking an input rejects that input (reason
//! `internal`) and the task goes on; a source that panics is dropped and its route says it is
//! stopped while it keeps serving; a handshake that panics drops that connection only.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::SystemTime;

use futures::StreamExt as _;
use tls_reload::{Error, Reloader};
use tls_source::CertBundle;
use tls_source::clock::Clock;
use tls_test::{TestCa, TestServer};

use common::{bundle, installed, patiently, provider, route_installed};

/// A wall clock that panics once when armed: a bug in code the reload core calls while it
/// checks an input.
#[derive(Debug, Default)]
struct Tripwire(AtomicBool);

impl Clock for Tripwire {
    fn now(&self) -> SystemTime {
        assert!(!self.0.swap(false, Ordering::SeqCst), "the tripwire clock");
        SystemTime::now()
    }
}

#[tokio::test]
async fn a_panic_while_checking_an_input_rejects_it_and_the_task_goes_on() {
    let ca = TestCa::new("panics");
    let [first, second, third] = ca.leaves(&["localhost"]);
    let clock = Arc::new(Tripwire::default());
    let (tx, reloader) = common::clocked(clock.clone(), &first);
    patiently("ready", reloader.ready()).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;

    clock.0.store(true, Ordering::SeqCst);
    tx.unbounded_send(Ok(bundle(&second))).unwrap();
    let status = tls_test::wait_for(reloader.status(), "the panic reported", |s| {
        s.last_error.is_some()
    })
    .await;
    let err = status.last_error.as_deref().unwrap();
    assert!(
        matches!(err, Error::Internal { route, .. } if route == "default"),
        "{err:?}"
    );
    assert_eq!(err.reason(), "internal");
    assert!(err.to_string().contains("the tripwire clock"), "{err}");
    assert!(status.running, "the task goes on");
    assert_eq!(status.generation, 1);
    assert_eq!(installed(&status), Some(first.fingerprint.as_str()));
    assert_eq!(tls_test::served(server.addr()).await, first.fingerprint);

    // The same bundle again is checked again (nothing was recorded of it), and so is the next.
    tx.unbounded_send(Ok(bundle(&third))).unwrap();
    tls_test::expect_served(server.addr(), reloader.status(), installed, &third).await;
    let status = reloader.status().borrow().clone();
    assert!(status.last_error.is_none() && status.running && !status.stopped);
}

/// A source that yields `first`, then panics in `poll_next`.
fn panics_after(
    first: CertBundle,
) -> impl futures::Stream<Item = Result<CertBundle, tls_source::Error>> {
    let mut first = Some(first);
    futures::stream::poll_fn(move |_| match first.take() {
        Some(bundle) => Poll::Ready(Some(Ok(bundle))),
        None => panic!("the route's source broke"),
    })
}

#[tokio::test]
async fn a_source_that_panics_is_dropped_and_its_route_says_it_is_stopped() {
    let ca = TestCa::new("panics");
    let (api, default) = (ca.leaf(&["api.example.com"]), ca.leaf(&["localhost"]));
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<CertBundle, tls_source::Error>>();
    tx.unbounded_send(Ok(bundle(&default))).unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .route("api.example.com", panics_after(bundle(&api)))
        .spawn(rx)
        .unwrap();
    let status = tls_test::wait_for(reloader.status(), "the route stopped", |s| {
        s.routes.get("api.example.com").is_some_and(|r| r.stopped)
    })
    .await;
    let route = &status.routes["api.example.com"];
    assert!(
        matches!(route.last_error.as_deref(), Some(Error::SourcePanicked { route, message })
            if route == "api.example.com" && message == "the route's source broke"),
        "{route:#?}"
    );
    assert_eq!(
        route_installed(&status, "api.example.com"),
        Some(api.fingerprint.as_str())
    );
    assert!(
        status.running && !status.stopped,
        "the other routes go on: {status:#?}"
    );

    // It keeps serving its certificate; the default route keeps rotating.
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(
        tls_test::served_as(server.addr(), "api.example.com")
            .await
            .unwrap(),
        api.fingerprint
    );
    let next = ca.leaf(&["localhost"]);
    tx.unbounded_send(Ok(bundle(&next))).unwrap();
    tls_test::expect_served(server.addr(), reloader.status(), installed, &next).await;
    assert!(reloader.status().borrow().routes["api.example.com"].stopped);
}

#[cfg(feature = "accept")]
#[tokio::test]
async fn a_handshake_that_panics_drops_that_connection_only() {
    /// Key logging that panics the first time it is asked: a bug inside one handshake.
    #[derive(Debug, Default)]
    struct PanicOnce(AtomicBool);
    impl rustls::KeyLog for PanicOnce {
        fn log(&self, _: &str, _: &[u8], _: &[u8]) {
            assert!(self.0.swap(true, Ordering::SeqCst), "key logging broke");
        }
    }

    let ca = TestCa::new("panics");
    let leaf = ca.leaf(&["localhost"]);
    let source = futures::stream::iter([Ok(bundle(&leaf))]).chain(futures::stream::pending());
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .spawn(source)
        .unwrap();
    // Through the stream, then through `spawn_each` (the handshake in a task of its own).
    for spawn_each in [false, true] {
        let mut config = reloader.server_config().unwrap();
        config.key_log = Arc::new(PanicOnce::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = tls_reload::Incoming::builder(&reloader)
            .server_config(config)
            .listen(listener)
            .unwrap();
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&served);
        let accepting = tokio::spawn(async move {
            if spawn_each {
                let _ = incoming
                    .spawn_each(move |_conn| async move {
                        count.fetch_add(1, Ordering::SeqCst);
                    })
                    .await;
            } else {
                while let Some(Ok(_conn)) = incoming.next().await {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
        });

        assert!(
            tls_test::served_as(addr, "localhost").await.is_err(),
            "the first handshake panicked: that connection is dropped"
        );
        assert_eq!(
            tls_test::served(addr).await,
            leaf.fingerprint,
            "the next one is served"
        );
        patiently("the next connection is handed over", async {
            while served.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert_eq!(served.load(Ordering::SeqCst), 1);
        assert!(!accepting.is_finished(), "still accepting");
        accepting.abort();
    }
}
