//! [`Incoming`]: a stream of established TLS connections from a listener, served with the
//! reloader's certificates; [`TlsConnection`], one of them.
//!
//! # How it works
//!
//! Feature `accept`, default; here rather than a crate of its own because it is the
//! reloader's serving half and needs nothing the reloader does not already have but
//! tokio-rustls): `Incoming`, a `Stream` of established `TlsConnection`s from a `TcpListener` or
//! any stream of IO: until `Reloader::ready` accepts and closes each connection at once (the
//! client fails fast; one warn line), then runs each handshake as a task of its own in a
//! `JoinSet` (time-out 10 s, at most 1,024 at once), skips per-connection accept errors
//! and pauses with backoff (10 ms to 1 s) on others (EMFILE), ends on the reloader's token or its
//! own; `axum::serve::Listener` (feature `axum`) and tonic's `Connected` (feature `tonic`).
//! `Incoming::spawn_each(handler)` takes the same connections without the stream's hand-off:
//! each handshake's task goes on to run a clone of `handler` on its connection (no wake of the
//! accepting task, no second task); the slots are a counter whose last release wakes the
//! accepting task only while they are full; handshakes in progress end on a child of the token
//! (also cancelled if `spawn_each` is dropped), and it returns a closed `TaskTracker` of the
//! connections still open, for a drain.
//! Opt-in recycling (`recycle_after`): each connection notes what the resolver served it, and
//! `TlsConnection::recycle_signal` fires once that changed and the connection is old enough; the
//! server calls hyper's `graceful_shutdown` (the `serve` example's `--recycle-after`).
//! `connection.rs`: with client authentication each `TlsConnection` follows the trust: a
//! `Lifetime` future, polled from the connection's own reads and writes (so it needs no task and
//! holds under `axum::serve`) but only when its own waker fired (a read costs two atomics, not a
//! poll of the trust watch every connection shares), waits for the verifier `TrustConfig` publishes after each removal
//! of a CA, verifies the client's chain again, and if it fails (a trust close) ends the reads
//! (HTTP/2 at once; otherwise, by the `Lifetime`'s `Drain`, so a connection that follows no trust does no such work, once nothing was written for `HTTP1_QUIET` and no
//! request is half answered, so hyper's HTTP/1.1 finishes its response and closes), fires
//! `close_signal` (graceful) and, after `close_grace`, fails every read and write. `TlsInfo` is what handlers read (peer, SNI,
//! ALPN, client chain): axum `ConnectInfo`, tonic's connect info, request extensions.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::task::AtomicWaker;
use futures::{FutureExt as _, Stream, StreamExt as _};
use tls_source::Backoff;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use tokio::sync::watch;

mod builder;
mod connection;

pub use builder::IncomingBuilder;
use connection::{Follow, Lifetime, Recycle};
pub use connection::{HTTP1_QUIET, TlsConnection, TlsInfo};

use crate::{CertResolver, NotReady, Reloader, Status};

/// The default [`IncomingBuilder::handshake_timeout`]: 10 seconds.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`IncomingBuilder::close_grace`]: 10 seconds.
pub const DEFAULT_CLOSE_GRACE: Duration = Duration::from_secs(10);

/// The default [`IncomingBuilder::max_handshakes`]: 1,024 handshakes in progress at once.
pub const DEFAULT_MAX_HANDSHAKES: usize = 1024;

