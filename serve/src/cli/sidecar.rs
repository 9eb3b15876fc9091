//! The sidecar's flags: TLS in front of an upstream (`--upstream`, `--upstream-tcp`), which
//! verified clients may connect (`--allow-*`), and outbound mTLS for an app that cannot
//! (`--connect`). Each group under a help heading of its own; checked into [`Mode`] and
//! [`AllowArgs`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;
use tls_rotation::{AllowList, Rule};

use super::values::{address, duration};
use super::{MAX_TIMEOUT, MIN_TIMEOUT};

const SIDECAR: &str =
    "Sidecar: TLS in front of an upstream (the status page and metrics move to --status-listen)";
const ALLOW: &str = "Client authorization (with --client-ca: which verified clients may connect; every one without these flags)";
const CONNECT: &str = "Outbound mTLS (--connect: a plain listener for an app, each connection carried over TLS with the certificate chosen above as the client's)";

/// The default `--request-timeout`.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The default `--idle-timeout`.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The default `--max-request-body`: 16 MiB.
pub(crate) const DEFAULT_MAX_REQUEST_BODY: u64 = 16 << 20;

// The doc comments below are `--help`'s text, plain for a terminal.
#[allow(clippy::doc_markdown)]
#[derive(Debug, ClapArgs)]
pub(crate) struct SidecarFlags {
    /// Proxy HTTP to this upstream (HOST:PORT, or a Unix socket path such as
    /// /run/app.sock): HTTP/1.1, gRPC as h2c, WebSocket upgrades; it must be reachable only
    /// through serve (loopback or a Unix socket), or the X-Forwarded-* headers can be forged
    #[arg(long, help_heading = SIDECAR, value_name = "ADDR", value_parser = upstream("--upstream"))]
    upstream: Option<Upstream>,
    /// Pass the bytes of each connection, after its TLS handshake, to this upstream (HOST:PORT
    /// or a Unix socket path)
    #[arg(long, help_heading = SIDECAR, value_name = "ADDR", value_parser = upstream("--upstream-tcp"))]
    upstream_tcp: Option<Upstream>,
    /// With --upstream-tcp: send a PROXY protocol v2 header first, with the client's address
    /// and TLS identity (SNI, ALPN, version, the client certificate's common name)
    #[arg(long, help_heading = SIDECAR)]
    proxy_protocol: bool,
    /// Serve the status JSON (GET /) and the Prometheus metrics (GET /metrics) over plain HTTP
    /// on ADDR
    #[arg(long, help_heading = SIDECAR, value_name = "ADDR",
          value_parser = address("--status-listen", "127.0.0.1:9901"))]
    status_listen: Option<SocketAddr>,
    /// With --upstream: answer 504 when the upstream has not answered a request's headers by
    /// then [default: 60s]
    #[arg(long, help_heading = SIDECAR, value_name = "DURATION",
          value_parser = duration("--request-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "60s or 500ms"))]
    request_timeout: Option<Duration>,
    /// Close a client connection idle this long (no request in flight; with --upstream-tcp,
    /// no byte either way) [default: 5m]
    #[arg(long, help_heading = SIDECAR, value_name = "DURATION",
          value_parser = duration("--idle-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "5m or 30s"))]
    idle_timeout: Option<Duration>,
    /// With --upstream: answer 413 to a request whose body is larger (bytes, or with KiB, MiB,
    /// GiB) [default: 16MiB]
    #[arg(long, help_heading = SIDECAR, value_name = "SIZE", value_parser = parse_size)]
    max_request_body: Option<u64>,

    /// Allow a verified client whose certificate's common name is NAME (repeatable)
    #[arg(long, help_heading = ALLOW, value_name = "NAME")]
    allow_cn: Vec<String>,
    /// Allow a verified client with the DNS name NAME among its SANs, exactly (repeatable)
    #[arg(long, help_heading = ALLOW, value_name = "NAME")]
    allow_dns: Vec<String>,
    /// Allow a verified client with this URI SAN: exact, or ending in /* for one or more
    /// further path segments (spiffe://example.org/ns/prod/*); a spiffe:// rule matches only a
    /// certificate with exactly one URI SAN (a SPIFFE ID) (repeatable)
    #[arg(long, help_heading = ALLOW, value_name = "URI")]
    allow_uri: Vec<String>,
    /// Also the rules in PATH, one a line (cn=NAME, dns=NAME, uri=URI; # comments), read again
    /// when it changes (checked every --poll and on SIGHUP): open connections the new rules
    /// refuse are closed; a file that does not parse changes nothing
    #[arg(long, help_heading = ALLOW, value_name = "PATH")]
    allow_file: Option<PathBuf>,

    /// Carry each connection to --client-listen over TLS to HOST:PORT, presenting the
    /// certificate chosen above (it rotates: each new connection presents the current one)
    #[arg(long, help_heading = CONNECT, value_name = "HOST:PORT")]
    connect: Option<String>,
    /// The plain listener the app connects to (keep it on loopback)
    #[arg(long, help_heading = CONNECT, value_name = "ADDR",
          value_parser = address("--client-listen", "127.0.0.1:7000"))]
    client_listen: Option<SocketAddr>,
    /// Verify the server against the CA certificates in this PEM file (followed like the
    /// certificate files) [default: the system's roots]
    #[arg(long, help_heading = CONNECT, value_name = "PATH")]
    connect_ca: Option<PathBuf>,
    /// The server name sent and verified [default: HOST of --connect]
    #[arg(long, help_heading = CONNECT, value_name = "NAME")]
    connect_sni: Option<String>,
}

