//! `--upstream`: a reverse proxy on hyper. Each request goes to the upstream over HTTP/1.1
//! (gRPC over h2c, so that its trailers pass), with the forwarded headers set and every
//! client-sent one removed; a WebSocket upgrade is passed through as bytes once the upstream
//! agrees.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tls_rotation::TlsInfo;

use super::Stream;
use crate::cli::{HttpProxy, Upstream};

type BoxError = Box<dyn StdError + Send + Sync>;
/// What the proxy answers with: the upstream's body, or one of its own.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;
/// What the proxy sends upstream: the client's body, limited.
type UpBody = Limited<Incoming>;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The headers a client may not set: the proxy sets them (or nobody does). Names, not text, so
/// that no request parses them again.
const FORWARDING: [HeaderName; 6] = [
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_CLIENT_CERT,
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    header::FORWARDED,
];

/// Hop-by-hop headers (RFC 9110 7.6.1, and the ones of old proxies): never passed on.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The proxy service, one for every connection.
#[derive(Clone)]
pub(crate) struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    http1: Client<Connector, UpBody>,
    h2c: Client<Connector, UpBody>,
    upstream: Upstream,
    /// The authority of the URIs sent upstream.
    authority: Authority,
    request_timeout: Duration,
    max_body: u64,
}

/// Makes connections to the upstream for hyper-util's pool.
#[derive(Clone)]
struct Connector(Arc<Upstream>);

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<TokioIo<Stream>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let upstream = Arc::clone(&self.0);
        Box::pin(async move { upstream.connect().await.map(TokioIo::new) })
    }
}

impl Proxy {
    pub(crate) fn new(options: &HttpProxy) -> Self {
        let connector = Connector(Arc::new(options.upstream.clone()));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(90));
        let http1 = builder.clone().build(connector.clone());
        let h2c = builder.http2_only(true).build(connector);
        let authority = match &options.upstream {
            Upstream::Tcp(addr) => Authority::try_from(addr.as_str()).ok(),
            Upstream::Unix(_) => None,
        }
        .unwrap_or_else(|| Authority::from_static("localhost"));
        Self {
            inner: Arc::new(Inner {
                http1,
                h2c,
                upstream: options.upstream.clone(),
                authority,
                request_timeout: options.request_timeout,
                max_body: options.max_request_body,
            }),
        }
    }
}

impl tower_service::Service<Request<Incoming>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { Ok(inner.forward(request).await) })
    }
}

