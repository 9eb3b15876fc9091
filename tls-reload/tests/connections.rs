//! Connections follow the trust: an mTLS connection opened under CA A is closed once A has left
//! the trusted set (its overlap over), over HTTP/1.1 keep-alive and HTTP/2, through
//! `serve_http` (gracefully) and through `axum::serve` (its reads end at once: the response in
//! flight is finished, no further request is read, HTTP/2 streams are cut); a connection whose
//! CA is still trusted stays open. Real handshakes over loopback, hyper
//! clients on both ends.
#![cfg(all(feature = "hyper", feature = "axum"))]

mod common;

use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use tls_reload::{Incoming, IncomingBuilder, Reloader, TlsInfo};
use tls_test::{PATIENCE, TestCa, TestCert};
use tokio::net::TcpListener;

use common::bundle_with_cas as bundle;

/// Who the server saw: the client certificate's fingerprint.
async fn whoami(Extension(tls): Extension<TlsInfo>) -> String {
    tls.peer_certificates
        .as_deref()
        .and_then(|chain| chain.first())
        .map_or_else(
            || "anonymous".into(),
            |leaf| tls_test::fingerprint(leaf.as_ref()),
        )
}

async fn whoami_connect_info(
    axum::extract::ConnectInfo(tls): axum::extract::ConnectInfo<TlsInfo>,
) -> String {
    whoami(Extension(tls)).await
}

enum Serving {
    /// `tls_reload::http::serve_http` serving this app: graceful closes.
    Helper(Router),
    /// `axum::serve` serving this app (with `ConnectInfo<TlsInfo>`): the connection's reads
    /// end at a trust close, its writes after the grace period.
    Axum(Router),
}

/// `axum::serve` answering who the client is.
fn axum_whoami() -> Serving {
    Serving::Axum(Router::new().route("/", get(whoami_connect_info)))
}

/// `serve_http` answering who the client is.
fn helper() -> Serving {
    Serving::Helper(Router::new().route("/", get(whoami)))
}

struct Server {
    addr: std::net::SocketAddr,
    reloader: Reloader,
    feed: common::Feed,
    server_cert: TestCert,
}

impl Server {
    /// A server trusting `cas`, its accept stream configured by `incoming`.
    async fn start(
        cas: &[&TestCa],
        incoming: impl FnOnce(IncomingBuilder) -> IncomingBuilder,
        serving: Serving,
    ) -> Self {
        let server_cert = TestCa::new("server").leaf(&["localhost"]);
        let (feed, reloader) = common::mtls(bundle(&server_cert, cas)).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = incoming(Incoming::builder(&reloader))
            .listen(listener)
            .unwrap();
        match serving {
            Serving::Helper(app) => {
                tokio::spawn(tls_reload::http::serve_http(incoming, app));
            }
            Serving::Axum(app) => {
                tokio::spawn(async move {
                    axum::serve(
                        incoming,
                        app.into_make_service_with_connect_info::<TlsInfo>(),
                    )
                    .await
                });
            }
        }
        Self {
            addr,
            reloader,
            feed,
            server_cert,
        }
    }

    /// Trusts `cas` from now on (a CA not among them leaves at once: no overlap).
    async fn trust(&self, cas: &[&TestCa]) {
        self.feed
            .unbounded_send(Ok(bundle(&self.server_cert, cas)))
            .unwrap();
        let want: Vec<String> = cas
            .iter()
            .map(|ca| tls_test::fingerprint(ca.cert_der().as_ref()))
            .collect();
        tls_test::wait_for(self.reloader.status(), "the new trust", |s| {
            let now: Vec<String> = s
                .client_cas
                .iter()
                .map(|ca| ca.fingerprint_sha256.clone())
                .collect();
            now == want
        })
        .await;
    }
}

