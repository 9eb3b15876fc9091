//! tonic (gRPC) on a rotating certificate: the standard health service,
//! `cargo run --example tonic -- CERT_DIR [ADDR]`. SIGINT or SIGTERM stops it gracefully.
use tls_reload::{CancellationToken, FileSource, Reloader};
use tonic_health::ServingStatus;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: tonic CERT_DIR [ADDR]")?;
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());

    let shutdown = CancellationToken::new();
    let reloader = Reloader::builder()
        .cancellation_token(shutdown.clone())
        .spawn(FileSource::kubernetes_dir(dir).build())?;
    // Listen once a certificate is in: connections before it would be closed at once.
    reloader
        .ready_timeout(std::time::Duration::from_secs(30))
        .await?;
    let incoming = reloader.incoming(tokio::net::TcpListener::bind(addr).await?)?;
    println!(
        "listening on https://{}",
        incoming.local_addr().ok_or("no address")?
    );
    tokio::spawn(examples::stop_on_signal(shutdown.clone()));

    let (health, service) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}