impl Inner {
    async fn forward(&self, mut request: Request<Incoming>) -> Response<Body> {
        let too_large = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|length| length > self.max_body);
        if too_large {
            return answer(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        }
        let info = request.extensions().get::<TlsInfo>().cloned();
        let upgrade = is_upgrade(&request);
        let grpc = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));

        let (mut parts, body) = request.into_parts();
        // The client's host: HTTP/2 carries it in the URI (:authority).
        if !parts.headers.contains_key(header::HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, host);
        }
        let mut uri = std::mem::take(&mut parts.uri).into_parts();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        if uri.path_and_query.is_none() {
            uri.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        parts.uri = match Uri::from_parts(uri) {
            Ok(uri) => uri,
            Err(_) => return answer(StatusCode::BAD_REQUEST, "bad request target\n"),
        };
        strip_hop_by_hop(&mut parts.headers, upgrade, &FORWARDING);
        if grpc {
            // gRPC needs `te: trailers` on the way to its server.
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        set_forwarded(&mut parts.headers, info.as_ref());
        parts.version = if grpc {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let outbound = Request::from_parts(parts, Limited::new(body, saturating(self.max_body)));
        let client = if grpc { &self.h2c } else { &self.http1 };

        let mut response = match tokio::time::timeout(
            self.request_timeout,
            client.request(outbound),
        )
        .await
        {
            Ok(Ok(response)) => response,
            Ok(Err(err)) if limit_exceeded(&err) => {
                return answer(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
            }
            Ok(Err(err)) => {
                tracing::warn!(upstream = %self.upstream, error = %chain(&err), "the upstream failed: answered 502");
                return answer(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
            }
            Err(_) => {
                tracing::warn!(upstream = %self.upstream, timeout = ?self.request_timeout, "the upstream did not answer in time: answered 504");
                return answer(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
            }
        };
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let (true, Some(client_upgrade)) = (switching, client_upgrade) {
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        let (mut client, mut upstream) =
                            (TokioIo::new(client), TokioIo::new(upstream));
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    Err(err) => tracing::debug!(error = %err, "an upgrade did not complete"),
                }
            });
        }
        strip_hop_by_hop(response.headers_mut(), switching, &[]);
        response.map(|body| body.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
    }
}

/// An HTTP/1.1 request to switch protocols (a WebSocket): `Connection: upgrade` and `Upgrade`.
fn is_upgrade<B>(request: &Request<B>) -> bool {
    request.version() == Version::HTTP_11
        && request.headers().contains_key(header::UPGRADE)
        && connection_tokens(request.headers()).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes the hop-by-hop headers, those `Connection` names, and `also`; with `upgrade`, keeps
/// `Connection: upgrade` and `Upgrade`. One pass over the few names present, then a removal
/// only for those found (most requests carry none of them).
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool, also: &[HeaderName]) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter(|t| !(upgrade && t.eq_ignore_ascii_case("upgrade")))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    let found: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            HOP_BY_HOP.contains(name)
                || also.contains(name)
                || named.contains(name)
                || (!upgrade && *name == header::UPGRADE)
        })
        .cloned()
        .collect();
    for name in found {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// `X-Forwarded-For` (the client's address), `X-Forwarded-Proto: https` and, with a client
/// certificate, `X-Forwarded-Client-Cert` in Envoy's format.
fn set_forwarded(headers: &mut HeaderMap, info: Option<&TlsInfo>) {
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    let Some(info) = info else { return };
    if let Some(peer) = info.peer_addr
        && let Ok(value) = HeaderValue::try_from(peer.ip().to_string())
    {
        headers.insert(X_FORWARDED_FOR, value);
    }
    // Parsed once per connection, not per request.
    if let Some(client) = info.client_identity()
        && let Some(value) = xfcc(client)
    {
        headers.insert(X_FORWARDED_CLIENT_CERT, value);
    }
}

/// Envoy's `X-Forwarded-Client-Cert` element for a client certificate:
/// `Hash=<SHA-256 hex>;Subject="<subject>";URI=<uri>;DNS=<name>` (a `URI` or `DNS` pair
/// for each SAN of that kind).
pub(crate) fn xfcc(client: &tls_rotation::ClientIdentity) -> Option<HeaderValue> {
    let mut value = format!("Hash={};Subject={}", client.digest, quoted(&client.subject));
    for uri in &client.uris {
        let _ = write!(value, ";URI={}", maybe_quoted(uri));
    }
    for dns in &client.dns_names {
        let _ = write!(value, ";DNS={}", maybe_quoted(dns));
    }
    HeaderValue::from_str(&value).ok()
}

fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn maybe_quoted(value: &str) -> String {
    if value.contains([',', ';', '=', '"']) {
        quoted(value)
    } else {
        value.to_owned()
    }
}

fn answer(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Whether the request failed because its body went over the limit.
fn limit_exceeded(err: &(dyn StdError + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(err) = source {
        if err.is::<LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// An error and its sources, one line.
fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        let _ = write!(text, ": {err}");
        source = err.source();
    }
    text
}

fn saturating(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers, false, &FORWARDING);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn an_upgrade_keeps_its_upgrade_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        strip_hop_by_hop(&mut headers, true, &[]);
        assert_eq!(headers[header::CONNECTION], "upgrade");
        assert_eq!(headers[header::UPGRADE], "websocket");
    }

    #[test]
    fn xfcc_is_envoys_format() {
        let ca = tls_test::TestCa::new("xfcc");
        let leaf = ca.uri_client_leaf("web", &["spiffe://example.org/ns/prod/sa/web"]);
        let client = tls_rotation::ClientIdentity::parse(&leaf.cert_der).unwrap();
        let value = xfcc(&client).unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            format!(
                "Hash={};Subject=\"CN=web\";URI=spiffe://example.org/ns/prod/sa/web",
                leaf.fingerprint
            )
        );
        assert_eq!(quoted(r#"CN=a "b"\"#), r#""CN=a \"b\"\\""#);
    }
}
