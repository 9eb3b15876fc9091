//! [`TlsConnection`]: one established connection of an [`Incoming`](super::Incoming) stream,
//! its recycling signal, and tonic's `Connected` for it.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use tls_source::clock::SystemClock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::{CertResolver, Status};

/// An established TLS connection from an [`Incoming`](crate::Incoming) stream: read and write
/// it like the underlying IO.
///
/// With client authentication, the connection follows the trust that let it in: when a client
/// CA leaves the trusted set (its overlap ended), the client's chain is verified again against
/// the CAs trusted now, and if it fails (a *trust close*):
/// - its reads end (end of file): the server reads nothing more the client sends. Over HTTP/2
///   at once: the connection ends and its streams are cut. Over HTTP/1.1 (or no ALPN) once the
///   request being answered has its response: no further request is read, a response in
///   flight is finished (the reads end once the connection has written nothing for
///   [`HTTP1_QUIET`] and read nothing since its last flush), and the connection closes;
/// - [`close_signal`](Self::close_signal) fires, for servers that close gracefully on it;
/// - after the grace period ([`IncomingBuilder::close_grace`](crate::IncomingBuilder::close_grace),
///   default 10 s) every write fails too, so the server drops it whatever it is still writing
///   (a long download, a WebSocket).
///
/// This is in the connection itself, so it holds for `axum::serve`, hyper and tonic alike: the
/// accept stream cannot see request boundaries, so what it does is end the reads. Recycling
/// ([`recycle_signal`](Self::recycle_signal)) and shutdown stay graceful: they end nothing.
pub struct TlsConnection<IO> {
    pub(super) stream: TlsStream<IO>,
    pub(super) peer: Option<SocketAddr>,
    pub(super) recycle: Option<Recycle>,
    pub(super) lifetime: Option<Lifetime>,
}

/// After a trust close, an HTTP/1.1 connection's reads end once it has written nothing for this
/// long and read nothing since its last flush: its response in flight is done (a server writes
/// a response without pausing this long), and no request is half answered (the server, seeing
/// the end of the reads in the middle of one, would drop its response).
pub const HTTP1_QUIET: Duration = Duration::from_millis(100);

/// When the reads of an HTTP/1.1 connection end after a trust close (see [`HTTP1_QUIET`]). Part
/// of a [`Lifetime`]: a connection that follows no trust keeps no such state and does no work.
#[derive(Default)]
struct Drain {
    /// Bytes were read, and no write then flush has followed: a request is being answered.
    answering: bool,
    /// Written since `answering` was set.
    written: bool,
    /// After the trust close: the end of the quiet, pushed back by every write.
    quiet: Option<Pin<Box<tokio::time::Sleep>>>,
}

// ===== impl Drain =====

impl Drain {
    /// A write (or a flush that completed an answer): the answer to what was read has begun;
    /// after a trust close, the quiet starts again.
    fn wrote(&mut self) {
        self.written = self.answering;
        if let Some(quiet) = self.quiet.as_mut() {
            quiet
                .as_mut()
                .reset(tokio::time::Instant::now() + HTTP1_QUIET);
        }
    }

    /// A completed flush: whether it completed an answer (then a reader parked by a trust close
    /// may end after the quiet).
    fn flushed(&mut self) -> bool {
        if !self.written {
            return false;
        }
        self.answering = false;
        self.wrote();
        true
    }
}

/// When a connection must close: its client no longer trusted (or its certificate expired).
pub(super) struct Lifetime {
    /// Cancelled when the connection should close gracefully.
    closing: CancellationToken,
    /// Completes at the end of the grace period after `closing`; `None` once it has: every
    /// read and write fails from then on.
    deadline: Option<BoxFuture<'static, ()>>,
    /// After a trust close over HTTP/1.1: when the reads end.
    drain: Drain,
    /// Polled with `woken`'s waker, and only when that was woken (or first): a read does not
    /// re-poll the trust watch, whose registration takes a lock every connection shares.
    woken: Arc<Woken>,
}

