//! Session tickets across replicas, with real handshakes: three reloaders given the same
//! secret, each behind its own accept stream on loopback, and a rustls client with one session
//! cache going round-robin over them.

#![cfg(any(feature = "aws-lc-rs", feature = "ring"))]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use tls_reload::{ClientAuth, Reloader, SessionTickets};
use tls_source::clock::Clock;
use tls_test::{PATIENCE, TestCa, TestCert};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// A clock every replica reads, which the test moves.
#[derive(Debug)]
struct Moved(Mutex<Duration>);

impl Clock for Moved {
    fn now(&self) -> SystemTime {
        SystemTime::now() + *self.0.lock().unwrap()
    }
}

struct Replica {
    reloader: Reloader,
    addr: SocketAddr,
    feed: common::Feed,
}

/// A replica serving `cert` (with `client_cas` trusted for client certificates when given),
/// issuing tickets as `tickets` says.
async fn replica(
    cert: &TestCert,
    client_cas: Option<&[&TestCa]>,
    tickets: Option<SessionTickets>,
) -> Replica {
    let (feed, rx) = futures::channel::mpsc::unbounded();
    let mut builder = Reloader::builder().crypto_provider(common::provider());
    let first = match client_cas {
        Some(cas) => {
            builder = builder.client_auth(ClientAuth::from_bundle());
            common::bundle_with_cas(cert, cas)
        }
        None => common::bundle(cert),
    };
    feed.unbounded_send(Ok(first)).unwrap();
    if let Some(tickets) = tickets {
        builder = builder.session_tickets(tickets);
    }
    let reloader = builder.spawn(rx).unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tls_test::answer_each(reloader.incoming(listener).unwrap());
    Replica {
        reloader,
        addr,
        feed,
    }
}

async fn fleet(
    cert: &TestCert,
    client_cas: Option<&[&TestCa]>,
    tickets: impl Fn() -> Option<SessionTickets>,
) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(cert, client_cas, tickets()).await);
    }
    replicas
}

