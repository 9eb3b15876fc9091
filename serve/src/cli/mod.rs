//! serve's command line, on clap: the flags, their values and bounds, and the rules of which go
//! together. A usage error exits 2 (clap's convention, and serve's before it), naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser};

use tls_rotation::acme::ChallengeType;
pub(crate) use values::{DirectoryFlag, EabKey};
use values::{
    Secret, acme_challenge, acme_directory, address, duration, eab_key, namespace, namespaced,
    profile, secret, sni_route,
};

/// serve's crypto provider, by its features: aws-lc-rs by default (X25519MLKEM768, the
/// post-quantum key exchange current clients offer first, at once), *ring* when built with
/// `--no-default-features --features ring`.
pub(crate) fn crypto_provider() -> std::sync::Arc<tls_rotation::rustls::crypto::CryptoProvider> {
    #[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
    compile_error!("serve needs a crypto provider: its feature `aws-lc-rs` (default) or `ring`");
    tls_rotation::default_crypto_provider().expect("a provider feature is on")
}

/// The poll interval's bounds: below 10 ms a poll is a busy loop; beyond a year, time
/// arithmetic overflows for nothing.
const MIN_POLL: (Duration, &str) = (Duration::from_millis(10), "10ms");
const MAX_POLL: (Duration, &str) = (Duration::from_secs(365 * 24 * 3600), "365d");
/// The self-signed validity's bounds: tls-selfsigned's minimum (certificate times have
/// one-second precision, so shorter leaves cannot be renewed safely); X.509 dates end in the
/// year 9999, so a hundred years is plenty.
const MIN_VALIDITY: (Duration, &str) = (tls_rotation::selfsigned::MIN_VALIDITY, "3s");
const MAX_VALIDITY: (Duration, &str) = (Duration::from_secs(100 * 365 * 24 * 3600), "36500d");
/// The bounds of `--ready-timeout`, `--handshake-timeout`, `--recycle-after` and `--ca-overlap`.
const MIN_TIMEOUT: (Duration, &str) = (Duration::from_millis(1), "1ms");
const MAX_TIMEOUT: (Duration, &str) = (Duration::from_secs(24 * 3600), "1d");
const NO_OVERLAP: (Duration, &str) = (Duration::ZERO, "0s");
const MIN_ROTATION: (Duration, &str) = (Duration::from_secs(1), "1s");
/// etcd leases are whole seconds; below 2 s a writer would step down between keep-alives.
const MIN_LEASE_TTL: (Duration, &str) = (Duration::from_secs(2), "2s");

// The flags by help heading, one group per concern; a mode this round adds (a proxy in front of
// an upstream, a client for outbound mTLS) brings a heading of its own, and today's flags keep
// their names and meanings.
const SERVING: &str = "Serving (the listener, readiness, connections, metrics)";
const SOURCES: &str = "Where the certificate comes from";
const MTLS: &str = "Client certificates (mTLS)";
const TICKETS: &str = "Session tickets (TLS 1.3 resumption on any replica)";
const SEAL: &str =
    "Sealed at rest (with --k8s-shared; keep the key where readers of the Secrets cannot get it)";
const SNI: &str = "SNI (the certificate chosen above is the default, for every other name)";
const ACME: &str =
    "ACME (a certificate from an ACME CA for each --acme-domain, served as its SNI route)";
const ETCD: &str = "etcd (certificates kept in etcd: at PREFIX/certs/NAME, a JSON object with tls.crt, tls.key and an optional ca.crt, each PEM text)";
const SELF_SIGNED: &str =
    "With no certificate flags: a self-signed certificate for localhost, 127.0.0.1 and ::1";