/// Whether the deadline's waker was woken since it was last polled, and the connection's
/// current waker, woken with it.
#[derive(Default)]
struct Woken {
    woken: std::sync::atomic::AtomicBool,
    connection: futures::task::AtomicWaker,
}

impl std::task::Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::Release);
        self.connection.wake();
    }
}

/// What a connection's client is checked against, and when to close it.
#[derive(Clone)]
pub(super) struct Follow {
    /// The verifier after each removal of a CA.
    pub(super) revoked: Option<watch::Receiver<Arc<dyn ClientCertVerifier>>>,
    /// With authorization rules: changes on every change of them; the client is then checked
    /// again against `current`.
    pub(super) rules: Option<watch::Receiver<u64>>,
    /// The verifier in force: a resumed client is checked against it before it is served.
    pub(super) current: Option<Arc<arc_swap::ArcSwap<Arc<dyn ClientCertVerifier>>>>,
    /// Close at the client certificate's `notAfter`.
    pub(super) at_expiry: bool,
    pub(super) grace: Duration,
}

impl Follow {
    /// A copy for a connection about to shake hands: it has seen every change so far, since
    /// its handshake is checked against the trust and rules in force from now on; only later
    /// changes check it again.
    pub(super) fn fresh(&self) -> Self {
        let mut follow = self.clone();
        if let Some(revoked) = follow.revoked.as_mut() {
            revoked.borrow_and_update();
        }
        if let Some(rules) = follow.rules.as_mut() {
            rules.borrow_and_update();
        }
        follow
    }
}

impl Lifetime {
    /// The lifetime of a connection whose client presented `chain` (leaf first).
    pub(super) fn new(
        chain: Vec<CertificateDer<'static>>,
        follow: Follow,
        peer: Option<SocketAddr>,
    ) -> Option<Self> {
        if chain.is_empty() || (follow.revoked.is_none() && !follow.at_expiry) {
            return None;
        }
        let expiry = follow
            .at_expiry
            .then(|| tls_source::x509::LeafInfo::parse(&chain[0]).ok())
            .flatten()
            .map(|leaf| leaf.not_after);
        let closing = CancellationToken::new();
        let signal = closing.clone();
        let Follow {
            revoked,
            rules,
            current,
            grace,
            ..
        } = follow;
        let deadline = async move {
            let untrusted = async {
                let Some(mut revoked) = revoked else {
                    return std::future::pending().await;
                };
                let mut rules = rules;
                loop {
                    let verifier = tokio::select! {
                        changed = revoked.changed() => {
                            if changed.is_err() {
                                // The reloader is gone: the trust will not change again.
                                return std::future::pending().await;
                            }
                            Arc::clone(&revoked.borrow_and_update())
                        }
                        Some(()) = async {
                            match rules.as_mut() {
                                Some(rules) => rules.changed().await.ok(),
                                None => std::future::pending().await,
                            }
                        } => match &current {
                            Some(current) => Arc::clone(&**current.load()),
                            None => continue,
                        },
                    };
                    if let Err(err) =
                        verifier.verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
                    {
                        return format!("its client certificate is no longer trusted ({err})");
                    }
                }
            };
            let expired = async {
                match expiry {
                    // Any date a certificate can carry, the year 9999 included.
                    Some(at) => crate::task::sleep_until(at, &SystemClock).await,
                    None => std::future::pending().await,
                }
                "its client certificate expired".to_owned()
            };
            let why = tokio::select! {
                why = untrusted => why,
                why = expired => why,
            };
            tracing::info!(?peer, reason = %why, ?grace, "closing the connection: gracefully now, for good after the grace period");
            signal.cancel();
            tokio::time::sleep(grace).await;
            tracing::debug!(?peer, "grace period over: connection closed");
        };
        let woken = Arc::new(Woken::default());
        // Polled on the first read or write.
        woken
            .woken
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Some(Self {
            closing,
            deadline: Some(Box::pin(deadline)),
            drain: Drain::default(),
            woken,
        })
    }
}

