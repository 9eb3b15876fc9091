//! Pebble, Let's Encrypt's ACME test server, and `pebble-challtestsrv`, its DNS server, run
//! per test on free loopback ports (the Debian package `pebble` holds both).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::{PATIENCE, TestCa};

/// How to install Pebble, for the message of a test that needs it.
const INSTALL: &str =
    "apt-get install pebble (Debian/Ubuntu: it holds pebble and pebble-challtestsrv)";

/// Configures a [`Pebble`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct PebbleBuilder {
    http_port: u16,
    tls_port: u16,
    validity: Option<u64>,
    nonce_reject: u8,
    dns_server: Option<SocketAddr>,
}

impl PebbleBuilder {
    /// The share of good nonces Pebble rejects with `badNonce`, in percent
    /// (`PEBBLE_WFE_NONCEREJECT`; Pebble's own default is 5). Default here: 0.
    pub fn nonce_reject(mut self, percent: u8) -> Self {
        self.nonce_reject = percent.min(100);
        self
    }

    /// The port Pebble's validator connects to for HTTP-01 (on the address the name resolves
    /// to). Default: 5002, Pebble's own.
    pub fn http_port(mut self, port: u16) -> Self {
        self.http_port = port;
        self
    }

    /// The port Pebble's validator connects to for TLS-ALPN-01. Default: 5001, Pebble's own.
    pub fn tls_port(mut self, port: u16) -> Self {
        self.tls_port = port;
        self
    }

    /// The DNS server Pebble's validator asks (a [`Bind`](crate::Bind), say) in place of
    /// challtestsrv: names then resolve as that server says, and DNS-01 records are read there.
    pub fn dns_server(mut self, addr: SocketAddr) -> Self {
        self.dns_server = Some(addr);
        self
    }

    /// How long the certificates Pebble issues are valid (`certificateValidityPeriod`).
    pub fn validity(mut self, validity: Duration) -> Self {
        self.validity = Some(validity.as_secs().max(1));
        self
    }

    /// Starts challtestsrv and Pebble (every name resolves to 127.0.0.1 unless
    /// [`Pebble::add_a`] says otherwise), and waits until both answer.
    ///
    /// `None` when Pebble is not installed and `CI` is not set (the test is skipped, and says
    /// how to install it).
    ///
    /// # Panics
    /// When Pebble is not installed under `CI`, or it does not start.
    pub async fn start(self) -> Option<Pebble> {
        let (Some(pebble), Some(challtestsrv)) = (which("pebble"), which("pebble-challtestsrv"))
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "Pebble is needed (CI is set): {INSTALL}"
            );
            eprintln!("skipped: Pebble is not installed ({INSTALL})");
            return None;
        };
        Some(Pebble::spawn(self, &pebble, &challtestsrv).await)
    }

    /// [`start`](Self::start) for a test that needs Pebble: such a test is
    /// `#[cfg_attr(not(pebble), ignore)]` (the `cfg` tls-acme's build script sets when Pebble
    /// is installed or `CI` is set), so that it runs only where Pebble is expected.
    ///
    /// # Panics
    /// When Pebble is not installed, or it does not start.
    pub async fn start_required(self) -> Pebble {
        self.start().await.unwrap_or_else(|| {
            panic!("Pebble is needed: {INSTALL} (the test is ignored where it is not installed)")
        })
    }
}

/// A running Pebble with its DNS server, stopped when dropped.
///
/// ```no_run
/// # async fn run() {
/// let Some(pebble) = tls_test::Pebble::builder().tls_port(8443).start().await else {
///     return; // not installed
/// };
/// let directory = pebble.directory_url(); // trust pebble.https_ca_pem() for it
/// let root = pebble.issuing_root().await; // what its certificates chain to
/// # drop((directory, root)); }
/// ```
pub struct Pebble {
    dir: tempfile::TempDir,
    listen: SocketAddr,
    management: SocketAddr,
    dns_management: SocketAddr,
    https_ca: TestCa,
    log: Arc<Mutex<Vec<String>>>,
    _pebble: Child,
    _challtestsrv: Child,
}

impl std::fmt::Debug for Pebble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pebble")
            .field("listen", &self.listen)
            .field("management", &self.management)
            .finish_non_exhaustive()
    }
}

impl Pebble {
    /// Configures a Pebble for one test.
    pub fn builder() -> PebbleBuilder {
        PebbleBuilder {
            http_port: 5002,
            tls_port: 5001,
            validity: None,
            nonce_reject: 0,
            dns_server: None,
        }
    }

