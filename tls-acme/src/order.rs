//! The one module that speaks instant-acme (its API is being reworked upstream): the HTTP
//! client it is given (hyper-util over rustls, on the user's crypto provider and the
//! directory's trust), the account, ARI, each order from its placing to its certificate, and
//! how its errors map to ours. What to do and when is the plan's (`plan.rs`); what is kept,
//! the store's.
//!
//! A `badNonce` (RFC 8555 6.5) is the protocol's hiccup, not a failure: instant-acme retries a
//! request twice with the nonce the error carries, and every step here is tried again, up to
//! [`BAD_NONCE_RETRIES`] times, before it counts as failed.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, BodyWrapper, BytesResponse,
    CertificateIdentifier, ExternalAccountKey, HttpClient, Identifier, NewAccount, NewOrder, Order,
    OrderStatus, RetryPolicy,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::Decoder;
use tls_source::clock::Clock;

use crate::Error;
use crate::challenge::{ChallengeType, Challenges, Dns01Solver};
use crate::record::{Window, to_unix};
use crate::store::{AcmeStore, Published};

/// How long the CA may take to validate, or to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(120));

/// How many times a step refused with `badNonce` is tried again (each try is itself up to three
/// requests in instant-acme).
pub(crate) const BAD_NONCE_RETRIES: u32 = 10;

/// Evaluates an instant-acme call again while it fails with `badNonce`, at most
/// [`BAD_NONCE_RETRIES`] more times.
macro_rules! nonce_safe {
    ($call:expr) => {{
        let mut tries = 0;
        loop {
            match $call {
                Err(e) if problem_type(&e) == Some("badNonce") && tries < BAD_NONCE_RETRIES => {
                    tries += 1;
                }
                other => break other,
            }
        }
    }};
}

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

    /// The time the CA asked to wait until, if it is still ahead at `now`.
    pub(crate) fn until(&self, now: SystemTime) -> Option<SystemTime> {
        let slot = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.filter(|t| *t > now)
    }
}

/// `Retry-After` received at `now`: seconds, or an HTTP date.
fn retry_after(headers: &http::HeaderMap, now: SystemTime) -> Option<SystemTime> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        // The CA's number: saturated at the end of 9999, never an overflow.
        return Some(tls_source::clock::saturating_add(
            now,
            Duration::from_secs(secs),
        ));
    }
    httpdate::parse_http_date(value).ok()
}

/// instant-acme's HTTP client: hyper-util over rustls with `provider` and `trust`, HTTPS only.
struct Https {
    client: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>,
    retry_after: RetryAfter,
    clock: Arc<dyn Clock>,
}

impl HttpClient for Https {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let response = self.client.request(req);
        let (retry_after, clock) = (self.retry_after.clone(), Arc::clone(&self.clock));
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, response).await {
                Ok(Ok(response)) => {
                    let status = response.status();
                    if (status == http::StatusCode::TOO_MANY_REQUESTS
                        || status == http::StatusCode::SERVICE_UNAVAILABLE)
                        && let Some(at) = self::retry_after(response.headers(), clock.now())
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

fn http(
    provider: Arc<CryptoProvider>,
    trust: &Trust,
    retry_after: RetryAfter,
    clock: Arc<dyn Clock>,
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
        clock,
    }))
}

/// The account: the stored credentials if they are for this directory, else a new one.
/// Returns it with the credentials to store when they are new.
async fn account(
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
            .map_err(|e| directory_error(directory, e));
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
                source: None,
            },
            other => directory_error(directory, other),
        })
}

fn directory_error(url: &str, e: instant_acme::Error) -> Error {
    let reason = match e {
        instant_acme::Error::Json(_) => "not an ACME directory (its answer is not the JSON of one)",
        _ => "cannot be used",
    };
    Error::Directory {
        url: url.to_owned(),
        reason: reason.into(),
        source: Some(Box::new(e)),
    }
}

/// The problem type of an ACME error (`rateLimited`, `alreadyReplaced`, …), if it is one.
fn problem_type(e: &instant_acme::Error) -> Option<&str> {
    match e {
        instant_acme::Error::Api(problem) => problem
            .r#type
            .as_deref()?
            .strip_prefix("urn:ietf:params:acme:error:"),
        _ => None,
    }
}