/// What [`TlsConnection::recycle_signal`] watches.
#[derive(Clone)]
pub(super) struct Recycle {
    pub(super) age: Duration,
    pub(super) established: tokio::time::Instant,
    pub(super) server_name: Option<String>,
    /// The local address it arrived on, when known (what serves it without a server name).
    pub(super) local: Option<std::net::IpAddr>,
    /// What the connection was served (as the resolver answered right after the handshake).
    pub(super) served: Option<Arc<CertifiedKey>>,
    pub(super) resolver: Arc<CertResolver>,
    pub(super) status: watch::Receiver<Status>,
}

impl Recycle {
    fn rotated(&self) -> bool {
        let now = self
            .resolver
            .lookup_on(self.server_name.as_deref(), self.local);
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

    /// Completes when this connection should be closed gracefully: when
    /// [`recycle_signal`](Self::recycle_signal) does, or when its client is no longer trusted
    /// (its CA left the trusted set, or, with
    /// [`close_at_client_expiry`](crate::IncomingBuilder::close_at_client_expiry), its
    /// certificate expired). Closing is then up to the server (hyper's `graceful_shutdown`);
    /// a connection whose client is no longer trusted fails every read and write after the
    /// grace period anyway. `http::serve_http` (feature `hyper`) does all of this.
    pub fn close_signal(&self) -> impl Future<Output = ()> + Send + 'static + use<IO> {
        let recycle = self.recycle_signal();
        let closing = self.lifetime.as_ref().map(|l| l.closing.clone());
        async move {
            let untrusted = async {
                match closing {
                    Some(closing) => closing.cancelled_owned().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = recycle => {}
                () = untrusted => {}
            }
        }
    }

    /// Whether this connection's client is no longer trusted (see
    /// [`close_signal`](Self::close_signal)).
    pub fn is_closing(&self) -> bool {
        self.lifetime
            .as_ref()
            .is_some_and(|l| l.closing.is_cancelled())
    }

    /// What the connection's handlers may want to know: the peer, the server name, ALPN,
    /// the client's certificates ([`TlsInfo`]).
    pub fn info(&self) -> TlsInfo {
        TlsInfo {
            peer_addr: self.peer,
            server_name: self.server_name().map(Arc::from),
            alpn_protocol: self.alpn_protocol().map(Arc::from),
            peer_certificates: self.peer_certificates().map(Arc::from),
            identity: Arc::default(),
        }
    }

    /// After the grace period of a connection whose client is no longer trusted: the error
    /// every read and write returns. Otherwise registers the caller's waker, and polls the
    /// deadline if its own waker fired.
    fn closed(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let lifetime = self.lifetime.as_mut()?;
        if let Some(deadline) = lifetime.deadline.as_mut() {
            // Two atomics on a read; the deadline itself only when its waker fired.
            lifetime.woken.connection.register(cx.waker());
            if lifetime
                .woken
                .woken
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                let waker = std::task::Waker::from(Arc::clone(&lifetime.woken));
                if deadline
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
                {
                    lifetime.deadline = None;
                }
            }
        }
        lifetime.deadline.is_none().then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the client certificate of this connection is no longer trusted",
            )
        })
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
        if let Some(err) = self.closed(cx) {
            return Poll::Ready(Err(err));
        }
        let TlsConnection {
            stream, lifetime, ..
        } = &mut *self;
        let Some(lifetime) = lifetime else {
            return Pin::new(stream).poll_read(cx, buf);
        };
        if lifetime.closing.is_cancelled() {
            // A trust close: the reads end (nothing read, end of file), whatever the client
            // sends; the writes go on until the grace period is over.
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            return if h2 || lifetime.drained(cx) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        }
        let filled = buf.filled().len();
        let read = Pin::new(stream).poll_read(cx, buf);
        if buf.filled().len() > filled {
            lifetime.drain.answering = true;
        }
        read
    }
}

// ===== impl Lifetime =====