    async fn spawn(config: PebbleBuilder, pebble: &Path, challtestsrv: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let https_ca = TestCa::new("Pebble test HTTPS CA");
        let https = https_ca.leaf(&["localhost", "127.0.0.1"]);
        let cert = dir.path().join("pebble.crt");
        let key = dir.path().join("pebble.key");
        std::fs::write(&cert, &https.chain_pem).expect("write Pebble's certificate");
        std::fs::write(&key, &https.key_pem).expect("write Pebble's key");
        std::fs::write(dir.path().join("https-ca.pem"), https_ca.cert_pem()).expect("write CA");

        let log = Arc::new(Mutex::new(Vec::new()));
        let dns = free_udp_and_tcp_port();
        let dns_management = free_port();
        let mut challtestsrv = Command::new(challtestsrv);
        challtestsrv
            .arg("-dns01")
            .arg(dns.to_string())
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .arg("-management")
            .arg(dns_management.to_string())
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""]);
        let challtestsrv = run(challtestsrv, "challtestsrv", &log);
        wait_listening(dns_management, "challtestsrv").await;

        let listen = free_port();
        let management = free_port();
        let mut settings = serde_json::json!({
            "listenAddress": listen.to_string(),
            "managementListenAddress": management.to_string(),
            "certificate": cert,
            "privateKey": key,
            "httpPort": config.http_port,
            "tlsPort": config.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        });
        if let Some(validity) = config.validity {
            settings["certificateValidityPeriod"] = validity.into();
        }
        let file = dir.path().join("pebble.json");
        std::fs::write(
            &file,
            serde_json::to_vec(&serde_json::json!({ "pebble": settings })).expect("JSON"),
        )
        .expect("write Pebble's configuration");
        let mut command = Command::new(pebble);
        command
            .arg("-config")
            .arg(&file)
            .arg("-strict=false")
            .arg("-dnsserver")
            .arg(config.dns_server.unwrap_or(dns).to_string())
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", config.nonce_reject.to_string())
            .env("PEBBLE_AUTHZREUSE", "0");
        let pebble = run(command, "pebble", &log);
        wait_listening(listen, "pebble").await;
        wait_listening(management, "pebble's management").await;
        Self {
            dir,
            listen,
            management,
            dns_management,
            https_ca,
            log,
            _pebble: pebble,
            _challtestsrv: challtestsrv,
        }
    }

    /// The directory URL.
    pub fn directory_url(&self) -> String {
        format!("https://localhost:{}/dir", self.listen.port())
    }

    /// The address of the ACME server (what a layer in front of it forwards to).
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The CA certificate (PEM) that Pebble's own HTTPS certificate chains to: what a client
    /// must trust to reach the directory.
    pub fn https_ca_pem(&self) -> String {
        self.https_ca.cert_pem()
    }

    /// The same CA certificate as DER.
    pub fn https_ca_der(&self) -> CertificateDer<'static> {
        self.https_ca.cert_der()
    }

    /// A file holding [`https_ca_pem`](Self::https_ca_pem) (for a `--acme-directory-ca`).
    pub fn https_ca_file(&self) -> PathBuf {
        self.dir.path().join("https-ca.pem")
    }

    /// The root Pebble's certificates chain to (a new one each start), from its management
    /// port.
    ///
    /// # Panics
    /// If it cannot be fetched.
    pub async fn issuing_root(&self) -> CertificateDer<'static> {
        let (status, body) = self.management_get("/roots/0").await;
        assert_eq!(status, 200, "Pebble's /roots/0 answered {status}: {body}");
        let mut reader = io::Cursor::new(body.into_bytes());
        rustls_pemfile_certs(&mut reader)
            .into_iter()
            .next()
            .expect("a root certificate in /roots/0")
    }

    /// Pebble's process id (to read its CPU time from `/proc`), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self._pebble.id()
    }

    /// Orders placed so far (`newOrder` requests), counted in Pebble's log: the CA's count,
    /// not the client's.
    pub fn orders(&self) -> usize {
        self.log_matching("POST /order-plz")
    }

    /// How many lines of Pebble's (and challtestsrv's) log contain `needle`.
    pub fn log_matching(&self, needle: &str) -> usize {
        lines_matching(&self.log, needle)
    }

    /// The log so far (for a failing test's message).
    pub fn log(&self) -> String {
        joined(&self.log)
    }

    /// Makes `host` resolve to `addr` (challtestsrv's `add-a`): Pebble's validator then
    /// connects there.
    ///
    /// # Panics
    /// If challtestsrv refuses.
    pub async fn add_a(&self, host: &str, addr: Ipv4Addr) {
        self.dns_command(
            "/add-a",
            &serde_json::json!({ "host": fqdn(host), "addresses": [addr.to_string()] }),
        )
        .await;
    }

    /// Publishes a TXT record (challtestsrv's `set-txt`), as a DNS-01 solver does.
    ///
    /// # Errors
    /// When challtestsrv cannot be reached or refuses.
    pub async fn set_txt(&self, host: &str, value: &str) -> io::Result<()> {
        self.try_dns_command(
            "/set-txt",
            &serde_json::json!({ "host": fqdn(host), "value": value }),
        )
        .await
    }

    /// Removes a name's TXT records (challtestsrv's `clear-txt`).
    ///
    /// # Errors
    /// When challtestsrv cannot be reached or refuses.
    pub async fn clear_txt(&self, host: &str) -> io::Result<()> {
        self.try_dns_command("/clear-txt", &serde_json::json!({ "host": fqdn(host) }))
            .await
    }

    async fn dns_command(&self, path: &str, body: &serde_json::Value) {
        self.try_dns_command(path, body)
            .await
            .unwrap_or_else(|e| panic!("challtestsrv {path}: {e}"));
    }

    async fn try_dns_command(&self, path: &str, body: &serde_json::Value) -> io::Result<()> {
        let body = body.to_string();
        let mut tcp = TcpStream::connect(self.dns_management).await?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        tcp.read_to_string(&mut response).await?;
        if response.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "challtestsrv answered: {}",
                response.lines().next().unwrap_or_default()
            )))
        }
    }

    async fn management_get(&self, path: &str) -> (u16, String) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.https_ca.cert_der()).expect("a CA");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(self.management)
            .await
            .expect("Pebble's management port");
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").expect("a name"), tcp)
            .await
            .expect("a handshake with Pebble's management port");
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tls.write_all(request.as_bytes()).await.expect("a request");
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, body.to_owned())
    }
}

