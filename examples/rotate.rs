//! Writes a new certificate into a directory the way the kubelet updates a mounted Secret, so
//! that you can watch `serve --cert-dir DIR` follow it.
//!
//! ```text
//! cargo run --example rotate -- DIR [--name NAME]... [--validity DURATION] [--every DURATION]
//!                                    [--count N] [--mismatched] [--signing-ca CA_DIR] [--client]
//!                                    [--not-before RFC3339] [--not-after RFC3339]
//! ```
//!
//! `--signing-ca CA_DIR` signs each certificate with a CA kept in `CA_DIR` (`ca.crt`, `ca.key`;
//! made on first use, then reused) and writes that CA as `DIR/ca.crt` beside the pair: the
//! bundle an mTLS server (`serve --client-ca DIR/ca.crt`) or client (`client --cert-dir DIR`)
//! needs. `--client` writes a client certificate (`clientAuth`) instead of a server one.
//! Not to be confused with serve's `--ca`, the CA file served with a certificate.
//!
//! `--mismatched` writes a bad update on purpose: a certificate with the key of another pair, the
//! torn pair that breaks naive reloaders. `serve` keeps its certificate and reports it.
//!
//! `--not-before` and `--not-after` (RFC 3339, e.g. `2020-01-01T00:00:00Z`) set the validity
//! exactly, in the past or the future, so that an expired or not-yet-valid certificate can be
//! written on purpose (to see `serve` refuse it, or to test alerting on expiry metrics).
//!
//! Each rotation writes `tls.crt` and `tls.key` (a fresh self-signed P-256 pair) into a new
//! timestamped directory `DIR/..<time>`, points `DIR/..data_tmp` at it and renames that over
//! `DIR/..data`; `DIR/tls.crt` and `DIR/tls.key` are symlinks through `..data`. Names default to
//! `localhost`, `127.0.0.1` and `::1`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tls_selfsigned::SelfSigned;
use tls_test::KubeDir;

const USAGE: &str = "\
usage: rotate DIR [--name NAME]... [--uri URI]... [--validity DURATION] [--every DURATION]
                  [--count N] [--mismatched]

  DIR                 the directory serve --cert-dir reads (created if missing)
  --name NAME         a DNS name or IP address (repeatable; default localhost, 127.0.0.1, ::1)
  --validity DURATION lifetime of each certificate (default 90d)
  --every DURATION    rotate repeatedly at this interval (default: once)
  --count N           with --every, stop after N rotations (default: until interrupted)
  --mismatched        write a bad update: a certificate with another pair's key
  --signing-ca CA_DIR sign with a CA kept in CA_DIR (made on first use), written as DIR/ca.crt
  --client            a client certificate (clientAuth), for client --cert-dir DIR
  --uri URI           a URI SAN, e.g. a SPIFFE ID spiffe://example.org/ns/prod/sa/web
                      (repeatable; what serve --allow-uri matches)
  --not-before TIME   valid from TIME (RFC 3339, e.g. 2020-01-01T00:00:00Z; default a minute ago)
  --not-after TIME    valid until TIME (RFC 3339; default --validity from now): a date in the
                      past writes an expired certificate, --not-before in the future one not
                      valid yet";

