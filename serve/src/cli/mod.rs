//! serve's command line, on clap: the flags, their values and bounds, and the rules of which go
//! together. A usage error exits 2 (clap's convention, and serve's before it), naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser};
use tls_acme::ChallengeType;

/// serve's crypto provider, by the examples' features: aws-lc-rs by default (X25519MLKEM768, the
/// post-quantum key exchange current clients offer first, at once), *ring* when built with
/// `--no-default-features --features ring`.
pub(crate) fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    let provider = tls_reload::ring_provider();
    #[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
    compile_error!(
        "serve needs a crypto provider: the examples' feature `aws-lc-rs` (default) or `ring`"
    );
    std::sync::Arc::new(provider)
}

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
const ACME: &str =
    "ACME (a certificate from an ACME CA for each --acme-domain, served as its SNI route)";
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
    /// status JSON gains `leader`). With --acme-directory: the fleet's ACME state, in Secrets
    /// named NAME-acme-*; the Lease holder orders, every replica serves and answers
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = namespaced("--k8s-shared"))]
    k8s_shared: Option<(String, String)>,
    /// The Lease that elects the writer [default: NAME-writer; with --acme-directory,
    /// NAME-acme]
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

    /// The ACME directory URL, e.g. https://acme-v02.api.letsencrypt.org/directory
    #[arg(long, value_name = "URL", help_heading = ACME)]
    acme_directory: Option<String>,
    /// A DNS name to get a certificate for (repeatable; one certificate each; no wildcards:
    /// they need DNS-01, which serve cannot answer)
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
    /// tls-alpn-01 (answered on --listen) or http-01 (answered on --acme-http-listen)
    /// [default: tls-alpn-01]
    #[arg(long, value_name = "TYPE", value_parser = acme_challenge, help_heading = ACME)]
    acme_challenge: Option<ChallengeType>,
    /// Answer HTTP-01 over plain HTTP on ADDR (port 80 for a public CA)
    #[arg(long, value_name = "ADDR", help_heading = ACME,
          value_parser = address("--acme-http-listen", "0.0.0.0:80"))]
    acme_http_listen: Option<SocketAddr>,
    /// How many certificates for new names may be ordered per registered domain in any seven
    /// days (Let's Encrypt's limit is 50); beyond it a name waits, without asking the CA
    #[arg(long, value_name = "N", default_value_t = tls_acme::DEFAULT_NEW_CERTIFICATES_PER_WEEK,
          help_heading = ACME)]
    acme_weekly_limit: u32,
    /// External account binding: the key id the CA gave (needs --acme-eab-key)
    #[arg(long, value_name = "ID", help_heading = ACME)]
    acme_eab_kid: Option<String>,
    /// External account binding: the HMAC key the CA gave, base64url
    // Decoded in `check`: clap's report of a value it refuses would show the key.
    #[arg(long, value_name = "B64URL", value_parser = secret, help_heading = ACME)]
    acme_eab_key: Option<Secret>,

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
    /// External account binding: the key id and the HMAC key.
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
}

/// An external account binding's HMAC key (kept out of `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct EabKey(pub(crate) Vec<u8>);

impl std::fmt::Debug for EabKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EabKey(..)")
    }
}