/// An HTTPS server whose certificate rotates without a restart.
///
/// `GET /` answers the status as JSON. SIGHUP re-reads the files; SIGINT / SIGTERM stop
/// gracefully (a second one exits at once, status 130).
// The doc comments below are `--help`'s text, plain for a terminal.
#[allow(clippy::doc_markdown)]
#[derive(Debug, Parser)]
#[command(name = "serve")]
pub(crate) struct Cli {
    /// Address to listen on (port 0 picks a free port)
    #[arg(long, help_heading = SERVING, value_name = "ADDR", default_value = "127.0.0.1:8443",
          value_parser = address("--listen", "127.0.0.1:8443"))]
    listen: SocketAddr,
    /// Give up (status 1) when no certificate is installed by then
    #[arg(long, help_heading = SERVING, value_name = "DURATION", default_value = "30s",
          value_parser = duration("--ready-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "30s or 500ms"))]
    ready_timeout: Duration,
    /// Give up at once when the first read of the certificate fails
    #[arg(long, help_heading = SERVING)]
    fail_fast: bool,
    /// Drop a connection whose TLS handshake takes longer
    #[arg(long, help_heading = SERVING, value_name = "DURATION", default_value = "10s",
          value_parser = duration("--handshake-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "10s or 500ms"))]
    handshake_timeout: Duration,
    /// After a rotation, close connections at least this old gracefully, so their clients
    /// reconnect to the new certificate [default: never]
    #[arg(long, help_heading = SERVING, value_name = "DURATION",
          value_parser = duration("--recycle-after", MIN_TIMEOUT, MAX_TIMEOUT, "1m or 500ms"))]
    recycle_after: Option<Duration>,
    /// Require client certificates signed by a CA in the PEM bundle at PATH (followed like the
    /// certificate files)
    #[arg(long, help_heading = MTLS, value_name = "PATH")]
    client_ca: Option<PathBuf>,
    /// How long a CA that leaves the --client-ca file stays trusted [default: 0s]
    #[arg(long, help_heading = MTLS, value_name = "DURATION",
          value_parser = duration("--ca-overlap", NO_OVERLAP, MAX_TIMEOUT, "0s or 10m"))]
    ca_overlap: Option<Duration>,
    /// Serve Prometheus metrics over plain HTTP at http://ADDR/metrics
    #[arg(long, help_heading = SERVING, value_name = "ADDR", value_parser = address("--metrics", "127.0.0.1:9090"))]
    metrics: Option<SocketAddr>,
    /// Certificate chain file (PEM, leaf first); needs --key
    #[arg(long, help_heading = SOURCES, value_name = "PATH")]
    cert: Option<PathBuf>,
    /// Private key file (PEM: PKCS#8, PKCS#1 or SEC1)
    #[arg(long, help_heading = SOURCES, value_name = "PATH")]
    key: Option<PathBuf>,
    /// CA bundle file, reported with the certificate
    #[arg(long, help_heading = SOURCES, value_name = "PATH")]
    ca: Option<PathBuf>,
    /// DIR/tls.crt, DIR/tls.key and DIR/ca.crt if present (a mounted Secret)
    #[arg(long, help_heading = SOURCES, value_name = "DIR")]
    cert_dir: Option<PathBuf>,
    /// How often to check the files without an event (10ms to 365d)
    #[arg(long, help_heading = SOURCES, value_name = "DURATION", default_value = "10s",
          value_parser = duration("--poll", MIN_POLL, MAX_POLL, "10s or 500ms"))]
    poll: Duration,
    /// Do not watch the directories; poll only
    #[arg(long, help_heading = SOURCES)]
    no_notify: bool,
    /// Watch this kubernetes.io/tls Secret through the API (kubeconfig or in-cluster config;
    /// needs get, list, watch on it)
    #[arg(long, help_heading = SOURCES, value_name = "NAMESPACE/NAME", value_parser = namespaced("--k8s-secret"))]
    k8s_secret: Option<(String, String)>,
    /// One self-signed certificate for every replica, kept in this Secret: the Lease holder
    /// generates and renews it, every replica serves it (the self-signed flags apply; the
    /// status JSON gains `leader`). With --acme-directory: the fleet's ACME state, in Secrets
    /// named NAME-acme-*; the Lease holder orders, every replica serves and answers
    #[arg(long, help_heading = SOURCES, value_name = "NAMESPACE/NAME", value_parser = namespaced("--k8s-shared"))]
    k8s_shared: Option<(String, String)>,
    /// The Lease that elects the writer [default: NAME-writer; with --acme-directory,
    /// NAME-acme]
    #[arg(long, help_heading = SOURCES, value_name = "NAME")]
    lease: Option<String>,
    /// This replica's name in the Lease [default: $POD_NAME, else the host name]
    #[arg(long, help_heading = SOURCES, value_name = "ID")]
    identity: Option<String>,

    /// Seal the fleet's own state (the CA Secret) with the key in PATH: 32 random bytes in
    /// base64 (openssl rand -base64 32), re-read when it changes; repeatable: the first seals,
    /// all open (with --k8s-secret: open a sealed tls.key)
    #[arg(long, value_name = "PATH", help_heading = SEAL)]
    seal_key: Vec<PathBuf>,
    /// Once, to migrate: seal the state found unsealed instead of refusing it
    #[arg(long, help_heading = SEAL)]
    seal_adopt_unsealed: bool,
    /// Issue TLS 1.3 session tickets a client can resume with on any replica: `fleet` (keys
    /// the --k8s-shared Lease holder writes to the Secret NAME-tickets, sealed with
    /// --seal-key), FILE (keys derived from 32 or more random bytes in base64 in FILE, e.g.
    /// openssl rand -base64 32: processes given the same file share tickets, and whoever reads
    /// it opens every period's tickets), or `off` (each process its own session cache)
    #[arg(long, value_name = "fleet|FILE|off", default_value = "off", help_heading = TICKETS)]
    session_tickets: String,
    /// No TLS resumption: no session tickets and no session cache, every connection a full
    /// handshake (what a benchmark of handshakes, or a policy, asks for)
    #[arg(long, help_heading = TICKETS)]
    no_resumption: bool,
    /// How long each session-ticket key is the current one; a ticket lives at most twice that
    /// [default: 6h]
    #[arg(long, value_name = "DURATION", help_heading = TICKETS,
          value_parser = duration("--ticket-rotation", MIN_ROTATION, MAX_POLL, "6h or 10m"))]
    ticket_rotation: Option<Duration>,

    /// Also seal the served Secret's tls.key (then only readers with the key can use it)
    #[arg(long, help_heading = SEAL)]
    seal_served_key: bool,

    /// The ACME directory URL, e.g. https://acme-v02.api.letsencrypt.org/directory; repeatable:
    /// the first is preferred, each next one is asked when those before it fail for a reason
    /// of theirs (down, a 5xx, rateLimited). With ,ca=PATH its HTTPS is also checked against
    /// that PEM file; with ,eab-kid=ID,eab-key-file=PATH it takes an external account binding
    /// (the HMAC key, base64url, read from the file)
    #[arg(long, value_name = "URL[,ca=PATH][,eab-kid=ID,eab-key-file=PATH]",
          value_parser = acme_directory, help_heading = ACME)]
    acme_directory: Vec<DirectoryFlag>,
    /// A DNS name or IP address to get a certificate for (repeatable; one certificate each;
    /// an address's is served to handshakes without a server name; a wildcard such as
    /// '*.example.com' needs --acme-challenge dns-01)
    #[arg(long, value_name = "NAME", help_heading = ACME)]
    acme_domain: Vec<String>,
    /// The account's contact address
    #[arg(long, value_name = "ADDR", help_heading = ACME)]
    acme_email: Option<String>,
    /// Also trust the CA certificates in this PEM file for the directory's HTTPS (a private or
    /// test CA)
    #[arg(long, value_name = "PATH", help_heading = ACME)]
    acme_directory_ca: Option<PathBuf>,
    /// Keep the account, the certificates and the orders in flight in DIR (one replica): a
    /// restart serves what is stored and orders nothing that still fits
    #[arg(long, value_name = "DIR", help_heading = ACME)]
    acme_state: Option<PathBuf>,
    /// tls-alpn-01 (answered on --listen), http-01 (answered on --acme-http-listen) or dns-01
    /// (published by RFC 2136 update at --acme-dns-server) [default: tls-alpn-01]
    #[arg(long, value_name = "TYPE", value_parser = acme_challenge, help_heading = ACME)]
    acme_challenge: Option<ChallengeType>,
    /// Answer HTTP-01 over plain HTTP on ADDR (port 80 for a public CA)
    #[arg(long, value_name = "ADDR", help_heading = ACME,
          value_parser = address("--acme-http-listen", "0.0.0.0:80"))]
    acme_http_listen: Option<SocketAddr>,
    /// dns-01: the zone's primary DNS server, which takes RFC 2136 updates (HOST:PORT; HOST
    /// alone for port 53)
    #[arg(long, value_name = "HOST:PORT", help_heading = ACME)]
    acme_dns_server: Option<String>,
    /// dns-01: the TSIG key the updates are signed with, a file in BIND's format (as
    /// tsig-keygen writes it; not readable by every user)
    #[arg(long, value_name = "FILE", help_heading = ACME)]
    acme_dns_tsig_key: Option<PathBuf>,
    /// How many certificates for new names may be ordered per registered domain in any seven
    /// days (Let's Encrypt's limit is 50); beyond it a name waits, without asking the CA
    #[arg(long, value_name = "N", default_value_t = tls_rotation::acme::DEFAULT_NEW_CERTIFICATES_PER_WEEK,
          help_heading = ACME)]
    acme_weekly_limit: u32,
    /// Ask the CA for certificates of this profile (e.g. Let's Encrypt's classic, tlsserver,
    /// shortlived), on renewal too, when its directory advertises it; otherwise the CA's
    /// default, with a note in the status
    #[arg(long, value_name = "NAME", value_parser = profile("--acme-profile"), help_heading = ACME)]
    acme_profile: Option<String>,
    /// As --acme-profile, but order nothing when the CA does not advertise it (the status
    /// names the profiles it does)
    #[arg(long, value_name = "NAME", value_parser = profile("--acme-profile-required"),
          help_heading = ACME)]
    acme_profile_required: Option<String>,
    /// External account binding: the key id the CA gave (needs --acme-eab-key)
    #[arg(long, value_name = "ID", help_heading = ACME)]
    acme_eab_kid: Option<String>,
    /// External account binding: the HMAC key the CA gave, base64url
    // Decoded in `check`: clap's report of a value it refuses would show the key.
    #[arg(long, value_name = "B64URL", value_parser = secret, help_heading = ACME)]
    acme_eab_key: Option<Secret>,

    /// Serve DIR/tls.crt + DIR/tls.key to handshakes for NAME (exact, or *.example.com for one
    /// label; or an IP address, for handshakes without a server name); repeatable
    #[arg(long, value_name = "NAME=DIR", value_parser = sni_route, help_heading = SNI)]
    sni: Vec<(String, PathBuf)>,
    /// Refuse handshakes for names no route serves, instead of the default; one without a
    /// server name (a client connecting to an IP address) is served a certificate for the
    /// address it arrived on, or the routes' only IP certificate, or refused
    #[arg(long, help_heading = SNI)]
    sni_strict: bool,
    /// Serve every kubernetes.io/tls Secret in NAMESPACE for the DNS names in its certificate
    /// (one watch; needs list, watch on secrets there)
    #[arg(long, value_name = "NAMESPACE", value_parser = namespace, help_heading = SNI)]
    k8s_secrets: Option<String>,
    /// Only the Secrets matching this label selector, e.g. app=web
    #[arg(long, value_name = "SELECTOR", help_heading = SNI)]
    selector: Option<String>,
    /// Listen once the default certificate is in, without waiting for the --k8s-secrets list:
    /// the default is served to every name (with --sni-strict, to its own) until the list is in
    #[arg(long, help_heading = SNI)]
    ready_before_lists: bool,

    /// The etcd cluster's client endpoints, comma-separated (HOST:PORT, http:// or https://;
    /// every member, so that one going away is left for the next)
    #[arg(long, value_name = "ENDPOINTS", help_heading = ETCD)]
    etcd: Option<String>,
    /// Where the certificates are kept [default: /tls-rotation/]
    #[arg(long, value_name = "PREFIX", help_heading = ETCD)]
    etcd_prefix: Option<String>,
    /// Serve the certificate at PREFIX/certs/NAME (the default certificate)
    #[arg(long, value_name = "NAME", help_heading = ETCD)]
    etcd_cert: Option<String>,
    /// Serve every certificate under PREFIX/certs/ for the DNS names in it (one watch; ready
    /// once the whole prefix is listed)
    #[arg(long, help_heading = ETCD)]
    etcd_certs: bool,
    /// One self-signed certificate for every replica, kept under PREFIX/fleets/NAME/: the
    /// holder of the writer key generates and renews it, every replica serves it (the
    /// self-signed flags and --seal-key apply; the status JSON gains `leader`). With
    /// --acme-directory: the fleet's ACME state there instead, the writer orders and renews
    #[arg(long, value_name = "NAME", help_heading = ETCD)]
    etcd_shared: Option<String>,
    /// The writer lease's time to live with --etcd-shared (2s to 1d): a writer that stops
    /// without releasing it is replaced after this long [default: 15s]
    #[arg(long, value_name = "DURATION", help_heading = ETCD,
          value_parser = duration("--etcd-lease-ttl", MIN_LEASE_TTL, MAX_TIMEOUT, "15s or 1m"))]
    etcd_lease_ttl: Option<Duration>,
    /// Authenticate as this etcd user (needs --etcd-password-file)
    #[arg(long, value_name = "USER", help_heading = ETCD)]
    etcd_user: Option<String>,
    /// The --etcd-user's password: the first line of PATH
    #[arg(long, value_name = "PATH", help_heading = ETCD)]
    etcd_password_file: Option<PathBuf>,
    /// TLS to etcd, trusting the CA certificates in this PEM file (read at start)
    #[arg(long, value_name = "PATH", help_heading = ETCD)]
    etcd_ca: Option<PathBuf>,
    /// The client certificate presented to etcd (PEM; followed like --cert, so a renewed one is
    /// used on the next connection); needs --etcd-client-key and --etcd-ca
    #[arg(long, value_name = "PATH", help_heading = ETCD)]
    etcd_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM)
    #[arg(long, value_name = "PATH", help_heading = ETCD)]
    etcd_client_key: Option<PathBuf>,

    /// Also for this DNS name or IP address (repeatable)
    #[arg(long, value_name = "NAME", help_heading = SELF_SIGNED)]
    name: Vec<String>,
    /// Lifetime of each certificate, e.g. 6s or 90d (3s to 36500d), renewed when a third
    /// remains [default: 90d]
    #[arg(long, value_name = "DURATION", help_heading = SELF_SIGNED,
          value_parser = duration("--self-signed-validity", MIN_VALIDITY, MAX_VALIDITY, "6s or 90d"))]
    self_signed_validity: Option<Duration>,
    /// Keep the certificate (and CA) in DIR and reuse it on restart
    #[arg(long, value_name = "DIR", help_heading = SELF_SIGNED)]
    self_signed_dir: Option<PathBuf>,
    /// Sign the certificates with a stable CA, shown in the status
    #[arg(long, help_heading = SELF_SIGNED)]
    self_signed_ca: bool,

    #[command(flatten)]
    sidecar: sidecar::SidecarFlags,
}

