//! [`TlsConnection`]: one established connection of an [`Incoming`](super::Incoming) stream,
//! its recycling signal, and tonic's `Connected` for it.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

use crate::{CertResolver, Status};

/// An established TLS connection from an [`Incoming`](crate::Incoming) stream: read and write it like the
/// underlying IO.
pub struct TlsConnection<IO> {
    pub(super) stream: TlsStream<IO>,
    pub(super) peer: Option<SocketAddr>,
    pub(super) recycle: Option<Recycle>,
}

/// What [`TlsConnection::recycle_signal`] watches.
#[derive(Clone)]
pub(super) struct Recycle {
    pub(super) age: Duration,
    pub(super) established: tokio::time::Instant,
    pub(super) server_name: Option<String>,
    /// What the connection was served (as the resolver answered right after the handshake).
    pub(super) served: Option<Arc<CertifiedKey>>,
    pub(super) resolver: Arc<CertResolver>,
    pub(super) status: watch::Receiver<Status>,
}

impl Recycle {
    fn rotated(&self) -> bool {
        let now = self.resolver.lookup(self.server_name.as_deref());
        match (&now, &self.served) {
            (Some(now), Some(served)) => !Arc::ptr_eq(now, served),
            (now, served) => now.is_some() != served.is_some(),
        }
    }
}

impl<IO> TlsConnection<IO> {
    /// The client's address, when the listener knows it.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The server name (SNI) the client asked for.
    pub fn server_name(&self) -> Option<&str> {
        self.stream.get_ref().1.server_name()
    }

    /// The ALPN protocol agreed on, if any (`b"h2"`, `b"http/1.1"`).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.stream.get_ref().1.alpn_protocol()
    }

    /// The certificate chain the client presented (with client authentication), leaf first.
    pub fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        self.stream.get_ref().1.peer_certificates()
    }

    /// The TLS stream, for everything else rustls knows about the connection.
    pub fn get_ref(&self) -> &TlsStream<IO> {
        &self.stream
    }

    /// The TLS stream, and the client's address.
    pub fn into_inner(self) -> (TlsStream<IO>, Option<SocketAddr>) {
        (self.stream, self.peer)
    }

    /// With [`IncomingBuilder::recycle_after`](crate::IncomingBuilder::recycle_after): completes when this connection should be
    /// closed gracefully, because a newer certificate than the one it was served is installed
    /// and the connection is at least the configured age. Without: never completes. An owned
    /// future: take it before handing the connection to the HTTP server.
    ///
    /// ```no_run
    /// # async fn run(conn: tls_reload::TlsConnection<tokio::net::TcpStream>) {
    /// use hyper_util::rt::{TokioExecutor, TokioIo};
    /// let recycle = conn.recycle_signal();
    /// let service = hyper::service::service_fn(|_req| async {
    ///     Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from("hello")))
    /// });
    /// let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    /// let conn = builder.serve_connection(TokioIo::new(conn), service);
    /// let mut conn = std::pin::pin!(conn);
    /// tokio::select! {
    ///     _ = conn.as_mut() => return,
    ///     () = recycle => conn.as_mut().graceful_shutdown(),
    /// }
    /// let _ = conn.await;
    /// # }
    /// ```
    pub fn recycle_signal(&self) -> impl Future<Output = ()> + Send + 'static + use<IO> {
        let recycle = self.recycle.clone();
        async move {
            let Some(recycle) = recycle else {
                return std::future::pending().await;
            };
            let mut status = recycle.status.clone();
            while !recycle.rotated() {
                if status.changed().await.is_err() {
                    // The reloader is gone: nothing will rotate.
                    return std::future::pending().await;
                }
            }
            // An age too large to add (`Duration::MAX`) never comes.
            match recycle.established.checked_add(recycle.age) {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }
}

impl<IO> fmt::Debug for TlsConnection<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnection")
            .field("peer", &self.peer)
            .field("server_name", &self.server_name())
            .field("alpn", &self.alpn_protocol().map(String::from_utf8_lossy))
            .finish_non_exhaustive()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsConnection<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsConnection<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(feature = "tonic")]
impl<IO> tonic::transport::server::Connected for TlsConnection<IO> {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer
    }
}