/// One HTTP connection presenting `cert`, over HTTP/2 or HTTP/1.1: its sender, and the
/// connection's task (it ends when the server closes the connection).
struct Client {
    send: Sender,
    conn: tokio::task::JoinHandle<()>,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

fn config(cert: &TestCert, h2: bool) -> ClientConfig {
    let mut config = tls_test::client_config_with_cert(cert);
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    config
}

async fn open(addr: std::net::SocketAddr, cert: &TestCert, h2: bool) -> Result<Client, String> {
    let tls = tls_test::connect(addr, "localhost", config(cert, h2))
        .await
        .map_err(|e| e.to_string())?;
    let io = TokioIo::new(tls);
    if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Client {
            send: Sender::H2(send),
            conn,
        })
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Client {
            send: Sender::H1(send),
            conn,
        })
    }
}

impl Client {
    /// A GET on this connection: what the server says it saw.
    async fn get(&mut self) -> Result<String, String> {
        let request = hyper::Request::get("https://localhost/")
            .body(Empty::new())
            .unwrap();
        let response = match &mut self.send {
            Sender::H1(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(request).await
            }
            Sender::H2(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(request).await
            }
        }
        .map_err(|e| e.to_string())?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    }

    /// Waits until the server has closed the connection.
    async fn closed(self, what: &str) {
        tokio::time::timeout(PATIENCE, self.conn)
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection is still open"))
            .unwrap();
    }
}

/// An open connection from A's client, A removed: closed; a new handshake from A refused; B's
/// connection, opened at the same time, still answers.
async fn a_removed_ca_closes_its_connections(serving: Serving, h2: bool, grace: Duration) {
    let (a, b) = (TestCa::new("A"), TestCa::new("B"));
    let (client_a, client_b) = (a.client_leaf("client-a"), b.client_leaf("client-b"));
    let server = Server::start(&[&a, &b], |b| b.close_grace(grace), serving).await;
    let mut from_a = open(server.addr, &client_a, h2).await.unwrap();
    let mut from_b = open(server.addr, &client_b, h2).await.unwrap();
    assert_eq!(from_a.get().await.unwrap(), client_a.fingerprint);
    assert_eq!(from_b.get().await.unwrap(), client_b.fingerprint);

    server.trust(&[&b]).await;
    from_a.closed("A's connection after A left").await;
    // TLS 1.3: the client's side of the handshake ends before the server has checked its
    // certificate; the refusal comes as an alert on the first read.
    let again = match open(server.addr, &client_a, h2).await {
        Ok(mut again) => again.get().await,
        Err(err) => Err(err),
    };
    assert!(
        again.is_err(),
        "a new connection from A is refused: {again:?}"
    );
    assert_eq!(
        from_b.get().await.unwrap(),
        client_b.fingerprint,
        "B is still trusted: its connection stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_closes_an_http1_keep_alive_connection_whose_ca_left() {
    // A grace far beyond the test's patience: only the graceful close can pass.
    a_removed_ca_closes_its_connections(helper(), false, Duration::from_secs(3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_closes_an_http2_connection_whose_ca_left_with_goaway() {
    a_removed_ca_closes_its_connections(helper(), true, Duration::from_secs(3600)).await;
}

/// Under `axum::serve` a trust close ends the connection's reads: keep-alive HTTP/1.1 and
/// HTTP/2 connections close without waiting for the grace period (an hour here). Before, they
/// were answered until the grace period was over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_serve_closes_connections_whose_ca_left_without_waiting_for_the_grace_period() {
    for h2 in [false, true] {
        a_removed_ca_closes_its_connections(axum_whoami(), h2, Duration::from_secs(3600)).await;
    }
}

/// Under `axum::serve`, HTTP/1.1: the response being written when the CA leaves is finished,
/// then the connection reads no further request and closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_serve_finishes_the_http1_response_in_flight_then_closes() {
    let (a, b) = (TestCa::new("A"), TestCa::new("B"));
    let client_a = a.client_leaf("client-a");
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let released = std::sync::Arc::clone(&release);
    let app = Router::new().route(
        "/",
        get(move || {
            let (entered_tx, released) = (entered_tx.clone(), std::sync::Arc::clone(&released));
            async move {
                let _ = entered_tx.send(());
                released.notified().await;
                "the whole response"
            }
        }),
    );
    let grace = |b: IncomingBuilder| b.close_grace(Duration::from_secs(3600));
    let server = Server::start(&[&a, &b], grace, Serving::Axum(app)).await;
    let mut from_a = open(server.addr, &client_a, false).await.unwrap();
    let in_flight = tokio::spawn(async move {
        let body = from_a.get().await;
        (body, from_a)
    });
    entered
        .recv()
        .await
        .expect("the request reached the handler");
    server.trust(&[&b]).await;
    release.notify_one();
    let (body, from_a) = tokio::time::timeout(PATIENCE, in_flight)
        .await
        .expect("the response comes")
        .unwrap();
    assert_eq!(body.unwrap(), "the whole response");
    from_a.closed("A's connection after its response").await;
}

/// Under `axum::serve`, HTTP/2: a stream that never ends is cut within a second of the trust
/// close, not at the end of the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_serve_cuts_http2_streams_of_a_connection_whose_ca_left_within_a_second() {
    let (a, b) = (TestCa::new("A"), TestCa::new("B"));
    let client_a = a.client_leaf("client-a");
    let server = Server::start(
        &[&a, &b],
        |b| b.close_grace(Duration::from_secs(3600)),
        Serving::Axum(endless()),
    )
    .await;
    let mut from_a = open(server.addr, &client_a, true).await.unwrap();
    let Sender::H2(send) = &mut from_a.send else {
        unreachable!()
    };
    let request = hyper::Request::get("https://localhost/")
        .body(Empty::new())
        .unwrap();
    let mut body = send.send_request(request).await.unwrap().into_body();
    assert!(body.frame().await.is_some(), "the stream flows");
    server.trust(&[&b]).await;
    let cut = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
    assert!(cut.is_ok(), "the stream was not cut within a second");
    from_a.closed("A's connection").await;
}

/// An app whose one route answers with an endless body: a tick every 20 ms.
fn endless() -> Router {
    Router::new().route(
        "/",
        get(|| async {
            let ticks = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Some((
                    Ok::<_, std::convert::Infallible>(Bytes::from_static(b".")),
                    (),
                ))
            });
            axum::body::Body::from_stream(ticks)
        }),
    )
}