/// What an order's error means for when to try again; a rate limit waits until the CA's
/// `Retry-After` (`retry_after`), or an hour after `now` when it sent none.
fn classify(
    name: &str,
    e: instant_acme::Error,
    retry_after: &RetryAfter,
    now: SystemTime,
) -> Error {
    match e {
        instant_acme::Error::Api(problem) => {
            let kind = problem.r#type.as_deref().unwrap_or_default();
            let reason = problem.to_string();
            match kind.strip_prefix("urn:ietf:params:acme:error:") {
                Some("rateLimited") => Error::RateLimited {
                    name: name.to_owned(),
                    until: retry_after.until(now).unwrap_or_else(|| {
                        tls_source::clock::saturating_add(now, Duration::from_secs(3600))
                    }),
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
                    source: None,
                },
            }
        }
        other => Error::Order {
            name: name.to_owned(),
            reason: "the request to the CA failed".into(),
            source: Some(Box::new(other)),
        },
    }
}

/// What reaching the CA needs.
pub(crate) struct Directory<'a> {
    pub(crate) url: &'a str,
    pub(crate) contact: &'a [String],
    pub(crate) eab: Option<&'a (String, Vec<u8>)>,
    pub(crate) trust: &'a Trust,
    pub(crate) provider: &'a Arc<CryptoProvider>,
    pub(crate) clock: &'a Arc<dyn Clock>,
}

/// The CA, through one account.
pub(crate) struct Ca {
    account: Account,
    retry_after: RetryAfter,
    clock: Arc<dyn Clock>,
    /// Cleared once the CA said it has no ARI.
    ari: AtomicBool,
}

/// An order placed or resumed.
pub(crate) struct Placed(Order);

impl Placed {
    pub(crate) fn url(&self) -> &str {
        self.0.url()
    }

    /// The profile the CA says the order is under, if it says.
    pub(crate) fn profile(&mut self) -> Option<String> {
        self.0.state().profile.clone()
    }
}

/// What answering an order's challenges needs: the configured type, where TLS-ALPN-01
/// answers live, the DNS-01 solver, and the store (for a fleet's other replicas, and to
/// withdraw after a restart).
pub(crate) struct Answering<'a> {
    pub(crate) challenge: ChallengeType,
    pub(crate) challenges: &'a Challenges,
    pub(crate) provider: &'a Arc<CryptoProvider>,
    pub(crate) dns01: Option<&'a dyn Dns01Solver>,
    pub(crate) store: &'a dyn AcmeStore,
    /// The thumbprint HTTP-01 answers with (the preferred account's).
    pub(crate) thumbprint: &'a RwLock<Option<String>>,
    /// HTTP-01 answers of orders at a CA whose account has another thumbprint.
    pub(crate) http01_tokens: &'a RwLock<std::collections::HashMap<String, String>>,
}

/// instant-acme's name of a challenge type.
fn acme_type(challenge: ChallengeType) -> instant_acme::ChallengeType {
    match challenge {
        ChallengeType::TlsAlpn01 => instant_acme::ChallengeType::TlsAlpn01,
        ChallengeType::Http01 => instant_acme::ChallengeType::Http01,
        ChallengeType::Dns01 => instant_acme::ChallengeType::Dns01,
    }
}

/// The identity a certificate is known by: its ARI certificate identifier, or (a certificate
/// without an authority key identifier) a digest of it.
pub(crate) fn certificate_id(leaf: &CertificateDer<'_>) -> String {
    match CertificateIdentifier::try_from(leaf) {
        Ok(id) => id.to_string(),
        Err(_) => {
            let digest = <sha2::Sha256 as sha2::Digest>::digest(leaf.as_ref());
            digest.iter().map(|b| format!("{b:02x}")).collect()
        }
    }
}

