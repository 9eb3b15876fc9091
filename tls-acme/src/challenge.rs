//! Answering the CA's challenges: TLS-ALPN-01 in the handshake ([`Challenges`], a
//! `HandshakeHook` the reload core asks), HTTP-01 as a tower service ([`Http01`]), DNS-01
//! through a trait the user implements ([`Dns01Solver`]).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use rustls::crypto::CryptoProvider;
use rustls::server::ClientHello;
use rustls::sign::CertifiedKey;
use tls_reload::{HandshakeHook, Takeover};

/// The ALPN protocol of a TLS-ALPN-01 validation (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The challenge types this crate answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ChallengeType {
    /// TLS-ALPN-01 (RFC 8737), answered in the handshake on the TLS port (443): the
    /// accept stream hands the CA's `acme-tls/1` handshake to [`Challenges`]. The default.
    #[default]
    TlsAlpn01,
    /// HTTP-01, answered on port 80 by [`Http01`].
    Http01,
    /// DNS-01, answered by a [`Dns01Solver`] of yours; the only one for wildcard names.
    Dns01,
}

impl fmt::Display for ChallengeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TlsAlpn01 => "tls-alpn-01",
            Self::Http01 => "http-01",
            Self::Dns01 => "dns-01",
        })
    }
}

impl std::str::FromStr for ChallengeType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tls-alpn-01" => Ok(Self::TlsAlpn01),
            "http-01" => Ok(Self::Http01),
            "dns-01" => Ok(Self::Dns01),
            other => Err(format!(
                "unknown challenge type {other:?} (tls-alpn-01, http-01 or dns-01)"
            )),
        }
    }
}

/// The TLS-ALPN-01 responder: a [`HandshakeHook`] that takes over a handshake offering exactly
/// `acme-tls/1` for a name with a challenge in progress, and serves it the challenge
/// certificate (self-signed, with the critical acmeIdentifier extension), alone, before ready
/// too. A validation for a name without a challenge gets no certificate (the handshake fails
/// with an alert), never a real certificate. Give it to the reload core with
/// [`Builder::handshake_hook`](tls_reload::Builder::handshake_hook); an acceptor of your own
/// asks [`Reloader::takeover_config`](tls_reload::Reloader::takeover_config).
#[derive(Clone, Default)]
pub struct Challenges {
    inner: Arc<RwLock<HashMap<String, Arc<CertifiedKey>>>>,
}

impl Challenges {
    /// Publishes the challenge for `name` (the server name the validation sends: an IP
    /// address's reverse-mapping name for the address, RFC 8738): `digest` is the SHA-256 of
    /// the key authorization.
    pub(crate) fn present(
        &self,
        provider: &CryptoProvider,
        name: &str,
        digest: &[u8],
    ) -> Result<(), crate::Error> {
        let key = challenge_key(provider, name, digest)?;
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_ascii_lowercase(), key);
        Ok(())
    }

    /// Withdraws the challenge for `name`.
    pub(crate) fn clean_up(&self, name: &str) {
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&name.to_ascii_lowercase());
    }

    /// How many challenges are published now.
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no challenge is published now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this `ClientHello` is a TLS-ALPN-01 validation: it offers exactly
    /// `acme-tls/1`.
    pub fn is_validation(hello: &ClientHello<'_>) -> bool {
        hello.alpn().is_some_and(|mut offered| {
            offered.next() == Some(ACME_TLS_ALPN) && offered.next().is_none()
        })
    }
}

impl HandshakeHook for Challenges {
    fn answer(&self, _: &ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        None
    }

    fn takes_over(&self) -> bool {
        true
    }

    fn take_over(&self, hello: &ClientHello<'_>) -> Option<Takeover> {
        if !Self::is_validation(hello) {
            return None;
        }
        let found = hello.server_name().and_then(|name| {
            let name = name.strip_suffix('.').unwrap_or(name);
            self.inner
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&name.to_ascii_lowercase())
                .cloned()
        });
        if found.is_none() {
            tracing::debug!(server_name = ?hello.server_name(), "a TLS-ALPN-01 validation for a name with no challenge in progress");
        }
        Some(match found {
            Some(key) => Takeover::new(key, ACME_TLS_ALPN),
            None => Takeover::refuse(ACME_TLS_ALPN),
        })
    }
}

