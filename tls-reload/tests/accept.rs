//! The accept stream, through real sockets and handshakes: nothing accepted before a
//! certificate, a client that never speaks dropped at the time-out, rotation seen by new
//! connections, and the end on the token.
#![cfg(feature = "accept")]

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tls_reload::{Incoming, Reloader, TlsConnection};
use tls_test::{PATIENCE, TestCa};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use common::{bundle, patiently, provider};

/// The two ways to take connections from an `Incoming`.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// The stream: each connection yielded, then served in a task of its own.
    Stream,
    /// `spawn_each`: each connection served in the task that made its handshake.
    SpawnEach,
}

const WAYS: [Way; 2] = [Way::Stream, Way::SpawnEach];

/// Serves every connection from `incoming` the `way` given: writes the ALPN it agreed on and
/// closes.
fn serve(mut incoming: Incoming<TcpStream>, way: Way) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        match way {
            Way::Stream => {
                while let Some(Ok(conn)) = incoming.next().await {
                    tokio::spawn(answer(conn));
                }
            }
            Way::SpawnEach => drop(incoming.spawn_each(answer).await),
        }
    })
}

/// A reloader serving one certificate for `localhost` from a CA named `ca`, ready.
async fn serving_one(ca: &str) -> (Reloader, tls_test::TestCert) {
    let cert = TestCa::new(ca).leaf(&["localhost"]);
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .spawn(futures::stream::iter([Ok(bundle(&cert))]).chain(futures::stream::pending()))
        .unwrap();
    reloader.ready().await.unwrap();
    (reloader, cert)
}

