//! An upstream to put serve's sidecar in front of (`cargo run --example upstream -- http
//! 127.0.0.1:8080`), and what the sidecar tests run as a process of their own:
//!
//! - `upstream http ADDR|unix:PATH`: HTTP/1.1 (and h2c): every request is answered with JSON
//!   naming its method, path and headers as received; a request with `Upgrade: websocket` is
//!   switched (101) and every byte after it echoed; `GET /slow?ms=N` answers after N ms (default 5,000); `GET
//!   /count` answers `{"count": N}`, the requests answered before it.
//! - `upstream grpc ADDR`: the standard gRPC health service (tonic), over h2c.
//! - `upstream tcp ADDR`: echoes every byte of each connection (a PROXY header included).
//!
//! Prints `listening on ADDR` once it accepts.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: upstream http|grpc|tcp ADDR|unix:PATH";
    let mode = args.next().ok_or(usage)?;
    let at = args.next().ok_or(usage)?;
    match mode.as_str() {
        "http" => {
            if let Some(path) = at.strip_prefix("unix:") {
                let _ = std::fs::remove_file(path);
                let listener = tokio::net::UnixListener::bind(path)?;
                println!("listening on unix:{path}");
                loop {
                    let (stream, _) = listener.accept().await?;
                    tokio::spawn(serve_http(TokioIo::new(stream)));
                }
            }
            let listener = tokio::net::TcpListener::bind(&at).await?;
            println!("listening on {}", listener.local_addr()?);
            loop {
                let (stream, _) = listener.accept().await?;
                tokio::spawn(serve_http(TokioIo::new(stream)));
            }
        }
        "grpc" => {
            let listener = tokio::net::TcpListener::bind(&at).await?;
            println!("listening on {}", listener.local_addr()?);
            let (health, service) = tonic_health::server::health_reporter();
            health
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream(listener))
                .await?;
            Ok(())
        }
        "tcp" => {
            let listener = tokio::net::TcpListener::bind(&at).await?;
            println!("listening on {}", listener.local_addr()?);
            loop {
                let (mut stream, _) = listener.accept().await?;
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if stream.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        }
        _ => Err(usage.into()),
    }
}

/// The accepted connections as the stream tonic serves.
fn tokio_stream(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

async fn serve_http<IO>(io: TokioIo<IO>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(answer);
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(io, service)
        .await;
}

/// The requests answered, `/count` aside.
static ANSWERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn answer(mut request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.headers().contains_key(hyper::header::UPGRADE) {
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        });
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        response.headers_mut().insert(
            hyper::header::UPGRADE,
            hyper::header::HeaderValue::from_static("websocket"),
        );
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("upgrade"),
        );
        return Ok(response);
    }
    if request.uri().path() == "/count" {
        let count = ANSWERED.load(std::sync::atomic::Ordering::SeqCst);
        let body = serde_json::json!({ "count": count }).to_string();
        return Ok(Response::new(Full::new(Bytes::from(body))));
    }
    ANSWERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if request.uri().path() == "/slow" {
        let ms = request
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("ms="))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(5000);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = serde_json::json!({
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "version": format!("{:?}", request.version()),
        "headers": headers,
    });
    Ok(Response::new(Full::new(Bytes::from(body.to_string()))))
}