/// A flag's value that is a secret, as given (kept out of `Debug`).
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Takes any value: checked later, so that no report shows it.
#[allow(clippy::unnecessary_wraps)] // clap's value parsers return a Result
fn secret(v: &str) -> Result<Secret, String> {
    Ok(Secret(v.to_owned()))
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
        let acme = Self::acme(
            AcmeFlags {
                directory: self.acme_directory,
                domains: self.acme_domain,
                email: self.acme_email,
                directory_ca: self.acme_directory_ca,
                state: self.acme_state,
                challenge: self.acme_challenge,
                http_listen: self.acme_http_listen,
                weekly_limit: self.acme_weekly_limit,
                eab_kid: self.acme_eab_kid,
                eab_key: self.acme_eab_key,
            },
            self.k8s_shared.clone().map(|shared| FleetFlags {
                shared,
                lease: self.lease.clone(),
                identity: self.identity.clone(),
            }),
        )?;
        // ACME for a fleet takes --k8s-shared: the default certificate (for names without an
        // ACME one) is --cert's, or the in-memory self-signed one.
        let acme_fleet = acme
            .as_ref()
            .is_some_and(|a| matches!(a.state, AcmeState::Fleet { .. }));
        if acme_fleet {
            if self.k8s_secret.is_some() {
                return Err("--k8s-shared with --acme-directory cannot be combined with --k8s-secret (give the default certificate with --cert)".into());
            }
            if seal.served_key {
                return Err("--seal-served-key does not go with --acme-directory: the certificates' Secrets are kubernetes.io/tls Secrets every replica serves through one label-selector watch, which reads a plain tls.key (--seal-key seals the ACME account and the orders' keys)".into());
            }
            if self.self_signed_dir.is_some() || self.self_signed_ca {
                return Err("--self-signed-dir and --self-signed-ca do not go with --acme-directory and --k8s-shared: the self-signed default is kept in memory".into());
            }
        }
        let k8s_shared = if acme_fleet { None } else { self.k8s_shared };
        let self_signed = SelfSignedArgs {
            names: self.name,
            validity: self.self_signed_validity,
            dir: self.self_signed_dir,
            ca: self.self_signed_ca,
        };
        let self_signed_flags = self_signed != SelfSignedArgs::default();
        let certs = if let Some((namespace, name)) = k8s_shared {
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
            let identity = identity(self.identity)?;
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
            acme,
        })
    }

    /// The `--acme-*` flags, checked together and against what tls-acme accepts.
    fn acme(flags: AcmeFlags, fleet: Option<FleetFlags>) -> Result<Option<AcmeArgs>, String> {
        let Some(directory) = flags.directory else {
            let given = !flags.domains.is_empty()
                || flags.email.is_some()
                || flags.directory_ca.is_some()
                || flags.state.is_some()
                || flags.challenge.is_some()
                || flags.http_listen.is_some()
                || flags.eab_kid.is_some()
                || flags.eab_key.is_some();
            if given {
                return Err("the --acme-* flags go with --acme-directory".into());
            }
            return Ok(None);
        };
        if !directory.starts_with("https://") {
            return Err(format!(
                "--acme-directory {directory}: an https:// URL is needed"
            ));
        }
        if flags.domains.is_empty() {
            return Err("--acme-directory needs at least one --acme-domain".into());
        }
        if let Some(wildcard) = flags.domains.iter().find(|d| d.starts_with("*.")) {
            return Err(format!(
                "--acme-domain {wildcard}: a wildcard can only be validated by dns-01, and serve has no DNS-01 solver (the tls-acme library takes one)"
            ));
        }
        let challenge = flags.challenge.unwrap_or_default();
        match (challenge, flags.http_listen) {
            (ChallengeType::Http01, None) => {
                return Err(
                    "--acme-challenge http-01 needs --acme-http-listen (where the CA's request arrives)"
                        .into(),
                );
            }
            (ChallengeType::Http01, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err("--acme-http-listen goes with --acme-challenge http-01".into());
            }
        }
        let eab = match (flags.eab_kid, flags.eab_key) {
            (Some(kid), Some(key)) => Some((kid, eab_key(&key.0)?)),
            (None, None) => None,
            _ => return Err("--acme-eab-kid and --acme-eab-key go together".into()),
        };
        let state = match (flags.state, fleet) {
            (Some(_), Some(_)) => {
                return Err("--acme-state does not go with --k8s-shared: the fleet's state is kept in its Secrets".into());
            }
            (Some(dir), None) => AcmeState::Dir(dir),
            (None, Some(fleet)) => AcmeState::Fleet {
                namespace: fleet.shared.0,
                name: fleet.shared.1,
                lease: fleet.lease,
                identity: identity(fleet.identity)?,
            },
            (None, None) => {
                return Err("--acme-directory needs --acme-state DIR (or --k8s-shared NAMESPACE/NAME for a fleet): without it every restart orders every certificate again".into());
            }
        };
        // What the library refuses, refused here with the flag named (exit 2, not 1).
        let check = |builder: tls_acme::AcmeBuilder| {
            builder
                .crypto_provider(crypto_provider())
                // Only checked: nothing is read or written at build.
                .state_dir("/")
                .challenge(challenge)
                .build()
                .map(drop)
        };
        for domain in &flags.domains {
            check(tls_acme::Acme::builder(&directory).name(domain))
                .map_err(|e| format!("--acme-domain {domain}: {}", config_reason(&e)))?;
        }
        check(flags.domains.iter().fold(
            tls_acme::Acme::builder(&directory),
            tls_acme::AcmeBuilder::name,
        ))
        .map_err(|e| format!("--acme-domain: {}", config_reason(&e)))?;
        if let Some(ca) = &flags.directory_ca {
            check(
                tls_acme::Acme::builder(&directory)
                    .name(&flags.domains[0])
                    .directory_ca_file(ca),
            )
            .map_err(|e| {
                format!(
                    "--acme-directory-ca {}: {}",
                    ca.display(),
                    config_reason(&e)
                )
            })?;
        }
        Ok(Some(AcmeArgs {
            directory,
            domains: flags.domains,
            email: flags.email,
            directory_ca: flags.directory_ca,
            state,
            challenge,
            http_listen: flags.http_listen,
            weekly_limit: flags.weekly_limit,
            eab,
        }))
    }
}

