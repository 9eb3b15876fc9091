//! [`Etcd`]: how to reach an etcd cluster (endpoints, TLS on the caller's rustls config, a user),
//! and the connector that makes each connection: it tries the endpoints in turn, so that a
//! member that went away is replaced by the next one.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use crate::Error;

/// How long one endpoint is given to accept a connection and finish its TLS handshake before
/// the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings on an idle connection, so that a member that stopped answering (a partition, a
/// paused process) is noticed and the next one is tried.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest gRPC message accepted: a page of a list (see `watch::PAGE`) holds many values,
/// and one value may be up to etcd's own request limit (1.5 MiB by default).
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// How to reach an etcd cluster: its endpoints, TLS, a user. Cheap to clone; every source and
/// client made from it shares which endpoint answered last.
///
/// - Endpoints are `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`. Without a scheme, an
///   endpoint uses TLS when [`tls`](EtcdBuilder::tls) is set.
/// - Each connection tries the endpoints in turn, starting with the one that answered last, and
///   gives each [`connect_timeout`](EtcdBuilder::connect_timeout); a member that goes away or
///   has no leader is left for the next one. etcd-client's own balancing, which connects through
///   tonic's TLS and a crypto provider of its own, is not used.
/// - TLS is the caller's rustls [`ClientConfig`]: from `tls_reload::ClientTls::client_config`
///   it presents a client certificate that rotates, and a new connection (after a member
///   restart, say) presents the current one.
/// - With a [`user`](EtcdBuilder::user), the client authenticates and authenticates again when
///   etcd's token expires (`--auth-token-ttl`, 5 minutes by default).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let etcd = tls_etcd::Etcd::builder(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
///     .user("web", "secret")
///     .build()?;
/// let mut client = etcd.connect().await?;
/// client.put("/hello", "world", None).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    tls: Option<Arc<ClientConfig>>,
    user: Option<(String, String)>,
    connect_timeout: Duration,
    /// The endpoint tried first by the next connection: the one that answered last, or the one
    /// after a member left with [`Etcd::avoid_current`].
    next: AtomicUsize,
    /// Requests made through this connection's sources and stores ([`Etcd::requests`]).
    requests: std::sync::atomic::AtomicU64,
}

/// Configures an [`Etcd`]; made by [`Etcd::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct EtcdBuilder {
    endpoints: Vec<String>,
    tls: Option<Arc<ClientConfig>>,
    user: Option<(String, String)>,
    password_file: Option<std::path::PathBuf>,
    connect_timeout: Duration,
}

/// One endpoint, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    /// As given, for messages.
    text: String,
    host: String,
    port: u16,
    tls: bool,
}

impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls.is_some())
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("password_file", &self.password_file)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints())
            .field("tls", &self.inner.tls.is_some())
            .field("user", &self.inner.user.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}

// ===== impl EtcdBuilder =====

