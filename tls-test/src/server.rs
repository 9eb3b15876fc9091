//! A TLS accept loop on loopback around any certificate resolver.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// A TLS server on `127.0.0.1` that completes handshakes with certificates from a resolver,
/// answers `ok` and closes. Stops when dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl TestServer {
    /// Starts serving with `resolver` on an ephemeral port.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start(resolver: Arc<dyn ResolvesServerCert>) -> Self {
        let config = ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    () = token.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.write_all(b"ok").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        Self { addr, stop }
    }

    /// The address to connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Answers each connection `connections` yields (a server's accept stream, its handshakes
/// done) with `served` and closes it, each on a task of its own, until the stream ends or
/// yields an error: a server under test whose handshakes are what is looked at.
pub fn answer_each<S, C, E>(mut connections: S) -> tokio::task::JoinHandle<()>
where
    S: Stream<Item = Result<C, E>> + Unpin + Send + 'static,
    C: AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = connections.next().await {
            tokio::spawn(async move {
                let _ = conn.write_all(b"served").await;
                let _ = conn.shutdown().await;
            });
        }
    })
}
