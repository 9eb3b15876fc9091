//! serve as a sidecar, run as a user runs it: a real serve process in front of a real upstream
//! process (`serve/examples/upstream.rs`: HTTP, gRPC health, a TCP echo), real TLS clients.
//!
//! - `--upstream`: the forwarded headers, never a client-sent one; gRPC through h2c with its
//!   trailers; a WebSocket upgrade; an upstream that dies (502) and returns;
//! - `--upstream-tcp --proxy-protocol`: the bytes, after a PROXY v2 header read by `ppp`;
//! - `--allow-*`: an allowed SPIFFE ID passes, another is refused in the handshake before the
//!   upstream sees anything; a rule removed from `--allow-file` closes that client's
//!   connection; a client CA removed from `--client-ca` closes proxied connections;
//! - `--connect`: a plain connection carried over mTLS, the rotated identity on the next one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tls_test::{KubeDir, PATIENCE, Serve, TestCa, TestCert};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

const WEB: &str = "spiffe://example.org/ns/prod/sa/web";
const BATCH: &str = "spiffe://example.org/ns/staging/sa/batch";

fn serve_bin() -> PathBuf {
    std::env::var_os("SERVE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_serve")), PathBuf::from)
}

/// The upstream example, running: its process (killed when dropped) and address.
struct Upstream {
    child: Child,
    addr: String,
}

impl Upstream {
    /// `upstream MODE AT` (`AT`: an address, port 0 for any, or `unix:PATH`).
    async fn start(mode: &str, at: &str) -> Self {
        let mut command = Command::new(tls_test::example("upstream"));
        command.args([mode, at]);
        let (child, line, _) = tls_test::announced(command).await;
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("{line:?}"))
            .to_owned();
        Self { child, addr }
    }
}

/// Server and client certificates, and the files serve reads them from.
struct Pki {
    _dir: tempfile::TempDir,
    root: PathBuf,
    clients: TestCa,
    server_dir: PathBuf,
    /// The server certificate's CA, PEM.
    server_ca: String,
    client_ca: PathBuf,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let server = TestCa::new("server").leaf(&["localhost"]);
        let server_dir = root.join("server");
        std::fs::create_dir(&server_dir).unwrap();
        std::fs::write(server_dir.join("tls.crt"), &server.chain_pem).unwrap();
        std::fs::write(server_dir.join("tls.key"), &server.key_pem).unwrap();
        let clients = TestCa::new("clients");
        let client_ca = root.join("client-ca.pem");
        std::fs::write(&client_ca, clients.cert_pem()).unwrap();
        Self {
            _dir: dir,
            root,
            clients,
            server_dir,
            server_ca: server.ca_pem,
            client_ca,
        }
    }

    /// The flags of an mTLS server on these files, polled every 100 ms.
    fn mtls_args(&self) -> Vec<String> {
        vec![
            "--cert-dir".into(),
            self.server_dir.display().to_string(),
            "--client-ca".into(),
            self.client_ca.display().to_string(),
            "--poll".into(),
            "100ms".into(),
        ]
    }
}

/// serve requiring client certificates of `pki`'s CA, with `extra` flags.
async fn start_mtls(pki: &Pki, extra: &[&str]) -> Serve {
    let mut flags = pki.mtls_args();
    flags.extend(args(extra));
    start(&flags).await
}