/// The first and the longest pause after an accept error that is not about one connection
/// (out of file descriptors, out of memory).
const ACCEPT_BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A stream of established TLS connections, for any server: `while let Some(Ok(conn)) =
/// incoming.next().await`, `axum::serve(incoming, app)` (feature `axum`), or tonic's
/// `serve_with_incoming_shutdown(incoming, ..)` (feature `tonic`). Made by
/// [`Reloader::incoming`] or [`Incoming::builder`].
///
/// - **Nothing served before a certificate.** Until [`Reloader::ready`] (a certificate
///   installed, and every keyed source's initial list in), each connection is accepted and
///   closed at once (logged once, at warn level), so a client fails fast instead of hanging in a handshake that cannot complete
///   until its own time-out. If the reloader stops before any certificate was installed,
///   the stream ends (and says why, at error level).
/// - **Handshakes a hook takes over** ([`HandshakeHook::take_over`](crate::HandshakeHook::take_over):
///   an ACME CA's TLS-ALPN-01 validation): with such a hook, each `ClientHello` is read
///   first and offered to it; what it takes gets the hook's certificate and ALPN protocol
///   alone, then the connection is closed (never yielded). These are answered before ready
///   too, when every other handshake fails with an alert.
/// - **Handshakes in parallel** (each a task of its own, on every worker thread), **each with a
///   time-out** ([`handshake_timeout`], default 10 s), at
///   most [`max_handshakes`] at once (default 1,024; while that many are in progress, new
///   connections wait in the backlog). A client that never sends its `ClientHello` holds a
///   slot and a descriptor only until its time-out. A failed handshake is logged at debug
///   level and skipped: the stream yields only established connections.
/// - **Accept errors are survived.** Errors about one connection (reset or aborted before it
///   was accepted) are skipped; others (out of file descriptors, `EMFILE`/`ENFILE`) pause
///   accepting with backoff (10 ms, doubling, at most 1 s), logged once per episode, and
///   accepting resumes when descriptors come back.
/// - **Ends on the cancellation token**: the reloader's (its builder's token, or
///   [`Reloader::stop`]) unless [`cancellation_token`] gives another. Handshakes in progress
///   are dropped; connections already yielded are the server's to finish.
/// - ALPN: `h2` and `http/1.1` by default ([`alpn`] changes it).
/// - With client authentication ([`Builder::client_auth`](crate::Builder::client_auth)), each
///   connection gets the config current when it comes
///   ([`Reloader::current_server_config`]), so the trusted client CAs rotate; `alpn` and
///   `server_config` do not apply then (see [`ClientAuth::configure`](crate::ClientAuth::configure)).
///
/// The item is `Result<_, Infallible>` so the stream fits APIs that take a stream of results
/// (tonic); no error is ever yielded, so `let Ok(conn) = item;` needs no error handling.
///
/// [`handshake_timeout`]: IncomingBuilder::handshake_timeout
/// [`max_handshakes`]: IncomingBuilder::max_handshakes
/// [`cancellation_token`]: IncomingBuilder::cancellation_token
/// [`alpn`]: IncomingBuilder::alpn
///
/// # Example
/// ```no_run
/// use futures::StreamExt as _;
/// use tls_reload::Reloader;
/// use tls_source::FileSource;
/// use tokio::io::AsyncWriteExt as _;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let reloader = Reloader::spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8443").await?;
/// let mut incoming = reloader.incoming(listener)?;
/// while let Some(Ok(mut conn)) = incoming.next().await {
///     tokio::spawn(async move {
///         let _ = conn.write_all(b"hello\n").await;
///         let _ = conn.shutdown().await;
///     });
/// }
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Incoming<IO> {
    accept: BoxStream<'static, io::Result<(IO, Option<SocketAddr>)>>,
    accept_ended: bool,
    local_addr: Option<SocketAddr>,
    /// Each connection's own local address, when the connections are sockets: a handshake
    /// without a server name is served the IP certificate for it (see `CertResolver`).
    local_of: Option<fn(&IO) -> Option<SocketAddr>>,
    acceptor: Acceptor,
    takeovers: Option<Takeovers>,
    /// Each handshake is a task of its own, so handshakes use every worker thread; aborted
    /// when the stream is dropped or ends.
    handshakes: JoinSet<Option<TlsConnection<IO>>>,
    /// With [`Incoming::spawn_each`]: where handshakes go instead, each a task that goes on to
    /// serve its connection.
    detached: Option<Detached<IO>>,
    max_handshakes: usize,
    handshake_timeout: Duration,
    /// Until the first certificate is installed.
    ready: Option<BoxFuture<'static, Result<(), NotReady>>>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Accepting is paused after an accept error, until this fires.
    pause: Option<Pin<Box<Sleep>>>,
    backoff: Backoff,
    /// Whether the current accept-error episode was logged.
    said: bool,
    /// Connections closed because no certificate was installed yet.
    refused: u64,
    /// With recycling on: after how long, and what tells of a rotation.
    recycle: Option<(Duration, Arc<CertResolver>, watch::Receiver<Status>)>,
    /// With client authentication: what closes a connection whose client is no longer trusted.
    follow: Follow,
    token: CancellationToken,
}

