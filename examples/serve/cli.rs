//! serve's command line, on clap: the flags, their values and bounds, and the rules of which go
//! together. A usage error exits 2 (clap's convention, and serve's before it), naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser};

/// The poll interval's bounds: below 10 ms a poll is a busy loop; beyond a year, time
/// arithmetic overflows for nothing.
const MIN_POLL: (Duration, &str) = (Duration::from_millis(10), "10ms");
const MAX_POLL: (Duration, &str) = (Duration::from_secs(365 * 24 * 3600), "365d");
/// The self-signed validity's bounds: tls-selfsigned's minimum (certificate times have
/// one-second precision, so shorter leaves cannot be renewed safely); X.509 dates end in the
/// year 9999, so a hundred years is plenty.
const MIN_VALIDITY: (Duration, &str) = (tls_selfsigned::MIN_VALIDITY, "3s");
const MAX_VALIDITY: (Duration, &str) = (Duration::from_secs(100 * 365 * 24 * 3600), "36500d");
/// The bounds of `--ready-timeout`, `--handshake-timeout`, `--recycle-after` and `--ca-overlap`.
const MIN_TIMEOUT: (Duration, &str) = (Duration::from_millis(1), "1ms");
const MAX_TIMEOUT: (Duration, &str) = (Duration::from_secs(24 * 3600), "1d");
const NO_OVERLAP: (Duration, &str) = (Duration::ZERO, "0s");

const SEAL: &str =
    "Sealed at rest (with --k8s-shared; keep the key where readers of the Secrets cannot get it)";
const SNI: &str = "SNI (the certificate chosen above is the default, for every other name)";
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
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8443",
          value_parser = address("--listen", "127.0.0.1:8443"))]
    listen: SocketAddr,
    /// Give up (status 1) when no certificate is installed by then
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = duration("--ready-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "30s or 500ms"))]
    ready_timeout: Duration,
    /// Give up at once when the first read of the certificate fails
    #[arg(long)]
    fail_fast: bool,
    /// Drop a connection whose TLS handshake takes longer
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = duration("--handshake-timeout", MIN_TIMEOUT, MAX_TIMEOUT, "10s or 500ms"))]
    handshake_timeout: Duration,
    /// After a rotation, close connections at least this old gracefully, so their clients
    /// reconnect to the new certificate [default: never]
    #[arg(long, value_name = "DURATION",
          value_parser = duration("--recycle-after", MIN_TIMEOUT, MAX_TIMEOUT, "1m or 500ms"))]
    recycle_after: Option<Duration>,
    /// Require client certificates signed by a CA in the PEM bundle at PATH (followed like the
    /// certificate files)
    #[arg(long, value_name = "PATH")]
    client_ca: Option<PathBuf>,
    /// How long a CA that leaves the --client-ca file stays trusted [default: 0s]
    #[arg(long, value_name = "DURATION",
          value_parser = duration("--ca-overlap", NO_OVERLAP, MAX_TIMEOUT, "0s or 10m"))]
    ca_overlap: Option<Duration>,
    /// Serve Prometheus metrics over plain HTTP at http://ADDR/metrics
    #[arg(long, value_name = "ADDR", value_parser = address("--metrics", "127.0.0.1:9090"))]
    metrics: Option<SocketAddr>,
    /// Certificate chain file (PEM, leaf first); needs --key
    #[arg(long, value_name = "PATH")]
    cert: Option<PathBuf>,
    /// Private key file (PEM: PKCS#8, PKCS#1 or SEC1)
    #[arg(long, value_name = "PATH")]
    key: Option<PathBuf>,
    /// CA bundle file, reported with the certificate
    #[arg(long, value_name = "PATH")]
    ca: Option<PathBuf>,
    /// DIR/tls.crt, DIR/tls.key and DIR/ca.crt if present (a mounted Secret)
    #[arg(long, value_name = "DIR")]
    cert_dir: Option<PathBuf>,
    /// How often to check the files without an event (10ms to 365d)
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = duration("--poll", MIN_POLL, MAX_POLL, "10s or 500ms"))]
    poll: Duration,
    /// Do not watch the directories; poll only
    #[arg(long)]
    no_notify: bool,
    /// Watch this kubernetes.io/tls Secret through the API (kubeconfig or in-cluster config;
    /// needs get, list, watch on it)
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = namespaced("--k8s-secret"))]
    k8s_secret: Option<(String, String)>,
    /// One self-signed certificate for every replica, kept in this Secret: the Lease holder
    /// generates and renews it, every replica serves it (the self-signed flags apply; the
    /// status JSON gains `leader`)
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = namespaced("--k8s-shared"))]
    k8s_shared: Option<(String, String)>,
    /// The Lease that elects the writer [default: NAME-writer]
    #[arg(long, value_name = "NAME")]
    lease: Option<String>,
    /// This replica's name in the Lease [default: $POD_NAME, else the host name]
    #[arg(long, value_name = "ID")]
    identity: Option<String>,

    /// Seal the fleet's own state (the CA Secret) with the key in PATH: 32 random bytes in
    /// base64 (openssl rand -base64 32), re-read when it changes; repeatable: the first seals,
    /// all open (with --k8s-secret: open a sealed tls.key)
    #[arg(long, value_name = "PATH", help_heading = SEAL)]
    seal_key: Vec<PathBuf>,
    /// Once, to migrate: seal the state found unsealed instead of refusing it
    #[arg(long, help_heading = SEAL)]
    seal_adopt_unsealed: bool,
    /// Also seal the served Secret's tls.key (then only readers with the key can use it)
    #[arg(long, help_heading = SEAL)]
    seal_served_key: bool,

    /// Serve DIR/tls.crt + DIR/tls.key to handshakes for NAME (exact, or *.example.com for one
    /// label); repeatable
    #[arg(long, value_name = "NAME=DIR", value_parser = sni_route, help_heading = SNI)]
    sni: Vec<(String, PathBuf)>,
    /// Refuse handshakes for names no route serves, instead of the default
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
    /// Ready with the default alone, before the `--k8s-secrets` list is in.
    pub(crate) ready_before_lists: bool,
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