async fn start(args: &[String]) -> Serve {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(&serve_bin(), &args).await
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A TLS connection to serve as `client` (or none), offering `alpn`.
async fn tls(
    addr: SocketAddr,
    client: Option<&TestCert>,
    alpn: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut config = match client {
        Some(cert) => tls_test::client_config_with_cert(cert),
        None => tls_test::client_config(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    tls_test::connect(addr, "localhost", config).await
}

/// Sends `request` (raw HTTP/1.1, `Connection: close`) and reads the whole answer; an error
/// (a TLS alert, say) as text.
async fn exchange(
    addr: SocketAddr,
    client: Option<&TestCert>,
    request: &str,
) -> Result<String, String> {
    let mut stream = tls(addr, client, b"http/1.1")
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// `GET path` through serve: the status code and body.
async fn get(
    addr: SocketAddr,
    client: Option<&TestCert>,
    path: &str,
) -> Result<(u16, String), String> {
    let answer = exchange(
        addr,
        client,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    )
    .await?;
    let code = answer
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((code, body.to_owned()))
}

/// The headers the upstream received, from its JSON answer (lower-case names).
fn received(body: &str) -> Vec<(String, String)> {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    json["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_owned(),
                pair[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test]
async fn an_http_upstream_gets_the_forwarded_headers_and_never_a_client_sent_one() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let pki = Pki::new();
    let serve = start_mtls(&pki, &["--upstream", &upstream.addr]).await;
    let client = pki.clients.uri_client_leaf("web", &[WEB]);
    let answer = exchange(
        serve.addr,
        Some(&client),
        "GET /echo?x=1 HTTP/1.1\r\nHost: app.example.com\r\n\
         X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: http\r\n\
         X-Forwarded-Client-Cert: Hash=forged\r\nForwarded: for=203.0.113.9\r\n\
         X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 1\r\n\
         Connection: close, x-hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n\
         Proxy-Authorization: Basic Zm9v\r\nX-App: kept\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["path"], "/echo");
    let headers = received(body);
    assert_eq!(
        header(&headers, "x-forwarded-for"),
        ["127.0.0.1"],
        "replaced, not appended"
    );
    assert_eq!(header(&headers, "x-forwarded-proto"), ["https"]);
    assert_eq!(
        header(&headers, "x-forwarded-client-cert"),
        [format!("Hash={};Subject=\"CN=web\";URI={WEB}", client.fingerprint).as_str()]
    );
    assert_eq!(header(&headers, "host"), ["app.example.com"]);
    assert_eq!(header(&headers, "x-app"), ["kept"]);
    for gone in [
        "forwarded",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-hop",
        "keep-alive",
        "proxy-authorization",
    ] {
        assert!(
            header(&headers, gone).is_empty(),
            "{gone} was passed on: {headers:?}"
        );
    }
    // Without a client certificate nobody may claim one.
    let plain = Upstream::start("http", "127.0.0.1:0").await;
    let serve = start(&args(&["--upstream", &plain.addr])).await;
    let answer = exchange(
        serve.addr,
        None,
        "GET / HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-Client-Cert: Hash=forged\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let headers = received(answer.split_once("\r\n\r\n").unwrap().1);
    assert!(
        header(&headers, "x-forwarded-client-cert").is_empty(),
        "{headers:?}"
    );
    assert_eq!(header(&headers, "x-forwarded-proto"), ["https"]);
}

#[tokio::test]
async fn grpc_goes_through_h2c_with_its_trailers() {
    use http_body_util::BodyExt as _;
    let upstream = Upstream::start("grpc", "127.0.0.1:0").await;
    let serve = start(&args(&["--upstream", &upstream.addr])).await;
    let stream = tls(serve.addr, None, b"h2").await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // grpc.health.v1.Health/Check with an empty HealthCheckRequest: a 5-byte frame header.
    let request = hyper::Request::post("https://localhost/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, send.send_request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("gRPC trailers");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    // HealthCheckResponse { status: SERVING (1) }.
    assert_eq!(collected.to_bytes().as_ref(), [0, 0, 0, 0, 2, 0x08, 0x01]);
}

#[tokio::test]
async fn a_websocket_upgrade_passes_through_and_bytes_flow_both_ways() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let serve = start(&args(&["--upstream", &upstream.addr])).await;
    let mut stream = tls(serve.addr, None, b"http/1.1").await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tokio::time::timeout(PATIENCE, stream.read_exact(&mut byte))
            .await
            .unwrap()
            .unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for message in [&b"\x81\x05hello"[..], b"\x81\x05again"] {
        stream.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(PATIENCE, stream.read_exact(&mut echoed))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(echoed, message);
    }
}

#[tokio::test]
async fn a_tcp_upstream_gets_a_proxy_v2_header_then_the_bytes() {
    let upstream = Upstream::start("tcp", "127.0.0.1:0").await;
    let pki = Pki::new();
    let serve = start_mtls(
        &pki,
        &["--upstream-tcp", &upstream.addr, "--proxy-protocol"],
    )
    .await;
    let client = pki.clients.uri_client_leaf("web", &[WEB]);
    let mut stream = tls(serve.addr, Some(&client), b"postgresql").await.unwrap();
    let client_addr = stream.get_ref().0.local_addr().unwrap();
    stream.write_all(b"hello").await.unwrap();
    // The echo: the header serve sent, then our bytes.
    let mut echoed = vec![0u8; 16];
    stream.read_exact(&mut echoed).await.unwrap();
    let length = usize::from(u16::from_be_bytes([echoed[14], echoed[15]]));
    echoed.resize(16 + length + 5, 0);
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut echoed[16..]))
        .await
        .unwrap()
        .unwrap();
    let header = ppp::v2::Header::try_from(&echoed[..16 + length]).unwrap();
    assert_eq!(header.command, ppp::v2::Command::Proxy);
    assert_eq!(header.protocol, ppp::v2::Protocol::Stream);
    let ppp::v2::Addresses::IPv4(addresses) = header.addresses else {
        panic!("{:?}", header.addresses)
    };
    assert_eq!(
        SocketAddr::from((addresses.source_address, addresses.source_port)),
        client_addr
    );
    assert_eq!(
        SocketAddr::from((addresses.destination_address, addresses.destination_port)),
        serve.addr
    );
    let tlvs: Vec<(u8, Vec<u8>)> = header
        .tlvs()
        .map(|tlv| {
            let tlv = tlv.unwrap();
            (tlv.kind, tlv.value.to_vec())
        })
        .collect();
    let find = |kind: u8| {
        tlvs.iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        find(0x01),
        None,
        "no application protocol is negotiated for bytes"
    );
    assert_eq!(find(0x02).as_deref(), Some(&b"localhost"[..]), "SNI");
    assert_eq!(find(0xe0).as_deref(), Some(WEB.as_bytes()), "the URI SAN");
    let ssl = find(0x20).expect("PP2_TYPE_SSL");
    assert_eq!(ssl[0] & 0x03, 0x03, "over TLS, with a client certificate");
    assert_eq!(&ssl[1..5], [0, 0, 0, 0], "verified");
    let sub: Vec<(u8, Vec<u8>)> = ppp::v2::TypeLengthValues::from(&ssl[5..])
        .map(|tlv| {
            let tlv = tlv.unwrap();
            (tlv.kind, tlv.value.to_vec())
        })
        .collect();
    assert!(sub.contains(&(0x21, b"TLSv1.3".to_vec())), "{sub:?}");
    assert!(sub.contains(&(0x22, b"web".to_vec())), "{sub:?}");
    assert_eq!(&echoed[16 + length..], b"hello");
}

#[tokio::test]
async fn an_allowed_spiffe_id_passes_and_another_is_refused_before_the_upstream_sees_anything() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let pki = Pki::new();
    let mut serve = start_mtls(
        &pki,
        &[
            "--upstream",
            &upstream.addr,
            "--allow-uri",
            "spiffe://example.org/ns/prod/*",
            "--status-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    let status_line = tokio::time::timeout(PATIENCE, serve.lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let status_addr: SocketAddr = status_line
        .strip_prefix("status on http://")
        .and_then(|s| s.strip_suffix('/'))
        .unwrap_or_else(|| panic!("{status_line:?}"))
        .parse()
        .unwrap();
    let web = pki.clients.uri_client_leaf("web", &[WEB]);
    let batch = pki.clients.uri_client_leaf("batch", &[BATCH]);

    let (code, body) = get(serve.addr, Some(&web), "/").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let seen_before = upstream_requests(&upstream).await;
    assert_eq!(seen_before, 1, "web's request reached the upstream");
    let refused = get(serve.addr, Some(&batch), "/").await.unwrap_err();
    assert!(refused.contains("AccessDenied"), "{refused}");
    assert_eq!(
        upstream_requests(&upstream).await,
        seen_before,
        "the upstream saw nothing of the refused client"
    );
    // The status moved to --status-listen, with the refusal counted in its metrics.
    let (code, status) = plain(status_addr, "/").await.unwrap();
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["generation"], 1);
    let (code, metrics) = plain(status_addr, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("tls_reload_clients_refused_total 1"),
        "{metrics}"
    );
}

/// A plain `GET path`: the status code and body.
async fn plain(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let answer = tls_test::plain_get(addr, path).await?;
    let code = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((code, body.to_owned()))
}

/// How many requests the HTTP upstream has answered (asked directly, not through serve).
async fn upstream_requests(upstream: &Upstream) -> usize {
    let (code, body) = plain(upstream.addr.parse().unwrap(), "/count")
        .await
        .unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let count = json["count"].as_u64().unwrap_or_else(|| panic!("{body}"));
    usize::try_from(count).unwrap()
}

/// An HTTP/1.1 keep-alive connection through serve: each request's status code; `None` once
/// serve closed it.
struct KeepAlive {
    stream: BufReader<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
}

impl KeepAlive {
    async fn open(addr: SocketAddr, client: &TestCert) -> Self {
        Self {
            stream: BufReader::new(tls(addr, Some(client), b"http/1.1").await.unwrap()),
        }
    }

    async fn get(&mut self) -> Option<u16> {
        self.stream
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut status = String::new();
        self.stream.read_line(&mut status).await.ok()?;
        let code = status.get(9..12)?.parse().ok()?;
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.ok()?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(code)
    }

    /// Waits for serve to close the connection (end of file or an error on read).
    async fn closed(mut self, what: &str) {
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, self.stream.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection is still open"))
            .ok();
    }
}

/// Replaces `path` the way an editor or a ConfigMap update does: a new file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_rule_removed_from_the_allow_file_closes_that_clients_connection() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let pki = Pki::new();
    let rules = pki.root.join("allow");
    std::fs::write(&rules, format!("# who may call\nuri={WEB}\nuri={BATCH}\n")).unwrap();
    let rules_flag = rules.display().to_string();
    let serve = start_mtls(
        &pki,
        &["--upstream", &upstream.addr, "--allow-file", &rules_flag],
    )
    .await;
    let web = pki.clients.uri_client_leaf("web", &[WEB]);
    let batch = pki.clients.uri_client_leaf("batch", &[BATCH]);
    let mut from_web = KeepAlive::open(serve.addr, &web).await;
    let mut from_batch = KeepAlive::open(serve.addr, &batch).await;
    assert_eq!(from_web.get().await, Some(200));
    assert_eq!(from_batch.get().await, Some(200));

    // A file that does not parse changes nothing.
    replace(&rules, "uri=spiffe://example.org/*/broken\n");
    replace(&rules, &format!("uri={WEB}\n"));
    from_batch
        .closed("batch's connection once its rule is gone")
        .await;
    assert_eq!(from_web.get().await, Some(200), "web's connection stays");
    let again = get(serve.addr, Some(&batch), "/").await.unwrap_err();
    assert!(again.contains("AccessDenied"), "{again}");
}

#[tokio::test]
async fn a_client_ca_removed_from_the_file_closes_proxied_connections() {
    let upstream = Upstream::start("tcp", "127.0.0.1:0").await;
    let pki = Pki::new();
    let other = TestCa::new("other clients");
    std::fs::write(
        &pki.client_ca,
        format!("{}{}", pki.clients.cert_pem(), other.cert_pem()),
    )
    .unwrap();
    let serve = start_mtls(&pki, &["--upstream-tcp", &upstream.addr]).await;
    let leaving = pki.clients.client_leaf("leaving");
    let staying = other.client_leaf("staying");
    let mut from_leaving = tls(serve.addr, Some(&leaving), b"x").await.unwrap();
    let mut from_staying = tls(serve.addr, Some(&staying), b"x").await.unwrap();
    for stream in [&mut from_leaving, &mut from_staying] {
        stream.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        stream.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
    }

    replace(&pki.client_ca, &other.cert_pem());
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, from_leaving.read_to_end(&mut rest))
        .await
        .expect("the connection of the CA that left is closed")
        .ok();
    from_staying.write_all(b"pong").await.unwrap();
    let mut echo = [0u8; 4];
    from_staying.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"pong", "the other CA's connection stays");
}

#[tokio::test]
async fn an_upstream_that_dies_gets_502_and_is_served_again_when_it_returns() {
    // A port for the upstream that serve knows before it starts.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let at = format!("127.0.0.1:{port}");
    let mut upstream = Upstream::start("http", &at).await;
    let serve = start(&args(&["--upstream", &at])).await;
    assert_eq!(get(serve.addr, None, "/").await.unwrap().0, 200);
    upstream.child.kill().await.unwrap();
    let (code, body) = get(serve.addr, None, "/").await.unwrap();
    assert_eq!((code, body.as_str()), (502, "upstream unavailable\n"));
    let _upstream = Upstream::start("http", &at).await;
    assert_eq!(
        get(serve.addr, None, "/").await.unwrap().0,
        200,
        "served again, no restart"
    );
}

#[tokio::test]
async fn a_unix_socket_upstream_is_proxied_to() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("app.sock");
    let _upstream = Upstream::start("http", &format!("unix:{}", socket.display())).await;
    let serve = start(&args(&["--upstream", &socket.display().to_string()])).await;
    let (code, body) = get(serve.addr, None, "/via-unix").await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"/via-unix\""), "{body}");
}

