//! Serving HTTP on an [`Incoming`] stream (feature `hyper`): [`serve_http`] runs any tower
//! service (an axum `Router`, a tonic router's service, a `service_fn`) on every connection
//! through hyper-util, HTTP/1.1 and HTTP/2, and closes each connection gracefully when it
//! should.
//!
//! A connection is closed gracefully (HTTP/2 GOAWAY, HTTP/1.1 close after the response in
//! flight) when:
//! - the stream's cancellation token is cancelled (shutdown: open connections then have the
//!   drain period, [`HttpServer::drain`], to finish);
//! - it is recycled ([`IncomingBuilder::recycle_after`](crate::IncomingBuilder::recycle_after));
//! - it has been idle for [`HttpServer::idle_timeout`] (no request in flight), when set;
//! - its client is no longer trusted: its CA left the trusted set (and, with
//!   [`close_at_client_expiry`](crate::IncomingBuilder::close_at_client_expiry), its
//!   certificate expired). The connection itself fails for good after the grace period
//!   ([`close_grace`](crate::IncomingBuilder::close_grace)) if the client does not go.
//!
//! Every request carries its connection's [`TlsInfo`] in its extensions (the client's
//! certificate with mTLS: `axum::Extension<TlsInfo>` in a handler).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::body::{Body, Incoming as IncomingBody};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{Incoming, TlsInfo};

/// The default [`HttpServer::drain`]: 10 seconds.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

/// Serves `service` on every connection of `incoming` until the stream ends (its token is
/// cancelled), then lets open connections finish for [`DEFAULT_DRAIN`]. See the
/// [module docs](self) for when each connection is closed.
///
/// ```no_run
/// use axum::{Extension, Router, routing::get};
/// use tls_reload::{ClientAuth, FileSource, Reloader, TlsInfo};
///
/// async fn whoami(Extension(tls): Extension<TlsInfo>) -> String {
///     let leaf = tls.peer_certificates.as_deref().and_then(|chain| chain.first());
///     match leaf {
///         Some(leaf) => format!("{}\n", tls_reload::tls_source::Digest::of(leaf)),
///         None => "anonymous\n".into(),
///     }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let reloader = Reloader::builder()
///     .client_auth(ClientAuth::from_bundle())
///     .spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
/// let incoming = reloader.incoming(tokio::net::TcpListener::bind("0.0.0.0:8443").await?)?;
/// let app = Router::new().route("/", get(whoami));
/// tls_reload::http::serve_http(incoming, app).await;
/// # Ok(()) }
/// ```
pub async fn serve_http<IO, S, B>(incoming: Incoming<IO>, service: S)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower_service::Service<Request<IncomingBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    HttpServer::new().serve(incoming, service).await;
}

/// [`serve_http`] with settings.
#[derive(Debug, Clone)]
pub struct HttpServer {
    drain: Duration,
    idle: Option<Duration>,
}

impl Default for HttpServer {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpServer {
    /// The defaults: [`DEFAULT_DRAIN`].
    pub fn new() -> Self {
        Self {
            drain: DEFAULT_DRAIN,
            idle: None,
        }
    }

    /// Closes a connection gracefully once no request has been in flight on it for `idle`
    /// (a response body still being written counts as idle: the close waits for it). Default:
    /// never (a client's keep-alive connection stays open until it closes it). A timeout
    /// beyond a year is taken as a year.
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle = Some(idle.min(MAX_IDLE));
        self
    }

    /// How long open connections may take to finish after shutdown, before the rest are
    /// dropped.
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Serves `service` on every connection of `incoming`, as [`serve_http`] does.
    pub async fn serve<IO, S, B>(&self, incoming: Incoming<IO>, service: S)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: tower_service::Service<
                Request<IncomingBody>,
                Response = Response<B>,
                Error = Infallible,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let shutdown = incoming.cancellation_token().clone();
        let idle_timeout = self.idle;
        // Each connection is served in the task that made its handshake.
        let connections = incoming
            .spawn_each(move |conn| {
                let peer = conn.peer_addr();
                let info = conn.info();
                let close = conn.close_signal();
                // This closure is a clone of its own, called once: `service` and `shutdown`
                // are this connection's.
                let activity = idle_timeout.map(|_| Arc::new(Activity::new()));
                let service = WithInfo {
                    inner: service,
                    info,
                    activity: activity.clone(),
                };
                async move {
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let served =
                        builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
                    let mut served = std::pin::pin!(served);
                    let idle = async {
                        match (activity, idle_timeout) {
                            (Some(activity), Some(timeout)) => activity.idle_for(timeout).await,
                            _ => std::future::pending().await,
                        }
                    };
                    let ended = tokio::select! {
                        ended = served.as_mut() => ended,
                        () = shutdown.cancelled() => {
                            served.as_mut().graceful_shutdown();
                            served.await
                        }
                        () = close => {
                            tracing::debug!(?peer, "closing the connection gracefully");
                            served.as_mut().graceful_shutdown();
                            served.await
                        }
                        () = idle => {
                            tracing::debug!(?peer, "idle: closing the connection gracefully");
                            served.as_mut().graceful_shutdown();
                            served.await
                        }
                    };
                    if let Err(err) = ended {
                        tracing::debug!(?peer, error = %err, "connection ended with an error");
                    }
                }
            })
            .await;
        if tokio::time::timeout(self.drain, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(drain = ?self.drain, "drain period over; dropping the remaining connections");
        }
    }
}

/// The longest [`HttpServer::idle_timeout`]: a year (so that no deadline overflows).
const MAX_IDLE: Duration = Duration::from_secs(365 * 24 * 3600);

/// What an idle timeout watches on one connection: requests in flight, and when the last one
/// began or ended.
struct Activity {
    start: tokio::time::Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Release);
    }

    /// Completes once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Acquire));
            // `timeout` is at most a year (`idle_timeout` clamps it): no overflow.
            let deadline = self.start + last + timeout;
            tokio::time::sleep_until(deadline).await;
            let last_now = Duration::from_millis(self.last.load(Ordering::Acquire));
            if self.in_flight.load(Ordering::Acquire) == 0 && last_now == last {
                return;
            }
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // Looked at again a timeout after this.
                self.touch();
            }
        }
    }
}

/// A request in flight on a connection with an idle timeout.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.touch();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The service of one connection: each request gets the connection's [`TlsInfo`].
struct WithInfo<S> {
    inner: S,
    info: TlsInfo,
    activity: Option<Arc<Activity>>,
}

impl<S> fmt::Debug for WithInfo<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithInfo")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl<S, B> hyper::service::Service<Request<IncomingBody>> for WithInfo<S>
where
    S: tower_service::Service<Request<IncomingBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response<B>, Infallible>>;

    fn call(&self, mut request: Request<IncomingBody>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        let mut inner = self.inner.clone();
        let in_flight = self.activity.clone().map(InFlight::new);
        Box::pin(async move {
            let _in_flight = in_flight;
            futures::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        })
    }
}