/// A long response in flight when the CA leaves: the connection is cut at the end of the grace
/// period, even though the client keeps it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_ends_is_cut_after_the_grace_period() {
    let a = TestCa::new("A");
    let b = TestCa::new("B");
    let client_a = a.client_leaf("client-a");
    let grace = |b: IncomingBuilder| b.close_grace(Duration::from_millis(300));
    let server = Server::start(&[&a], grace, Serving::Helper(endless())).await;
    let mut from_a = open(server.addr, &client_a, true).await.unwrap();
    let Sender::H2(send) = &mut from_a.send else {
        unreachable!()
    };
    let response = send
        .send_request(
            hyper::Request::get("https://localhost/")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = response.into_body();
    assert!(body.frame().await.is_some(), "the stream flows");

    server
        .feed
        .unbounded_send(Ok(bundle(&server.server_cert, &[&b])))
        .unwrap();
    let drained = tokio::time::timeout(PATIENCE, async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
    assert!(drained.is_ok(), "the endless stream was cut");
    from_a.closed("A's connection after the grace period").await;
}

/// With `close_at_client_expiry`, a connection ends when its client certificate does, though
/// its CA is still trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_can_end_with_its_client_certificate() {
    let a = TestCa::new("A");
    let now = std::time::SystemTime::now();
    let short = a.client_leaf_valid(
        "short",
        now - Duration::from_secs(60),
        now + Duration::from_secs(2),
    );
    let at_expiry = |b: IncomingBuilder| {
        b.close_at_client_expiry(true)
            .close_grace(Duration::from_secs(3600))
    };
    let server = Server::start(&[&a], at_expiry, helper()).await;
    let mut client = open(server.addr, &short, false).await.unwrap();
    assert_eq!(client.get().await.unwrap(), short.fingerprint);
    client
        .closed("the connection after its certificate expired")
        .await;
}
