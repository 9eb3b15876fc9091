//! hyper on a rotating certificate, HTTP/1.1 and HTTP/2, with graceful shutdown:
//! `cargo run --example hyper -- CERT_DIR [ADDR]`. SIGINT or SIGTERM stops accepting and lets
//! open connections finish.
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::{conn::auto, graceful::GracefulShutdown};
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
    let mut incoming = reloader.incoming(tokio::net::TcpListener::bind(addr).await?)?;
    println!(
        "listening on https://{}",
        incoming.local_addr().ok_or("no address")?
    );
    tokio::spawn(examples::stop_on_signal(shutdown.clone()));

    // The stream ends when `shutdown` is cancelled.
    let graceful = GracefulShutdown::new();
    while let Some(Ok(conn)) = incoming.next().await {
        let http = auto::Builder::new(TokioExecutor::new());
        let served = http.serve_connection(TokioIo::new(conn), hyper::service::service_fn(hello));
        tokio::spawn(graceful.watch(served.into_owned()));
    }
    graceful.shutdown().await;
    Ok(())
}
