//! Authorization of verified clients (mTLS): which of the clients whose certificates chain to a
//! trusted CA may connect. [`Authorize`] is the hook, [`AllowList`] the rules `serve` takes
//! (`--allow-cn`, `--allow-dns`, `--allow-uri`, `--allow-file`), [`Authorization`] the handle
//! that changes them at run time.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;

pub use tls_source::x509::Identity as ClientIdentity;

/// Decides whether a verified client may connect. Asked in the handshake, after the client's
/// chain verified against the trusted CAs; a refusal fails the handshake with the TLS alert
/// `access_denied`. Asked again of a resumed session, and of every open connection when the
/// rules change ([`Authorization::set`]).
pub trait Authorize: fmt::Debug + Send + Sync + 'static {
    /// Whether `client` may connect.
    fn authorize(&self, client: &ClientIdentity) -> bool;
}

/// The rules a client must match one of: by common name, DNS name or URI (a SPIFFE ID).
///
/// An empty list lets no client in.
///
/// ```
/// use tls_reload::{AllowList, Rule};
///
/// let rules = AllowList::parse(
///     "# who may call us
///      uri=spiffe://example.org/ns/prod/*
///      cn=backup-job",
/// )
/// .unwrap();
/// assert_eq!(rules.rules().len(), 2);
/// assert!("dns=web.example.com".parse::<Rule>().is_ok());
/// assert!("email=a@example.com".parse::<Rule>().is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<Rule>,
}

/// One rule of an [`AllowList`]. As text: `cn=NAME`, `dns=NAME` or `uri=URI`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// The subject's common name, exactly (case-sensitive).
    CommonName(String),
    /// One of the DNS names among the subject alternative names, exactly (ignoring ASCII case
    /// and a trailing dot; no wildcards).
    DnsName(String),
    /// A URI among the subject alternative names: exactly, or, for a rule ending in `/*`, any
    /// URI that adds one or more non-empty path segments to what precedes the `*`
    /// (`spiffe://example.org/ns/prod/*` matches `spiffe://example.org/ns/prod/sa/web`, not
    /// `spiffe://example.org/ns/prod` nor `spiffe://example.org/ns/prod/`). A `spiffe://` rule
    /// matches only a SPIFFE identity: a certificate with exactly one URI SAN.
    Uri(String),
}

/// A rule that does not parse: what is wrong, naming the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    text: String,
    reason: &'static str,
    /// The 1-based line in [`AllowList::parse`]'s text.
    line: Option<usize>,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        write!(f, "{}: {:?}", self.reason, self.text)
    }
}

impl std::error::Error for RuleError {}

impl RuleError {
    /// The 1-based line of the text given to [`AllowList::parse`], if that is where it was.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let err = |reason| RuleError {
            text: text.to_owned(),
            reason,
            line: None,
        };
        let (kind, value) = text
            .trim()
            .split_once('=')
            .ok_or_else(|| err("a rule is cn=NAME, dns=NAME or uri=URI"))?;
        let value = value.trim();
        if value.is_empty() {
            return Err(err("a rule needs a value"));
        }
        match kind.trim() {
            "cn" => Ok(Self::CommonName(value.to_owned())),
            "dns" => {
                if value.contains('*') {
                    return Err(err("a dns rule names one DNS name, without wildcards"));
                }
                Ok(Self::DnsName(value.to_owned()))
            }
            "uri" => Self::uri(value).map_err(err),
            _ => Err(err("a rule's kind is cn, dns or uri")),
        }
    }
}

impl Rule {
    /// A URI rule, checked: a scheme, and a `*` only as the whole last path segment.
    fn uri(value: &str) -> Result<Self, &'static str> {
        let Some((scheme, rest)) = value.split_once("://") else {
            return Err("a uri rule is an absolute URI, e.g. spiffe://example.org/ns/prod/sa/web");
        };
        if scheme.is_empty() || rest.is_empty() {
            return Err("a uri rule is an absolute URI, e.g. spiffe://example.org/ns/prod/sa/web");
        }
        if let Some(star) = value.find('*')
            && (star + 1 != value.len() || !value.ends_with("/*") || !rest.contains('/'))
        {
            return Err("a * in a uri rule stands only for the last path segments (…/*)");
        }
        Ok(Self::Uri(value.to_owned()))
    }

    /// Whether `client` matches this rule.
    pub fn matches(&self, client: &ClientIdentity) -> bool {
        match self {
            Self::CommonName(cn) => client.common_name.as_deref() == Some(cn.as_str()),
            Self::DnsName(name) => {
                let name = name.strip_suffix('.').unwrap_or(name);
                client.dns_names.iter().any(|san| {
                    san.strip_suffix('.')
                        .unwrap_or(san)
                        .eq_ignore_ascii_case(name)
                })
            }
            Self::Uri(rule) => {
                let candidates: &[String] = if rule.starts_with("spiffe://") {
                    match client.spiffe_id() {
                        Some(_) => &client.uris,
                        None => &[],
                    }
                } else {
                    &client.uris
                };
                candidates.iter().any(|uri| uri_matches(rule, uri))
            }
        }
    }
}