/// The self-signed generator's options.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SelfSignedArgs {
    pub(crate) names: Vec<String>,
    pub(crate) validity: Option<Duration>,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) ca: bool,
}

/// Where the default certificate comes from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Certs {
    SelfSigned(SelfSignedArgs),
    Files {
        cert: PathBuf,
        key: PathBuf,
        ca: Option<PathBuf>,
    },
    Dir(PathBuf),
    Secret {
        namespace: String,
        name: String,
    },
    /// `--etcd-cert NAME`: the whole etcd key, `PREFIX/certs/NAME`.
    Etcd {
        key: String,
    },
    /// `--etcd-shared NAME`: one self-signed certificate for every replica, under
    /// `PREFIX/fleets/NAME/`, written by the holder of the writer key.
    EtcdShared {
        prefix: String,
        name: String,
        identity: String,
        ttl: Duration,
        options: SelfSignedArgs,
    },
    /// One self-signed certificate for every replica, in a Secret written by the Lease holder.
    Shared {
        namespace: String,
        name: String,
        lease: Option<String>,
        identity: String,
        options: SelfSignedArgs,
    },
}

/// The seal of `--seal-key`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SealArgs {
    /// The key files, the sealing one first; none: no seal.
    pub(crate) keys: Vec<PathBuf>,
    pub(crate) adopt_unsealed: bool,
    pub(crate) served_key: bool,
}

