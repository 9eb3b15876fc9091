//! [`IncomingBuilder`]: the settings of an [`Incoming`] stream, and how it starts (from a
//! listener, or from a stream of connections accepted elsewhere).

use super::*;

/// Configures an [`Incoming`]; made by [`Incoming::builder`].
#[must_use = "a builder does nothing until `listen` or `serve_stream` is called"]
pub struct IncomingBuilder {
    reloader: Reloader,
    config: Option<rustls::ServerConfig>,
    alpn: Vec<Vec<u8>>,
    handshake_timeout: Duration,
    max_handshakes: usize,
    token: Option<CancellationToken>,
    recycle_after: Option<Duration>,
    close_grace: Duration,
    close_at_client_expiry: bool,
}

impl fmt::Debug for IncomingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncomingBuilder")
            .field("alpn", &self.alpn)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_handshakes", &self.max_handshakes)
            .field("recycle_after", &self.recycle_after)
            .field("close_grace", &self.close_grace)
            .field("close_at_client_expiry", &self.close_at_client_expiry)
            .finish_non_exhaustive()
    }
}

impl IncomingBuilder {
    /// With client authentication: how long a connection whose client is no longer trusted
    /// (its CA left the trusted set) may go on writing (the response in flight) before every
    /// write on it fails too; its reads end at once (see [`TlsConnection`]). Default:
    /// [`DEFAULT_CLOSE_GRACE`]. `Duration::ZERO` closes at once.
    pub fn close_grace(mut self, grace: Duration) -> Self {
        self.close_grace = grace;
        self
    }

    /// With client authentication: also close each connection when its client certificate
    /// expires (gracefully, then for good after [`close_grace`](Self::close_grace)). Default:
    /// off (TLS checks expiry at the handshake only).
    pub fn close_at_client_expiry(mut self, close: bool) -> Self {
        self.close_at_client_expiry = close;
        self
    }

    /// Opt-in recycling of long-lived connections: once a newer certificate than the one a
    /// connection was served is installed, [`TlsConnection::recycle_signal`] fires for it when
    /// it is `age` old (at once if it is older), so the server can close it gracefully (hyper's
    /// `graceful_shutdown`: HTTP/2 GOAWAY, HTTP/1.1 `Connection: close`) and the client's next
    /// connection gets the new certificate. Off by default: the signal never fires.
    ///
    /// It needs a per-connection hook, which hyper has and `axum::serve` does not: serve axum
    /// through hyper-util (as the `serve` example does) to use it.
    pub fn recycle_after(mut self, age: Duration) -> Self {
        self.recycle_after = Some(age);
        self
    }

    /// How long a handshake may take, from accept to established. Default:
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// How many handshakes may be in progress at once; more connections wait in the listen
    /// backlog. Default: [`DEFAULT_MAX_HANDSHAKES`]. At least 1.
    pub fn max_handshakes(mut self, max: usize) -> Self {
        self.max_handshakes = max.max(1);
        self
    }

    /// The ALPN protocols offered, most preferred first. Default: `h2`, `http/1.1`. Empty for
    /// none (a client's ALPN is then ignored).
    pub fn alpn(mut self, protocols: impl IntoIterator<Item = impl Into<Vec<u8>>>) -> Self {
        self.alpn = protocols.into_iter().map(Into::into).collect();
        self
    }

    /// The `ServerConfig` to serve with, instead of [`Reloader::server_config`]: for protocol
    /// versions, session storage or key logging of your own. Put the reloader's resolver in it
    /// (`with_cert_resolver(reloader.resolver())`), or it will not rotate. Its
    /// `alpn_protocols` are replaced by [`alpn`](Self::alpn) unless that is set to empty.
    pub fn server_config(mut self, config: rustls::ServerConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// The token that ends the stream. Default: the reloader's own (cancelled with the token
    /// given to its builder, or by [`Reloader::stop`]).
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Accepts from a TCP listener.
    ///
    /// # Errors
    /// If the reloader's provider supports no safe protocol version.
    pub fn listen(self, listener: TcpListener) -> Result<Incoming<TcpStream>, rustls::Error> {
        let local_addr = listener.local_addr().ok();
        let accept = futures::stream::poll_fn(move |cx| {
            listener
                .poll_accept(cx)
                .map(|accepted| Some(accepted.map(|(tcp, peer)| (tcp, Some(peer)))))
        });
        let mut incoming = self.serve_stream(accept)?;
        incoming.local_addr = local_addr;
        incoming.local_of = Some(|tcp: &TcpStream| tcp.local_addr().ok());
        Ok(incoming)
    }

    /// Accepts from any stream of connections (a Unix socket listener, an in-memory duplex in
    /// tests): each item is a connection, or an accept error handled as
    /// [`Incoming`] describes.
    ///
    /// # Errors
    /// If the reloader's provider supports no safe protocol version.
    pub fn serve_stream<IO, S>(self, connections: S) -> Result<Incoming<IO>, rustls::Error>
    where
        S: Stream<Item = io::Result<(IO, Option<SocketAddr>)>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let acceptor = if let Some(shared) = self.reloader.tls_config() {
            // Client authentication: the reloader builds the configs (ALPN and the rest through
            // `ClientAuth::configure`).
            if self.config.is_some() {
                tracing::warn!(
                    "Incoming: server_config is ignored with client authentication; use ClientAuth::configure"
                );
            }
            Acceptor::PerConnection(shared)
        } else {
            let mut config = match self.config {
                Some(config) => config,
                None => self.reloader.server_config()?,
            };
            if !self.alpn.is_empty() {
                config.alpn_protocols = self.alpn;
            }
            Acceptor::Fixed(TlsAcceptor::from(Arc::new(config)))
        };
        let takeovers = if self.reloader.takes_over() {
            Some(Takeovers {
                reloader: self.reloader.clone(),
                refusing: self.reloader.refusing_config()?,
            })
        } else {
            None
        };
        let reloader = self.reloader.clone();
        let token = self.token.unwrap_or_else(|| self.reloader.token.clone());
        let cancelled = Box::pin(token.clone().cancelled_owned());
        Ok(Incoming {
            accept: connections.boxed(),
            accept_ended: false,
            local_addr: None,
            local_of: None,
            acceptor,
            takeovers,
            handshakes: JoinSet::new(),
            detached: None,
            max_handshakes: self.max_handshakes,
            handshake_timeout: self.handshake_timeout,
            ready: Some(async move { reloader.ready().await }.boxed()),
            cancelled,
            pause: None,
            backoff: Backoff::new(ACCEPT_BACKOFF_INITIAL, ACCEPT_BACKOFF_MAX),
            said: false,
            refused: 0,
            recycle: self
                .recycle_after
                .map(|age| (age, self.reloader.resolver(), self.reloader.status())),
            follow: Follow {
                revoked: self.reloader.revocations(),
                rules: self.reloader.rule_changes(),
                current: self.reloader.trust_now(),
                at_expiry: self.close_at_client_expiry,
                grace: self.close_grace,
            },
            token,
        })
    }
}

impl Incoming<TcpStream> {
    /// Starts configuring an accept stream served with `reloader`'s certificates.
    pub fn builder(reloader: &Reloader) -> IncomingBuilder {
        IncomingBuilder {
            reloader: reloader.clone(),
            config: None,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            token: None,
            recycle_after: None,
            close_grace: DEFAULT_CLOSE_GRACE,
            close_at_client_expiry: false,
        }
    }
}