/// serve with `--connect`: the process and the address of its plain listener.
async fn start_connect(args: &[&str]) -> (Child, SocketAddr) {
    let mut command = Command::new(serve_bin());
    command.args(args);
    let (client, line, _) = tls_test::announced(command).await;
    let listen = line
        .strip_prefix("listening on tcp://")
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    (client, listen)
}

/// The client certificate a `serve` status page reached through `listen` saw.
async fn presented_through(listen: SocketAddr) -> String {
    let (code, body) = plain(listen, "/").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    status["client_fingerprint_sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}"))
        .to_owned()
}

#[tokio::test]
async fn connect_carries_a_plain_connection_over_mtls_and_the_next_one_presents_a_rotated_identity()
{
    // The server: serve itself, requiring client certificates, whose status names the client
    // certificate of each connection.
    let pki = Pki::new();
    let server = start(&pki.mtls_args()).await;
    let server_ca = pki.root.join("server-ca.pem");
    std::fs::write(&server_ca, &pki.server_ca).unwrap();

    let identity = KubeDir::new(pki.root.join("client")).unwrap();
    let first = pki.clients.client_leaf("app-1");
    identity
        .write(&[
            ("tls.crt", first.chain_pem.as_bytes()),
            ("tls.key", first.key_pem.as_bytes()),
        ])
        .unwrap();
    let (_client, listen) = start_connect(&[
        "--cert-dir",
        &identity.path().display().to_string(),
        "--poll",
        "100ms",
        "--connect",
        &server.addr.to_string(),
        "--connect-sni",
        "localhost",
        "--connect-ca",
        &server_ca.display().to_string(),
        "--client-listen",
        "127.0.0.1:0",
    ])
    .await;
    let presented = || presented_through(listen);
    assert_eq!(presented().await, first.fingerprint);

    let second = pki.clients.client_leaf("app-2");
    identity
        .write(&[
            ("tls.crt", second.chain_pem.as_bytes()),
            ("tls.key", second.key_pem.as_bytes()),
        ])
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if presented().await == second.fingerprint {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated identity was never presented"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_lets_a_proxied_request_in_flight_finish() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let serve = start(&args(&["--upstream", &upstream.addr])).await;
    let addr = serve.addr;
    let slow = tokio::spawn(async move { get(addr, None, "/slow?ms=1500").await });
    // The request is in flight at the upstream once its count moved.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while upstream_requests(&upstream).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    serve.signal("-TERM");
    let (code, body) = slow.await.unwrap().unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"/slow\""), "{body}");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// How the second of two handshakes with one client config went (the first's session offered).