/// The SNI routes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sni {
    pub(crate) routes: Vec<(String, PathBuf)>,
    pub(crate) strict: bool,
    /// The namespace and label selector of `--k8s-secrets`.
    pub(crate) secrets: Option<(String, String)>,
    /// `--etcd-certs`: every certificate under this etcd prefix (`PREFIX/certs/`).
    pub(crate) etcd_certs: Option<String>,
    /// Ready with the default alone, before the `--k8s-secrets` (or `--etcd-certs`) list is in.
    pub(crate) ready_before_lists: bool,
}

/// How to reach etcd (`--etcd` and its TLS and user flags).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct EtcdArgs {
    pub(crate) endpoints: Vec<String>,
    /// The user and the file holding the password.
    pub(crate) user: Option<(String, PathBuf)>,
    /// `--etcd-ca`: TLS to etcd.
    pub(crate) ca: Option<PathBuf>,
    /// `--etcd-client-cert` and `--etcd-client-key`.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// The ACME client of `--acme-directory`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AcmeArgs {
    pub(crate) directory: String,
    pub(crate) domains: Vec<String>,
    pub(crate) email: Option<String>,
    pub(crate) directory_ca: Option<PathBuf>,
    pub(crate) state: AcmeState,
    pub(crate) challenge: ChallengeType,
    pub(crate) http_listen: Option<SocketAddr>,
    /// `--acme-weekly-limit`: first orders per registered domain in any seven days.
    pub(crate) weekly_limit: u32,
    /// `--acme-profile NAME` (`false`) or `--acme-profile-required NAME` (`true`).
    pub(crate) profile: Option<(String, bool)>,
    /// External account binding: the key id and the HMAC key.
    pub(crate) eab: Option<(String, EabKey)>,
    /// The CAs after the first `--acme-directory`, in order.
    pub(crate) fallbacks: Vec<FallbackArgs>,
    /// dns-01: `--acme-dns-server` and `--acme-dns-tsig-key`.
    pub(crate) dns: Option<(String, PathBuf)>,
}