impl fmt::Debug for Challenges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        f.debug_struct("Challenges").field("names", &names).finish()
    }
}

/// A TLS-ALPN-01 certificate for `name`: self-signed P-256, the name as its one SAN (for an
/// address's reverse-mapping name, the address: RFC 8738 §6), and the critical acmeIdentifier
/// extension.
fn challenge_key(
    provider: &CryptoProvider,
    name: &str,
    digest: &[u8],
) -> Result<Arc<CertifiedKey>, crate::Error> {
    let failed = |e: &dyn fmt::Display| crate::Error::Order {
        name: name.to_owned(),
        reason: format!("cannot make the TLS-ALPN-01 certificate: {e}"),
        source: None,
    };
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| failed(&e))?;
    let san =
        crate::ip::from_reverse_name(name).map_or_else(|| name.to_owned(), |ip| ip.to_string());
    // rcgen writes an address as an iPAddress SAN.
    let mut params = rcgen::CertificateParams::new(vec![san]).map_err(|e| failed(&e))?;
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest));
    let cert = params.self_signed(&key).map_err(|e| failed(&e))?;
    let signing = provider
        .key_provider
        .load_private_key(rustls::pki_types::PrivateKeyDer::Pkcs8(
            key.serialize_der().into(),
        ))
        .map_err(|e| failed(&e))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

/// The HTTP-01 responder: a tower `Service` answering `GET
/// /.well-known/acme-challenge/{token}` for the configured names with `token.thumbprint`
/// (RFC 8555 §8.3), and 404 to everything else. It keeps no state of the challenges: the
/// answer is derived from the token and the account's public thumbprint, so any replica
/// that knows the account answers. Mount it in axum (`Router::route_service`) or serve it
/// alone on port 80 with hyper.
#[derive(Clone)]
pub struct Http01 {
    names: Arc<HashSet<String>>,
    thumbprint: Arc<RwLock<Option<String>>>,
    /// The answers of orders at a CA whose account has another thumbprint (a fallback CA's),
    /// by token, while they are in progress.
    tokens: Arc<RwLock<HashMap<String, String>>>,
}

impl Http01 {
    pub(crate) fn new(
        names: HashSet<String>,
        thumbprint: Arc<RwLock<Option<String>>>,
        tokens: Arc<RwLock<HashMap<String, String>>>,
    ) -> Self {
        Self {
            names: Arc::new(names),
            thumbprint,
            tokens,
        }
    }

    /// The answer to a request for `path` with `host` (its `Host` header, a port allowed; an
    /// IPv6 address in brackets, `[2001:db8::7]:80`), if it is a challenge for one of our
    /// names.
    pub fn answer(&self, host: &str, path: &str) -> Option<String> {
        let token = path.strip_prefix("/.well-known/acme-challenge/")?;
        let valid_token = !token.is_empty()
            && token.len() <= 256
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let ours = host_name(host).is_some_and(|host| self.names.contains(&host));
        if !(valid_token && ours) {
            return None;
        }
        if let Some(answer) = self
            .tokens
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
        {
            return Some(answer.clone());
        }
        let thumbprint = self
            .thumbprint
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        Some(format!("{token}.{thumbprint}"))
    }
}

/// The name a `Host` header names, as the builder keeps names (lower-case, no final dot; an
/// address in its canonical text); `None` when it is not a host and an optional port.
fn host_name(host: &str) -> Option<String> {
    let port_ok = |port: &str| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    if let Some(bracketed) = host.strip_prefix('[') {
        let (address, rest) = bracketed.split_once(']')?;
        if !(rest.is_empty() || rest.strip_prefix(':').is_some_and(port_ok)) {
            return None;
        }
        // Only an IPv6 address goes in brackets.
        return address
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|ip| ip.to_string());
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return None,
        None => host,
    };
    Some(crate::ip::normalize(name.trim_end_matches('.')))
}

impl fmt::Debug for Http01 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http01")
            .field("names", &self.names.len())
            .finish_non_exhaustive()
    }
}