/// One config for every connection, or (with client authentication) the one current when the
/// connection comes: the trusted client CAs change with the certificate.
enum Acceptor {
    Fixed(TlsAcceptor),
    PerConnection(Arc<arc_swap::ArcSwap<rustls::ServerConfig>>),
}

impl Acceptor {
    fn config(&self) -> Arc<rustls::ServerConfig> {
        match self {
            Self::Fixed(acceptor) => Arc::clone(acceptor.config()),
            Self::PerConnection(config) => config.load_full(),
        }
    }
}

/// With a [`HandshakeHook`](crate::HandshakeHook) that takes handshakes over: each
/// `ClientHello` is read first and offered to it; before the reloader is ready, what it does
/// not take fails with an alert.
#[derive(Clone)]
struct Takeovers {
    reloader: Reloader,
    refusing: Arc<rustls::ServerConfig>,
}

impl<IO> Incoming<IO> {
    /// The listener's local address (`None` for [`serve_stream`](IncomingBuilder::serve_stream)).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// How many handshakes are in progress.
    pub fn handshakes_in_progress(&self) -> usize {
        self.handshakes.len() + self.detached.as_ref().map_or(0, |d| d.room.in_progress())
    }

    /// Whether another handshake may start; if not, with `spawn_each`, `cx` is woken when one
    /// ends.
    fn has_room(&self, cx: &mut Context<'_>) -> bool {
        let Some(detached) = &self.detached else {
            return self.handshakes.len() < self.max_handshakes;
        };
        // Leftovers of the stream, started before `spawn_each`, count too; they end on their
        // own, and their end wakes the stream's poll.
        let max = self.max_handshakes.saturating_sub(self.handshakes.len());
        detached.room.has_room(cx, max)
    }

    /// The token that ends this stream: servers of its connections close them gracefully
    /// when it is cancelled.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }
}

impl Reloader {
    /// An [`Incoming`] stream of established TLS connections from `listener`, with the
    /// defaults (see [`Incoming::builder`] for the settings).
    ///
    /// # Errors
    /// If the reloader's provider supports no safe protocol version.
    pub fn incoming(&self, listener: TcpListener) -> Result<Incoming<TcpStream>, rustls::Error> {
        Incoming::builder(self).listen(listener)
    }
}

/// Whether an accept error concerns one connection only (then the next accept just goes on).
fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