/// A CA after the first `--acme-directory`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct FallbackArgs {
    pub(crate) url: String,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) eab: Option<(String, EabKey)>,
}

/// Where the ACME state is kept.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AcmeState {
    /// `--acme-state DIR`: one replica.
    Dir(PathBuf),
    /// `--k8s-shared NAMESPACE/NAME`: a fleet's Secrets, written by the Lease holder.
    Fleet {
        namespace: String,
        name: String,
        lease: Option<String>,
        identity: String,
    },
    /// `--etcd-shared NAME`: a fleet's keys in etcd under `PREFIX/fleets/NAME/acme/`, written
    /// by the holder of its writer key.
    Etcd {
        prefix: String,
        name: String,
        identity: String,
        ttl: Duration,
    },
}

/// What serve runs with: the flags, checked together.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Args {
    pub(crate) listen: SocketAddr,
    pub(crate) certs: Certs,
    pub(crate) poll: Duration,
    pub(crate) notify: bool,
    pub(crate) sni: Sni,
    pub(crate) ready_timeout: Duration,
    pub(crate) fail_fast: bool,
    pub(crate) handshake_timeout: Duration,
    pub(crate) recycle_after: Option<Duration>,
    /// mTLS: the client CA file (the bundle's CA), and how long a CA leaving it stays trusted.
    pub(crate) client_ca: Option<(PathBuf, Duration)>,
    /// Where to serve Prometheus metrics.
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) seal: SealArgs,
    pub(crate) acme: Option<AcmeArgs>,
    pub(crate) tickets: Tickets,
    /// `--no-resumption`: every connection a full handshake.
    pub(crate) no_resumption: bool,
    pub(crate) etcd: Option<EtcdArgs>,
    /// What is done with the connections: the status page, a proxy, or (`--connect`) a client.
    pub(crate) mode: Mode,
    /// `--status-listen`: the status page and metrics over plain HTTP.
    pub(crate) status_listen: Option<SocketAddr>,
    /// With `--client-ca`: which verified clients may connect (`None`: every one).
    pub(crate) allow: Option<AllowArgs>,
}