impl Cli {
    /// The rules of which flags go together, with the messages serve has always given.
    fn check(self) -> Result<Args, String> {
        if self.ready_before_lists && self.k8s_secrets.is_none() {
            return Err("--ready-before-lists goes with --k8s-secrets".into());
        }
        let mut sni = Sni {
            routes: self.sni,
            strict: self.sni_strict,
            secrets: None,
            ready_before_lists: self.ready_before_lists,
        };
        match (self.k8s_secrets, self.selector) {
            (Some(namespace), selector) => {
                sni.secrets = Some((namespace, selector.unwrap_or_default()));
            }
            (None, Some(_)) => return Err("--selector goes with --k8s-secrets".into()),
            (None, None) => {}
        }
        let files = self.cert.is_some()
            || self.key.is_some()
            || self.ca.is_some()
            || self.cert_dir.is_some();
        if self.k8s_shared.is_none() && (self.lease.is_some() || self.identity.is_some()) {
            return Err("--lease and --identity go with --k8s-shared".into());
        }
        if self.client_ca.is_none() && self.ca_overlap.is_some_and(|d| !d.is_zero()) {
            return Err("--ca-overlap goes with --client-ca".into());
        }
        let seal = SealArgs {
            keys: self.seal_key,
            adopt_unsealed: self.seal_adopt_unsealed,
            served_key: self.seal_served_key,
        };
        if seal.keys.is_empty() && (seal.adopt_unsealed || seal.served_key) {
            return Err("--seal-adopt-unsealed and --seal-served-key go with --seal-key".into());
        }
        if !seal.keys.is_empty() && self.k8s_shared.is_none() && self.k8s_secret.is_none() {
            return Err(
                "--seal-key goes with --k8s-shared (or --k8s-secret, to open a sealed tls.key)"
                    .into(),
            );
        }
        if seal.served_key && self.k8s_shared.is_none() {
            return Err("--seal-served-key goes with --k8s-shared".into());
        }
        let from_api = self.k8s_shared.is_some() || self.k8s_secret.is_some();
        if from_api && self.client_ca.is_some() {
            return Err(
                "--client-ca goes with --cert/--key or --cert-dir (the CA file is read with them)"
                    .into(),
            );
        }
        let self_signed = SelfSignedArgs {
            names: self.name,
            validity: self.self_signed_validity,
            dir: self.self_signed_dir,
            ca: self.self_signed_ca,
        };
        let self_signed_flags = self_signed != SelfSignedArgs::default();
        let certs = if let Some((namespace, name)) = self.k8s_shared {
            if files || self.k8s_secret.is_some() {
                return Err(
                    "--k8s-shared cannot be combined with --cert, --cert-dir or --k8s-secret"
                        .into(),
                );
            }
            if self_signed.dir.is_some() {
                return Err(
                    "--self-signed-dir does not go with --k8s-shared: the Secret is the store"
                        .into(),
                );
            }
            let identity = self
                .identity
                .or_else(default_identity)
                .ok_or("--k8s-shared needs --identity (no POD_NAME, no host name)".to_owned())?;
            Certs::Shared {
                namespace,
                name,
                lease: self.lease,
                identity,
                options: self_signed,
            }
        } else if let Some((namespace, name)) = self.k8s_secret {
            if files || self_signed_flags {
                return Err("--k8s-secret cannot be combined with other certificate flags".into());
            }
            Certs::Secret { namespace, name }
        } else {
            if files && self_signed_flags {
                return Err("--name and --self-signed-* apply to the self-signed default, not to --cert or --cert-dir".into());
            }
            match (self.cert, self.key, self.ca, self.cert_dir) {
                (None, None, None, None) => Certs::SelfSigned(self_signed),
                (None, None, None, Some(dir)) => Certs::Dir(dir),
                (Some(cert), Some(key), ca, None) => Certs::Files { cert, key, ca },
                (_, _, _, Some(_)) => {
                    return Err("--cert-dir cannot be combined with --cert, --key or --ca".into());
                }
                _ => return Err("--cert and --key go together (and --ca needs them)".into()),
            }
        };
        Ok(Args {
            listen: self.listen,
            certs,
            poll: self.poll,
            notify: !self.no_notify,
            sni,
            ready_timeout: self.ready_timeout,
            fail_fast: self.fail_fast,
            handshake_timeout: self.handshake_timeout,
            recycle_after: self.recycle_after,
            client_ca: self
                .client_ca
                .map(|path| (path, self.ca_overlap.unwrap_or_default())),
            metrics: self.metrics,
            seal,
        })
    }
}