/// `--k8s-shared` (and its `--lease`, `--identity`) as given, for ACME in a fleet.
struct FleetFlags {
    shared: (String, String),
    lease: Option<String>,
    identity: Option<String>,
}

/// This replica's name in a Lease: `--identity`, else `$POD_NAME` or the host name.
fn identity(given: Option<String>) -> Result<String, String> {
    given
        .or_else(default_identity)
        .ok_or_else(|| "--k8s-shared needs --identity (no POD_NAME, no host name)".to_owned())
}

/// The `--acme-*` flags as given.
struct AcmeFlags {
    directory: Option<String>,
    domains: Vec<String>,
    email: Option<String>,
    directory_ca: Option<PathBuf>,
    state: Option<PathBuf>,
    challenge: Option<ChallengeType>,
    http_listen: Option<SocketAddr>,
    weekly_limit: u32,
    eab_kid: Option<String>,
    eab_key: Option<Secret>,
}

/// The reason of a configuration error, without the library's prefix.
fn config_reason(error: &tls_acme::Error) -> String {
    match error {
        tls_acme::Error::Config(reason) => reason.clone(),
        other => other.to_string(),
    }
}

/// `--acme-challenge`: what serve can answer.
fn acme_challenge(v: &str) -> Result<ChallengeType, String> {
    match v.parse() {
        Ok(ChallengeType::Dns01) => Err(format!(
            "--acme-challenge {v}: serve has no DNS-01 solver (tls-alpn-01 or http-01)"
        )),
        Ok(challenge) => Ok(challenge),
        Err(_) => Err(format!(
            "--acme-challenge {v}: expected tls-alpn-01 or http-01"
        )),
    }
}