impl<IO> Incoming<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Starts a handshake, in the stream's set or (with [`spawn_each`](Self::spawn_each)) as a
    /// task that goes on to serve the connection; `ready` is false before the reloader is
    /// ready, when only a hook that takes handshakes over may answer.
    fn handshake(&mut self, io: IO, peer: Option<SocketAddr>, ready: bool) {
        let handshake = self.handshake_future(io, peer, ready);
        match &self.detached {
            Some(detached) => detached.start(handshake),
            None => {
                self.handshakes.spawn(handshake);
            }
        }
    }

    /// A handshake with its time-out: the connection established, or `None` (failed, timed out
    /// or taken over; logged).
    fn handshake_future(
        &self,
        io: IO,
        peer: Option<SocketAddr>,
        ready: bool,
    ) -> impl Future<Output = Option<TlsConnection<IO>>> + Send + 'static {
        let config = self.acceptor.config();
        let local = self
            .local_of
            .and_then(|local_of| local_of(&io))
            .map(|addr| addr.ip().to_canonical());
        let takeovers = self.takeovers.clone();
        let timeout = self.handshake_timeout;
        let recycle = self.recycle.clone();
        let follow = self.follow.fresh();
        let accept = async move {
            let Some(takeovers) = takeovers else {
                return Ok(Some(TlsAcceptor::from(config).accept(io).await?));
            };
            let start =
                tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
                    .await?;
            if let Some(own) = takeovers.reloader.takeover_config(&start.client_hello()) {
                let mut stream = start.into_stream(own).await?;
                tracing::debug!(peer = ?peer, "a handshake taken over by the handshake hook; closing it");
                let _ = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await;
                return Ok(None);
            }
            if !ready {
                // Fails with an alert: nothing to serve yet.
                let _ = start.into_stream(takeovers.refusing).await;
                return Ok(None);
            }
            start.into_stream(config).await.map(Some)
        };
        let accept = async move {
            match local {
                Some(ip) => crate::on_local_addr(ip, accept).await,
                None => accept.await,
            }
        };
        async move {
            match tokio::time::timeout(timeout, accept).await {
                Ok(Ok(None)) => None,
                Ok(Ok(Some(stream))) => {
                    // A resumed session skipped the client certificate check: the trust now.
                    if let Err(err) = crate::reloader::verify_resumed(
                        follow.current.as_deref(),
                        stream.get_ref().1,
                    ) {
                        tracing::info!(peer = ?peer, error = %err, "a resumed client is no longer trusted; connection closed");
                        return None;
                    }
                    let recycle = recycle.map(|(age, resolver, status)| {
                        let server_name = stream.get_ref().1.server_name().map(str::to_owned);
                        Recycle {
                            age,
                            established: tokio::time::Instant::now(),
                            served: resolver.lookup_on(server_name.as_deref(), local),
                            server_name,
                            local,
                            resolver,
                            status,
                        }
                    });
                    let chain = stream.get_ref().1.peer_certificates().map(|chain| {
                        chain
                            .iter()
                            .map(|c| c.clone().into_owned())
                            .collect::<Vec<_>>()
                    });
                    let lifetime = chain.and_then(|chain| Lifetime::new(chain, follow, peer));
                    Some(TlsConnection {
                        stream,
                        peer,
                        recycle,
                        lifetime,
                    })
                }
                Ok(Err(err)) => {
                    tracing::debug!(peer = ?peer, error = %err, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::debug!(peer = ?peer, ?timeout, "TLS handshake timed out; connection dropped");
                    None
                }
            }
        }
    }

    /// Accepts while there is room for handshakes. Returns when accepting is paused (its timer
    /// armed), the listener ended, the handshakes are full, or the listener has nothing (its
    /// waker registered). Before the first certificate (`refuse`), closes what it accepts.
    fn poll_accept(&mut self, cx: &mut Context<'_>, refuse: bool) {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return;
                }
                self.pause = None;
            }
            if self.accept_ended || !self.has_room(cx) {
                return;
            }
            match self.accept.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok((io, peer)))) => {
                    if std::mem::take(&mut self.said) {
                        tracing::info!("accepting connections again");
                    }
                    self.backoff.reset();
                    if refuse {
                        if self.refused == 0 {
                            tracing::warn!(
                                ?peer,
                                "not ready (no certificate installed, or a route list still loading): closing connections until it is"
                            );
                        }
                        self.refused += 1;
                        if self.takeovers.is_some() {
                            // A hook may take it over (an ACME validation); else an alert.
                            self.handshake(io, peer, false);
                        } else {
                            drop(io);
                        }
                    } else {
                        self.handshake(io, peer, true);
                    }
                }
                Poll::Ready(Some(Err(err))) if is_connection_error(&err) => {
                    tracing::debug!(error = %err, "a connection failed before it was accepted");
                }
                Poll::Ready(Some(Err(err))) => {
                    let wait = self.backoff.next().unwrap_or(ACCEPT_BACKOFF_MAX);
                    if !std::mem::replace(&mut self.said, true) {
                        tracing::warn!(error = %err, "cannot accept connections; retrying with backoff");
                    }
                    self.pause = Some(Box::pin(tokio::time::sleep(wait)));
                }
                Poll::Ready(None) => self.accept_ended = true,
                Poll::Pending => return,
            }
        }
    }
}

