//! Certificates for IP addresses (an ACME `shortlived` certificate for `192.0.2.7`, say): a
//! client connecting to an address sends no server name, so the resolver serves the IP
//! certificate of the local address the handshake arrived on, else the one IP certificate if
//! there is exactly one, else what any unknown name gets.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::StreamExt as _;
use futures::channel::mpsc::UnboundedSender;
use tls_reload::Reloader;
use tls_source::{Keyed, KeyedUpdate};
use tls_test::{PATIENCE, TestCa, TestCert, served_as};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

type Feed = UnboundedSender<Result<Keyed, tls_source::Error>>;

fn put(feed: &Feed, key: &str, cert: &TestCert) {
    feed.unbounded_send(Ok(Keyed {
        key: key.into(),
        update: KeyedUpdate::Put(common::bundle(cert)),
    }))
    .unwrap();
}

/// A reloader with a keyed source fed by the test, a default certificate, and an accept stream on every IPv4 address (so that each connection's own local
/// address, not the listener's `0.0.0.0`, tells the certificate).
async fn serve(strict: bool, default: &TestCert) -> (Feed, Reloader, u16) {
    let (feed, rx) = futures::channel::mpsc::unbounded();
    // The default certificate, and then nothing more (a source that never ends).
    let default_source =
        futures::stream::iter([Ok(common::bundle(default))]).chain(futures::stream::pending());
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .routes(rx)
        .sni_strict(strict)
        .ready_before_lists(true)
        .spawn(default_source)
        .unwrap();
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut incoming = reloader.incoming(listener).unwrap();
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = incoming.next().await {
            tokio::spawn(async move {
                let _ = conn.shutdown().await;
            });
        }
    });
    reloader.ready_timeout(PATIENCE).await.unwrap();
    (feed, reloader, port)
}

/// What a client connecting to `ip` (no server name) is served.
async fn at(ip: &str, port: u16) -> std::io::Result<String> {
    let addr = SocketAddr::new(ip.parse().unwrap(), port);
    served_as(addr, ip).await
}

