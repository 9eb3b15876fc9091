//! The one module that speaks to instant-acme (its API is being reworked upstream): the HTTP
//! client it is given (hyper-util over rustls, on the user's crypto provider and the
//! directory's trust), the account, and how its errors map to ours.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use instant_acme::{
    Account, AccountCredentials, BodyWrapper, BytesResponse, ExternalAccountKey, HttpClient,
    NewAccount,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use tls_source::Decoder;

use crate::Error;

/// Where the directory's HTTPS certificate must lead.
#[derive(Debug, Clone, Default)]
pub(crate) enum Trust {
    /// The web PKI's roots (webpki-roots).
    #[default]
    WebPki,
    /// The web PKI's roots and these (a private or test CA).
    Extra(Vec<rustls::pki_types::CertificateDer<'static>>),
}

impl Trust {
    /// The roots of `path` (PEM) besides the web PKI's.
    pub(crate) fn with_file(path: &Path) -> Result<Self, Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::State {
            path: path.to_path_buf(),
            source,
        })?;
        let roots = Decoder::default()
            .certificates(&path.display().to_string(), &bytes)
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self::Extra(roots))
    }

    fn store(&self) -> Result<RootCertStore, Error> {
        let mut store = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Self::Extra(extra) = self {
            for root in extra {
                store
                    .add(root.clone())
                    .map_err(|e| Error::Config(format!("a directory CA cannot be used: {e}")))?;
            }
        }
        Ok(store)
    }
}

/// The latest `Retry-After` the CA sent with a 429 (rate limited) or 503: instant-acme does
/// not carry it in its errors, so the HTTP client keeps it for [`classify`].
#[derive(Debug, Clone, Default)]
pub(crate) struct RetryAfter(Arc<Mutex<Option<SystemTime>>>);

impl RetryAfter {
    fn saw(&self, at: SystemTime) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *slot = Some(slot.map_or(at, |t| t.max(at)));
    }

    /// The time the CA asked to wait until, if it is still ahead.
    pub(crate) fn until(&self) -> Option<SystemTime> {
        let slot = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.filter(|t| *t > SystemTime::now())
    }
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(headers: &http::HeaderMap) -> Option<SystemTime> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        // The CA's number: saturated at the end of 9999, never an overflow.
        return Some(tls_source::clock::saturating_add(
            SystemTime::now(),
            Duration::from_secs(secs),
        ));
    }
    httpdate::parse_http_date(value).ok()
}

/// instant-acme's HTTP client: hyper-util over rustls with `provider` and `trust`, HTTPS only.
struct Https {
    client: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>,
    retry_after: RetryAfter,
}

impl HttpClient for Https {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let response = self.client.request(req);
        let retry_after = self.retry_after.clone();
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, response).await {
                Ok(Ok(response)) => {
                    let status = response.status();
                    if (status == http::StatusCode::TOO_MANY_REQUESTS
                        || status == http::StatusCode::SERVICE_UNAVAILABLE)
                        && let Some(at) = self::retry_after(response.headers())
                    {
                        retry_after.saw(at);
                    }
                    Ok(BytesResponse::from(response))
                }
                Ok(Err(e)) => Err(instant_acme::Error::Other(Box::new(e))),
                Err(_) => Err(instant_acme::Error::Str(
                    "the ACME server did not answer in time",
                )),
            }
        })
    }
}

/// How long one request to the CA may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn http(
    provider: Arc<CryptoProvider>,
    trust: &Trust,
    retry_after: RetryAfter,
) -> Result<Box<dyn HttpClient>, Error> {
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(e.to_string()))?
        .with_root_certificates(trust.store()?)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    Ok(Box::new(Https {
        client: HyperClient::builder(TokioExecutor::new()).build(connector),
        retry_after,
    }))
}

/// The account: the stored credentials if they are for this directory, else a new one.
/// Returns it with the credentials to store when they are new.
pub(crate) async fn account(
    http: Box<dyn HttpClient>,
    directory: &str,
    contact: &[String],
    eab: Option<&ExternalAccountKey>,
    stored: Option<AccountCredentials>,
) -> Result<(Account, Option<AccountCredentials>), Error> {
    if let Some(credentials) = stored {
        return Account::builder_with_http(http)
            .from_credentials(credentials)
            .await
            .map(|account| (account, None))
            .map_err(|e| directory_error(directory, &e));
    }
    let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
    Account::builder_with_http(http)
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            directory.to_owned(),
            eab,
        )
        .await
        .map(|(account, credentials)| (account, Some(credentials)))
        .map_err(|e| match e {
            instant_acme::Error::Api(problem) => Error::Account {
                url: directory.to_owned(),
                reason: problem.to_string(),
            },
            other => directory_error(directory, &other),
        })
}

fn directory_error(url: &str, e: &instant_acme::Error) -> Error {
    let reason = match e {
        instant_acme::Error::Json(_) => {
            format!("not an ACME directory (its answer is not the JSON of one: {e})")
        }
        other => chain(other),
    };
    Error::Directory {
        url: url.to_owned(),
        reason,
    }
}

/// An error and its sources, in one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

/// The problem type of an ACME error (`rateLimited`, `alreadyReplaced`, …), if it is one.
pub(crate) fn problem_type(e: &instant_acme::Error) -> Option<&str> {
    match e {
        instant_acme::Error::Api(problem) => problem
            .r#type
            .as_deref()?
            .strip_prefix("urn:ietf:params:acme:error:"),
        _ => None,
    }
}

/// What an order's error means for when to try again; a rate limit waits until the CA's
/// `Retry-After` (`retry_after`), or an hour when it sent none.
pub(crate) fn classify(name: &str, e: &instant_acme::Error, retry_after: &RetryAfter) -> Error {
    match e {
        instant_acme::Error::Api(problem) => {
            let kind = problem.r#type.as_deref().unwrap_or_default();
            let reason = problem.to_string();
            match kind.strip_prefix("urn:ietf:params:acme:error:") {
                Some("rateLimited") => Error::RateLimited {
                    name: name.to_owned(),
                    until: retry_after
                        .until()
                        .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(3600)),
                    reason,
                },
                Some("rejectedIdentifier" | "unsupportedIdentifier") => Error::Rejected {
                    name: name.to_owned(),
                    reason,
                },
                Some(
                    "caa" | "dns" | "connection" | "incorrectResponse" | "tls" | "unauthorized"
                    | "malformed",
                ) => Error::Refused {
                    name: name.to_owned(),
                    reason,
                },
                _ => Error::Order {
                    name: name.to_owned(),
                    reason,
                },
            }
        }
        other => Error::Order {
            name: name.to_owned(),
            reason: chain(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, value.parse().unwrap());
        headers
    }

    #[test]
    fn retry_after_in_seconds_too_large_for_the_clock_reads_as_the_end_of_9999() {
        let at = retry_after(&header("18446744073709551615")).expect("a time");
        assert_eq!(at, tls_source::clock::latest());
        let soon = retry_after(&header("120")).expect("a time");
        let ahead = soon.duration_since(SystemTime::now()).unwrap();
        assert!(ahead > Duration::from_secs(100) && ahead <= Duration::from_secs(120));
    }
}