async fn answer(mut conn: TlsConnection<TcpStream>) {
    let alpn = conn.alpn_protocol().map(<[u8]>::to_vec).unwrap_or_default();
    let _ = conn.write_all(&alpn).await;
    let _ = conn.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_before_the_first_certificate_fails_fast_then_rotations_are_served() {
    for way in WAYS {
        let ca = TestCa::new("accept");
        let (first, second) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .spawn(rx)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = reloader.incoming(listener).unwrap();
        assert_eq!(incoming.local_addr(), Some(addr));
        let server = serve(incoming, way);

        // No certificate yet: the connection is accepted and closed, the client fails at once
        // rather than at its own time-out (the bound is generous for a loaded machine; what it
        // tells apart is a close from a hang).
        let early = tokio::time::timeout(
            Duration::from_millis(500),
            tls_test::probe(addr, "localhost"),
        )
        .await
        .expect("the early client fails fast, it does not hang");
        assert!(early.is_err(), "no handshake before a certificate");

        tx.unbounded_send(Ok(bundle(&first))).unwrap();
        reloader.ready_timeout(PATIENCE).await.unwrap();
        assert_eq!(
            patiently("the next client is served", tls_test::served(addr)).await,
            first.fingerprint
        );

        tx.unbounded_send(Ok(bundle(&second))).unwrap();
        // The rotation is served to new connections.
        tls_test::expect_served(
            addr,
            reloader.status(),
            |status| {
                status
                    .current
                    .as_ref()
                    .map(|c| c.fingerprint_sha256.as_str())
            },
            &second,
        )
        .await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_is_dropped_at_the_time_out_and_others_are_served() {
    for way in WAYS {
        let (reloader, cert) = serving_one("slow").await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = Incoming::builder(&reloader)
            .handshake_timeout(Duration::from_millis(300))
            .max_handshakes(4)
            .listen(listener)
            .unwrap();
        let server = serve(incoming, way);

        // More silent clients than handshake slots: while they wait, a real client still gets in
        // once their time-outs free the slots.
        let mut silent = Vec::new();
        for _ in 0..8 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        assert_eq!(
            patiently("a real client is served", tls_test::served(addr)).await,
            cert.fingerprint
        );
        let started = Instant::now();
        for tcp in silent {
            dropped(tcp).await;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        server.abort();
    }
}

#[tokio::test]
async fn alpn_is_h2_and_http_1_1_by_default_and_can_be_changed() {
    let cert = TestCa::new("alpn").leaf(&["localhost"]);
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .spawn(futures::stream::iter([Ok(bundle(&cert))]).chain(futures::stream::pending()))
        .unwrap();
    let cases = [
        (None, &[&b"h2"[..], b"http/1.1"][..], &b"h2"[..]),
        (None, &[&b"http/1.1"[..]][..], &b"http/1.1"[..]),
        (
            Some(vec![b"imap".to_vec()]),
            &[&b"imap"[..]][..],
            &b"imap"[..],
        ),
    ];
    for (way, (alpn, offered, agreed)) in WAYS
        .into_iter()
        .flat_map(|way| cases.clone().map(|case| (way, case)))
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut builder = Incoming::builder(&reloader);
        if let Some(alpn) = alpn {
            builder = builder.alpn(alpn);
        }
        let server = serve(builder.listen(listener).unwrap(), way);
        let mut client = tls_test::client_config();
        client.alpn_protocols = offered.iter().map(|p| p.to_vec()).collect();
        let mut tls = tls_test::connect(addr, "localhost", client).await.unwrap();
        let mut said = Vec::new();
        let _ = tls.read_to_end(&mut said).await;
        assert_eq!(said, agreed);
        server.abort();
    }
}

/// Virtual time: no client connects, so nothing but the token can end the stream, and waiting
/// to see that it does not costs no real time.
#[tokio::test(start_paused = true)]
async fn the_stream_ends_on_its_token() {
    let cert = TestCa::new("end").leaf(&["localhost"]);
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .spawn(futures::stream::iter([Ok(bundle(&cert))]).chain(futures::stream::pending()))
        .unwrap();
    let token = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut incoming = Incoming::builder(&reloader)
        .cancellation_token(token.clone())
        .listen(listener)
        .unwrap();
    // An hour of (virtual) time with no client and the token alive: nothing, and no end.
    let quiet = tokio::time::timeout(Duration::from_secs(3600), incoming.next()).await;
    assert!(quiet.is_err(), "the stream yielded or ended by itself");
    token.cancel();
    assert!(
        patiently("the stream ends", incoming.next())
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_reloader_that_stops_before_any_certificate_ends_the_stream() {
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .spawn(futures::stream::iter([Err(tls_source::Error::source(
            "test",
            "no such file",
        ))]))
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut incoming = reloader.incoming(listener).unwrap();
    assert!(
        patiently("the stream ends", incoming.next())
            .await
            .is_none()
    );
}

/// A hook that takes over handshakes offering exactly one ALPN protocol (as an ACME
/// TLS-ALPN-01 responder takes the CA's `acme-tls/1` validation).
#[derive(Debug)]
struct TakesOver {
    name: &'static str,
    key: std::sync::Arc<rustls::sign::CertifiedKey>,
}

impl tls_reload::HandshakeHook for TakesOver {
    fn answer(
        &self,
        _: &rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        None
    }

    fn takes_over(&self) -> bool {
        true
    }

    fn take_over(&self, hello: &rustls::server::ClientHello<'_>) -> Option<tls_reload::Takeover> {
        let only: Vec<&[u8]> = hello.alpn()?.collect();
        (only == [b"acme-tls/1"] && hello.server_name() == Some(self.name))
            .then(|| tls_reload::Takeover::new(std::sync::Arc::clone(&self.key), "acme-tls/1"))
    }
}

/// Connects offering `alpn`, reports the leaf served, the protocol agreed and what the
/// server sent before closing.
async fn offer(
    addr: std::net::SocketAddr,
    name: &str,
    alpn: &[&[u8]],
) -> std::io::Result<(String, Option<Vec<u8>>, Vec<u8>)> {
    let mut config = tls_test::client_config();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let mut tls = tls_test::connect(addr, name, config).await?;
    let (_, conn) = tls.get_ref();
    let leaf = tls_test::fingerprint(&conn.peer_certificates().unwrap()[0]);
    let agreed = conn.alpn_protocol().map(<[u8]>::to_vec);
    let mut sent = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut sent)).await;
    Ok((leaf, agreed, sent))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_takes_over_its_handshakes_before_ready_and_after_and_nothing_else() {
    for way in WAYS {
        let ca = TestCa::new("takeover");
        let (served, challenge) = (ca.leaf(&["a.example.com"]), ca.leaf(&["a.example.com"]));
        let key = tls_reload::Validator::new(provider(), tls_reload::Policy::default())
            .validate(&bundle(&challenge))
            .unwrap()
            .certified_key()
            .clone();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .handshake_hook(std::sync::Arc::new(TakesOver {
                name: "a.example.com",
                key,
            }))
            .spawn(rx)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve(reloader.incoming(listener).unwrap(), way);

        // Nothing installed: the validation gets through, anything else fails (with an alert,
        // not a hang).
        let (leaf, agreed, sent) = patiently(
            "the hook's handshake before ready",
            offer(addr, "a.example.com", &[b"acme-tls/1"]),
        )
        .await
        .unwrap();
        assert_eq!(leaf, challenge.fingerprint);
        assert_eq!(agreed.as_deref(), Some(&b"acme-tls/1"[..]));
        assert!(sent.is_empty(), "closed after the handshake, never served");
        let refused = tokio::time::timeout(
            Duration::from_secs(2),
            offer(addr, "a.example.com", &[b"h2"]),
        )
        .await
        .expect("refused at once");
        assert!(refused.is_err(), "not ready: {refused:?}");
        let other_name = offer(addr, "b.example.com", &[b"acme-tls/1"]).await;
        assert!(
            other_name.is_err(),
            "what the hook leaves is refused before ready"
        );

        tx.unbounded_send(Ok(bundle(&served))).unwrap();
        reloader.ready_timeout(PATIENCE).await.unwrap();
        let (leaf, agreed, sent) = offer(addr, "a.example.com", &[b"h2", b"http/1.1"])
            .await
            .unwrap();
        assert_eq!(leaf, served.fingerprint);
        assert_eq!(agreed.as_deref(), Some(&b"h2"[..]));
        assert_eq!(sent, b"h2", "served by the server");
        let (leaf, agreed, sent) = offer(addr, "a.example.com", &[b"acme-tls/1"])
            .await
            .unwrap();
        assert_eq!(leaf, challenge.fingerprint, "still the hook's once ready");
        assert_eq!(agreed.as_deref(), Some(&b"acme-tls/1"[..]));
        assert!(sent.is_empty());
        server.abort();
    }
}

/// Virtual time: one handshake slot, held by a client that never speaks for the whole
/// time-out; a client behind it is served only once the slot is free, either way.
#[tokio::test(start_paused = true)]
async fn new_connections_wait_in_the_backlog_while_every_handshake_slot_is_taken() {
    let (reloader, cert) = serving_one("slots").await;
    let timeout = Duration::from_secs(60);
    for way in WAYS {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = Incoming::builder(&reloader)
            .handshake_timeout(timeout)
            .max_handshakes(1)
            .listen(listener)
            .unwrap();
        let server = serve(incoming, way);
        let silent = TcpStream::connect(addr).await.unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(tls_test::served(addr).await, cert.fingerprint);
        assert!(
            started.elapsed() >= timeout,
            "{way:?}: served after {:?}, before the silent client's time-out freed the slot",
            started.elapsed()
        );
        drop(silent);
        server.abort();
    }
}

/// A server whose handler says hello, and goodbye once `token` is cancelled; its
/// `spawn_each` in a task, with a handshake time-out of an hour. Returns the task and its
/// address, with a connection in its handler (hello read) and a handshake in progress (a
/// client that never speaks, accepted before it).
async fn serving_each(
    token: &CancellationToken,
) -> (
    tokio::task::JoinHandle<tokio_util::task::TaskTracker>,
    tokio_rustls::client::TlsStream<TcpStream>,
    TcpStream,
) {
    let (reloader, _) = serving_one("each").await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = Incoming::builder(&reloader)
        .cancellation_token(token.clone())
        .handshake_timeout(Duration::from_secs(3600))
        .listen(listener)
        .unwrap();
    let handler = {
        let token = token.clone();
        move |mut conn: TlsConnection<TcpStream>| async move {
            let _ = conn.write_all(b"hello\n").await;
            token.cancelled().await;
            let _ = conn.write_all(b"bye\n").await;
            let _ = conn.shutdown().await;
        }
    };
    let each = tokio::spawn(incoming.spawn_each(handler));
    // Accepted in this order: once the second has its hello, the first is in its handshake.
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut open = tls_test::connect(addr, "localhost", tls_test::client_config())
        .await
        .unwrap();
    let mut hello = [0u8; 6];
    patiently("hello", open.read_exact(&mut hello))
        .await
        .unwrap();
    assert_eq!(&hello, b"hello\n");
    (each, open, silent)
}

/// Everything `stream` says until it closes, read patiently (`what`: named in the failure).
async fn said(what: &str, stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Vec<u8> {
    let mut said = Vec::new();
    patiently(what, stream.read_to_end(&mut said))
        .await
        .unwrap();
    said
}

/// Waits for the server to close `tcp` (a client that never spoke).
async fn dropped(mut tcp: TcpStream) {
    let mut buf = [0u8; 16];
    let read = patiently("the silent client is dropped", tcp.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the server closed the connection: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_each_ends_on_its_token_dropping_handshakes_and_leaving_connections_to_their_handler()
{
    let token = CancellationToken::new();
    let (each, mut open, silent) = serving_each(&token).await;
    token.cancel();
    let open_tasks = patiently("spawn_each returns", each).await.unwrap();
    // The handshake in progress is dropped (its time-out is an hour away); the connection
    // in its handler is not: the handler says goodbye and closes it, tracked till then.
    dropped(silent).await;
    assert_eq!(said("goodbye", &mut open).await, b"bye\n");
    patiently("the tracked tasks end", open_tasks.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_spawn_each_drops_its_handshakes_in_progress() {
    let token = CancellationToken::new();
    let (each, mut open, silent) = serving_each(&token).await;
    each.abort();
    dropped(silent).await;
    // The connection being served is its handler's: still open, and told goodbye at the
    // token.
    open.write_all(b"still there\n").await.unwrap();
    token.cancel();
    assert_eq!(said("goodbye", &mut open).await, b"bye\n");
}

#[tokio::test]
async fn when_its_listener_ends_spawn_each_returns_and_the_handshakes_in_progress_finish() {
    let (reloader, _) = serving_one("ended").await;
    // A listener of one connection whose client has not spoken yet.
    let (client, server) = tokio::io::duplex(64 * 1024);
    let incoming = Incoming::builder(&reloader)
        .serve_stream(futures::stream::iter([Ok((server, None))]))
        .unwrap();
    let open = patiently(
        "spawn_each returns",
        incoming.spawn_each(|mut conn| async move {
            let _ = conn.write_all(b"hello\n").await;
            let _ = conn.shutdown().await;
        }),
    )
    .await;
    let connector =
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls_test::client_config()));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = patiently("the handshake finishes", connector.connect(name, client))
        .await
        .unwrap();
    assert_eq!(said("hello", &mut tls).await, b"hello\n");
    patiently("the tracked task ends", open.wait()).await;
}