async fn installed(reloader: &Reloader, keys: &[&str]) {
    tls_test::wait_for(reloader.status(), "the IP certificates installed", |s| {
        keys.iter().all(|k| common::route_installed(s, k).is_some()) && s.routes.len() == keys.len()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_without_a_server_name_gets_the_certificate_of_the_address_it_arrived_on() {
    let ca = TestCa::new("ip-routes");
    let default = ca.leaf(&["localhost"]);
    let (two, three) = (ca.leaf(&["127.0.0.2"]), ca.leaf(&["127.0.0.3"]));
    let (feed, reloader, port) = serve(false, &default).await;
    put(&feed, "two", &two);
    put(&feed, "three", &three);
    installed(&reloader, &["two", "three"]).await;
    assert_eq!(
        reloader.status().borrow().routes["two"].names,
        ["127.0.0.2"]
    );

    assert_eq!(at("127.0.0.2", port).await.unwrap(), two.fingerprint);
    assert_eq!(at("127.0.0.3", port).await.unwrap(), three.fingerprint);
    // Verified as a client verifies an address: against the CA, for the IP SAN.
    let verified = tls_test::probe_trusting(
        SocketAddr::new("127.0.0.2".parse().unwrap(), port),
        "127.0.0.2",
        &[ca.cert_der()],
    )
    .await
    .unwrap();
    assert_eq!(verified.fingerprint, two.fingerprint);
    // An address no IP certificate covers, with two of them: the default, as for any unknown
    // name; a server name still goes by name.
    assert_eq!(at("127.0.0.1", port).await.unwrap(), default.fingerprint);
    let named = SocketAddr::new("127.0.0.2".parse().unwrap(), port);
    assert_eq!(
        served_as(named, "localhost").await.unwrap(),
        default.fingerprint
    );

    // One IP certificate left: it is every nameless handshake's, whatever the address (behind
    // NAT the address a client reached is not the socket's).
    feed.unbounded_send(Ok(Keyed {
        key: "three".into(),
        update: KeyedUpdate::Remove,
    }))
    .unwrap();
    installed(&reloader, &["two"]).await;
    assert_eq!(at("127.0.0.1", port).await.unwrap(), two.fingerprint);
    assert_eq!(at("127.0.0.3", port).await.unwrap(), two.fingerprint);

    // A renewal of the address's certificate is served at once.
    let renewed = ca.leaf(&["127.0.0.2"]);
    put(&feed, "two", &renewed);
    tls_test::wait_for(reloader.status(), "the renewal", |s| {
        common::route_installed(s, "two") == Some(renewed.fingerprint.as_str())
    })
    .await;
    assert_eq!(at("127.0.0.2", port).await.unwrap(), renewed.fingerprint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_strict_sni_a_nameless_handshake_gets_an_ip_certificate_or_nothing() {
    let ca = TestCa::new("ip-strict");
    let default = ca.leaf(&["localhost"]);
    let (two, three) = (ca.leaf(&["127.0.0.2"]), ca.leaf(&["127.0.0.3"]));
    let (feed, reloader, port) = serve(true, &default).await;
    put(&feed, "two", &two);
    put(&feed, "three", &three);
    installed(&reloader, &["two", "three"]).await;
    assert_eq!(at("127.0.0.2", port).await.unwrap(), two.fingerprint);
    assert!(
        at("127.0.0.1", port).await.is_err(),
        "no IP certificate for the address, and no one IP certificate: refused"
    );
    let named = SocketAddr::new("127.0.0.1".parse().unwrap(), port);
    assert_eq!(
        served_as(named, "localhost").await.unwrap(),
        default.fingerprint
    );
}

/// A default certificate that covers the address keeps it, strict or not; the one IP
/// certificate of the routes serves the other addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_that_covers_the_address_is_served_there_before_the_one_ip_certificate() {
    let ca = TestCa::new("ip-default");
    for strict in [false, true] {
        let default = ca.leaf(&["localhost", "127.0.0.1"]);
        let two = ca.leaf(&["127.0.0.2"]);
        let (feed, reloader, port) = serve(strict, &default).await;
        put(&feed, "two", &two);
        installed(&reloader, &["two"]).await;
        assert_eq!(
            at("127.0.0.1", port).await.unwrap(),
            default.fingerprint,
            "strict: {strict}"
        );
        assert_eq!(at("127.0.0.2", port).await.unwrap(), two.fingerprint);
        assert_eq!(
            at("127.0.0.3", port).await.unwrap(),
            two.fingerprint,
            "strict: {strict}: the one IP certificate"
        );
        reloader.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_address_is_served_its_certificate() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    }
    let ca = TestCa::new("ip6-routes");
    let (v6, v4) = (ca.leaf(&["::1"]), ca.leaf(&["127.0.0.2"]));
    let (feed, rx) = futures::channel::mpsc::unbounded();
    put(&feed, "v6", &v6);
    put(&feed, "v4", &v4);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .routes(rx)
        .spawn_routes()
        .unwrap();
    installed(&reloader, &["v6", "v4"]).await;
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = reloader.incoming(listener).unwrap();
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = incoming.next().await {
            let _ = conn.shutdown().await;
        }
    });
    let verified = tls_test::probe_trusting(addr, "::1", &[ca.cert_der()])
        .await
        .unwrap();
    assert_eq!(verified.fingerprint, v6.fingerprint);
}

/// An acceptor of one's own (tokio-rustls on the reloader's config) says where each
/// handshake arrived with `on_local_addr`; without it, only the one-IP-certificate rule can
/// serve a nameless handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acceptor_of_ones_own_tells_the_local_address_with_on_local_addr() {
    let ca = TestCa::new("ip-own");
    let (two, three) = (ca.leaf(&["127.0.0.2"]), ca.leaf(&["127.0.0.3"]));
    let (feed, rx) = futures::channel::mpsc::unbounded();
    put(&feed, "two", &two);
    put(&feed, "three", &three);
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .routes(rx)
        .spawn_routes()
        .unwrap();
    installed(&reloader, &["two", "three"]).await;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(reloader.server_config().unwrap()));
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tell, told) = tokio::sync::watch::channel(true);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, local) = (acceptor.clone(), tcp.local_addr().unwrap().ip());
            let tell = *told.borrow();
            tokio::spawn(async move {
                let accepted = if tell {
                    tls_reload::on_local_addr(local, acceptor.accept(tcp)).await
                } else {
                    acceptor.accept(tcp).await
                };
                if let Ok(mut tls) = accepted {
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    assert_eq!(at("127.0.0.2", port).await.unwrap(), two.fingerprint);
    assert_eq!(at("127.0.0.3", port).await.unwrap(), three.fingerprint);
    tell.send(false).unwrap();
    assert!(
        at("127.0.0.2", port).await.is_err(),
        "not told the address, with two IP certificates and no default: nothing to serve"
    );
    let resolver = reloader.resolver();
    let local: IpAddr = "127.0.0.3".parse().unwrap();
    let by_hand = resolver.lookup_on(None, Some(local)).unwrap();
    assert_eq!(
        tls_test::fingerprint(&by_hand.cert[0]),
        three.fingerprint,
        "lookup_on answers as the handshake would"
    );
}
