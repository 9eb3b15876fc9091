//! The client side with pooling on: after the client identity rotates, the next request of a
//! pooled hyper-util client (through `ClientTls::connector`) and of a pooled reqwest client
//! (through `ClientTls::rebuilt`) is made on a new connection that presents the new
//! certificate; extra roots; a bounded, loud ready.
#![cfg(all(feature = "hyper", feature = "axum"))]

mod common;

use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tls_reload::{ClientTls, NotReady, Reloader, TlsInfo};
use tls_source::CertBundle;
use tls_test::{PATIENCE, TestCa};
use tokio::net::TcpListener;

use common::{bundle_with_cas as bundle, provider};

type Feed = futures::channel::mpsc::UnboundedSender<Result<CertBundle, tls_source::Error>>;

/// An mTLS HTTP server (`serve_http`) trusting `client_ca`, answering with the fingerprint of the
/// client certificate of the request's connection.
async fn server(server_ca: &TestCa, client_ca: &TestCa) -> (String, Reloader, Feed) {
    let first = bundle(&server_ca.leaf(&["localhost"]), &[client_ca]);
    let (feed, reloader) = common::mtls(first).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let incoming = reloader.incoming(listener).unwrap();
    let app = Router::new().route(
        "/",
        get(|Extension(tls): Extension<TlsInfo>| async move {
            tls.peer_certificates
                .as_deref()
                .and_then(|chain| chain.first())
                .map(|leaf| tls_test::fingerprint(leaf.as_ref()))
                .unwrap_or_default()
        }),
    );
    tokio::spawn(tls_reload::http::serve_http(incoming, app));
    (format!("https://localhost:{port}/"), reloader, feed)
}

async fn rotate(tls: &ClientTls, feed: &Feed, next: CertBundle) {
    let generation = tls.status().borrow().generation;
    feed.unbounded_send(Ok(next)).unwrap();
    tls_test::wait_for(tls.status(), "the new identity installed", |s| {
        s.generation == generation + 1
    })
    .await;
}

/// A pooled hyper-util HTTP/1.1 client on `tls`, through its connector.
fn http1_pool(
    tls: &ClientTls,
) -> Client<
    tls_reload::Connector<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
    Empty<Bytes>,
> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.client_config().unwrap())
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(tls.connector(https))
}

/// The fingerprint a hyper-util client's request was seen with.
async fn seen<C>(client: &Client<C, Empty<Bytes>>, url: &str, what: &str) -> String
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let response = client
        .get(url.parse().unwrap())
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_hyper_util_http1_client_presents_a_rotated_identity_on_the_next_request() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let (url, _server, _feed) = server(&server_ca, &client_ca).await;
    let (first, second) = (client_ca.client_leaf("svc"), client_ca.client_leaf("svc"));
    let (tls, feed) = common::client_tls(bundle(&first, &[&server_ca])).await;
    let client = http1_pool(&tls);
    assert_eq!(seen(&client, &url, "first").await, first.fingerprint);
    assert_eq!(seen(&client, &url, "pooled").await, first.fingerprint);
    rotate(&tls, &feed, bundle(&second, &[&server_ca])).await;
    assert_eq!(
        seen(&client, &url, "after the rotation").await,
        second.fingerprint,
        "the request right after the rotation presents the new certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_hyper_util_http2_client_presents_a_rotated_identity_on_the_next_request() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let (url, _server, _feed) = server(&server_ca, &client_ca).await;
    let (first, second) = (client_ca.client_leaf("svc"), client_ca.client_leaf("svc"));
    let (tls, feed) = common::client_tls(bundle(&first, &[&server_ca])).await;
    let http = tls
        .rebuilt(|config| {
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_only()
                .enable_http2()
                .build();
            let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(https);
            Ok::<_, std::convert::Infallible>(client)
        })
        .unwrap();
    assert_eq!(
        seen(&http.get().unwrap(), &url, "first").await,
        first.fingerprint
    );
    assert_eq!(
        seen(&http.get().unwrap(), &url, "pooled").await,
        first.fingerprint
    );
    rotate(&tls, &feed, bundle(&second, &[&server_ca])).await;
    assert_eq!(
        seen(&http.get().unwrap(), &url, "after the rotation").await,
        second.fingerprint
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_reqwest_client_presents_a_rotated_identity_on_the_next_request() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let (url, _server, _feed) = server(&server_ca, &client_ca).await;
    let (first, second) = (client_ca.client_leaf("svc"), client_ca.client_leaf("svc"));
    let (tls, feed) = common::client_tls(bundle(&first, &[&server_ca])).await;
    let http = tls
        .rebuilt(|mut config| {
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            reqwest::Client::builder()
                .tls_backend_preconfigured(config)
                .build()
        })
        .unwrap();
    let seen = || async {
        http.get()
            .unwrap()
            .get(&url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert_eq!(seen().await, first.fingerprint);
    assert_eq!(seen().await, first.fingerprint, "pooled");
    rotate(&tls, &feed, bundle(&second, &[&server_ca])).await;
    assert_eq!(seen().await, second.fingerprint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_roots_trust_servers_for_a_bundle_without_ca_crt() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let (url, _server, _feed) = server(&server_ca, &client_ca).await;
    let leaf = client_ca.client_leaf("svc");
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(common::bundle(&leaf))).unwrap();
    // The server's CA as a root of the platform's, say: the bundle is the identity alone.
    let tls = ClientTls::builder()
        .crypto_provider(provider())
        .roots([server_ca.cert_der()])
        .spawn(rx)
        .unwrap();
    tls.ready_timeout(PATIENCE).await.unwrap();
    let client = http1_pool(&tls);
    assert_eq!(seen(&client, &url, "extra roots").await, leaf.fingerprint);
    assert_eq!(tls.status().borrow().root_fingerprints_sha256.len(), 1);
}

#[tokio::test]
async fn ready_is_bounded_and_says_why_a_bundle_was_rejected() {
    let server_ca = TestCa::new("server");
    // A server certificate: no clientAuth purpose.
    let wrong = server_ca.leaf(&["localhost"]);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(bundle(&wrong, &[&server_ca])))
        .unwrap();
    let tls = ClientTls::builder()
        .crypto_provider(provider())
        .spawn(rx)
        .unwrap();
    let err = tls
        .ready_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    let NotReady::TimedOut { last_error, .. } = &err else {
        panic!("{err:?}")
    };
    let said = last_error.as_ref().expect("the rejection").to_string();
    assert!(said.contains("client"), "{said}");
    assert!(err.to_string().contains(&said), "{err}");
}