/// Where an upstream listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Upstream {
    /// `HOST:PORT`, resolved on each connection.
    Tcp(String),
    /// A Unix socket's path.
    Unix(PathBuf),
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => f.write_str(addr),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// What serve does with the connections it accepts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Answer the status page on `--listen` (no upstream).
    Status,
    /// `--upstream`: proxy HTTP.
    Http(HttpProxy),
    /// `--upstream-tcp`: pass the bytes on.
    Tcp {
        upstream: Upstream,
        proxy_protocol: bool,
        idle_timeout: Duration,
    },
    /// `--connect`: no TLS server; a plain listener carried over mTLS.
    Connect(ConnectArgs),
}

/// `--upstream` and its limits.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HttpProxy {
    pub(crate) upstream: Upstream,
    pub(crate) request_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_request_body: u64,
}

/// `--connect` and its flags.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ConnectArgs {
    /// `HOST:PORT`.
    pub(crate) server: String,
    pub(crate) listen: SocketAddr,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) sni: String,
}

/// The authorization rules: from the flags, and the file followed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AllowArgs {
    pub(crate) rules: AllowList,
    pub(crate) file: Option<PathBuf>,
}

/// What the rest of the flags tell the sidecar's rules.
pub(super) struct Context {
    pub(super) client_ca: bool,
    /// A flag that only a TLS server takes (ACME, SNI routes, --client-ca, tickets), named.
    pub(super) server_only: Option<&'static str>,
}

