//! Authorization rules on verified clients (`ClientAuth::authorize`): a client whose chain
//! verifies but whose identity no rule matches is refused in the handshake with the alert
//! `access_denied`, before the service sees a request; when the rules change, an open
//! connection they now refuse is closed and one they still allow stays. Real handshakes over
//! loopback, hyper on both ends.
#![cfg(feature = "hyper")]

mod common;

use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tls_reload::{AllowList, Authorization, ClientAuth, Incoming, Reloader, TlsInfo};
use tls_test::{PATIENCE, TestCa, TestCert};
use tokio::net::TcpListener;

const WEB: &str = "spiffe://example.org/ns/prod/sa/web";
const BATCH: &str = "spiffe://example.org/ns/staging/sa/batch";

async fn whoami(Extension(tls): Extension<TlsInfo>) -> String {
    let leaf = tls.peer_certificates.as_deref().and_then(|c| c.first());
    leaf.map_or_else(|| "anonymous".into(), |l| tls_test::fingerprint(l.as_ref()))
}

/// A server trusting `ca`, authorizing by `rules`: its address and how many requests it saw.
async fn serve(ca: &TestCa, rules: &Authorization) -> (std::net::SocketAddr, Reloader) {
    let server_cert = TestCa::new("server").leaf(&["localhost"]);
    let (feed, rx) = futures::channel::mpsc::unbounded();
    feed.unbounded_send(Ok(common::bundle_with_cas(&server_cert, &[ca])))
        .unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(tls_test::provider())
        .client_auth(ClientAuth::from_bundle().authorize(rules.clone()))
        .spawn(rx)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    std::mem::forget(feed);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = Incoming::builder(&reloader).listen(listener).unwrap();
    let app = Router::new().route("/", get(whoami));
    tokio::spawn(tls_reload::http::serve_http(incoming, app));
    (addr, reloader)
}

struct Conn {
    send: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    conn: tokio::task::JoinHandle<Result<(), String>>,
}

async fn open(addr: std::net::SocketAddr, cert: &TestCert) -> Result<Conn, String> {
    let mut config = tls_test::client_config_with_cert(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = tls_test::connect(addr, "localhost", config)
        .await
        .map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(async move { conn.await.map_err(|e| format!("{e:?}")) });
    Ok(Conn { send, conn })
}

impl Conn {
    async fn get(&mut self) -> Result<String, String> {
        let request = hyper::Request::get("https://localhost/")
            .body(Empty::new())
            .unwrap();
        self.send.ready().await.map_err(|e| format!("{e:?}"))?;
        let response = self
            .send
            .send_request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    }
}

/// A first request on a new connection from `cert`: the answer, or the error.
async fn get_once(addr: std::net::SocketAddr, cert: &TestCert) -> Result<String, String> {
    let mut conn = open(addr, cert).await?;
    match conn.get().await {
        Ok(answer) => Ok(answer),
        // The connection's own error: a TLS alert, say.
        Err(err) => Err(format!("{err}: {:?}", conn.conn.await)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_no_rule_matches_is_refused_with_access_denied_and_an_allowed_one_is_served() {
    let ca = TestCa::new("clients");
    let (web, batch) = (
        ca.uri_client_leaf("web", &[WEB]),
        ca.uri_client_leaf("batch", &[BATCH]),
    );
    let two_uris = ca.uri_client_leaf("web", &[WEB, "https://example.org/x"]);
    let rules = Authorization::new(AllowList::parse("uri=spiffe://example.org/ns/prod/*").unwrap());
    let (addr, _reloader) = serve(&ca, &rules).await;

    assert_eq!(get_once(addr, &web).await.unwrap(), web.fingerprint);
    let refused = get_once(addr, &batch).await.unwrap_err();
    assert!(refused.contains("AccessDenied"), "{refused}");
    let refused = get_once(addr, &two_uris).await.unwrap_err();
    assert!(
        refused.contains("AccessDenied"),
        "two URI SANs are no SPIFFE identity: {refused}"
    );
    // A client of an untrusted CA is refused by the chain check, not the rules.
    let stranger = TestCa::new("stranger").uri_client_leaf("web", &[WEB]);
    let refused = get_once(addr, &stranger).await.unwrap_err();
    assert!(!refused.contains("AccessDenied"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_rules_close_the_connections_they_refuse_and_keep_the_others() {
    let ca = TestCa::new("clients");
    let (web, batch) = (
        ca.uri_client_leaf("web", &[WEB]),
        ca.uri_client_leaf("batch", &[BATCH]),
    );
    let rules = Authorization::new(AllowList::parse(&format!("uri={WEB}\ncn=batch")).unwrap());
    let (addr, _reloader) = serve(&ca, &rules).await;
    let mut from_web = open(addr, &web).await.unwrap();
    let mut from_batch = open(addr, &batch).await.unwrap();
    assert_eq!(from_web.get().await.unwrap(), web.fingerprint);
    assert_eq!(from_batch.get().await.unwrap(), batch.fingerprint);

    rules.set(AllowList::parse(&format!("uri={WEB}")).unwrap());
    tokio::time::timeout(PATIENCE, from_batch.conn)
        .await
        .expect("batch's connection is closed once the rules refuse it")
        .unwrap()
        .unwrap();
    assert_eq!(
        from_web.get().await.unwrap(),
        web.fingerprint,
        "web is still allowed: its connection stays"
    );
    let again = get_once(addr, &batch).await.unwrap_err();
    assert!(again.contains("AccessDenied"), "{again}");

    rules.set(AllowList::parse("cn=batch").unwrap());
    assert_eq!(get_once(addr, &batch).await.unwrap(), batch.fingerprint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_is_checked_against_the_rules_in_force() {
    let ca = TestCa::new("clients");
    let web = ca.uri_client_leaf("web", &[WEB]);
    let rules = Authorization::new(AllowList::parse(&format!("uri={WEB}")).unwrap());
    let (addr, _reloader) = serve(&ca, &rules).await;
    let mut config = tls_test::client_config_with_cert(&web);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // The clones share the session store: the second connection resumes the first's session.
    let resumed = |config: rustls::ClientConfig| async move {
        let tls = tls_test::connect(addr, "localhost", config).await.unwrap();
        let kind = tls.get_ref().1.handshake_kind();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::get("https://localhost/")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let answer = match send.ready().await {
            Ok(()) => send
                .send_request(request)
                .await
                .map(|r| r.status().as_u16()),
            Err(err) => Err(err),
        };
        (kind, answer.map_err(|e| format!("{e:?}")))
    };
    let (kind, first) = resumed(config.clone()).await;
    assert_eq!(
        (kind, first.unwrap()),
        (Some(rustls::HandshakeKind::Full), 200)
    );
    let (kind, second) = resumed(config.clone()).await;
    assert_eq!(
        (kind, second.unwrap()),
        (Some(rustls::HandshakeKind::Resumed), 200)
    );

    rules.set(AllowList::parse("cn=someone-else").unwrap());
    let (kind, third) = resumed(config).await;
    assert_eq!(kind, Some(rustls::HandshakeKind::Resumed));
    assert!(
        third.is_err(),
        "a resumed session the rules refuse is not served: {third:?}"
    );
}