/// A duration for `flag`, like `example`, within its bounds (each a value and how to write it).
fn duration(
    flag: &'static str,
    (min, min_text): (Duration, &'static str),
    (max, max_text): (Duration, &'static str),
    example: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |v| {
        let d = humantime::parse_duration(v)
            .map_err(|_| format!("{flag} {v}: not a duration like {example}"))?;
        if d < min || d > max {
            return Err(format!(
                "{flag} {v}: must be between {min_text} and {max_text}"
            ));
        }
        Ok(d)
    }
}

/// A socket address for `flag`, like `example`.
fn address(
    flag: &'static str,
    example: &'static str,
) -> impl Fn(&str) -> Result<SocketAddr, String> + Clone + Send + Sync + 'static {
    move |v| {
        v.parse()
            .map_err(|_| format!("{flag} {v}: not an address like {example}"))
    }
}

/// `NAMESPACE/NAME`, for `flag`.
fn namespaced(
    flag: &'static str,
) -> impl Fn(&str) -> Result<(String, String), String> + Clone + Send + Sync + 'static {
    move |v| {
        v.split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
            .ok_or_else(|| format!("{flag} {v}: expected NAMESPACE/NAME"))
    }
}

/// `--k8s-secrets NAMESPACE`.
fn namespace(v: &str) -> Result<String, String> {
    if v.is_empty() || v.contains('/') {
        return Err(format!("--k8s-secrets {v}: expected a NAMESPACE"));
    }
    Ok(v.to_owned())
}

/// `--sni NAME=DIR`.
fn sni_route(v: &str) -> Result<(String, PathBuf), String> {
    v.split_once('=')
        .filter(|(name, dir)| !name.is_empty() && !dir.is_empty())
        .map(|(name, dir)| (name.to_owned(), PathBuf::from(dir)))
        .ok_or_else(|| format!("--sni {v}: expected NAME=DIR"))
}