struct Args {
    dir: PathBuf,
    names: Vec<String>,
    uris: Vec<String>,
    validity: Duration,
    every: Option<Duration>,
    count: Option<u64>,
    mismatched: bool,
    signing_ca: Option<PathBuf>,
    client: bool,
    not_before: Option<time::OffsetDateTime>,
    not_after: Option<time::OffsetDateTime>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut dir = None;
    let mut names = Vec::new();
    let mut uris = Vec::new();
    let mut validity = tls_selfsigned::DEFAULT_VALIDITY;
    let (mut every, mut count, mut mismatched) = (None, None, false);
    let (mut signing_ca, mut client) = (None, false);
    let (mut not_before, mut not_after) = (None, None);
    // The workspace's one RFC 3339 parser: any date a certificate carries, 1950 and 9999 too.
    let date = |flag: &str, v: String| {
        tls_source::clock::Rfc3339::parse(&v)
            .map(time::OffsetDateTime::from)
            .with_context(|| format!("{flag} {v}: not an RFC 3339 time like 2020-01-01T00:00:00Z"))
    };
    let duration = |flag: &str, v: String| {
        humantime::parse_duration(&v)
            .with_context(|| format!("{flag} {v}: not a duration like 5s or 90d"))
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--name" => names.push(value()?),
            "--uri" => uris.push(value()?),
            "--validity" => validity = duration("--validity", value()?)?,
            "--every" => every = Some(duration("--every", value()?)?),
            "--count" => count = Some(value()?.parse().context("--count needs a number")?),
            "--mismatched" => mismatched = true,
            "--signing-ca" => signing_ca = Some(PathBuf::from(value()?)),
            "--client" => client = true,
            "--not-before" => not_before = Some(date("--not-before", value()?)?),
            "--not-after" => not_after = Some(date("--not-after", value()?)?),
            "-h" | "--help" => return Ok(None),
            flag if flag.starts_with('-') => bail!("unknown flag {flag:?}"),
            _ if dir.is_some() => bail!("one directory only"),
            _ => dir = Some(PathBuf::from(arg)),
        }
    }
    if names.is_empty() {
        names = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    }
    let dir = dir.context("the directory to write is missing")?;
    if client && signing_ca.is_none() {
        bail!(
            "--client needs --signing-ca CA_DIR: a client bundle carries the CA (ca.crt) it trusts servers with"
        );
    }
    if let (Some(from), Some(until)) = (not_before, not_after)
        && from >= until
    {
        bail!("--not-before must be earlier than --not-after");
    }
    Ok(Some(Args {
        dir,
        names,
        uris,
        validity,
        every,
        count,
        mismatched,
        signing_ca,
        client,
        not_before,
        not_after,
    }))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("error: {err:#}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let generator = args
        .names
        .iter()
        .fold(SelfSigned::builder(), |b, name| b.name(name))
        .validity(args.validity)
        .build()?;
    let dir =
        KubeDir::new(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    let ca = args
        .signing_ca
        .as_deref()
        .map(SigningCa::open)
        .transpose()?;
    let mut written = 0u64;
    loop {
        let (cert_pem, mut key_pem) = match &ca {
            Some(ca) => ca.sign(args)?,
            // Dates of the user's: rcgen directly (the generator's are always from now).
            None if args.not_before.is_some() || args.not_after.is_some() => {
                let key = rcgen::KeyPair::generate()?;
                (
                    leaf_params(args)?.self_signed(&key)?.pem(),
                    key.serialize_pem(),
                )
            }
            None => {
                let pair = generator.generate_pem()?;
                (pair.cert_pem, pair.key_pem)
            }
        };
        if args.mismatched {
            key_pem = generator.generate_pem()?.key_pem;
        }
        let mut files = vec![
            ("tls.crt", cert_pem.as_bytes()),
            ("tls.key", key_pem.as_bytes()),
        ];
        if let Some(ca) = &ca {
            files.push(("ca.crt", ca.cert_pem.as_bytes()));
        }
        dir.write(&files)
            .with_context(|| format!("cannot write into {}", args.dir.display()))?;
        let pair = Pem { cert_pem };
        written += 1;
        let fingerprint = tls_test::fingerprint(&pem_der(&pair.cert_pem));
        let note = if args.mismatched {
            " (with a mismatched key)"
        } else {
            ""
        };
        println!("rotated {}: sha256 {fingerprint}{note}", args.dir.display());
        match args.every {
            Some(every) if args.count.is_none_or(|n| written < n) => std::thread::sleep(every),
            _ => return Ok(()),
        }
    }
}

struct Pem {
    cert_pem: String,
}

/// A CA kept in a directory (`ca.crt`, `ca.key`), made on first use.
struct SigningCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
}

impl SigningCa {
    fn open(dir: &std::path::Path) -> anyhow::Result<Self> {
        let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
        if !cert_path.exists() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--signing-ca: cannot create {}", dir.display()))?;
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "tls-rotation rotate CA");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![
                rcgen::KeyUsagePurpose::KeyCertSign,
                rcgen::KeyUsagePurpose::CrlSign,
            ];
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::hours(1);
            params.not_after = now + time::Duration::days(3650);
            let key = rcgen::KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            std::fs::write(&cert_path, cert.pem())
                .with_context(|| format!("cannot write {}", cert_path.display()))?;
            write_private(&key_path, &key.serialize_pem())?;
            println!("made the signing CA {}", cert_path.display());
        }
        let cert_pem = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("--signing-ca: cannot read {}", cert_path.display()))?;
        let key_pem = std::fs::read_to_string(&key_path)
            .with_context(|| format!("--signing-ca: cannot read {}", key_path.display()))?;
        let key = rcgen::KeyPair::from_pem(&key_pem)
            .with_context(|| format!("--signing-ca: {} is not a key", key_path.display()))?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(&cert_pem, key)
            .with_context(|| format!("--signing-ca: {} is not a CA", cert_path.display()))?;
        Ok(Self { issuer, cert_pem })
    }

    /// A leaf for `args`' names, signed by this CA: its certificate and key, PEM.
    fn sign(&self, args: &Args) -> anyhow::Result<(String, String)> {
        let key = rcgen::KeyPair::generate()?;
        let cert = leaf_params(args)?.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// A leaf's parameters for `args`: its names, purpose and validity (`--not-before`,
/// `--not-after`, else from a minute ago for `--validity`).
fn leaf_params(args: &Args) -> anyhow::Result<rcgen::CertificateParams> {
    let mut params = rcgen::CertificateParams::new(args.names.clone())?;
    for uri in &args.uris {
        let uri = rcgen::string::Ia5String::try_from(uri.as_str())
            .with_context(|| format!("--uri {uri}: not an ASCII URI"))?;
        params.subject_alt_names.push(rcgen::SanType::URI(uri));
    }
    let cn = if args.client {
        "rotate client"
    } else {
        "rotate server"
    };
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![if args.client {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    }];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = args.not_before.unwrap_or(now - time::Duration::minutes(1));
    params.not_after = match args.not_after {
        Some(until) => until,
        // Checked: any --validity a person types gets an error, not a panic.
        None => time::Duration::try_from(args.validity)
            .ok()
            .and_then(|validity| now.checked_add(validity))
            .with_context(|| {
                format!(
                    "--validity {:?}: a certificate cannot end that late",
                    args.validity
                )
            })?,
    };
    if params.not_before >= params.not_after {
        bail!(
            "the certificate would end before it begins: give --not-after later than --not-before"
        );
    }
    Ok(params)
}

/// Writes `contents` readable by the owner only.
fn write_private(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

fn pem_der(pem: &str) -> Vec<u8> {
    use tls_source::rustls_pki_types::CertificateDer;
    use tls_source::rustls_pki_types::pem::PemObject as _;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .unwrap_or_default()
}