/// `uri` against a rule: equal, or for `PREFIX/*`, `PREFIX/` then one or more non-empty
/// segments that are not `.` or `..`, with no query or fragment.
fn uri_matches(rule: &str, uri: &str) -> bool {
    let Some(prefix) = rule.strip_suffix('*') else {
        return rule == uri;
    };
    let Some(rest) = uri.strip_prefix(prefix) else {
        return false;
    };
    !rest.is_empty()
        && !rest.contains(['?', '#'])
        && rest
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CommonName(v) => write!(f, "cn={v}"),
            Self::DnsName(v) => write!(f, "dns={v}"),
            Self::Uri(v) => write!(f, "uri={v}"),
        }
    }
}

impl AllowList {
    /// A list of these rules.
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Self {
        Self {
            rules: rules.into_iter().collect(),
        }
    }

    /// Reads one rule a line (`cn=NAME`, `dns=NAME`, `uri=URI`); blank lines and lines
    /// starting with `#` are skipped.
    ///
    /// # Errors
    /// The first line that is not a rule, with its number ([`RuleError::line`]).
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            rules.push(line.parse::<Rule>().map_err(|mut e| {
                e.line = Some(i + 1);
                e
            })?);
        }
        Ok(Self { rules })
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// This list and `other`'s rules after it.
    #[must_use]
    pub fn and(mut self, other: &Self) -> Self {
        self.rules.extend(other.rules.iter().cloned());
        self
    }
}

impl Authorize for AllowList {
    fn authorize(&self, client: &ClientIdentity) -> bool {
        self.rules.iter().any(|rule| rule.matches(client))
    }
}

/// The authorization a server applies, changeable while it runs: give a clone to
/// [`ClientAuth::authorize`](crate::ClientAuth::authorize), keep one to [`set`](Self::set) new
/// rules. On a change, every open connection of the accept stream whose client the new rules
/// refuse is closed as a trust close is (see [`TlsConnection`](crate::TlsConnection)); new
/// handshakes and resumed sessions are checked against the new rules at once.
///
/// ```
/// use tls_reload::{AllowList, Authorization, ClientAuth};
///
/// let rules = Authorization::new(AllowList::parse("uri=spiffe://example.org/ns/prod/*").unwrap());
/// let auth = ClientAuth::from_bundle().authorize(rules.clone());
/// // later, from a file watcher:
/// rules.set(AllowList::parse("cn=backup-job").unwrap());
/// # drop(auth);
/// ```
#[derive(Clone)]
pub struct Authorization {
    rules: Arc<ArcSwap<Arc<dyn Authorize>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl fmt::Debug for Authorization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorization")
            .field("rules", &self.rules.load())
            .finish()
    }
}

impl Authorization {
    /// An authorization by `rules`.
    pub fn new(rules: impl Authorize) -> Self {
        Self {
            rules: Arc::new(ArcSwap::from_pointee(Arc::new(rules))),
            changed: Arc::new(watch::channel(0).0),
        }
    }

    /// Replaces the rules: new handshakes follow them at once, and open connections they
    /// refuse are closed.
    pub fn set(&self, rules: impl Authorize) {
        self.rules.store(Arc::new(Arc::new(rules)));
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        crate::metrics::authorization_changed();
    }

    /// Whether the rules in force let `client` in.
    pub fn authorize(&self, client: &ClientIdentity) -> bool {
        self.rules.load().authorize(client)
    }