impl Lifetime {
    /// After a trust close over HTTP/1.1: whether the reads may end now (see [`HTTP1_QUIET`]);
    /// if not, `cx` is woken when they may.
    fn drained(&mut self, cx: &mut Context<'_>) -> bool {
        let quiet = self
            .drain
            .quiet
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(HTTP1_QUIET)));
        if self.drain.answering {
            // A request is being answered: its response's flush will wake the reader.
            self.woken.connection.register(cx.waker());
            return false;
        }
        quiet.as_mut().poll(cx).is_ready()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsConnection<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(err) = self.closed(cx) {
            return Poll::Ready(Err(err));
        }
        if let Some(lifetime) = self.lifetime.as_mut() {
            lifetime.drain.wrote();
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(err) = self.closed(cx) {
            return Poll::Ready(Err(err));
        }
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        if let Some(lifetime) = self.lifetime.as_mut()
            && flushed.is_ready()
            && lifetime.drain.flushed()
            && lifetime.closing.is_cancelled()
        {
            // An answer went out: the reader parked by the trust close may end after the quiet.
            lifetime.woken.connection.wake();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(err) = self.closed(cx) {
            return Poll::Ready(Err(err));
        }
        if let Some(lifetime) = self.lifetime.as_mut() {
            lifetime.drain.wrote();
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What a handler may want to know of its connection: made by [`TlsConnection::info`], put
/// in every request's extensions by `http::serve_http` (feature `hyper`), given to tonic
/// handlers (feature `tonic`: `request.extensions().get::<TlsInfo>()`) and to axum handlers
/// (feature `axum`: `ConnectInfo<TlsInfo>` with `into_make_service_with_connect_info`).
///
/// Reading the client certificate in an axum handler served by `axum::serve`:
/// ```no_run
/// # #[cfg(feature = "axum")]
/// # async fn run(reloader: tls_reload::Reloader) -> Result<(), Box<dyn std::error::Error>> {
/// use axum::extract::ConnectInfo;
/// use tls_reload::TlsInfo;
///
/// async fn whoami(ConnectInfo(tls): ConnectInfo<TlsInfo>) -> String {
///     match tls.peer_certificates.as_deref().and_then(|chain| chain.first()) {
///         Some(leaf) => format!("client certificate {}\n", tls_reload::tls_source::Digest::of(leaf)),
///         None => "no client certificate\n".into(),
///     }
/// }
///
/// let app = axum::Router::new().route("/", axum::routing::get(whoami));
/// let incoming = reloader.incoming(tokio::net::TcpListener::bind("0.0.0.0:8443").await?)?;
/// axum::serve(incoming, app.into_make_service_with_connect_info::<TlsInfo>()).await?;
/// # Ok(()) }
/// ```
/// With `http::serve_http` (feature `hyper`), take it from the request's extensions
/// (`axum::Extension<TlsInfo>`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct TlsInfo {
    /// The client's address, when the listener knows it.
    pub peer_addr: Option<SocketAddr>,
    /// The server name (SNI) the client asked for.
    pub server_name: Option<Arc<str>>,
    /// The ALPN protocol agreed on.
    pub alpn_protocol: Option<Arc<[u8]>>,
    /// The chain the client presented (with client authentication), leaf first.
    pub peer_certificates: Option<Arc<[CertificateDer<'static>]>>,
    /// The leaf's names, read on first use and shared by every clone (every request of the
    /// connection).
    identity: Arc<std::sync::OnceLock<Option<crate::ClientIdentity>>>,
}

impl TlsInfo {
    /// The names of the client's certificate (common name, DNS and URI SANs, digest): what
    /// authorization rules match and what a proxy forwards. Read once per connection, on first
    /// use; `None` without a client certificate (or one whose names cannot be read).
    pub fn client_identity(&self) -> Option<&crate::ClientIdentity> {
        self.identity
            .get_or_init(|| {
                let leaf = self.peer_certificates.as_deref()?.first()?;
                crate::ClientIdentity::parse(leaf).ok()
            })
            .as_ref()
    }
}

#[cfg(feature = "tonic")]
impl<IO> tonic::transport::server::Connected for TlsConnection<IO> {
    type ConnectInfo = TlsInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info()
    }
}

#[cfg(feature = "axum")]
impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, super::Incoming<tokio::net::TcpStream>>,
    > for TlsInfo
{
    fn connect_info(
        stream: axum::serve::IncomingStream<'_, super::Incoming<tokio::net::TcpStream>>,
    ) -> Self {
        stream.io().info()
    }
}