impl<IO> Incoming<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Runs `handler` on every established connection, each in the task that made its
    /// handshake, until the stream ends; returns the tracker of those tasks, closed, so that
    /// the connections still open can be waited for (a drain).
    ///
    /// The same connections as the stream yields, under the same settings, in fewer steps: a
    /// connection the stream yields goes from its handshake's task to the task polling the
    /// stream, and then usually to a task of its own; here it stays where it is. That saves
    /// two wake-ups across threads per connection, about 2% of a loopback handshake
    /// (`benches/peer-compare --handshakes`). `http::serve_http` (feature `hyper`) serves
    /// through it.
    ///
    /// - When the token is cancelled, the handshakes in progress are dropped (as the stream
    ///   drops them) and this returns; the connections being served are `handler`'s to close
    ///   ([`cancellation_token`](Self::cancellation_token)).
    /// - When the listener ends, this returns; handshakes in progress go on, and their
    ///   connections are handled and tracked.
    /// - Dropping this future drops the handshakes in progress too.
    /// - `handler` is cloned as each handshake starts, and that clone is called once with
    ///   the connection, in the handshake's task (so it need not be `Sync`).
    /// - A handshake that panics drops its connection only (logged, as the stream logs it);
    ///   a `handler` that panics ends its own task only.
    /// - Connections whose handshakes the stream started before (if it was polled) are
    ///   handled too, each in a task of its own.
    ///
    /// ```no_run
    /// use tls_reload::Reloader;
    /// use tls_source::FileSource;
    /// use tokio::io::AsyncWriteExt as _;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let reloader = Reloader::spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8443").await?;
    /// let incoming = reloader.incoming(listener)?;
    /// let open = incoming
    ///     .spawn_each(|mut conn| async move {
    ///         let _ = conn.write_all(b"hello\n").await;
    ///         let _ = conn.shutdown().await;
    ///     })
    ///     .await;
    /// // The stream ended (its token was cancelled): give open connections 10 s to finish.
    /// let _ = tokio::time::timeout(std::time::Duration::from_secs(10), open.wait()).await;
    /// # Ok(()) }
    /// ```
    pub async fn spawn_each<F, Fut>(mut self, handler: F) -> TaskTracker
    where
        F: FnOnce(TlsConnection<IO>) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let tasks = TaskTracker::new();
        let stop = self.token.child_token();
        let dropped = stop.clone().drop_guard();
        let leftovers = handler.clone();
        let handler: Handler<IO> = Box::new(move || {
            let handler = handler.clone();
            Box::new(move |conn| handler(conn).boxed())
        });
        self.detached = Some(Detached {
            handler,
            room: Arc::default(),
            tasks: tasks.clone(),
            stop,
        });
        // The stream now yields only what it started before: each handshake since goes on in
        // its own task.
        while let Some(Ok(conn)) = self.next().await {
            tasks.spawn(leftovers.clone()(conn));
        }
        // Cancelled (the handshakes in progress are dropped with the token), or the listener
        // ended (they may still finish).
        dropped.disarm();
        tasks.close();
        tasks
    }
}

/// What [`Incoming::spawn_each`] runs on each connection: a copy of its handler for each
/// handshake, so that the handler need not be `Sync`.
type Handler<IO> = Box<dyn Fn() -> OnceHandler<IO> + Send>;
type OnceHandler<IO> = Box<dyn FnOnce(TlsConnection<IO>) -> BoxFuture<'static, ()> + Send>;

/// [`Incoming::spawn_each`]'s handshakes: each a task that goes on to serve its connection.
struct Detached<IO> {
    handler: Handler<IO>,
    room: Arc<Room>,
    tasks: TaskTracker,
    /// Ends the handshakes in progress: a child of the stream's token, also cancelled when
    /// `spawn_each` is dropped.
    stop: CancellationToken,
}

