//! Client authentication (mTLS) whose trust rotates with the served bundle's `ca.crt`: real
//! mTLS handshakes over loopback through the accept stream.
#![cfg(feature = "accept")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tls_reload::{ClientAuth, Reloader, Status};
use tls_source::CertBundle;
use tls_test::{TestCa, TestCert};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use common::{bundle_with_cas as bundle, patiently, provider};

struct Server {
    addr: std::net::SocketAddr,
    reloader: Reloader,
    tx: futures::channel::mpsc::UnboundedSender<Result<CertBundle, tls_source::Error>>,
}

impl Server {
    /// A server requiring client certificates, answering `ok` to each client it lets in.
    async fn start(auth: ClientAuth, first: CertBundle) -> Self {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        tx.unbounded_send(Ok(first)).unwrap();
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .client_auth(auth)
            .spawn(rx)
            .unwrap();
        reloader.ready().await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = reloader.incoming(listener).unwrap();
        tokio::spawn(async move {
            while let Some(Ok(mut conn)) = incoming.next().await {
                tokio::spawn(async move {
                    let _ = conn.write_all(b"ok").await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { addr, reloader, tx }
    }

    async fn install(
        &self,
        bundle: CertBundle,
        what: &str,
        pred: impl FnMut(&Status) -> bool,
    ) -> Status {
        self.tx.unbounded_send(Ok(bundle)).unwrap();
        tls_test::wait_for(self.reloader.status(), what, pred).await
    }
}

/// One connection with `config` (whose session cache carries over between calls): whether the
/// server let it in, and whether the handshake was a resumption.
async fn attempt(addr: std::net::SocketAddr, config: &Arc<ClientConfig>) -> Result<bool, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let mut said = Vec::new();
    tls.read_to_end(&mut said)
        .await
        .map_err(|e| e.to_string())?;
    if said == b"ok" {
        Ok(resumed)
    } else {
        Err(format!("the server said {said:?}"))
    }
}

fn client(cert: &TestCert) -> Arc<ClientConfig> {
    Arc::new(tls_test::client_config_with_cert(cert))
}

fn fingerprints(status: &Status) -> Vec<&str> {
    status
        .client_cas
        .iter()
        .map(|ca| ca.fingerprint_sha256.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_leaving_the_bundle_is_trusted_for_the_overlap_then_refused_even_when_resuming() {
    let (server_ca, a, b) = (TestCa::new("server"), TestCa::new("A"), TestCa::new("B"));
    let server_cert = server_ca.leaf(&["localhost"]);
    let (client_a, client_b) = (a.client_leaf("client-a"), b.client_leaf("client-b"));
    let fp = |ca: &TestCa| tls_test::fingerprint(ca.cert_der().as_ref());
    let overlap = Duration::from_secs(3);
    let server = Server::start(
        ClientAuth::from_bundle().overlap(overlap),
        bundle(&server_cert, &[&a]),
    )
    .await;
    assert_eq!(fingerprints(&server.reloader.status().borrow()), [fp(&a)]);

    let a_resuming = client(&client_a);
    assert_eq!(
        attempt(server.addr, &a_resuming).await,
        Ok(false),
        "A: full handshake"
    );
    assert_eq!(
        attempt(server.addr, &a_resuming).await,
        Ok(true),
        "A: resumed"
    );
    assert!(
        attempt(server.addr, &client(&client_b)).await.is_err(),
        "B not trusted yet"
    );

    // A and B, then B alone: A stays trusted for the overlap.
    server
        .install(bundle(&server_cert, &[&a, &b]), "A and B trusted", |s| {
            s.client_cas.len() == 2
        })
        .await;
    assert_eq!(attempt(server.addr, &client(&client_b)).await, Ok(false));
    let status = server
        .install(bundle(&server_cert, &[&b]), "A leaving", |s| {
            s.client_cas.iter().any(|ca| ca.leaves_at.is_some())
        })
        .await;
    let leaving = status
        .client_cas
        .iter()
        .find(|ca| ca.leaves_at.is_some())
        .unwrap();
    assert_eq!(leaving.fingerprint_sha256, fp(&a));
    assert_eq!(
        attempt(server.addr, &client(&client_a)).await,
        Ok(false),
        "A during the overlap"
    );
    assert_eq!(
        attempt(server.addr, &a_resuming).await,
        Ok(true),
        "A resumes during the overlap"
    );

    // After the overlap: A is refused, on a full handshake and when it offers its old session.
    let status = tls_test::wait_for(server.reloader.status(), "A dropped", |s| {
        s.client_cas.len() == 1
    })
    .await;
    assert_eq!(fingerprints(&status), [fp(&b)]);
    let refused = attempt(server.addr, &client(&client_a)).await;
    assert!(refused.is_err(), "A after the overlap: {refused:?}");
    let resumed = attempt(server.addr, &a_resuming).await;
    assert!(
        resumed.is_err(),
        "A's old session no longer lets it in: {resumed:?}"
    );
    assert_eq!(attempt(server.addr, &client(&client_b)).await, Ok(false));
}

#[tokio::test]
async fn a_rejected_bundle_changes_no_trust() {
    let (server_ca, a, b) = (TestCa::new("server"), TestCa::new("A"), TestCa::new("B"));
    let server_cert = server_ca.leaf(&["localhost"]);
    let other = server_ca.leaf(&["localhost"]);
    let server = Server::start(ClientAuth::from_bundle(), bundle(&server_cert, &[&a])).await;
    // A new CA arriving with a certificate whose key does not match: refused as a whole.
    server
        .install(
            bundle(&other.with_key_of(&server_cert), &[&b]),
            "the mismatched bundle refused",
            |s| s.last_error.is_some(),
        )
        .await;
    assert_eq!(
        fingerprints(&server.reloader.status().borrow()),
        [tls_test::fingerprint(a.cert_der().as_ref())]
    );
    assert_eq!(
        attempt(server.addr, &client(&a.client_leaf("a"))).await,
        Ok(false)
    );
    assert!(
        attempt(server.addr, &client(&b.client_leaf("b")))
            .await
            .is_err()
    );

    // A bundle without any CA is refused too: it does not say whom to trust.
    let status = server
        .install(
            common::bundle(&other),
            "the bundle without ca.crt refused",
            |s| {
                s.last_error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains("no CA certificate"))
            },
        )
        .await;
    assert_eq!(status.client_cas.len(), 1);
}

#[tokio::test]
async fn ordinary_rotations_keep_resumption_working() {
    let (server_ca, a) = (TestCa::new("server"), TestCa::new("A"));
    let [first, second] = server_ca.leaves(&["localhost"]);
    let server = Server::start(ClientAuth::from_bundle(), bundle(&first, &[&a])).await;
    let resuming = client(&a.client_leaf("a"));
    assert_eq!(attempt(server.addr, &resuming).await, Ok(false));
    server
        .install(bundle(&second, &[&a]), "the rotation", |s| {
            s.generation == 2
        })
        .await;
    assert_eq!(
        attempt(server.addr, &resuming).await,
        Ok(true),
        "the session from before the rotation resumes"
    );
}

#[tokio::test]
async fn client_certificates_without_client_auth_expired_or_untrusted_are_refused() {
    let (server_ca, a, c) = (TestCa::new("server"), TestCa::new("A"), TestCa::new("C"));
    let server = Server::start(
        ClientAuth::from_bundle(),
        bundle(&server_ca.leaf(&["localhost"]), &[&a]),
    )
    .await;
    for (what, cert) in [
        (
            "a server certificate (no clientAuth EKU)",
            a.leaf(&["client"]),
        ),
        (
            "an expired client certificate",
            a.expired_client_leaf("client"),
        ),
        (
            "a client certificate from an untrusted CA",
            c.client_leaf("client"),
        ),
    ] {
        let refused = patiently(what, attempt(server.addr, &client(&cert))).await;
        let err = refused.expect_err(what);
        assert!(
            err.contains("alert"),
            "{what}: the rustls error is surfaced: {err}"
        );
    }
    assert_eq!(
        attempt(server.addr, &client(&a.client_leaf("client"))).await,
        Ok(false)
    );
}

#[tokio::test]
async fn a_trust_source_of_its_own_replaces_the_trusted_cas_and_bad_items_change_nothing() {
    let (server_ca, a, b) = (TestCa::new("server"), TestCa::new("A"), TestCa::new("B"));
    let (trust_tx, trust_rx) = futures::channel::mpsc::unbounded();
    trust_tx.unbounded_send(Ok(vec![a.cert_der()])).unwrap();
    // The served bundle has no ca.crt: the trust comes from elsewhere.
    let server = Server::start(
        ClientAuth::from_source(trust_rx),
        common::bundle(&server_ca.leaf(&["localhost"])),
    )
    .await;
    let fp = |ca: &TestCa| tls_test::fingerprint(ca.cert_der().as_ref());
    // Ready means a CA is trusted too: a server that trusts none would refuse everyone.
    assert_eq!(fingerprints(&server.reloader.status().borrow()), [fp(&a)]);
    assert_eq!(
        attempt(server.addr, &client(&a.client_leaf("a"))).await,
        Ok(false)
    );

    // Garbage, an empty set and an error change nothing; each is waited for by what its own
    // report says (none was reported before the first).
    assert!(server.reloader.status().borrow().client_ca_error.is_none());
    for (bad, says) in [
        (
            Ok(vec![rustls::pki_types::CertificateDer::from(vec![1, 2, 3])]),
            "client CAs: ",
        ),
        (Ok(Vec::new()), "no CA certificate"),
        (
            Err(tls_source::Error::source("trust", "unreadable")),
            "unreadable",
        ),
    ] {
        trust_tx.unbounded_send(bad).unwrap();
        let status = tls_test::wait_for(server.reloader.status(), says, |s| {
            s.client_ca_error
                .as_ref()
                .is_some_and(|e| e.to_string().contains(says))
        })
        .await;
        let reported = status
            .client_ca_error
            .as_ref()
            .expect("reported")
            .to_string();
        assert!(reported.starts_with("client CAs: "), "{reported}");
        assert!(
            reported.ends_with("; keeping the trusted ones"),
            "{reported}"
        );
        assert_eq!(fingerprints(&status), [fp(&a)]);
        assert_eq!(
            attempt(server.addr, &client(&a.client_leaf("a"))).await,
            Ok(false)
        );
    }
    trust_tx.unbounded_send(Ok(vec![b.cert_der()])).unwrap();
    let status = tls_test::wait_for(server.reloader.status(), "B trusted", |s| {
        s.client_cas.len() == 1 && s.client_cas[0].fingerprint_sha256 == fp(&b)
    })
    .await;
    assert_eq!(fingerprints(&status), [fp(&b)]);
    assert!(status.client_ca_error.is_none(), "cleared by a good one");
    assert!(
        attempt(server.addr, &client(&a.client_leaf("a")))
            .await
            .is_err()
    );
    assert_eq!(
        attempt(server.addr, &client(&b.client_leaf("b"))).await,
        Ok(false)
    );
}

/// A client-CA source with nothing good to give: the certificate is installed, but the
/// reloader is not ready, and the time-out says so (not "no certificate installed"), with the
/// source's error; a good CA later makes it ready.
#[tokio::test]
async fn without_a_trusted_client_ca_the_time_out_says_so() {
    let (server_ca, a) = (TestCa::new("server"), TestCa::new("A"));
    let (trust_tx, trust_rx) = futures::channel::mpsc::unbounded();
    trust_tx
        .unbounded_send(Err(tls_source::Error::source(
            "client-ca.pem",
            "No such file or directory",
        )))
        .unwrap();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(common::bundle(&server_ca.leaf(&["localhost"]))))
        .unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .client_auth(ClientAuth::from_source(trust_rx))
        .spawn(rx)
        .unwrap();
    let err = reloader
        .ready_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the certificate is installed, but no client CA is trusted after 300ms: last error: \
         client CAs: client-ca.pem: No such file or directory; keeping the trusted ones"
    );
    trust_tx.unbounded_send(Ok(vec![a.cert_der()])).unwrap();
    patiently("ready once a CA is trusted", reloader.ready())
        .await
        .unwrap();
    assert!(reloader.status().borrow().client_ca_error.is_none());
    drop(tx);
}
