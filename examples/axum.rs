//! axum on a rotating certificate: `cargo run --example axum -- CERT_DIR [ADDR]`, where
//! `CERT_DIR` holds `tls.crt` and `tls.key` (a mounted Secret, or `cargo run --example rotate --
//! CERT_DIR`). SIGINT or SIGTERM stops it gracefully.
use tls_reload::{CancellationToken, FileSource, Reloader};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: axum CERT_DIR [ADDR]")?;
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());

    let shutdown = CancellationToken::new();
    let reloader = Reloader::builder()
        .cancellation_token(shutdown.clone())
        .spawn(FileSource::kubernetes_dir(dir).build())?;
    // Listen once a certificate is in: connections before it would be closed at once.
    reloader
        .ready_timeout(std::time::Duration::from_secs(30))
        .await?;
    let listener = reloader.incoming(tokio::net::TcpListener::bind(addr).await?)?;
    println!(
        "listening on https://{}",
        listener.local_addr().ok_or("no address")?
    );

    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello\n" }));
    tokio::spawn(examples::stop_on_signal(shutdown.clone()));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}