/// `--acme-eab-key`: base64url, padded or not.
fn eab_key(v: &str) -> Result<EabKey, String> {
    use base64::Engine as _;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match engine.decode(v.trim()) {
        Ok(key) if !key.is_empty() => Ok(EabKey(key)),
        _ => Err("--acme-eab-key: not base64url (the value is not shown: it is a secret)".into()),
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

    const DIRECTORY: &str = "https://acme.example.net/directory";

    /// ACME for a fleet: the flags every fleet case below starts from.
    const ACME_FLEET: &[&str] = &[
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "a.example.com",
        "--k8s-shared",
        "default/web",
        "--identity",
        "pod-0",
    ];

    #[test]
    fn acme_flags_take_their_values_with_tls_alpn_01_by_default() {
        let args = parse(&[
            "--acme-directory",
            DIRECTORY,
            "--acme-domain",
            "a.example.com",
            "--acme-domain",
            "b.example.com",
            "--acme-email",
            "ops@example.com",
            "--acme-state",
            "/var/lib/acme",
            "--acme-eab-kid",
            "kid-1",
            "--acme-eab-key",
            "c2VjcmV0LWhtYWMta2V5",
        ])
        .unwrap();
        let acme = args.acme.unwrap();
        assert_eq!(acme.directory, DIRECTORY);
        assert_eq!(acme.domains, ["a.example.com", "b.example.com"]);
        assert_eq!(acme.email.as_deref(), Some("ops@example.com"));
        assert_eq!(acme.state, AcmeState::Dir(PathBuf::from("/var/lib/acme")));
        assert_eq!(acme.challenge, ChallengeType::TlsAlpn01);
        assert_eq!(acme.weekly_limit, 50, "Let's Encrypt's limit by default");
        assert_eq!(
            acme.eab,
            Some(("kid-1".into(), EabKey(b"secret-hmac-key".to_vec())))
        );
        assert!(!format!("{acme:?}").contains("c2VjcmV0"), "no key in Debug");
        assert_eq!(
            args.certs,
            Certs::SelfSigned(SelfSignedArgs::default()),
            "the default stays"
        );

        let http = parse(&[
            "--acme-directory",
            DIRECTORY,
            "--acme-domain",
            "a.example.com",
            "--acme-state",
            "/var/lib/acme",
            "--acme-challenge",
            "http-01",
            "--acme-http-listen",
            "0.0.0.0:80",
            "--acme-weekly-limit",
            "7",
        ])
        .unwrap()
        .acme
        .unwrap();
        assert_eq!(http.weekly_limit, 7);
        assert_eq!(http.challenge, ChallengeType::Http01);
        assert_eq!(http.http_listen, Some("0.0.0.0:80".parse().unwrap()));
    }

    #[test]
    fn bad_acme_flags_exit_2_with_the_reason() {
        let base = ["--acme-directory", DIRECTORY, "--acme-state", "/tmp/acme"];
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            base.iter().chain(extra).copied().collect()
        };
        refused(
            &with(&["--acme-domain", "*.example.com"]),
            "--acme-domain *.example.com",
            "serve has no DNS-01 solver",
        );
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-challenge",
                "dns-01",
            ]),
            "--acme-challenge dns-01",
            "no DNS-01 solver",
        );
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-challenge",
                "tls-sni-01",
            ]),
            "--acme-challenge tls-sni-01",
            "expected tls-alpn-01 or http-01",
        );
        refused(
            &with(&["--acme-domain", "10.0.0.1"]),
            "--acme-domain 10.0.0.1",
            "is not a DNS name",
        );
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-domain",
                "A.example.com",
            ]),
            "--acme-domain",
            "configured twice",
        );
        refused(&with(&[]), "--acme-directory", "at least one --acme-domain");
        refused(
            &[
                "--acme-directory",
                DIRECTORY,
                "--acme-domain",
                "a.example.com",
            ],
            "--acme-state",
            "every restart orders every certificate again",
        );
        refused(
            &[
                "--acme-directory",
                "http://acme.example.net/directory",
                "--acme-domain",
                "a.example.com",
            ],
            "--acme-directory http://",
            "https:// URL",
        );
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-challenge",
                "http-01",
            ]),
            "--acme-http-listen",
            "where the CA's request arrives",
        );
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-http-listen",
                "0.0.0.0:80",
            ]),
            "--acme-http-listen",
            "goes with --acme-challenge http-01",
        );
        refused(
            &with(&["--acme-domain", "a.example.com", "--acme-eab-kid", "kid"]),
            "--acme-eab-kid and --acme-eab-key",
            "go together",
        );
        let err = parse(&with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-eab-kid",
            "kid",
            "--acme-eab-key",
            "not*base64!xyzzy",
        ]))
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(
            text.contains("--acme-eab-key") && text.contains("not base64url"),
            "{text}"
        );
        assert!(!text.contains("xyzzy"), "the key is never shown: {text}");
        refused(
            &with(&[
                "--acme-domain",
                "a.example.com",
                "--acme-directory-ca",
                "/nonexistent/ca.pem",
            ]),
            "--acme-directory-ca /nonexistent/ca.pem",
            "",
        );
        refused(
            &["--acme-domain", "a.example.com"],
            "--acme-*",
            "go with --acme-directory",
        );
        refused(
            &[
                "--acme-directory",
                DIRECTORY,
                "--acme-domain",
                "a.example.com",
                "--k8s-shared",
                "default/web",
                "--acme-state",
                "/var/lib/acme",
            ],
            "--acme-state",
            "does not go with --k8s-shared",
        );
        refused(
            &[
                ACME_FLEET,
                &["--seal-key", "/keys/seal.key", "--seal-served-key"],
            ]
            .concat(),
            "--seal-served-key",
            "label-selector watch",
        );
        refused(
            &[ACME_FLEET, &["--self-signed-dir", "/tmp/x"]].concat(),
            "--self-signed-dir",
            "in memory",
        );
    }

    #[test]
    fn acme_with_k8s_shared_is_a_fleet_served_on_the_in_memory_default() {
        let args = parse(&[ACME_FLEET, &["--lease", "edge-orders"]].concat()).unwrap();
        assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
        assert_eq!(
            args.acme.unwrap().state,
            AcmeState::Fleet {
                namespace: "default".into(),
                name: "web".into(),
                lease: Some("edge-orders".into()),
                identity: "pod-0".into(),
            }
        );
        let args = parse(
            &[
                ACME_FLEET,
                &["--cert", "/etc/tls/tls.crt", "--key", "/etc/tls/tls.key"],
            ]
            .concat(),
        )
        .unwrap();
        assert!(
            matches!(args.certs, Certs::Files { .. }),
            "{:?}",
            args.certs
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
            "--acme-directory ",
            "--acme-domain",
            "--acme-email",
            "--acme-directory-ca",
            "--acme-state",
            "--acme-challenge",
            "--acme-http-listen",
            "--acme-eab-kid",
            "--acme-eab-key",
        ] {
            assert!(help.contains(flag), "{flag} in:\n{help}");
        }
        let err = parse(&["--help"]).unwrap_err();
        assert_eq!(err.exit_code(), 0, "--help is not an error");
        Cli::command().debug_assert();
    }
}
