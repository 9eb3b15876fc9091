//! Full TLS 1.3 handshakes by provider and key exchange (BENCHMARKS.md, rows 3 and 9 by
//! provider): a reloader's resolver on a plain tokio-rustls loop (row 3) and the accept stream
//! (`Incoming`, row 9), each served on *ring* and on aws-lc-rs, each asked by a rustls client on
//! aws-lc-rs restricted to X25519, and with its defaults (X25519MLKEM768 first, as reqwest's).
//! Against *ring* the default client gets a `HelloRetryRequest` and settles on another group:
//! that is the row the provider change removes.
//!
//! With `SERVE`, the path of a `serve` binary, the same two clients against it too, started
//! here on the bench's certificate (`--cert-dir`, kubelet-style).
//!
//! `cargo build --release --example serve && cargo run --release -p benches --features ring
//! --bin kx -- [N [target/release/examples/serve]]` (N handshakes per case, interleaved round by
//! round: default 300).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{Fed, certs, median, plain_loop, verifying_client_on};
use futures::StreamExt as _;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::{HandshakeKind, NamedGroup};
use tls_reload::Reloader;
use tls_test::TestCert;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// A server under test: where it listens and what it is.
struct Server {
    name: String,
    addr: SocketAddr,
}

/// A client: a name and its config (aws-lc-rs, no session cache: every handshake is full).
struct Client {
    name: &'static str,
    config: Arc<rustls::ClientConfig>,
}

fn client(name: &'static str, cert: &TestCert, groups: Option<&[NamedGroup]>) -> Client {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(groups) = groups {
        provider.kx_groups.retain(|g| groups.contains(&g.name()));
    }
    Client {
        name,
        config: Arc::new(verifying_client_on(cert, Arc::new(provider))),
    }
}

async fn accept_stream(reloader: &Reloader) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = reloader.incoming(listener).expect("an accept stream");
    tokio::spawn(async move {
        while let Some(connection) = incoming.next().await {
            drop(connection);
        }
    });
    addr
}