impl EtcdBuilder {
    /// TLS to every endpoint without a scheme, and to `https://` ones, with this rustls config:
    /// the roots it trusts etcd's server certificates with and, for etcd's
    /// `--client-cert-auth`, the client certificate it presents. ALPN is set to `h2`.
    ///
    /// A rotating client certificate: `tls_reload::ClientTls::client_config`. The server is
    /// checked under the endpoint's host (a name, or an IP address its certificate must hold).
    pub fn tls(mut self, config: Arc<ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Authenticates as `user` with `password` (etcd's `--auth`).
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self.password_file = None;
        self
    }

    /// Authenticates as `user` with the password in `path` (its first line, without the line
    /// end), read by [`build`](Self::build): a password on a command line is readable by every
    /// user of the machine (`/proc/PID/cmdline`).
    pub fn user_with_password_file(
        mut self,
        user: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Self {
        self.user = Some((user.into(), String::new()));
        self.password_file = Some(path.as_ref().to_owned());
        self
    }

    /// How long each endpoint is given to accept a connection (and finish the TLS handshake)
    /// before the next is tried. Default: 3 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Checks the endpoints and reads the password file. Nothing is connected yet.
    ///
    /// # Errors
    /// No endpoint; an endpoint that is not `[SCHEME://]HOST:PORT`; an `https://` endpoint
    /// without [`tls`](Self::tls), or an `http://` one with it; a password file that cannot be
    /// read or is empty.
    pub fn build(self) -> Result<Etcd, Error> {
        if self.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|text| Endpoint::parse(text, self.tls.is_some()))
            .collect::<Result<Vec<_>, _>>()?;
        let user = match (self.user, self.password_file) {
            (Some((user, _)), Some(path)) => Some((user, read_password(&path)?)),
            (user, _) => user,
        };
        Ok(Etcd {
            inner: Arc::new(Inner {
                endpoints,
                tls: self.tls,
                user,
                connect_timeout: self.connect_timeout,
                next: AtomicUsize::new(0),
                requests: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }
}

fn read_password(path: &Path) -> Result<String, Error> {
    let bad = |reason: String| Error::PasswordFile {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|err| bad(err.to_string()))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(bad(
            "it is empty (the password is its first line)".to_owned()
        ));
    }
    Ok(password.to_owned())
}

impl Endpoint {
    fn parse(text: &str, tls_configured: bool) -> Result<Self, Error> {
        let bad = |reason: &str| Error::Endpoint {
            endpoint: text.to_owned(),
            reason: reason.to_owned(),
        };
        let trimmed = text.trim().trim_end_matches('/');
        let (tls, rest) = if let Some(rest) = trimmed.strip_prefix("https://") {
            if !tls_configured {
                return Err(bad(
                    "https:// needs TLS configured (a CA to trust etcd with)",
                ));
            }
            (true, rest)
        } else if let Some(rest) = trimmed.strip_prefix("http://") {
            if tls_configured {
                return Err(bad(
                    "http:// is plain text, but TLS is configured: write https:// or HOST:PORT",
                ));
            }
            (false, rest)
        } else if trimmed.contains("://") {
            return Err(bad("the scheme must be http:// or https://"));
        } else {
            (tls_configured, trimmed)
        };
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected HOST:PORT (etcd's client port is usually 2379)"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
        let in_brackets = || bad("expected HOST:PORT, with an IPv6 address in brackets");
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) if v6.parse::<std::net::Ipv6Addr>().is_ok() => v6,
            Some(_) => return Err(in_brackets()),
            None if host.is_empty() || host.contains([':', '/', '[', ']', ' ']) => {
                return Err(in_brackets());
            }
            None => host,
        };
        if tls && ServerName::try_from(host.to_owned()).is_err() {
            return Err(bad("the host is neither a DNS name nor an IP address"));
        }
        Ok(Self {
            text: text.trim().to_owned(),
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

// ===== impl Etcd =====

impl Etcd {
    /// Starts configuring a connection to the cluster at `endpoints` (its members' client
    /// URLs; one is enough, all of them survive a member going away).
    pub fn builder<I>(endpoints: I) -> EtcdBuilder
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        EtcdBuilder {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            tls: None,
            user: None,
            password_file: None,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> Vec<&str> {
        self.inner
            .endpoints
            .iter()
            .map(|e| e.text.as_str())
            .collect()
    }

    /// A client on a new connection, made (lazily, on the first request) through the endpoint
    /// that answered last, or the next that accepts. With a user, it authenticates first.
    ///
    /// # Errors
    /// With a user: no endpoint answered, or etcd refused the authentication.
    pub async fn connect(&self) -> Result<Client, Error> {
        let connector = Connector {
            inner: self.inner.clone(),
        };
        // The URI is only what tonic writes as the requests' authority: the connector
        // chooses the endpoint.
        let channel = tonic::transport::Endpoint::from_static("http://etcd")
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect_with_connector_lazy(connector);
        let mut options = ConnectOptions::new()
            // A member cut off from its cluster's leader refuses instead of answering from a
            // stale copy, and a watch there is cancelled: the next connection tries another.
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &self.inner.user {
            options = options.with_user(user.clone(), password.clone());
            self.count("authenticate");
        }
        Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options))
            .await
            .map_err(|source| Error::Request {
                what: format!("authentication at {}", self.describe()),
                source,
            })
    }

    /// Moves the next connection on to the endpoint after the one that answered last: for a
    /// caller whose requests there fail although the connection holds (a member without a
    /// leader, one that is stopping).
    pub fn avoid_current(&self) {
        let count = self.inner.endpoints.len();
        let _ = self
            .inner
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                Some((i + 1) % count)
            });
    }

    /// How many requests the sources and stores made with this `Etcd` (and its clones) have
    /// sent: lists (a page each), watches opened, reads, transactions, lease grants, keep-alives,
    /// revocations, authentications. With the `metrics` feature, also the counter
    /// `tls_etcd_requests_total{request}`. Requests made on a client from [`connect`](Self::connect)
    /// by the caller are not counted.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Counts one request of the kind `request`.
    pub(crate) fn count(&self, request: &'static str) {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        crate::metrics::request(request);
    }

    /// The endpoint the next connection tries first.
    pub(crate) fn current(&self) -> &str {
        let i = self.inner.next.load(Ordering::Relaxed) % self.inner.endpoints.len();
        &self.inner.endpoints[i].text
    }

    /// `etcd at A,B,C` for messages.
    pub(crate) fn describe(&self) -> String {
        format!("etcd at {}", self.endpoints().join(","))
    }
}

// ===== the connector =====

type Io = TokioIo<Either<TcpStream, TlsStream<TcpStream>>>;

/// What tonic's channel calls for each connection it makes (at first, and after one breaks).
#[derive(Clone)]
struct Connector {
    inner: Arc<Inner>,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = Io;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Io, Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.connect_any().await })
    }
}

impl Inner {
    /// Tries every endpoint once, from the one that answered last; remembers which answered.
    async fn connect_any(&self) -> Result<Io, Error> {
        let count = self.endpoints.len();
        let start = self.next.load(Ordering::Relaxed) % count;
        let mut last = String::new();
        for step in 0..count {
            let i = (start + step) % count;
            let endpoint = &self.endpoints[i];
            match tokio::time::timeout(self.connect_timeout, self.connect_one(endpoint)).await {
                Ok(Ok(io)) => {
                    if step > 0 {
                        tracing::info!(endpoint = %endpoint.text, "connected to etcd through another endpoint");
                    }
                    self.next.store(i, Ordering::Relaxed);
                    return Ok(io);
                }
                Ok(Err(err)) => last = format!("{}: {err}", endpoint.text),
                Err(_) => {
                    last = format!(
                        "{}: no connection within {:?}",
                        endpoint.text, self.connect_timeout
                    );
                }
            }
            tracing::debug!(error = %last, "etcd endpoint not reachable; trying the next");
        }
        self.next.store((start + 1) % count, Ordering::Relaxed);
        Err(Error::Unreachable {
            tried: self
                .endpoints
                .iter()
                .map(|e| e.text.as_str())
                .collect::<Vec<_>>()
                .join(","),
            last,
        })
    }