/// A host name as challtestsrv keys it: fully qualified, with the final dot.
fn fqdn(host: &str) -> String {
    if host.ends_with('.') {
        host.to_owned()
    } else {
        format!("{host}.")
    }
}

/// The certificates of a PEM text.
fn rustls_pemfile_certs(reader: &mut dyn io::BufRead) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject as _;
    let mut text = Vec::new();
    let _ = reader.read_to_end(&mut text);
    CertificateDer::pem_slice_iter(&text)
        .filter_map(Result::ok)
        .collect()
}

/// How many lines of a process's `log` contain `needle`.
pub(crate) fn lines_matching(log: &Mutex<Vec<String>>, needle: &str) -> usize {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|line| line.contains(needle))
        .count()
}

/// A process's `log` so far, one line each.
pub(crate) fn joined(log: &Mutex<Vec<String>>) -> String {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .join("\n")
}

/// Runs `command` with its output appended, line by line, to `log` (killed when dropped).
pub(crate) fn run(mut command: Command, what: &str, log: &Arc<Mutex<Vec<String>>>) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    for pipe in [
        Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        Box::new(stderr),
    ] {
        let log = Arc::clone(log);
        let what = what.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "pebble", "{what}: {line}");
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{what}: {line}"));
            }
        });
    }
    child
}

pub(crate) async fn wait_listening(addr: SocketAddr, what: &str) {
    let listening = tokio::time::timeout(PATIENCE, async {
        while TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(listening.is_ok(), "{what} did not listen on {addr}");
}

/// Whether `port` was not handed out before by this process: a port is free when it is
/// returned, and taken only later (by a Pebble, a replica), so two tests running at once must
/// not both be given it.
fn first_time(port: u16) -> bool {
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    GIVEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(port)
}

/// A free loopback TCP port, never one this process was given before.
pub fn free_port() -> SocketAddr {
    loop {
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port");
        if first_time(addr.port()) {
            return addr;
        }
    }
}

/// A loopback port free for both UDP and TCP (a DNS server listens on both), never one this
/// process was given before.
pub(crate) fn free_udp_and_tcp_port() -> SocketAddr {
    loop {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free UDP port");
        let addr = udp.local_addr().expect("its address");
        if TcpListener::bind(addr).is_ok() && first_time(addr.port()) {
            return addr;
        }
    }
}

/// The path of `program` on `PATH`.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

mod layer;

pub use layer::AcmeLayer;
