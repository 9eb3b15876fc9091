//! [`AcmeLayer`]: an HTTPS layer in front of Pebble adding what Pebble lacks (ARI,
//! `alreadyReplaced`, rate limits, a damaged certificate) and holding a request on demand.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::Pebble;

/// What [`AcmeLayer`] adds to Pebble's answers.
#[derive(Debug, Default)]
struct Faults {
    /// ARI: the suggested window and the `Retry-After` of its answer.
    ari: Option<(std::time::SystemTime, std::time::SystemTime, Duration)>,
    already_replaced: bool,
    rate_limit_next_order: Option<Duration>,
    damage_next_certificate: bool,
    orders_replacing: usize,
    /// The profiles the directory advertises (draft-ietf-acme-profiles); none: no `profiles`.
    profiles: Option<Vec<String>>,
    /// Each new order's `profile`, in order.
    order_profiles: Vec<Option<String>>,
    renewal_info_requests: usize,
    /// Every request the layer answered or forwarded.
    requests: usize,
    /// The next request whose path starts with this is held: never answered (and, unless
    /// the flag says it is forwarded first, never forwarded).
    hold: Option<(String, bool)>,
    held: usize,
    /// Every connection is closed as it is accepted, as a CA that is down.
    unreachable: bool,
}

/// A small HTTPS layer in front of [`Pebble`] adding what Pebble 2.4 lacks: ARI
/// (`renewalInfo`, RFC 9773), `alreadyReplaced`, a `rateLimited` 429 with `Retry-After`, and a
/// malformed certificate. Everything else is forwarded as is, with the client's `Host`, so
/// the URLs Pebble writes point back at the layer. Its own answers carry a fresh
/// `Replay-Nonce` taken from Pebble, or the client's next request would fail with badNonce.
pub struct AcmeLayer {
    addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for AcmeLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcmeLayer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for AcmeLayer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Pebble {
    /// Starts an [`AcmeLayer`] in front of this Pebble (its HTTPS certificate from the same
    /// CA, so [`https_ca_der`](Self::https_ca_der) is trusted for both).
    ///
    /// # Panics
    /// If it cannot listen.
    pub async fn layer(&self) -> AcmeLayer {
        let leaf = self.https_ca.leaf(&["localhost", "127.0.0.1"]);
        let provider = crate::provider();
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.cert_der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf.key_der.clone().into()),
            )
            .expect("the layer's certificate");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.https_ca.cert_der()).expect("a CA");
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("a port for the layer");
        let addr = listener.local_addr().expect("its address");
        let faults = Arc::new(Mutex::new(Faults::default()));
        let forward = Forward {
            pebble: self.listen,
            client: Arc::new(client),
            faults: Arc::clone(&faults),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                if forward
                    .faults
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unreachable
                {
                    drop(tcp);
                    continue;
                }
                let (acceptor, forward) = (acceptor.clone(), forward.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        let forward = forward.clone();
                        async move {
                            // Down: an open connection is cut at its next request.
                            if forward
                                .faults
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .unreachable
                            {
                                return Err(io::Error::new(
                                    io::ErrorKind::ConnectionReset,
                                    "the CA is down",
                                ));
                            }
                            Ok(forward.handle(request).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        AcmeLayer { addr, faults, task }
    }
}

impl AcmeLayer {
    /// The directory URL through the layer.
    pub fn directory_url(&self) -> String {
        format!("https://localhost:{}/dir", self.addr.port())
    }

    /// Offers ARI: the directory gains `renewalInfo`, and every certificate's suggested window
    /// is `start..end`, to be asked again after `retry_after`.
    pub fn offer_ari(
        &self,
        start: std::time::SystemTime,
        end: std::time::SystemTime,
        retry_after: Duration,
    ) {
        self.faults().ari = Some((start, end, retry_after));
    }

    /// Advertises the profiles `names` in the directory's `meta` (what Pebble 2.4 lacks); a new
    /// order asking for another is refused with `invalidProfile`.
    pub fn advertise_profiles(&self, names: &[&str]) {
        self.faults().profiles = Some(names.iter().map(|n| (*n).to_owned()).collect());
    }

    /// The `profile` each new order asked for, in the order they came (`None`: none asked).
    pub fn order_profiles(&self) -> Vec<Option<String>> {
        self.faults().order_profiles.clone()
    }

    /// A new order that says it `replaces` a certificate is answered `alreadyReplaced` (409).
    pub fn answer_already_replaced(&self, on: bool) {
        self.faults().already_replaced = on;
    }

    /// The next new order is answered `rateLimited` (429) with `Retry-After: retry_after`.
    pub fn rate_limit_next_order(&self, retry_after: Duration) {
        self.faults().rate_limit_next_order = Some(retry_after);
    }

    /// The next certificate downloaded is cut short (malformed PEM).
    pub fn damage_next_certificate(&self) {
        self.faults().damage_next_certificate = true;
    }

    /// Holds the next request whose path starts with `prefix` (Pebble's paths: `/order-plz`,
    /// `/chalZ/`, `/finalize-order/`, `/certZ/`): it is never answered, so its client waits
    /// there, as a process killed at that point would. With `forward`, Pebble gets and
    /// acts on the request first (the client never learns the answer); without, Pebble never
    /// sees it. Later requests pass.
    pub fn hold_next(&self, prefix: &str, forward: bool) {
        let mut faults = self.faults();
        faults.hold = Some((prefix.to_owned(), forward));
        faults.held = 0;
    }

    /// Waits until the request [`hold_next`](Self::hold_next) named is held (forwarded ones
    /// once Pebble has acted on them).
    ///
    /// # Panics
    /// After [`PATIENCE`](crate::PATIENCE) times three without one.
    pub async fn until_held(&self) {
        let deadline = tokio::time::Instant::now() + crate::PATIENCE * 3;
        while self.faults().held == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no request was held: {:?}",
                self.faults().hold
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// While `down`, every connection is closed as soon as it is accepted, and one already open
    /// at its next request, with no answer (nothing reaches Pebble): to a client, the CA is
    /// down.
    pub fn set_unreachable(&self, down: bool) {
        self.faults().unreachable = down;
    }

    /// New orders seen that said they replace a certificate.
    pub fn orders_replacing(&self) -> usize {
        self.faults().orders_replacing
    }

    /// `renewalInfo` requests answered.
    pub fn renewal_info_requests(&self) -> usize {
        self.faults().renewal_info_requests
    }

    /// Every request that reached the layer so far (the directory, nonces, orders, polls):
    /// what a client costs the CA.
    pub fn requests(&self) -> usize {
        self.faults().requests
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type LayerResponse = hyper::Response<http_body_util::Full<bytes::Bytes>>;

#[derive(Clone)]
struct Forward {
    pebble: SocketAddr,
    client: Arc<rustls::ClientConfig>,
    faults: Arc<Mutex<Faults>>,
}

impl Forward {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn handle(&self, request: hyper::Request<hyper::body::Incoming>) -> LayerResponse {
        use http_body_util::BodyExt as _;
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        let path = parts.uri.path().to_owned();
        self.faults().requests += 1;
        let host = parts
            .headers
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost")
            .to_owned();
        if path.starts_with("/renewal-info/") {
            return self.renewal_info().await;
        }
        let hold = {
            let mut faults = self.faults();
            match faults.hold.take() {
                Some((prefix, forward)) if path.starts_with(&prefix) => Some(forward),
                other => {
                    faults.hold = other;
                    None
                }
            }
        };
        if let Some(forward) = hold {
            if forward {
                let request = hyper::Request::from_parts(parts, http_body_util::Full::new(body));
                let _ = self.forward(request).await;
            }
            // Held only now: a forwarded request has been acted on by Pebble, so a client
            // killed from here on cannot take it back.
            self.faults().held += 1;
            return std::future::pending().await;
        }
        if path == "/order-plz" {
            let payload = jws_payload(&body);
            let replaces = payload
                .as_ref()
                .is_some_and(|p| p.get("replaces").is_some());
            let profile = payload
                .as_ref()
                .and_then(|p| p.get("profile"))
                .and_then(|p| p.as_str())
                .map(str::to_owned);
            let (limited, already, unknown_profile) = {
                let mut faults = self.faults();
                if replaces {
                    faults.orders_replacing += 1;
                }
                faults.order_profiles.push(profile.clone());
                let unknown = profile.filter(|p| {
                    !faults
                        .profiles
                        .as_ref()
                        .is_some_and(|advertised| advertised.contains(p))
                });
                (
                    faults.rate_limit_next_order.take(),
                    replaces && faults.already_replaced,
                    unknown,
                )
            };
            if let Some(profile) = unknown_profile {
                return self
                    .problem(
                        400,
                        "invalidProfile",
                        &format!("the profile {profile} is not offered (the test layer)"),
                        None,
                    )
                    .await;
            }
            if let Some(wait) = limited {
                return self
                    .problem(
                        429,
                        "rateLimited",
                        "too many new orders (the test layer)",
                        Some(wait),
                    )
                    .await;
            }
            if already {
                return self
                    .problem(
                        409,
                        "alreadyReplaced",
                        "the certificate was already replaced (the test layer)",
                        None,
                    )
                    .await;
            }
        }
        let mut response = match self
            .forward(hyper::Request::from_parts(
                parts,
                http_body_util::Full::new(body),
            ))
            .await
        {
            Ok(response) => response,
            Err(e) => {
                return hyper::Response::builder()
                    .status(502)
                    .body(http_body_util::Full::new(bytes::Bytes::from(e.to_string())))
                    .unwrap_or_default();
            }
        };
        let (ari, profiles) = {
            let faults = self.faults();
            (faults.ari.is_some(), faults.profiles.clone())
        };
        if path == "/dir" && (ari || profiles.is_some()) {
            let (parts, body) = response.into_parts();
            let mut directory: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or_default();
            if ari {
                directory["renewalInfo"] = format!("https://{host}/renewal-info/").into();
            }
            if let Some(profiles) = profiles {
                let described: serde_json::Map<String, serde_json::Value> = profiles
                    .into_iter()
                    .map(|p| {
                        let about = format!("the {p} profile (the test layer)");
                        (p, about.into())
                    })
                    .collect();
                directory["meta"]["profiles"] = described.into();
            }
            let body = serde_json::to_vec(&directory).unwrap_or_default();
            let mut parts = parts;
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
            response = hyper::Response::from_parts(parts, bytes::Bytes::from(body));
        }
        if path.starts_with("/certZ/") && std::mem::take(&mut self.faults().damage_next_certificate)
        {
            let (mut parts, body) = response.into_parts();
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
            response = hyper::Response::from_parts(parts, body.slice(..body.len() / 2));
        }
        response.map(http_body_util::Full::new)
    }

    /// Sends `request` to Pebble on a connection of its own.
    async fn forward(
        &self,
        request: hyper::Request<http_body_util::Full<bytes::Bytes>>,
    ) -> io::Result<hyper::Response<bytes::Bytes>> {
        use http_body_util::BodyExt as _;
        let tcp = TcpStream::connect(self.pebble).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(&self.client))
            .connect(
                ServerName::try_from("localhost").map_err(io::Error::other)?,
                tcp,
            )
            .await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(io::Error::other)?;
        tokio::spawn(connection);
        let response = sender
            .send_request(request)
            .await
            .map_err(io::Error::other)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
        Ok(hyper::Response::from_parts(parts, body))
    }

    /// A fresh nonce from Pebble, for an answer of the layer's own.
    async fn nonce(&self) -> Option<hyper::header::HeaderValue> {
        let request = hyper::Request::head("/nonce-plz")
            .header(hyper::header::HOST, "localhost")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .ok()?;
        let response = self.forward(request).await.ok()?;
        response.headers().get("replay-nonce").cloned()
    }

    async fn problem(
        &self,
        status: u16,
        kind: &str,
        detail: &str,
        retry_after: Option<Duration>,
    ) -> LayerResponse {
        let body = serde_json::json!({
            "type": format!("urn:ietf:params:acme:error:{kind}"),
            "detail": detail,
            "status": status,
        });
        let mut response = hyper::Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, "application/problem+json");
        if let Some(nonce) = self.nonce().await {
            response = response.header("replay-nonce", nonce);
        }
        if let Some(wait) = retry_after {
            response = response.header(hyper::header::RETRY_AFTER, wait.as_secs().to_string());
        }
        response
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap_or_default()
    }

    async fn renewal_info(&self) -> LayerResponse {
        let window = {
            let mut faults = self.faults();
            faults.renewal_info_requests += 1;
            faults.ari
        };
        let Some((start, end, retry_after)) = window else {
            return hyper::Response::builder()
                .status(404)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap_or_default();
        };
        let rfc3339 = |t: std::time::SystemTime| {
            time::OffsetDateTime::from(t)
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        };
        let body = serde_json::json!({
            "suggestedWindow": { "start": rfc3339(start), "end": rfc3339(end) },
        });
        hyper::Response::builder()
            .status(200)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::RETRY_AFTER,
                retry_after.as_secs().to_string(),
            )
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap_or_default()
    }
}

/// The JSON payload of a JWS request body (flattened JSON serialization).
fn jws_payload(body: &[u8]) -> Option<serde_json::Value> {
    use base64::Engine as _;
    let jws: serde_json::Value = serde_json::from_slice(body).ok()?;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(jws.get("payload")?.as_str()?)
        .ok()?;
    serde_json::from_slice(&payload).ok()
}