async fn second_handshake(addr: SocketAddr) -> Option<tls_rotation::rustls::HandshakeKind> {
    let mut config = tls_test::client_config();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut kind = None;
    for _ in 0..2 {
        // A clone shares the session store: the second connection offers the first's ticket.
        let mut stream = tls_test::connect(addr, "localhost", config.clone())
            .await
            .unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        // Read to the end: the session ticket comes after the handshake.
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        assert!(!answer.is_empty(), "an answer through serve");
        kind = stream.get_ref().1.handshake_kind();
    }
    kind
}

#[tokio::test]
async fn no_resumption_makes_every_handshake_a_full_one() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let resuming = start(&args(&["--upstream", &upstream.addr])).await;
    assert_eq!(
        second_handshake(resuming.addr).await,
        Some(tls_rotation::rustls::HandshakeKind::Resumed),
        "by default a returning client resumes"
    );
    let full = start(&args(&["--upstream", &upstream.addr, "--no-resumption"])).await;
    assert_eq!(
        second_handshake(full.addr).await,
        Some(tls_rotation::rustls::HandshakeKind::Full)
    );
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_a_slow_upstream_504() {
    let upstream = Upstream::start("http", "127.0.0.1:0").await;
    let serve = start(&args(&[
        "--upstream",
        &upstream.addr,
        "--max-request-body",
        "1KiB",
        "--request-timeout",
        "300ms",
    ]))
    .await;
    let post = |length: usize| {
        format!(
            "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{}",
            "x".repeat(length)
        )
    };
    let small = exchange(serve.addr, None, &post(1024)).await.unwrap();
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    let large = exchange(serve.addr, None, &post(1025)).await.unwrap();
    assert!(large.starts_with("HTTP/1.1 413"), "{large}");
    // Chunked, so that only the bytes tell: over the limit on the way.
    let chunked = exchange(
        serve.addr,
        None,
        &format!(
            "POST /upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n800\r\n{}\r\n0\r\n\r\n",
            "x".repeat(0x800)
        ),
    )
    .await
    .unwrap();
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    let (code, body) = get(serve.addr, None, "/slow?ms=3000").await.unwrap();
    assert_eq!((code, body.as_str()), (504, "upstream timed out\n"));
    assert_eq!(
        get(serve.addr, None, "/").await.unwrap().0,
        200,
        "the next request is served"
    );
}

#[tokio::test]
async fn connect_presents_a_self_signed_identity_made_for_clients() {
    // The client first: its CA, in its directory, is what the server trusts.
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let server_ca = pki.root.join("server-ca.pem");
    std::fs::write(&server_ca, &pki.server_ca).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_client, listen) = start_connect(&[
        "--self-signed-ca",
        "--self-signed-dir",
        &dir.path().display().to_string(),
        "--connect",
        &format!("127.0.0.1:{port}"),
        "--connect-sni",
        "localhost",
        "--connect-ca",
        &server_ca.display().to_string(),
        "--client-listen",
        "127.0.0.1:0",
    ])
    .await;
    let _server = start(&args(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--cert-dir",
        &pki.server_dir.display().to_string(),
        "--client-ca",
        &dir.path().join("ca.crt").display().to_string(),
    ]))
    .await;
    let leaf = std::fs::read(dir.path().join("tls.crt")).unwrap();
    let leaf = tls_rotation::tls_source::Decoder::new()
        .certificates("tls.crt", &leaf)
        .unwrap()
        .remove(0);
    assert_eq!(
        presented_through(listen).await,
        tls_test::fingerprint(leaf.as_ref())
    );
}