/// This replica's name: `POD_NAME` (set from the downward API), else the host name.
fn default_identity() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::parse_from(std::iter::once("serve").chain(args.iter().copied()))
    }

    /// A usage error: exit status 2, and the message names `flag` and says `why`.
    #[track_caller]
    fn refused(args: &[&str], flag: &str, why: &str) {
        let err = parse(args).expect_err("refused");
        assert_eq!(err.exit_code(), 2, "{args:?}");
        let text = err.to_string();
        assert!(text.contains(flag), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
    }

    #[test]
    fn the_defaults_are_a_self_signed_certificate_on_8443() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
        assert_eq!(args.poll, tls_source::DEFAULT_POLL_INTERVAL);
        assert_eq!(args.ready_timeout, Duration::from_secs(30));
        assert_eq!(
            args.handshake_timeout,
            tls_reload::DEFAULT_HANDSHAKE_TIMEOUT
        );
        assert!(args.notify && !args.fail_fast);
        assert_eq!(
            (args.recycle_after, &args.client_ca, args.metrics),
            (None, &None, None)
        );
        assert_eq!(args.sni, Sni::default());
    }

    #[test]
    fn every_flag_takes_its_value_as_documented() {
        let args = parse(&[
            "--listen",
            "[::1]:0",
            "--cert-dir",
            "/etc/tls",
            "--poll",
            "500ms",
            "--no-notify",
            "--sni",
            "api.example.com=/etc/api",
            "--sni",
            "*.example.com=/etc/wild",
            "--sni-strict",
            "--k8s-secrets",
            "web",
            "--selector",
            "app=web",
            "--ready-timeout",
            "5s",
            "--fail-fast",
            "--handshake-timeout",
            "2s",
            "--recycle-after",
            "1m",
            "--client-ca",
            "/etc/ca.crt",
            "--ca-overlap",
            "10m",
            "--metrics",
            "127.0.0.1:9090",
        ])
        .unwrap();
        assert_eq!(args.listen, "[::1]:0".parse().unwrap());
        assert_eq!(args.certs, Certs::Dir("/etc/tls".into()));
        assert_eq!(args.poll, Duration::from_millis(500));
        assert!(!args.notify && args.fail_fast);
        assert_eq!(
            args.sni.routes,
            [
                ("api.example.com".to_owned(), PathBuf::from("/etc/api")),
                ("*.example.com".to_owned(), PathBuf::from("/etc/wild")),
            ]
        );
        assert!(args.sni.strict);
        assert_eq!(args.sni.secrets, Some(("web".into(), "app=web".into())));
        assert_eq!(args.ready_timeout, Duration::from_secs(5));
        assert_eq!(args.handshake_timeout, Duration::from_secs(2));
        assert_eq!(args.recycle_after, Some(Duration::from_secs(60)));
        assert_eq!(
            args.client_ca,
            Some(("/etc/ca.crt".into(), Duration::from_secs(600)))
        );
        assert_eq!(args.metrics, Some("127.0.0.1:9090".parse().unwrap()));

        let files = parse(&["--cert", "a.crt", "--key", "a.key", "--ca", "ca.crt"]).unwrap();
        assert_eq!(
            files.certs,
            Certs::Files {
                cert: "a.crt".into(),
                key: "a.key".into(),
                ca: Some("ca.crt".into())
            }
        );
        let own = parse(&[
            "--name",
            "web",
            "--name",
            "10.0.0.1",
            "--self-signed-validity",
            "6s",
            "--self-signed-dir",
            "/var/lib/tls",
            "--self-signed-ca",
        ])
        .unwrap();
        assert_eq!(
            own.certs,
            Certs::SelfSigned(SelfSignedArgs {
                names: vec!["web".into(), "10.0.0.1".into()],
                validity: Some(Duration::from_secs(6)),
                dir: Some("/var/lib/tls".into()),
                ca: true,
            })
        );
        let shared = parse(&[
            "--k8s-shared",
            "default/web-tls",
            "--lease",
            "w",
            "--identity",
            "pod-0",
        ])
        .unwrap();
        assert!(matches!(
            shared.certs,
            Certs::Shared { ref namespace, ref name, lease: Some(ref lease), ref identity, .. }
                if namespace == "default" && name == "web-tls" && lease == "w" && identity == "pod-0"
        ));
        let sealed = parse(&[
            "--k8s-shared",
            "default/web-tls",
            "--identity",
            "pod-0",
            "--seal-key",
            "/keys/new",
            "--seal-key",
            "/keys/old",
            "--seal-served-key",
        ])
        .unwrap();
        assert_eq!(
            sealed.seal,
            SealArgs {
                keys: vec!["/keys/new".into(), "/keys/old".into()],
                adopt_unsealed: false,
                served_key: true,
            },
            "the key files in their order: the first seals"
        );
        let secret = parse(&["--k8s-secret", "default/web-tls"]).unwrap();
        assert_eq!(
            secret.certs,
            Certs::Secret {
                namespace: "default".into(),
                name: "web-tls".into()
            }
        );
    }

    #[test]
    fn values_out_of_their_bounds_are_refused_naming_the_flag_and_the_bounds() {
        refused(
            &["--poll", "18446744073709551615s"],
            "--poll 18446744073709551615s",
            "must be between 10ms and 365d",
        );
        refused(
            &["--poll", "1ns"],
            "--poll 1ns",
            "must be between 10ms and 365d",
        );
        refused(&["--poll", "soon"], "--poll soon", "not a duration");
        refused(
            &["--self-signed-validity", "3650000d"],
            "--self-signed-validity",
            "must be between 3s and 36500d",
        );
        refused(
            &["--self-signed-validity", "1s"],
            "--self-signed-validity",
            "must be between 3s and 36500d",
        );
        refused(
            &["--ready-timeout", "2d"],
            "--ready-timeout",
            "must be between 1ms and 1d",
        );
        refused(
            &["--handshake-timeout", "0s"],
            "--handshake-timeout",
            "must be between 1ms and 1d",
        );
        refused(
            &["--client-ca", "ca", "--ca-overlap", "2d"],
            "--ca-overlap",
            "must be between 0s and 1d",
        );
        refused(
            &["--listen", "256.0.0.1:1"],
            "--listen 256.0.0.1:1",
            "not an address",
        );
        refused(
            &["--metrics", "nowhere"],
            "--metrics nowhere",
            "not an address",
        );
        refused(
            &["--k8s-shared", "web-tls"],
            "--k8s-shared web-tls",
            "expected NAMESPACE/NAME",
        );
        refused(
            &["--k8s-secret", "/web"],
            "--k8s-secret /web",
            "expected NAMESPACE/NAME",
        );
        refused(
            &["--k8s-secrets", "a/b"],
            "--k8s-secrets a/b",
            "expected a NAMESPACE",
        );
        refused(
            &["--sni", "api.example.com"],
            "--sni api.example.com",
            "expected NAME=DIR",
        );
        refused(&["--no-such-flag"], "--no-such-flag", "unexpected argument");
        refused(&["--cert"], "--cert", "a value is required");
    }

    #[test]
    fn flags_that_do_not_go_together_are_refused_naming_them() {
        refused(&["--cert", "only.crt"], "--cert and --key", "go together");
        refused(&["--ca", "ca.crt"], "--cert and --key", "go together");
        refused(
            &["--cert-dir", "/tmp", "--key", "k"],
            "--cert-dir",
            "cannot be combined",
        );
        refused(
            &["--cert-dir", "/tmp", "--self-signed-ca"],
            "--self-signed-*",
            "apply to the self-signed default",
        );
        refused(
            &["--selector", "app=web"],
            "--selector",
            "goes with --k8s-secrets",
        );
        refused(
            &["--lease", "web-writer"],
            "--lease and --identity",
            "go with --k8s-shared",
        );
        refused(
            &["--ca-overlap", "1m"],
            "--ca-overlap",
            "goes with --client-ca",
        );
        refused(
            &["--ready-before-lists"],
            "--ready-before-lists",
            "goes with --k8s-secrets",
        );
        refused(
            &["--seal-key", "/keys/seal.key"],
            "--seal-key",
            "goes with --k8s-shared",
        );
        refused(
            &["--k8s-shared", "default/web-tls", "--seal-adopt-unsealed"],
            "--seal-adopt-unsealed",
            "go with --seal-key",
        );
        refused(
            &[
                "--k8s-secret",
                "default/web",
                "--seal-key",
                "k",
                "--seal-served-key",
            ],
            "--seal-served-key",
            "goes with --k8s-shared",
        );
        refused(
            &["--k8s-secret", "default/web", "--client-ca", "ca"],
            "--client-ca",
            "goes with --cert/--key or --cert-dir",
        );
        refused(
            &["--k8s-secret", "default/web", "--name", "x"],
            "--k8s-secret",
            "cannot be combined",
        );
        refused(
            &[
                "--k8s-shared",
                "default/web-tls",
                "--self-signed-dir",
                "/tmp/x",
            ],
            "--self-signed-dir",
            "does not go with --k8s-shared",
        );
        refused(
            &[
                "--k8s-shared",
                "default/web-tls",
                "--k8s-secret",
                "default/web",
            ],
            "--k8s-shared",
            "cannot be combined with",
        );
    }

    #[test]
    fn help_lists_every_flag() {
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--listen",
            "--ready-timeout",
            "--fail-fast",
            "--handshake-timeout",
            "--recycle-after",
            "--client-ca",
            "--ca-overlap",
            "--metrics",
            "--cert",
            "--key",
            "--ca ",
            "--cert-dir",
            "--poll",
            "--no-notify",
            "--k8s-secret ",
            "--k8s-shared",
            "--lease",
            "--identity",
            "--sni ",
            "--sni-strict",
            "--k8s-secrets",
            "--selector",
            "--name",
            "--self-signed-validity",
            "--self-signed-dir",
            "--self-signed-ca",
        ] {
            assert!(help.contains(flag), "{flag} in:\n{help}");
        }
        let err = parse(&["--help"]).unwrap_err();
        assert_eq!(err.exit_code(), 0, "--help is not an error");
        Cli::command().debug_assert();
    }
}