/// One full handshake: its time, the group and whether a `HelloRetryRequest` was needed.
async fn handshake(client: &Client, addr: SocketAddr) -> (Duration, Option<NamedGroup>, bool) {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::clone(&client.config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let took = started.elapsed();
    let (_, connection) = tls.get_ref();
    let group = connection
        .negotiated_key_exchange_group()
        .map(rustls::crypto::SupportedKxGroup::name);
    let retried = connection.handshake_kind() == Some(HandshakeKind::FullWithHelloRetryRequest);
    (took, group, retried)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(300, |v| v.parse().expect("N: a number"));
    let serve: Option<std::path::PathBuf> = args.next().map(Into::into);
    let runtime = benches::runtime(2);

    let certs = certs(1);
    let clients = [
        client("X25519 only", &certs[0], Some(&[NamedGroup::X25519])),
        client("defaults (X25519MLKEM768 first)", &certs[0], None),
    ];

    #[cfg(feature = "ring")]
    let ring: Option<(&str, Arc<CryptoProvider>)> =
        Some(("ring", Arc::new(tls_reload::ring_provider())));
    #[cfg(not(feature = "ring"))]
    let ring: Option<(&str, Arc<CryptoProvider>)> = {
        eprintln!("(without --features ring: aws-lc-rs only)");
        None
    };
    let aws: (&str, Arc<CryptoProvider>) = (
        "aws-lc-rs",
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    );
    let providers: Vec<_> = ring.into_iter().chain([aws]).collect();

    let mut servers = Vec::new();
    let mut keep = Vec::new();
    for (name, provider) in &providers {
        let fed = Fed::start_on(&runtime, &certs[0], Arc::clone(provider));
        servers.push(Server {
            name: format!("{name}, reloader on a tokio-rustls loop (row 3)"),
            addr: runtime.block_on(plain_loop(
                fed.reloader.server_config().expect("a server config"),
            )),
        });
        servers.push(Server {
            name: format!("{name}, accept stream (row 9)"),
            addr: runtime.block_on(accept_stream(&fed.reloader)),
        });
        keep.push(fed);
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let _serve = serve.map(|binary| {
        let (child, addr) = start_serve(&binary, dir.path(), &certs[0]);
        servers.push(Server {
            name: format!("{}", binary.display()),
            addr,
        });
        child
    });

    // Warm-up, then N rounds: in each, every client against every server once, so that the
    // machine's drift falls on all cases alike.
    let mut times = vec![vec![Vec::with_capacity(n); clients.len()]; servers.len()];
    let mut seen = vec![vec![(None, 0usize); clients.len()]; servers.len()];
    runtime.block_on(async {
        for round in 0..n + 20 {
            for (s, server) in servers.iter().enumerate() {
                for (c, client) in clients.iter().enumerate() {
                    let (took, group, retried) = handshake(client, server.addr).await;
                    if round >= 20 {
                        times[s][c].push(took);
                        seen[s][c].0 = group;
                        seen[s][c].1 += usize::from(retried);
                    }
                }
            }
        }
    });
    println!("{n} full TLS 1.3 handshakes per case, P-256 leaf, loopback, interleaved; medians:");
    for (s, server) in servers.iter().enumerate() {
        let baseline = median(times[s][0].clone());
        for (c, client) in clients.iter().enumerate() {
            let m = median(times[s][c].clone());
            println!(
                "  {:<55} {:<32} {:>8.1} µs  {:.3}x  group {:?}, HelloRetryRequest in {} of {n}",
                server.name,
                client.name,
                m.as_secs_f64() * 1e6,
                m.as_secs_f64() / baseline.as_secs_f64(),
                seen[s][c].0,
                seen[s][c].1,
            );
        }
    }

    // The same handshakes with no socket, no task and no process: both ends in one thread,
    // records passed in memory. What is left is the handshake's CPU alone, on each provider.
    println!("{n} in-memory handshakes per case (one thread, no I/O), medians:");
    for (name, fed) in providers.iter().map(|(name, _)| name).zip(&keep) {
        let server = Arc::new(fed.reloader.server_config().expect("a server config"));
        let mut times = vec![Vec::with_capacity(n); clients.len()];
        for round in 0..n + 20 {
            for (c, client) in clients.iter().enumerate() {
                let took = in_memory(&client.config, &server);
                if round >= 20 {
                    times[c].push(took);
                }
            }
        }
        let baseline = median(times[0].clone());
        for (c, client) in clients.iter().enumerate() {
            let m = median(times[c].clone());
            println!(
                "  {:<55} {:<32} {:>8.1} µs  {:.3}x",
                format!("{name}, in memory"),
                client.name,
                m.as_secs_f64() * 1e6,
                m.as_secs_f64() / baseline.as_secs_f64(),
            );
        }
    }
    drop(keep);
}

/// One full handshake between `client` and `server` in this thread, the records passed in
/// memory: its time.
fn in_memory(client: &Arc<rustls::ClientConfig>, server: &Arc<rustls::ServerConfig>) -> Duration {
    let started = Instant::now();
    let name = ServerName::try_from("localhost").unwrap();
    let client = rustls::ClientConnection::new(Arc::clone(client), name).expect("a client");
    let server = rustls::ServerConnection::new(Arc::clone(server)).expect("a server");
    let (mut client, mut server) = (
        rustls::Connection::from(client),
        rustls::Connection::from(server),
    );
    let mut buffer = Vec::with_capacity(16 * 1024);
    while client.is_handshaking() || server.is_handshaking() {
        pass_flight(&mut client, &mut server, &mut buffer);
        pass_flight(&mut server, &mut client, &mut buffer);
    }
    started.elapsed()
}

/// What `from` has to send, read and processed by `to` (through `buffer`).
fn pass_flight(from: &mut rustls::Connection, to: &mut rustls::Connection, buffer: &mut Vec<u8>) {
    buffer.clear();
    while from.wants_write() {
        from.write_tls(buffer).expect("written");
    }
    let mut read = &buffer[..];
    while !read.is_empty() {
        to.read_tls(&mut read).expect("read");
    }
    to.process_new_packets().expect("the other side's flight");
}

/// `serve --cert-dir` on `cert`, written under `dir` the kubelet's way; killed when dropped.
fn start_serve(
    binary: &std::path::Path,
    dir: &std::path::Path,
    cert: &TestCert,
) -> (KillOnDrop, SocketAddr) {
    use std::io::BufRead as _;
    let kube = tls_test::KubeDir::new(dir.join("tls")).expect("a directory");
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .expect("written");
    let mut child = std::process::Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--cert-dir"])
        .arg(kube.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("its stdout"))
        .read_line(&mut line)
        .expect("serve announces itself");
    let addr = line
        .trim()
        .strip_prefix("listening on https://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("an address");
    (KillOnDrop(child), addr)
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