/// `--session-tickets` (and `--ticket-rotation`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tickets {
    /// Each process its own session cache (rustls's default).
    Off,
    /// Keys derived from the secret in a file.
    File {
        path: PathBuf,
        secret: TicketSecret,
        rotation: Duration,
    },
    /// The fleet's keys, in `NAME-tickets`, written by the Lease holder.
    Fleet {
        namespace: String,
        name: String,
        identity: String,
        rotation: Duration,
    },
}

/// The bytes of a `--session-tickets FILE` (kept out of `Debug`).
#[derive(PartialEq, Eq)]
pub(crate) struct TicketSecret(pub(crate) Vec<u8>);

impl std::fmt::Debug for TicketSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketSecret(..)")
    }
}

impl Args {
    /// The arguments of this process; on a usage error, clap's report and exit status 2
    /// (`--help` prints the usage and exits 0).
    pub(crate) fn from_env() -> Self {
        match Self::parse_from(std::env::args_os()) {
            Ok(args) => args,
            Err(err) => err.exit(),
        }
    }

    /// `args` (the program name first), checked.
    ///
    /// # Errors
    /// A usage error naming the flag.
    pub(crate) fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Cli::try_parse_from(args)?
            .check()
            .map_err(|message| Cli::command().error(ErrorKind::ArgumentConflict, message))
    }
}

mod check;
mod sidecar;
#[cfg(test)]
mod tests;
mod values;

pub(crate) use sidecar::{AllowArgs, ConnectArgs, HttpProxy, Mode, Upstream};