fn client(ca: &TestCa, identity: Option<&TestCert>, tls12: bool) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    let builder = ClientConfig::builder_with_provider(common::provider());
    let builder = if tls12 {
        builder.with_protocol_versions(&[&rustls::version::TLS12])
    } else {
        builder.with_safe_default_protocol_versions()
    }
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match identity {
        // The leaf alone: the server knows its CA.
        Some(cert) => builder
            .with_client_auth_cert(
                vec![cert.cert_der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into()),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// One connection: how its handshake went, and what the server sent before closing (`None`:
/// the connection failed or was closed without it).
async fn connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> (HandshakeKind, Option<String>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio::time::timeout(
        PATIENCE,
        TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await
    .expect("no hang")
    .expect("the handshake succeeds");
    let kind = tls.get_ref().1.handshake_kind().unwrap();
    let mut body = Vec::new();
    let read = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut body))
        .await
        .expect("no hang");
    let _ = tls.shutdown().await;
    let served = read.ok().filter(|_| !body.is_empty());
    (
        kind,
        served.map(|_| String::from_utf8_lossy(&body).into_owned()),
    )
}

/// Round-robin over `replicas`, `rounds` times: how many connections resumed.
async fn resumed(replicas: &[Replica], config: &Arc<ClientConfig>, rounds: usize) -> usize {
    let mut resumed = 0;
    for round in 0..rounds {
        for replica in replicas {
            let (kind, served) = connect(replica.addr, config).await;
            assert_eq!(served.as_deref(), Some("served"), "round {round}");
            resumed += usize::from(kind == HandshakeKind::Resumed);
        }
    }
    resumed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_issued_by_one_replica_resumes_on_the_others_and_tls_1_2_gets_none() {
    let ca = TestCa::new("tickets");
    let cert = ca.leaf(&["localhost"]);
    let shared = fleet(&cert, None, || {
        Some(SessionTickets::from_secret(&[9; 32]).unwrap())
    })
    .await;
    let config = client(&ca, None, false);
    // Every connection after the first resumes, whichever replica issued the ticket.
    assert_eq!(resumed(&shared, &config, 4).await, 11);
    let ids: Vec<String> = shared
        .iter()
        .map(|r| r.reloader.session_tickets().unwrap().key_id)
        .collect();
    assert!(
        ids.iter().all(|id| *id == ids[0] && !id.is_empty()),
        "{ids:?}"
    );

    // TLS 1.2: no shared ticket (its session carries the master secret), so another replica
    // makes a full handshake.
    let tls12 = client(&ca, None, true);
    for replica in &shared {
        let (kind, served) = connect(replica.addr, &tls12).await;
        assert_eq!(
            (kind, served.as_deref()),
            (HandshakeKind::Full, Some("served"))
        );
    }

    // Without shared tickets: each replica its own cache, nothing resumes going round-robin.
    let alone = fleet(&cert, None, || None).await;
    assert_eq!(resumed(&alone, &client(&ca, None, false), 4).await, 0);
    // A foreign ticket (another fleet's secret) is a full handshake, not a failure.
    let other = fleet(&cert, None, || {
        Some(SessionTickets::from_secret(&[8; 32]).unwrap())
    })
    .await;
    let (kind, served) = connect(other[0].addr, &config).await;
    assert_eq!(
        (kind, served.as_deref()),
        (HandshakeKind::Full, Some("served"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_keys_rotate_past_a_ticket_it_is_a_full_handshake() {
    let ca = TestCa::new("tickets-rotate");
    let cert = ca.leaf(&["localhost"]);
    let offset = Arc::new(Moved(Mutex::new(Duration::ZERO)));
    let clock = Arc::clone(&offset) as Arc<dyn Clock>;
    let replicas = fleet(&cert, None, || {
        Some(
            SessionTickets::from_secret(&[9; 32])
                .unwrap()
                .rotation(Duration::from_secs(3600))
                .clock(Arc::clone(&clock)),
        )
    })
    .await;
    let config = client(&ca, None, false);
    assert_eq!(
        connect(replicas[0].addr, &config).await.0,
        HandshakeKind::Full
    );
    assert_eq!(
        connect(replicas[1].addr, &config).await.0,
        HandshakeKind::Resumed
    );
    // Two periods on: the key that sealed the client's newest ticket opens nothing.
    *offset.0.lock().unwrap() += Duration::from_secs(2 * 3600);
    let (kind, served) = connect(replicas[2].addr, &config).await;
    assert_eq!(
        (kind, served.as_deref()),
        (HandshakeKind::Full, Some("served"))
    );
    assert_eq!(
        connect(replicas[0].addr, &config).await.0,
        HandshakeKind::Resumed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mtls_a_session_made_under_a_ca_that_has_left_is_closed_on_every_replica() {
    let server_ca = TestCa::new("tickets-server");
    let (old_ca, new_ca) = (TestCa::new("clients-old"), TestCa::new("clients-new"));
    let cert = server_ca.leaf(&["localhost"]);
    let replicas = fleet(&cert, Some(&[&old_ca]), || {
        Some(SessionTickets::from_secret(&[9; 32]).unwrap())
    })
    .await;
    let client_cert = old_ca.client_leaf("client");
    let config = client(&server_ca, Some(&client_cert), false);
    assert_eq!(
        connect(replicas[0].addr, &config).await,
        (HandshakeKind::Full, Some("served".into()))
    );
    let (kind, served) = connect(replicas[1].addr, &config).await;
    assert_eq!(
        (kind, served.as_deref()),
        (HandshakeKind::Resumed, Some("served")),
        "mTLS servers share tickets too"
    );

    // The old CA leaves every replica's trust.
    for replica in &replicas {
        replica
            .feed
            .unbounded_send(Ok(common::bundle_with_cas(&cert, &[&new_ca])))
            .unwrap();
    }
    for replica in &replicas {
        tls_test::wait_for(replica.reloader.status(), "the new client CA", |s| {
            s.client_cas.len() == 1
                && s.client_cas[0].fingerprint_sha256 == tls_test::fingerprint(&new_ca.cert_der())
        })
        .await;
    }
    // Each replica closes a client resuming a session from before, with nothing served (the
    // client holds a ticket for each: two from each of its two connections, one used).
    for replica in &replicas {
        let (kind, served) = connect(replica.addr, &config).await;
        assert_eq!(kind, HandshakeKind::Resumed, "the client offered a ticket");
        assert_eq!(
            served, None,
            "a resumed, no longer trusted client is served nothing"
        );
    }
}