impl<IO: Send + 'static> Detached<IO> {
    fn start(&self, handshake: impl Future<Output = Option<TlsConnection<IO>>> + Send + 'static) {
        let handler = (self.handler)();
        let room = Arc::clone(&self.room);
        let stop = self.stop.clone();
        room.take();
        self.tasks.spawn(async move {
            let established = tokio::select! {
                biased;
                () = stop.cancelled() => None,
                done = AssertUnwindSafe(handshake).catch_unwind() => Some(done),
            };
            room.release();
            match established {
                Some(Ok(Some(conn))) => handler(conn).await,
                Some(Err(panic)) => handshake_panicked(panic.as_ref()),
                Some(Ok(None)) | None => {}
            }
        });
    }
}

/// How many of `spawn_each`'s handshakes are in progress, and the accepting task to wake when
/// one ends (registered only while there is no room).
#[derive(Default)]
struct Room {
    in_progress: AtomicUsize,
    waiter: AtomicWaker,
}

impl Room {
    fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::Acquire)
    }

    fn take(&self) {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
    }

    fn release(&self) {
        self.in_progress.fetch_sub(1, Ordering::AcqRel);
        self.waiter.wake();
    }

    /// Whether fewer than `max` are in progress; if not, `cx` is woken when one ends.
    fn has_room(&self, cx: &mut Context<'_>, max: usize) -> bool {
        if self.in_progress() < max {
            return true;
        }
        self.waiter.register(cx.waker());
        // One may have ended before the waker was in place.
        self.in_progress() < max
    }
}

/// A panic in one handshake (a resolver's, a verifier's, a `configure` hook's) drops that
/// connection only; accepting goes on.
fn handshake_panicked(panic: &(dyn std::any::Any + Send)) {
    let message = tls_source::panic_message(panic);
    tracing::error!(panic = %message, "a TLS handshake panicked; connection dropped, still accepting");
}

impl<IO> Stream for Incoming<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Item = Result<TlsConnection<IO>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.cancelled.as_mut().poll(cx).is_ready() {
            this.handshakes.abort_all();
            return Poll::Ready(None);
        }
        if let Some(ready) = this.ready.as_mut() {
            match ready.as_mut().poll(cx) {
                Poll::Ready(Err(err)) => {
                    tracing::error!(error = %err, "no certificate to serve; not accepting connections");
                    this.accept_ended = true;
                    this.ready = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(())) => {
                    this.ready = None;
                    if this.refused > 0 {
                        tracing::info!(
                            closed = this.refused,
                            "a certificate is installed: serving connections"
                        );
                    }
                }
                Poll::Pending => {
                    // Accepted and closed at once: a client fails fast, not at its time-out.
                    this.poll_accept(cx, true);
                    return Poll::Pending;
                }
            }
        }
        loop {
            this.poll_accept(cx, false);
            match this.handshakes.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Some(conn)))) => return Poll::Ready(Some(Ok(conn))),
                // Failed (logged): room for the next one.
                Poll::Ready(Some(Ok(None))) => {}
                Poll::Ready(Some(Err(err))) if err.is_panic() => {
                    handshake_panicked(err.into_panic().as_ref());
                }
                // Aborted: only on the way out.
                Poll::Ready(Some(Err(_))) => {}
                Poll::Ready(None) if this.accept_ended => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<IO> fmt::Debug for Incoming<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming")
            .field("local_addr", &self.local_addr)
            .field("handshakes_in_progress", &self.handshakes_in_progress())
            .field("ready", &self.ready.is_none())
            .finish_non_exhaustive()
    }
}

// ===== framework glue =====

#[cfg(feature = "axum")]
impl axum::serve::Listener for Incoming<TcpStream> {
    type Io = TlsConnection<TcpStream>;
    type Addr = SocketAddr;

    /// The next established connection. Once the stream has ended (cancelled), never
    /// returns: stop axum with its graceful shutdown on the same token.
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.next().await {
                Some(Ok(conn)) => {
                    if let Some(peer) = conn.peer {
                        return (conn, peer);
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.local_addr
            .ok_or_else(|| io::Error::other("the accept stream has no local address"))
    }
}
