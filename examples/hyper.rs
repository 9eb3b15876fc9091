//! hyper on a rotating certificate, HTTP/1.1 and HTTP/2, with graceful shutdown:
//! `cargo run --example hyper -- CERT_DIR [ADDR]`. SIGINT or SIGTERM stops accepting and lets
//! open connections finish (tls-reload's `serve_http`, on hyper-util).
use tls_reload::{CancellationToken, FileSource, Reloader};

async fn hello(
    _: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible> {
    Ok(hyper::Response::new("hello\n".into()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: hyper CERT_DIR [ADDR]")?;
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

    // Until `shutdown` is cancelled; then open connections get 10 s to finish.
    let service = tower::service_fn(hello);
    tls_reload::http::serve_http(incoming, service).await;
    Ok(())
}
