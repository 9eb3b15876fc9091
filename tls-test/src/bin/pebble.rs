//! Pebble, Let's Encrypt's ACME test CA, with its DNS server, set up as the tests set it up, to
//! try `serve --acme-directory` on one machine:
//!
//! ```text
//! cargo run -p tls-test --bin pebble -- [--tls-port PORT] [--http-port PORT] [--bind]
//! ```
//!
//! With `--bind`, also BIND 9 (Debian `bind9`, `bind9-dnsutils`) on a loopback port as the
//! primary of `example.test` (`*.example.test` resolving to 127.0.0.1), whose `update-policy`
//! lets the key `acme-update` change the TXT records of `_acme-challenge.example.test.` alone;
//! Pebble then resolves through it, so a wildcard can be tried by DNS-01 (prints the server for
//! `--acme-dns-server` and the key file for `--acme-dns-tsig-key`).
//!
//! Needs the Debian package `pebble` (`pebble` and `pebble-challtestsrv`). Pebble validates
//! TLS-ALPN-01 on 127.0.0.1:`--tls-port` (default 5001) and HTTP-01 on 127.0.0.1:`--http-port`
//! (default 5002): every name resolves to 127.0.0.1. Prints the directory URL, the CA file
//! its HTTPS needs (`--acme-directory-ca`) and a file with the root its certificates chain
//! to (for `openssl s_client -CAfile`). Stops on Ctrl-C or SIGTERM.

use std::process::ExitCode;

const USAGE: &str = "usage: pebble [--tls-port PORT] [--http-port PORT] [--bind]";

fn port(value: Option<&str>, flag: &str) -> Result<u16, String> {
    value
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{flag} needs a port number\n{USAGE}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut builder = tls_test::Pebble::builder().tls_port(5001).http_port(5002);
    let mut bind = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let parsed = match arg.as_str() {
            "--tls-port" => {
                port(args.next().as_deref(), "--tls-port").map(|p| builder.clone().tls_port(p))
            }
            "--http-port" => {
                port(args.next().as_deref(), "--http-port").map(|p| builder.clone().http_port(p))
            }
            "--bind" => {
                let started = tls_test::Bind::builder()
                    .zone("example.test", &["* IN A 127.0.0.1", "@ IN A 127.0.0.1"])
                    .grant("name _acme-challenge.example.test. TXT")
                    .start()
                    .await;
                let Some(started) = started else {
                    return ExitCode::FAILURE;
                };
                let next = builder.clone().dns_server(started.addr());
                bind = Some(started);
                Ok(next)
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}\n{USAGE}")),
        };
        match parsed {
            Ok(next) => builder = next,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(pebble) = builder.start().await else {
        return ExitCode::FAILURE;
    };
    let ca = pebble.https_ca_file();
    let root = ca.with_file_name("issuing-root.pem");
    let der = pebble.issuing_root().await;
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
            .as_bytes()
            .chunks(64)
            .map(|line| String::from_utf8_lossy(line).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    );
    if let Err(e) = std::fs::write(&root, pem) {
        eprintln!("cannot write {}: {e}", root.display());
        return ExitCode::FAILURE;
    }
    println!("directory: {}", pebble.directory_url());
    println!("directory CA (--acme-directory-ca): {}", ca.display());
    println!("issuing root: {}", root.display());
    if let Some(bind) = &bind {
        println!("DNS server (--acme-dns-server): {}", bind.addr());
        println!(
            "TSIG key (--acme-dns-tsig-key): {}",
            bind.key_file(tls_test::UPDATE_KEY).display()
        );
    }
    // Stopped by Ctrl-C or SIGTERM: Pebble and challtestsrv are stopped with it.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match terminate.as_mut() {
                Some(signal) => { signal.recv().await; }
                None => std::future::pending().await,
            }
        } => {}
    }
    ExitCode::SUCCESS
}
