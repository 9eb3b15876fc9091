//! [`Error`]: what went wrong, naming the input (a name, the directory, a state file), never
//! a key.

use std::path::PathBuf;
use std::time::SystemTime;

/// An error of another library kept as the source of ours.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An ACME error. Every variant names what it concerns; none carries key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot work (at build: no names, a name that is not a DNS name, a
    /// wildcard without a DNS-01 solver, an unreadable trust file).
    #[error("ACME configuration: {0}")]
    Config(String),
    /// The directory could not be used (unreachable, not trusted, not an ACME directory).
    #[error("ACME directory {url}: {reason}")]
    Directory {
        /// The directory URL.
        url: String,
        /// Why.
        reason: String,
        /// The ACME client's error (instant-acme's), when it had one.
        #[source]
        source: Option<BoxError>,
    },
    /// The account could not be created or loaded.
    #[error("ACME account at {url}: {reason}")]
    Account {
        /// The directory URL.
        url: String,
        /// Why (the CA's problem, when it answered with one).
        reason: String,
        /// The ACME client's error (instant-acme's), or the stored value's, when there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The CA refused the order for good (the identifier is not allowed, a validation failed):
    /// retried no sooner than an hour later.
    #[error("{name}: the CA refused the order: {reason}")]
    Refused {
        /// The certificate's first name.
        name: String,
        /// The CA's reason.
        reason: String,
    },
    /// The CA will not issue for this identifier (`rejectedIdentifier`,
    /// `unsupportedIdentifier`), or offers no challenge of the configured type for it: not
    /// retried until the configuration changes.
    #[error("{name}: the CA will not issue for it: {reason}")]
    Rejected {
        /// The certificate's first name.
        name: String,
        /// The CA's reason.
        reason: String,
    },
    /// The CA said to wait (`rateLimited`, `Retry-After`).
    #[error("{name}: rate limited by the CA until {}: {reason}", tls_source::clock::Rfc3339(*until))]
    RateLimited {
        /// The certificate's first name.
        name: String,
        /// Not before then.
        until: SystemTime,
        /// The CA's reason.
        reason: String,
    },
    /// The weekly budget of first orders for the name's registered domain is spent
    /// ([`AcmeBuilder::new_certificates_per_week`](crate::AcmeBuilder::new_certificates_per_week)):
    /// the CA is not asked until it refills.
    #[error(
        "{name}: the budget of {limit} new certificates a week for {domain} is spent until {} (new_certificates_per_week)",
        tls_source::clock::Rfc3339(*until)
    )]
    Budget {
        /// The certificate's first name.
        name: String,
        /// Its registered domain.
        domain: String,
        /// The weekly limit.
        limit: u32,
        /// When one more may be ordered.
        until: SystemTime,
    },
    /// The order could not be completed this time (network, the CA's server error): retried
    /// with backoff.
    #[error("{name}: {reason}")]
    Order {
        /// The certificate's first name.
        name: String,
        /// Why (the CA's problem, when it answered with one).
        reason: String,
        /// The ACME client's error (instant-acme's, and below it the network's), when there
        /// was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The CA issued something that cannot be served (not PEM, not for the names ordered,
    /// not for the key): nothing is stored.
    #[error("{name}: the CA's certificate cannot be used: {reason}")]
    BadCertificate {
        /// The certificate's first name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A file of the state directory could not be read or written.
    #[error("ACME state {}: {source}", path.display())]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A fleet's Secret could not be read or written, or what it holds cannot be used
    /// (feature `k8s`).
    #[error("ACME state in Secret {secret}: {source}")]
    Kube {
        /// The Secret's `namespace/name`.
        secret: String,
        /// Why: the API's error (`kube::Error`), the value's (`serde_json::Error`), the seal's.
        #[source]
        source: BoxError,
    },
    /// A fleet's etcd key could not be read or written (a write refused because another
    /// replica leads now, too), or what it holds cannot be used (feature `etcd`).
    #[error("ACME state at etcd key {key}: {source}")]
    Etcd {
        /// The etcd key.
        key: String,
        /// Why: etcd's error, the fence's refusal, the value's, the seal's.
        #[source]
        source: BoxError,
    },
    /// A fleet's Secret was written by a later leader (feature `k8s`): this replica no longer
    /// leads, and leaves the work to it.
    #[error(
        "ACME state in Secret {secret}: written by {holder} in round {round}; this replica no longer leads"
    )]
    Deposed {
        /// The Secret's `namespace/name`.
        secret: String,
        /// The round that wrote it.
        round: u64,
        /// Who wrote it.
        holder: String,
    },
}

impl From<tls_source::layout::LayoutError> for Error {
    fn from(e: tls_source::layout::LayoutError) -> Self {
        Self::State {
            path: e.path,
            source: e.source,
        }
    }
}

/// An error and its sources, in one line (what the status shows as `last_error`).
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