impl Ca {
    /// Reaches the directory with the stored credentials, or registers a new account; the
    /// credentials are returned when they are new (to be stored).
    pub(crate) async fn connect(
        directory: &Directory<'_>,
        stored: Option<serde_json::Value>,
    ) -> Result<(Self, Option<serde_json::Value>), Error> {
        let stored = stored
            .map(serde_json::from_value::<AccountCredentials>)
            .transpose()
            .map_err(|e| Error::Account {
                url: directory.url.to_owned(),
                reason: "the stored account is not an ACME account".into(),
                source: Some(Box::new(e)),
            })?;
        let retry_after = RetryAfter::default();
        let http = http(
            Arc::clone(directory.provider),
            directory.trust,
            retry_after.clone(),
            Arc::clone(directory.clock),
        )?;
        let eab = directory
            .eab
            .map(|(id, key)| ExternalAccountKey::new(id.clone(), key));
        let (account, new) =
            account(http, directory.url, directory.contact, eab.as_ref(), stored).await?;
        let ca = Self {
            account,
            retry_after,
            clock: Arc::clone(directory.clock),
            ari: AtomicBool::new(true),
        };
        let new = new
            .map(|credentials| serde_json::to_value(&credentials))
            .transpose()
            .map_err(|e| Error::Account {
                url: directory.url.to_owned(),
                reason: "the new account cannot be stored".into(),
                source: Some(Box::new(e)),
            })?;
        Ok((ca, new))
    }

    pub(crate) fn id(&self) -> &str {
        self.account.id()
    }

    pub(crate) fn thumbprint(&self) -> &str {
        self.account.key_thumbprint()
    }

    /// The profiles the directory advertises (draft-ietf-acme-profiles), by name, sorted.
    pub(crate) fn profiles(&self) -> Vec<String> {
        let mut names: Vec<String> = self.account.profiles().map(|p| p.name.to_owned()).collect();
        names.sort();
        names
    }

    /// Whether the CA offers ARI (as far as known: until it says it does not).
    pub(crate) fn offers_ari(&self) -> bool {
        self.ari.load(Ordering::Relaxed)
    }

    fn error(&self, name: &str, e: instant_acme::Error) -> Error {
        classify(name, e, &self.retry_after, self.clock.now())
    }

    /// The CA's suggested renewal window for `leaf`, and when to ask again.
    pub(crate) async fn renewal_info(
        &self,
        name: &str,
        leaf: &CertificateDer<'_>,
    ) -> Result<(Window, Duration), Error> {
        let id = CertificateIdentifier::try_from(leaf).map_err(|e| Error::Order {
            name: name.to_owned(),
            reason: format!("the certificate has no ARI identifier: {e}"),
            source: None,
        })?;
        match self.account.renewal_info(&id).await {
            Ok((info, retry_after)) => Ok((
                Window {
                    start: to_unix(SystemTime::from(info.suggested_window.start)),
                    end: to_unix(SystemTime::from(info.suggested_window.end)),
                },
                retry_after,
            )),
            Err(e) => {
                if matches!(e, instant_acme::Error::Unsupported(_)) {
                    self.ari.store(false, Ordering::Relaxed);
                }
                Err(self.error(name, e))
            }
        }
    }

    /// The order at `url`, if the CA still has it, it can still complete, and it is for the
    /// names of `group` (the names of a certificate may have changed since it was placed: a CSR
    /// for the new ones would not match it).
    pub(crate) async fn resume(&self, url: &str, group: &[String]) -> Option<Placed> {
        let mut order = nonce_safe!(self.account.order(url.to_owned()).await).ok()?;
        if order.state().status == OrderStatus::Invalid {
            return None;
        }
        let mut ordered = Vec::new();
        {
            let mut identifiers = order.identifiers();
            while let Some(identifier) = identifiers.next().await {
                ordered.push(identifier.ok()?.to_string().to_ascii_lowercase());
            }
        }
        let mut wanted: Vec<String> = group.iter().map(|n| n.to_ascii_lowercase()).collect();
        ordered.sort_unstable();
        wanted.sort_unstable();
        (ordered == wanted).then_some(Placed(order))
    }

    /// Places an order for `group`, under `profile` when given; with `replaces`, naming that
    /// certificate (ARI), and once more without if the CA answers `alreadyReplaced`.
    pub(crate) async fn place(
        &self,
        group: &[String],
        replaces: Option<&CertificateDer<'_>>,
        profile: Option<&str>,
    ) -> Result<Placed, Error> {
        let new_order = |identifiers| {
            let order = NewOrder::new(identifiers);
            match profile {
                Some(profile) => order.profile(profile),
                None => order,
            }
        };
        let name = &group[0];
        let identifiers: Vec<Identifier> = group
            .iter()
            .map(|n| match crate::ip::address(n) {
                Some(ip) => Identifier::Ip(ip),
                None => Identifier::Dns(n.clone()),
            })
            .collect();
        let replaced = replaces.and_then(|leaf| CertificateIdentifier::try_from(leaf).ok());
        let order = match replaced {
            Some(id) => {
                match nonce_safe!(
                    self.account
                        .new_order(&new_order(&identifiers).replaces(id.clone()))
                        .await
                ) {
                    Err(e) if problem_type(&e) == Some("alreadyReplaced") => {
                        tracing::info!(name = %name, "the CA says the certificate was already replaced; ordering without replaces");
                        nonce_safe!(self.account.new_order(&new_order(&identifiers)).await)
                    }
                    other => other,
                }
            }
            None => nonce_safe!(self.account.new_order(&new_order(&identifiers)).await),
        };
        order.map(Placed).map_err(|e| self.error(name, e))
    }

