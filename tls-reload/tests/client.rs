//! The client side of mTLS: one `ClientConfig` (as a connection pool keeps it) whose identity
//! and roots rotate, against a real mTLS server that reports the client certificate of each
//! connection.
#![cfg(feature = "accept")]

mod common;

use std::sync::Arc;

use futures::StreamExt as _;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tls_reload::{ClientTls, Reloader};
use tls_source::CertBundle;
use tls_test::TestCa;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use common::{bundle_with_cas as bundle, provider};

type Feed = futures::channel::mpsc::UnboundedSender<Result<CertBundle, tls_source::Error>>;

/// An mTLS server trusting the client CAs of its bundle, answering each connection with the
/// fingerprint of the client certificate it presented.
async fn server(first: CertBundle) -> (std::net::SocketAddr, Reloader, Feed) {
    let (tx, reloader) = common::mtls(first).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = reloader.incoming(listener).unwrap();
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = incoming.next().await {
            tokio::spawn(async move {
                let presented = conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|leaf| tls_test::fingerprint(leaf.as_ref()))
                    .unwrap_or_default();
                let _ = conn.write_all(presented.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, reloader, tx)
}

/// One request through the pooled config: the client fingerprint the server saw.
async fn request(addr: std::net::SocketAddr, config: &Arc<ClientConfig>) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut said = String::new();
    tls.read_to_string(&mut said)
        .await
        .map_err(|e| e.to_string())?;
    Ok(said)
}

async fn installed(client: &ClientTls, generation: u64) {
    tls_test::wait_for(client.status(), "the client bundle installed", |s| {
        s.generation == generation
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_identity_is_presented_on_new_connections_not_resumed_away() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let (addr, _server, _feed) =
        server(bundle(&server_ca.leaf(&["localhost"]), &[&client_ca])).await;
    let (first, second) = (client_ca.client_leaf("svc"), client_ca.client_leaf("svc"));

    let (client, tx) = common::client_tls(bundle(&first, &[&server_ca])).await;
    let config = Arc::new(client.client_config().unwrap());
    assert_eq!(request(addr, &config).await.unwrap(), first.fingerprint);
    // The second connection resumes (the session cache works) and is the same identity.
    assert_eq!(request(addr, &config).await.unwrap(), first.fingerprint);

    tx.unbounded_send(Ok(bundle(&second, &[&server_ca])))
        .unwrap();
    installed(&client, 2).await;
    assert_eq!(
        request(addr, &config).await.unwrap(),
        second.fingerprint,
        "the same config presents the new certificate (no resumption of the old identity)"
    );
    assert_eq!(
        client
            .status()
            .borrow()
            .current
            .as_ref()
            .unwrap()
            .fingerprint_sha256,
        second.fingerprint
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trust_rotates_to_a_new_ca_before_the_server_moves_to_it() {
    let (old_ca, new_ca, client_ca) = (
        TestCa::new("old"),
        TestCa::new("new"),
        TestCa::new("clients"),
    );
    let (addr, server_reloader, feed) =
        server(bundle(&old_ca.leaf(&["localhost"]), &[&client_ca])).await;
    let identity = client_ca.client_leaf("svc");

    let (client, tx) = common::client_tls(bundle(&identity, &[&old_ca])).await;
    let config = Arc::new(client.client_config().unwrap());
    assert!(request(addr, &config).await.is_ok());

    // The roots grow to old + new, then the server moves to a certificate from the new CA.
    tx.unbounded_send(Ok(bundle(&identity, &[&old_ca, &new_ca])))
        .unwrap();
    installed(&client, 2).await;
    assert!(request(addr, &config).await.is_ok());
    feed.unbounded_send(Ok(bundle(&new_ca.leaf(&["localhost"]), &[&client_ca])))
        .unwrap();
    tls_test::wait_for(server_reloader.status(), "the server rotated", |s| {
        s.generation == 2
    })
    .await;
    assert_eq!(request(addr, &config).await.unwrap(), identity.fingerprint);

    // Roots without the server's CA: refused, with rustls's reason.
    tx.unbounded_send(Ok(bundle(&identity, &[&old_ca])))
        .unwrap();
    installed(&client, 3).await;
    let err = request(addr, &config).await.unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.contains("unknown issuer"),
        "{err}"
    );
}

#[tokio::test]
async fn a_bad_client_bundle_changes_nothing() {
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let good = client_ca.client_leaf("svc");
    let (client, tx) = common::client_tls(bundle(&good, &[&server_ca])).await;
    for (what, bad) in [
        (
            "a server certificate (no clientAuth)",
            bundle(&client_ca.leaf(&["svc"]), &[&server_ca]),
        ),
        (
            "an expired certificate",
            bundle(&client_ca.expired_client_leaf("svc"), &[&server_ca]),
        ),
        (
            "no CA to trust servers with",
            common::bundle(&client_ca.client_leaf("svc")),
        ),
    ] {
        tx.unbounded_send(Ok(bad)).unwrap();
        let status = tls_test::wait_for(client.status(), what, |s| s.last_error.is_some()).await;
        assert_eq!(status.generation, 1, "{what}");
        assert_eq!(
            status.current.as_ref().unwrap().fingerprint_sha256,
            good.fingerprint,
            "{what}"
        );
        // Good again: the error clears.
        tx.unbounded_send(Ok(bundle(&good, &[&server_ca]))).unwrap();
        tls_test::wait_for(client.status(), "recovered", |s| s.last_error.is_none()).await;
    }
}

/// The client side runs on the reload engine: an identity not valid yet is presented when its
/// `notBefore` comes, and its status says when it nears its end and once it has expired.
/// Virtual time.
#[tokio::test(start_paused = true)]
async fn a_client_identity_is_retried_at_its_not_before_and_its_expiry_is_reported() {
    use std::time::{Duration, SystemTime};
    use tls_source::clock::{Clock as _, SteppedClock};

    const DAY: Duration = Duration::from_secs(86_400);
    let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let now = clock.now();
    let (server_ca, client_ca) = (TestCa::new("server"), TestCa::new("clients"));
    let later = client_ca.client_leaf_valid("svc", now + DAY, now + 30 * DAY);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(bundle(&later, &[&server_ca])))
        .unwrap();
    let client = ClientTls::builder()
        .crypto_provider(provider())
        .clock(clock.clone())
        .spawn(rx)
        .unwrap();
    // Virtual bounds: they fire (and fail the test) instead of hanging if nothing happens.
    let within = |days: u32| DAY * days;
    let mut status = client.status();
    let refused = tokio::time::timeout(within(1) / 2, status.wait_for(|s| s.last_error.is_some()))
        .await
        .expect("refused at once")
        .unwrap()
        .clone();
    assert!(
        matches!(
            refused.last_error.as_deref(),
            Some(tls_reload::Error::NotYetValid { .. })
        ),
        "{refused:?}"
    );
    assert!(refused.current.is_none());

    tokio::time::timeout(within(2), client.ready())
        .await
        .expect("presented once its notBefore came")
        .unwrap();
    let shown = client.status().borrow().clone();
    let current = shown.current.unwrap();
    assert!(
        clock.now() >= current.not_before,
        "not before its notBefore"
    );
    assert!(
        clock.now() < now + DAY + Duration::from_secs(60),
        "nor much after"
    );
    assert_eq!(current.fingerprint_sha256, later.fingerprint);
    assert!(shown.last_error.is_none() && !shown.expiring);
    assert_eq!(shown.root_fingerprints_sha256.len(), 1);

    let expiring = tokio::time::timeout(within(30), status.wait_for(|s| s.expiring))
        .await
        .expect("the warning comes")
        .unwrap()
        .clone();
    assert!(!expiring.expired);
    assert!(
        clock.now() >= current.not_after - 7 * DAY,
        "a week before the end"
    );
    let expired = tokio::time::timeout(within(10), status.wait_for(|s| s.expired))
        .await
        .expect("the expiry is reported")
        .unwrap()
        .clone();
    assert!(clock.now() > current.not_after);
    assert!(matches!(
        expired.last_error.as_deref(),
        Some(tls_reload::Error::ServedExpired { .. })
    ));
    assert!(expired.running);
    drop(tx);
}
