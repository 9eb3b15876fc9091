//! `--upstream-tcp`: each connection's bytes both ways after its handshake, optionally after a
//! PROXY protocol v2 header; idle connections closed; a recycle or a trust close ends the
//! connection (bytes have no graceful close of their own).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tls_rotation::TlsConnection;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;

use super::proxy_protocol::{self, Tls};
use crate::cli::Upstream;

/// What every connection is carried to.
pub(crate) struct TcpProxy {
    pub(crate) upstream: Upstream,
    pub(crate) proxy_protocol: bool,
    pub(crate) idle_timeout: Duration,
}

impl TcpProxy {
    /// Carries every connection of `incoming` until it ends (shutdown), then gives the open
    /// ones `grace` to finish.
    pub(crate) async fn serve(self, incoming: tls_rotation::Incoming<TcpStream>, grace: Duration) {
        let proxy = Arc::new(self);
        let open = incoming
            .spawn_each(move |conn| Arc::clone(&proxy).carry(conn))
            .await;
        if tokio::time::timeout(grace, open.wait()).await.is_err() {
            tracing::warn!(drain = ?grace, "drain period over; dropping the remaining connections");
        }
        tracing::info!("all connections closed");
    }

    /// Carries `conn` to the upstream until either side closes, it idles, or it must close.
    pub(crate) async fn carry(self: Arc<Self>, conn: TlsConnection<TcpStream>) {
        let peer = conn.peer_addr();
        let mut upstream = match self.upstream.connect().await {
            Ok(upstream) => upstream,
            Err(err) => {
                tracing::warn!(upstream = %self.upstream, ?peer, error = %err, "the upstream is unreachable: connection closed");
                return;
            }
        };
        if self.proxy_protocol {
            let header = header_for(&conn);
            if let Err(err) = upstream.write_all(&header).await {
                tracing::warn!(upstream = %self.upstream, error = %err, "the upstream closed before the PROXY header: connection closed");
                return;
            }
        }
        let recycle = conn.recycle_signal();
        let close = conn.close_signal();
        let activity = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = tokio::time::Instant::now();
        let mut client = Counted {
            inner: conn,
            activity: Arc::clone(&activity),
            started,
        };
        let idle = async {
            loop {
                let last =
                    Duration::from_millis(activity.load(std::sync::atomic::Ordering::Relaxed));
                // Saturating: no duration given here can overflow the instant (the flag's
                // bound is a day, but nothing here relies on it).
                let deadline = started
                    .checked_add(last)
                    .and_then(|at| at.checked_add(self.idle_timeout));
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
                let now =
                    Duration::from_millis(activity.load(std::sync::atomic::Ordering::Relaxed));
                if now == last {
                    return;
                }
            }
        };
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                if let Err(err) = copied {
                    tracing::debug!(?peer, error = %err, "connection ended with an error");
                }
            }
            () = recycle => tracing::debug!(?peer, "recycled: connection closed"),
            () = close => tracing::info!(?peer, "its client is no longer allowed: connection closed"),
            () = idle => tracing::debug!(?peer, "idle: connection closed"),
        }
        let _ = client.inner.shutdown().await;
        let _ = upstream.shutdown().await;
    }
}

/// The PROXY v2 header for `conn`.
fn header_for(conn: &TlsConnection<TcpStream>) -> Vec<u8> {
    let (tcp, tls) = conn.get_ref().get_ref();
    let unspecified = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    let source = conn.peer_addr().unwrap_or(unspecified);
    let destination = tcp.local_addr().unwrap_or(unspecified);
    let client = conn
        .peer_certificates()
        .and_then(<[_]>::first)
        .and_then(|leaf| tls_rotation::ClientIdentity::parse(leaf).ok())
        .map(|id| proxy_protocol::Client {
            common_name: id.common_name,
            uris: id.uris,
        });
    let version = tls.protocol_version().map(|v| match v {
        tls_rotation::rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
        tls_rotation::rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
        _ => "TLS",
    });
    proxy_protocol::header(
        source,
        destination,
        &Tls {
            server_name: conn.server_name(),
            alpn: conn.alpn_protocol(),
            version,
            client,
        },
    )
}

/// A connection that records when a byte last moved, for the idle timeout.
struct Counted<T> {
    inner: T,
    activity: Arc<std::sync::atomic::AtomicU64>,
    started: tokio::time::Instant,
}

impl<T> Counted<T> {
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.activity
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