    /// Completes `placed` for `group` with the new key `key_pem`: answers its challenges
    /// (withdrawn after), finalizes, downloads the chain (PEM). An order the CA found invalid
    /// is [`Error::Refused`] with the CA's reason.
    pub(crate) async fn complete(
        &self,
        placed: &mut Placed,
        group: &[String],
        key_pem: &[u8],
        answering: &Answering<'_>,
    ) -> Result<String, Error> {
        let name = &group[0];
        let order = &mut placed.0;
        if order.state().status == OrderStatus::Pending {
            let mut presented = Vec::new();
            let answered = self.answer(order, name, answering, &mut presented).await;
            let ready = match answered {
                Ok(()) => {
                    nonce_safe!(order.poll_ready(&POLL).await).map_err(|e| self.error(name, e))
                }
                Err(e) => Err(e),
            };
            withdraw(answering, presented).await;
            match ready? {
                OrderStatus::Invalid => {
                    return Err(Error::Refused {
                        name: name.clone(),
                        reason: why_invalid(order).await,
                    });
                }
                OrderStatus::Pending => {
                    return Err(Error::Order {
                        name: name.clone(),
                        reason: "the CA is still validating".into(),
                        source: None,
                    });
                }
                _ => {}
            }
        }
        if order.state().status == OrderStatus::Ready {
            let key = rcgen::KeyPair::from_pem(std::str::from_utf8(key_pem).unwrap_or_default())
                .map_err(|e| Error::Order {
                    name: name.clone(),
                    reason: format!("the stored order's key: {e}"),
                    source: None,
                })?;
            let csr = rcgen::CertificateParams::new(group.to_vec())
                .and_then(|params| params.serialize_request(&key))
                .map_err(|e| Error::Order {
                    name: name.clone(),
                    reason: e.to_string(),
                    source: None,
                })?;
            nonce_safe!(order.finalize_csr(csr.der()).await).map_err(|e| self.error(name, e))?;
        }
        nonce_safe!(order.poll_certificate(&POLL).await).map_err(|e| self.error(name, e))
    }