impl<B> tower_service::Service<http::Request<B>> for Http01 {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().host())
            .unwrap_or_default();
        let answer = (request.method() == http::Method::GET)
            .then(|| self.answer(host, request.uri().path()))
            .flatten();
        let response = match answer {
            Some(body) => http::Response::builder()
                .status(http::StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/octet-stream")
                .body(Full::new(Bytes::from(body))),
            None => http::Response::builder()
                .status(http::StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::new())),
        };
        std::future::ready(Ok(response.unwrap_or_default()))
    }
}

/// A future a [`Dns01Solver`] returns.
pub type SolverFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send + 'a>>;

/// DNS-01: publishes and removes the `_acme-challenge` TXT record of a name with your DNS
/// provider's API. No provider is built in.
///
/// ```
/// use tls_acme::{Dns01Solver, SolverFuture};
///
/// #[derive(Debug)]
/// struct MyDns;
///
/// impl Dns01Solver for MyDns {
///     fn present<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a> {
///         Box::pin(async move {
///             // e.g. PUT the TXT record `value` at `record` through your provider's API.
///             println!("TXT {record} {value}");
///             Ok(())
///         })
///     }
///
///     fn clean_up<'a>(&'a self, record: &'a str, _value: &'a str) -> SolverFuture<'a> {
///         Box::pin(async move {
///             println!("delete TXT {record}");
///             Ok(())
///         })
///     }
/// }
/// ```
pub trait Dns01Solver: Send + Sync + fmt::Debug + 'static {
    /// Publishes `value` as a TXT record at `record` (`_acme-challenge.<name>.`, for a wildcard
    /// the name without `*.`), and returns once the authoritative servers answer it.
    fn present<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a>;

    /// Removes what [`present`](Self::present) published.
    fn clean_up<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service as _;

    fn http01(thumbprint: Option<&str>) -> Http01 {
        Http01::new(
            ["a.example.com".to_owned()].into_iter().collect(),
            Arc::new(RwLock::new(thumbprint.map(str::to_owned))),
            Arc::default(),
        )
    }

    #[test]
    fn http01_answers_a_fallback_cas_token_with_its_own_key_authorization() {
        let tokens = Arc::new(RwLock::new(HashMap::new()));
        let responder = Http01::new(
            ["a.example.com".to_owned()].into_iter().collect(),
            Arc::new(RwLock::new(Some("THUMB".to_owned()))),
            Arc::clone(&tokens),
        );
        tokens
            .write()
            .unwrap()
            .insert("other".to_owned(), "other.OTHER-THUMB".to_owned());
        let answer = |token: &str| {
            responder.answer(
                "a.example.com",
                &format!("/.well-known/acme-challenge/{token}"),
            )
        };
        assert_eq!(answer("other").as_deref(), Some("other.OTHER-THUMB"));
        assert_eq!(answer("mine").as_deref(), Some("mine.THUMB"));
        tokens.write().unwrap().clear();
        assert_eq!(answer("other").as_deref(), Some("other.THUMB"));
    }

    #[test]
    fn http01_answers_token_dot_thumbprint_for_our_names_only() {
        let responder = http01(Some("THUMB"));
        let path = "/.well-known/acme-challenge/tok_EN-1";
        assert_eq!(
            responder.answer("a.example.com", path).as_deref(),
            Some("tok_EN-1.THUMB")
        );
        assert_eq!(
            responder.answer("A.Example.com.:80", path).as_deref(),
            Some("tok_EN-1.THUMB"),
            "case, a final dot and a port do not matter"
        );
        assert_eq!(responder.answer("b.example.com", path), None, "not ours");
        let addresses = Http01::new(
            ["192.0.2.7".to_owned(), "2001:db8::7".to_owned()].into(),
            Arc::new(RwLock::new(Some("THUMB".to_owned()))),
            Arc::default(),
        );
        for host in [
            "192.0.2.7",
            "192.0.2.7:80",
            "[2001:db8::7]",
            "[2001:DB8:0::7]:80",
        ] {
            assert_eq!(
                addresses.answer(host, path).as_deref(),
                Some("tok_EN-1.THUMB"),
                "{host}"
            );
        }
        for host in [
            "2001:db8::7",
            "[2001:db8::7]x",
            "[192.0.2.7]",
            "[2001:db8::8]",
            "192.0.2.7:",
            "192.0.2.8",
        ] {
            assert_eq!(addresses.answer(host, path), None, "{host}");
        }
        for bad in [
            "/.well-known/acme-challenge/",
            "/.well-known/acme-challenge/../x",
            "/.well-known/acme-challenge/a/b",
            "/other",
        ] {
            assert_eq!(responder.answer("a.example.com", bad), None, "{bad}");
        }
        assert_eq!(
            http01(None).answer("a.example.com", path),
            None,
            "no account yet, no answer"
        );
    }

    #[tokio::test]
    async fn http01_is_a_tower_service_answering_get_with_200_and_anything_else_with_404() {
        let mut responder = http01(Some("THUMB"));
        let request = |method: http::Method, host: &str| {
            http::Request::builder()
                .method(method)
                .uri("/.well-known/acme-challenge/abc")
                .header(http::header::HOST, host)
                .body(())
                .unwrap()
        };
        let ok = responder
            .call(request(http::Method::GET, "a.example.com"))
            .await
            .unwrap();
        assert_eq!(ok.status(), http::StatusCode::OK);
        let body = http_body_util::BodyExt::collect(ok.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"abc.THUMB");
        for (method, host) in [
            (http::Method::POST, "a.example.com"),
            (http::Method::GET, "b.example.com"),
        ] {
            let response = responder.call(request(method, host)).await.unwrap();
            assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
        }
    }

    #[test]
    fn challenge_types_parse_from_what_serve_takes() {
        for t in [
            ChallengeType::TlsAlpn01,
            ChallengeType::Http01,
            ChallengeType::Dns01,
        ] {
            assert_eq!(t.to_string().parse::<ChallengeType>(), Ok(t));
        }
        let error = "tls-sni-01".parse::<ChallengeType>().unwrap_err();
        assert!(
            error.contains("tls-sni-01") && error.contains("http-01"),
            "{error}"
        );
    }

    #[test]
    fn a_challenge_certificate_carries_the_critical_acme_identifier_for_its_name() {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let challenges = Challenges::default();
        challenges
            .present(&provider, "A.example.com", &[7u8; 32])
            .unwrap();
        assert_eq!(challenges.len(), 1);
        let key = challenges.inner.read().unwrap()["a.example.com"].clone();
        let (_, cert) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        let acme_identifier =
            x509_parser::oid_registry::Oid::from(&[1, 3, 6, 1, 5, 5, 7, 1, 31]).unwrap();
        let extension = cert
            .extensions()
            .iter()
            .find(|e| e.oid == acme_identifier)
            .expect("the acmeIdentifier extension");
        assert!(extension.critical);
        assert!(
            extension.value.ends_with(&[7u8; 32]),
            "the digest, as an OCTET STRING"
        );
        challenges.clean_up("a.example.com");
        assert!(challenges.is_empty());
    }

    #[test]
    fn an_addresss_challenge_is_found_by_its_reverse_name_and_its_certificate_carries_the_address()
    {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let challenges = Challenges::default();
        for (ip, reverse) in [
            ("192.0.2.7", "7.2.0.192.in-addr.arpa"),
            ("::1", &crate::ip::reverse_name("::1".parse().unwrap())[..]),
        ] {
            challenges.present(&provider, reverse, &[7u8; 32]).unwrap();
            let key = challenges.inner.read().unwrap()[reverse].clone();
            let (_, cert) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
            let san = cert.subject_alternative_name().unwrap().unwrap();
            let wanted: std::net::IpAddr = ip.parse().unwrap();
            assert!(
                matches!(
                    &san.value.general_names[..],
                    [x509_parser::extensions::GeneralName::IPAddress(bytes)]
                        if match wanted {
                            std::net::IpAddr::V4(v4) => bytes[..] == v4.octets(),
                            std::net::IpAddr::V6(v6) => bytes[..] == v6.octets(),
                        }
                ),
                "{ip}: {:?}",
                san.value.general_names
            );
            challenges.clean_up(reverse);
        }
        assert!(challenges.is_empty());
    }
}
