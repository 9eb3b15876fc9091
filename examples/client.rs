//! An mTLS client whose identity and trusted roots rotate, through one pooled reqwest client:
//!
//! ```text
//! cargo run --example client -- URL --cert-dir DIR [--ca PATH] [--every DURATION] [--count N]
//!                                    [--ready-timeout DURATION]
//! ```
//!
//! Requests `URL` every `DURATION` (default 1s), `N` times (default: until stopped), presenting
//! the client certificate in `DIR` (`tls.crt`, `tls.key`, followed like a mounted Secret) and
//! trusting servers with the CAs in `--ca PATH` (default `DIR/ca.crt`), both rotating; the
//! request after a rotation presents the new certificate (the reqwest client is rebuilt).
//! Prints one JSON line per request: `{"n":…,"status":…,"client_fingerprint_sha256":…,"error":…}`.
//! Without a usable client bundle within `--ready-timeout` (default 30s) it exits 1 and says
//! why; each rejected bundle is logged (stderr, `RUST_LOG` to filter).
use std::time::Duration;

use anyhow::{Context as _, bail};
use tls_reload::{ClientTls, FileSource};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::log_to_stderr("info");
    let mut args = std::env::args().skip(1);
    let (mut url, mut dir, mut ca, mut every, mut count) =
        (None, None, None, Duration::from_secs(1), None);
    let mut ready_timeout = Duration::from_secs(30);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--cert-dir" => dir = Some(std::path::PathBuf::from(value()?)),
            "--ca" => ca = Some(value()?),
            "--every" => every = humantime::parse_duration(&value()?).context("--every")?,
            "--count" => count = Some(value()?.parse::<u64>().context("--count")?),
            "--ready-timeout" => {
                ready_timeout = humantime::parse_duration(&value()?).context("--ready-timeout")?;
            }
            other if url.is_none() && !other.starts_with("--") => url = Some(other.to_owned()),
            other => bail!("unknown argument {other}"),
        }
    }
    let (Some(url), Some(dir)) = (url, dir) else {
        bail!(
            "usage: client URL --cert-dir DIR [--ca PATH] [--every DURATION] [--count N] [--ready-timeout DURATION]"
        );
    };

    let files = FileSource::builder(dir.join("tls.crt"), dir.join("tls.key"));
    let files = files.ca(ca.map_or_else(|| dir.join("ca.crt"), Into::into));
    let tls = ClientTls::builder().spawn(files.build())?;
    tls.ready_timeout(ready_timeout)
        .await
        .with_context(|| format!("no usable client certificate in {}", dir.display()))?;
    // Rebuilt on the first request after each rotation: a pooled connection would go on
    // presenting the certificate it was made with.
    let client = tls
        .rebuilt(|mut config| {
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            reqwest::Client::builder()
                .tls_backend_preconfigured(config)
                .build()
        })
        .map_err(|e| anyhow::anyhow!(e))?;

    for n in 1..=count.unwrap_or(u64::MAX) {
        let response = match client.get() {
            Ok(client) => client.get(&url).send().await,
            Err(err) => bail!("cannot build the HTTP client: {err}"),
        };
        let presented = tls
            .status()
            .borrow()
            .current
            .as_ref()
            .map(|c| c.fingerprint_sha256.clone());
        let line = serde_json::json!({
            "n": n,
            "status": response.as_ref().ok().map(|r| r.status().as_u16()),
            "client_fingerprint_sha256": presented,
            "error": response.as_ref().err().map(|e| format!("{e:#}")),
        });
        println!("{line}");
        tokio::time::sleep(every).await;
    }
    Ok(())
}