    /// Answers every pending authorization of `order` with the configured challenge; what was
    /// published goes into `presented`.
    async fn answer(
        &self,
        order: &mut Order,
        name: &str,
        answering: &Answering<'_>,
        presented: &mut Vec<Published>,
    ) -> Result<(), Error> {
        // Every authorization's state fetched first, each fetch tried again on `badNonce` (the
        // stream cannot repeat one item): answering below then makes no fetch of its own.
        let mut tries = 0;
        loop {
            let mut fetched = Ok(());
            let mut authorizations = order.authorizations();
            while let Some(authorization) = authorizations.next().await {
                if let Err(e) = authorization {
                    fetched = Err(e);
                    break;
                }
            }
            match fetched {
                Err(e) if problem_type(&e) == Some("badNonce") && tries < BAD_NONCE_RETRIES => {
                    tries += 1;
                }
                Err(e) => return Err(self.error(name, e)),
                Ok(()) => break,
            }
        }
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization.map_err(|e| self.error(name, e))?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => {
                    return Err(Error::Refused {
                        name: name.to_owned(),
                        reason: format!("an authorization is {other:?}"),
                    });
                }
            }
            let identifier = authorization.identifier().to_string();
            // What a TLS-ALPN-01 validation names in its SNI: an address's reverse-mapping
            // name (RFC 8738 §6), the challenge certificate then carries the address.
            let validated_as = match authorization.identifier().identifier {
                Identifier::Ip(ip) => crate::ip::reverse_name(*ip),
                _ => identifier.clone(),
            };
            let Some(mut challenge) = authorization.challenge(acme_type(answering.challenge))
            else {
                return Err(Error::Rejected {
                    name: name.to_owned(),
                    reason: format!(
                        "the CA offers no {} challenge for {identifier}",
                        answering.challenge
                    ),
                });
            };
            let key_authorization = challenge.key_authorization();
            match answering.challenge {
                ChallengeType::TlsAlpn01 => {
                    let digest = key_authorization.digest();
                    answering.challenges.present(
                        answering.provider,
                        &validated_as,
                        digest.as_ref(),
                    )?;
                    let published = Published {
                        kind: ChallengeType::TlsAlpn01,
                        name: validated_as,
                        value: digest.as_ref().to_vec(),
                    };
                    presented.push(published.clone());
                    // A fleet's other replicas answer it too.
                    answering.store.publish(&published).await?;
                }
                ChallengeType::Http01 => {
                    // An account with another thumbprint (a fallback CA's): answered by token.
                    let published = answering
                        .thumbprint
                        .read()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    if published.as_deref() != Some(self.thumbprint()) {
                        let token = challenge.token.clone();
                        answering
                            .http01_tokens
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(token.clone(), key_authorization.as_str().to_owned());
                        presented.push(Published {
                            kind: ChallengeType::Http01,
                            name: token,
                            value: Vec::new(),
                        });
                    }
                }
                ChallengeType::Dns01 => {
                    let record = format!("_acme-challenge.{}", identifier.trim_start_matches("*."));
                    let value = key_authorization.dns_value();
                    let solver = answering
                        .dns01
                        .ok_or_else(|| Error::Config("no DNS-01 solver".into()))?;
                    let published = Published {
                        kind: ChallengeType::Dns01,
                        name: record.clone(),
                        value: value.clone().into_bytes(),
                    };
                    // Stored first: a restart withdraws it even if the solver's call was cut.
                    answering.store.publish(&published).await?;
                    presented.push(published);
                    solver
                        .present(&record, &value)
                        .await
                        .map_err(|e| Error::Order {
                            name: name.to_owned(),
                            reason: format!("the DNS-01 solver could not publish {record}: {e}"),
                            source: None,
                        })?;
                }
            }
            if answering.challenge != ChallengeType::Dns01 {
                // Every replica the CA may reach has it before it is asked to validate.
                tokio::time::sleep(answering.store.propagation()).await;
            }
            nonce_safe!(challenge.set_ready().await).map_err(|e| self.error(name, e))?;
        }
        Ok(())
    }
}

/// Withdraws what was published for an order (also what a restart finds published).
pub(crate) async fn withdraw(answering: &Answering<'_>, presented: Vec<Published>) {
    for published in presented {
        match published.kind {
            ChallengeType::TlsAlpn01 => answering.challenges.clean_up(&published.name),
            ChallengeType::Dns01 => {
                if let Some(solver) = answering.dns01
                    && let Err(e) = solver
                        .clean_up(&published.name, &String::from_utf8_lossy(&published.value))
                        .await
                {
                    tracing::warn!(record = %published.name, error = %e, "the DNS-01 solver could not remove the record");
                    continue;
                }
            }
            ChallengeType::Http01 => {
                // Kept in memory only (never stored).
                answering
                    .http01_tokens
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&published.name);
                continue;
            }
        }
        if let Err(e) = answering.store.withdraw(&published).await {
            tracing::warn!(name = %published.name, error = %e, "could not withdraw the published challenge");
        }
    }
}

/// The CA's reason an order became invalid: the first failed challenge's error.
async fn why_invalid(order: &mut Order) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authorization)) = authorizations.next().await {
        if let Ok(state) = authorization.refresh().await {
            for challenge in &state.challenges {
                if let Some(problem) = &challenge.error {
                    reasons.push(problem.to_string());
                }
            }
        }
    }
    if reasons.is_empty()
        && let Some(problem) = &order.state().error
    {
        reasons.push(problem.to_string());
    }
    if reasons.is_empty() {
        "the order became invalid (the CA gave no reason)".into()
    } else {
        reasons.join("; ")
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
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = retry_after(&header("18446744073709551615"), now).expect("a time");
        assert_eq!(at, tls_source::clock::latest());
        let soon = retry_after(&header("120"), now).expect("a time");
        assert_eq!(soon, now + Duration::from_secs(120));
        let date = retry_after(&header("Sun, 06 Nov 1994 08:49:37 GMT"), now).expect("a date");
        assert_eq!(
            date,
            SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
        );
    }
}