    /// Checks the leaf `der` of a chain that verified: `Err` (the handshake's `access_denied`)
    /// when the rules refuse it, logged with the client's identity and counted.
    pub(crate) fn check(&self, der: &[u8]) -> Result<(), rustls::Error> {
        let refused = || {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            )
        };
        let client = match ClientIdentity::parse(der) {
            Ok(client) => client,
            Err(err) => {
                tracing::info!(error = %err, "client refused: its certificate's names cannot be read");
                crate::metrics::client_refused();
                return Err(refused());
            }
        };
        if self.authorize(&client) {
            return Ok(());
        }
        tracing::info!(client = %client, "client refused: no authorization rule matches it");
        crate::metrics::client_refused();
        Err(refused())
    }

    /// What open connections watch: a new value on every [`set`](Self::set).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(cn: &str, dns: &[&str], uris: &[&str]) -> ClientIdentity {
        let ca = tls_test::TestCa::new("authorize");
        let mut id = if uris.is_empty() {
            ClientIdentity::parse(&ca.client_leaf(dns.first().copied().unwrap_or("x")).cert_der)
        } else {
            ClientIdentity::parse(&ca.uri_client_leaf(cn, uris).cert_der)
        }
        .unwrap();
        id.common_name = Some(cn.to_owned());
        id
    }

    fn allows(rule: &str, who: &ClientIdentity) -> bool {
        AllowList::parse(rule).unwrap().authorize(who)
    }

    #[test]
    fn a_spiffe_prefix_rule_takes_one_or_more_segments_and_nothing_else() {
        let rule = "uri=spiffe://example.org/ns/prod/*";
        let at = |uri: &str| client("c", &[], &[uri]);
        assert!(allows(rule, &at("spiffe://example.org/ns/prod/sa/web")));
        assert!(allows(rule, &at("spiffe://example.org/ns/prod/web")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/prod")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/prod/")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/prod//x")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/prod/../admin")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/production/x")));
        assert!(!allows(rule, &at("spiffe://example.org/ns/staging/sa/web")));
        let exact = "uri=spiffe://example.org/ns/prod/sa/web";
        assert!(allows(exact, &at("spiffe://example.org/ns/prod/sa/web")));
        assert!(!allows(exact, &at("spiffe://example.org/ns/prod/sa/web2")));
    }

    #[test]
    fn a_certificate_with_two_uris_is_no_spiffe_identity() {
        let two = client(
            "c",
            &[],
            &[
                "spiffe://example.org/ns/prod/sa/web",
                "https://example.org/other",
            ],
        );
        assert_eq!(two.spiffe_id(), None);
        assert!(!allows("uri=spiffe://example.org/ns/prod/sa/web", &two));
        assert!(!allows("uri=spiffe://example.org/ns/prod/*", &two));
        // A rule of another scheme still matches either URI.
        assert!(allows("uri=https://example.org/other", &two));
    }

    #[test]
    fn common_and_dns_names_match_exactly() {
        let web = client("web", &["web.example.com"], &[]);
        assert!(allows("cn=web", &web));
        assert!(!allows("cn=Web", &web));
        assert!(allows("dns=WEB.example.com.", &web));
        assert!(!allows("dns=example.com", &web));
        assert!(!allows("", &web), "an empty list lets no client in");
        assert!(allows("cn=other\ndns=web.example.com", &web));
    }

    #[test]
    fn a_bad_rule_is_refused_naming_its_line_and_text() {
        let err = AllowList::parse("# rules\ncn=a\nemail=x@example.com").unwrap_err();
        assert_eq!(err.line(), Some(3));
        assert!(err.to_string().contains("email=x@example.com"), "{err}");
        assert!(err.to_string().starts_with("line 3: "), "{err}");
        for bad in [
            "cn",
            "cn=",
            "dns=*.example.com",
            "uri=example.org",
            "uri=spiffe://example.org/*/web",
            "uri=spiffe://example.org/ns*",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad} parsed");
        }
        assert_eq!(
            "uri=spiffe://example.org/*"
                .parse::<Rule>()
                .unwrap()
                .to_string(),
            "uri=spiffe://example.org/*"
        );
    }

    #[test]
    fn set_changes_the_answer_and_tells_the_watchers() {
        let web = client("web", &["web.example.com"], &[]);
        let auth = Authorization::new(AllowList::parse("cn=web").unwrap());
        let changes = auth.changes();
        assert!(auth.authorize(&web));
        assert!(
            auth.check(&tls_test::TestCa::new("x").client_leaf("web").cert_der)
                .is_ok()
        );
        auth.set(AllowList::default());
        assert!(changes.has_changed().unwrap());
        assert!(!auth.authorize(&web));
        assert_eq!(
            auth.check(&tls_test::TestCa::new("x").client_leaf("web").cert_der),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure
            ))
        );
    }
}
