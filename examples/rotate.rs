//! Writes a new certificate into a directory the way the kubelet updates a mounted Secret, so
//! that you can watch `serve --cert-dir DIR` follow it.
//!
//! ```text
//! cargo run --example rotate -- DIR [--name NAME]... [--validity DURATION] [--every DURATION]
//!                                    [--count N] [--mismatched]
//! ```
//!
//! `--mismatched` writes a bad update on purpose: a certificate with the key of another pair, the
//! torn pair that breaks naive reloaders. `serve` keeps its certificate and reports it.
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
usage: rotate DIR [--name NAME]... [--validity DURATION] [--every DURATION] [--count N]
                  [--mismatched]

  DIR                 the directory serve --cert-dir reads (created if missing)
  --name NAME         a DNS name or IP address (repeatable; default localhost, 127.0.0.1, ::1)
  --validity DURATION lifetime of each certificate (default 90d)
  --every DURATION    rotate repeatedly at this interval (default: once)
  --count N           with --every, stop after N rotations (default: until interrupted)
  --mismatched        write a bad update: a certificate with another pair's key";

struct Args {
    dir: PathBuf,
    names: Vec<String>,
    validity: Duration,
    every: Option<Duration>,
    count: Option<u64>,
    mismatched: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut dir = None;
    let mut names = Vec::new();
    let mut validity = tls_selfsigned::DEFAULT_VALIDITY;
    let (mut every, mut count, mut mismatched) = (None, None, false);
    let duration = |flag: &str, v: String| {
        humantime::parse_duration(&v)
            .with_context(|| format!("{flag} {v}: not a duration like 5s or 90d"))
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--name" => names.push(value()?),
            "--validity" => validity = duration("--validity", value()?)?,
            "--every" => every = Some(duration("--every", value()?)?),
            "--count" => count = Some(value()?.parse().context("--count needs a number")?),
            "--mismatched" => mismatched = true,
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
    Ok(Some(Args {
        dir,
        names,
        validity,
        every,
        count,
        mismatched,
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
    let mut written = 0u64;
    loop {
        let mut pair = generator.generate_pem()?;
        if args.mismatched {
            pair.key_pem = generator.generate_pem()?.key_pem;
        }
        dir.write(&[
            ("tls.crt", pair.cert_pem.as_bytes()),
            ("tls.key", pair.key_pem.as_bytes()),
        ])
        .with_context(|| format!("cannot write into {}", args.dir.display()))?;
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

fn pem_der(pem: &str) -> Vec<u8> {
    use tls_source::rustls_pki_types::CertificateDer;
    use tls_source::rustls_pki_types::pem::PemObject as _;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .unwrap_or_default()
}