impl SidecarFlags {
    /// The mode, the status listener and the authorization rules, or a message naming the flags.
    #[allow(clippy::type_complexity)]
    pub(super) fn check(
        self,
        context: &Context,
    ) -> Result<(Mode, Option<SocketAddr>, Option<AllowArgs>), String> {
        let idle_timeout = self.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT);
        if self.proxy_protocol && self.upstream_tcp.is_none() {
            return Err("--proxy-protocol goes with --upstream-tcp".into());
        }
        if self.upstream.is_none()
            && (self.request_timeout.is_some() || self.max_request_body.is_some())
        {
            return Err("--request-timeout and --max-request-body go with --upstream".into());
        }
        if self.connect.is_none()
            && (self.client_listen.is_some()
                || self.connect_ca.is_some()
                || self.connect_sni.is_some())
        {
            return Err("--client-listen, --connect-ca and --connect-sni go with --connect".into());
        }
        let mode = match (self.upstream, self.upstream_tcp, self.connect) {
            (Some(_), Some(_), _) => {
                return Err(
                    "--upstream and --upstream-tcp cannot be combined: one upstream, HTTP or bytes"
                        .into(),
                );
            }
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return Err("--connect cannot be combined with --upstream or --upstream-tcp: one serve per direction".into());
            }
            (Some(upstream), None, None) => Mode::Http(HttpProxy {
                upstream,
                request_timeout: self.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT),
                idle_timeout,
                max_request_body: self.max_request_body.unwrap_or(DEFAULT_MAX_REQUEST_BODY),
            }),
            (None, Some(upstream), None) => Mode::Tcp {
                upstream,
                proxy_protocol: self.proxy_protocol,
                idle_timeout,
            },
            (None, None, Some(server)) => {
                if let Some(flag) = context.server_only {
                    return Err(format!(
                        "--connect cannot be combined with {flag}: with --connect, serve is a client and serves no TLS"
                    ));
                }
                let Some(listen) = self.client_listen else {
                    return Err(
                        "--connect needs --client-listen ADDR (where the app connects)".into(),
                    );
                };
                let host = connect_host(&server)?;
                Mode::Connect(ConnectArgs {
                    sni: self.connect_sni.unwrap_or(host),
                    server,
                    listen,
                    ca: self.connect_ca,
                })
            }
            (None, None, None) => {
                if self.idle_timeout.is_some() {
                    return Err("--idle-timeout goes with --upstream or --upstream-tcp".into());
                }
                Mode::Status
            }
        };
        let mut rules = Vec::new();
        for (flag, kind, values) in [
            ("--allow-cn", "cn", &self.allow_cn),
            ("--allow-dns", "dns", &self.allow_dns),
            ("--allow-uri", "uri", &self.allow_uri),
        ] {
            for value in values {
                let rule: Rule = format!("{kind}={value}")
                    .parse()
                    .map_err(|e| format!("{flag} {value}: {e}"))?;
                rules.push(rule);
            }
        }
        let allow = if rules.is_empty() && self.allow_file.is_none() {
            None
        } else if !context.client_ca {
            return Err(
                "--allow-cn, --allow-dns, --allow-uri and --allow-file go with --client-ca".into(),
            );
        } else {
            Some(AllowArgs {
                rules: AllowList::new(rules),
                file: self.allow_file,
            })
        };
        Ok((mode, self.status_listen, allow))
    }
}

/// `HOST` of `--connect HOST:PORT`.
fn connect_host(server: &str) -> Result<String, String> {
    let bad = || format!("--connect {server}: expected HOST:PORT");
    let (host, port) = server.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok(host.to_owned())
}

/// An upstream for `flag`: a Unix socket path (`/…`, `./…` or `unix:…`), or `HOST:PORT`.
fn upstream(
    flag: &'static str,
) -> impl Fn(&str) -> Result<Upstream, String> + Clone + Send + Sync + 'static {
    move |v| {
        if let Some(path) = v.strip_prefix("unix:") {
            return Ok(Upstream::Unix(path.into()));
        }
        if v.starts_with('/') || v.starts_with("./") {
            return Ok(Upstream::Unix(v.into()));
        }
        let port = v
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        match port {
            Some((host, Ok(_))) if !host.is_empty() => Ok(Upstream::Tcp(v.to_owned())),
            _ => Err(format!(
                "{flag} {v}: expected HOST:PORT (127.0.0.1:8080) or a Unix socket path (/run/app.sock)"
            )),
        }
    }
}

/// A size in bytes: a number, optionally with KiB, MiB or GiB (or k, M, G: the same powers of
/// two).
pub(super) fn parse_size(v: &str) -> Result<u64, String> {
    let bad = || format!("--max-request-body {v}: expected bytes, e.g. 1048576, 512KiB or 16MiB");
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let shift = match unit {
        "" | "B" => 0,
        "k" | "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}