    async fn connect_one(&self, endpoint: &Endpoint) -> std::io::Result<Io> {
        let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        tcp.set_nodelay(true)?;
        if !endpoint.tls {
            return Ok(TokioIo::new(Either::Left(tcp)));
        }
        let Some(config) = &self.tls else {
            return Err(std::io::Error::other("TLS is not configured"));
        };
        let mut config = ClientConfig::clone(config);
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = ServerName::try_from(endpoint.host.clone()).map_err(std::io::Error::other)?;
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        Ok(TokioIo::new(Either::Right(tls)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, tls: bool) -> Result<Endpoint, String> {
        Endpoint::parse(text, tls).map_err(|e| e.to_string())
    }

    #[test]
    fn endpoints_are_host_and_port_with_an_optional_scheme() {
        let plain = parse("127.0.0.1:2379", false).unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tls),
            ("127.0.0.1", 2379, false)
        );
        let tls = parse("etcd-0.internal:2379", true).unwrap();
        assert_eq!((tls.host.as_str(), tls.tls), ("etcd-0.internal", true));
        let v6 = parse("https://[::1]:2379/", true).unwrap();
        assert_eq!((v6.host.as_str(), v6.port, v6.tls), ("::1", 2379, true));
        assert!(!parse("http://localhost:2379", false).unwrap().tls);
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_it() {
        for (text, tls, expected) in [
            ("localhost", false, "expected HOST:PORT"),
            ("localhost:0", false, "port"),
            ("localhost:http", false, "port"),
            ("::1:2379", false, "brackets"),
            ("https://localhost:2379", false, "needs TLS"),
            ("http://localhost:2379", true, "plain text"),
            ("unix:///run/etcd.sock", false, "scheme"),
        ] {
            let err = parse(text, tls).unwrap_err();
            assert!(
                err.contains(text) && err.contains(expected),
                "{text}: {err}"
            );
        }
        assert!(matches!(
            Etcd::builder(Vec::<String>::new()).build(),
            Err(Error::NoEndpoints)
        ));
    }

    #[test]
    fn the_password_file_is_read_once_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "hunter2\n").unwrap();
        let etcd = Etcd::builder(["localhost:2379"])
            .user_with_password_file("web", &path)
            .build()
            .unwrap();
        assert_eq!(etcd.inner.user.as_ref().unwrap().1, "hunter2");
        assert!(!format!("{etcd:?}").contains("hunter2"));
        std::fs::write(&path, "\n").unwrap();
        let err = Etcd::builder(["localhost:2379"])
            .user_with_password_file("web", &path)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = Etcd::builder(["localhost:2379"])
            .user_with_password_file("web", dir.path().join("missing"))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[tokio::test]
    async fn a_connection_goes_to_the_next_endpoint_when_one_refuses() {
        // Two ports: one closed, one accepting.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open_addr = open.local_addr().unwrap();
        let etcd = Etcd::builder([closed_addr.to_string(), open_addr.to_string()])
            .build()
            .unwrap();
        let accepted = tokio::spawn(async move { open.accept().await.map(|_| ()) });
        etcd.inner.connect_any().await.unwrap();
        accepted.await.unwrap().unwrap();
        assert_eq!(
            etcd.current(),
            open_addr.to_string(),
            "the one that answered is tried first next"
        );
        etcd.avoid_current();
        assert_eq!(etcd.current(), closed_addr.to_string());
        // None accepts: an error naming every endpoint.
        let none = Etcd::builder([closed_addr.to_string()]).build().unwrap();
        let err = none
            .inner
            .connect_any()
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&closed_addr.to_string()), "{err}");
    }
}
