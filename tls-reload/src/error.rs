//! Errors of the reload core.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tls_source::Origin;
use tls_source::clock::Rfc3339;

/// Why a bundle was not installed, or why the reloader could not start.
///
/// [`NoCryptoProvider`](Self::NoCryptoProvider), [`InvalidRouteName`](Self::InvalidRouteName),
/// [`NoSources`](Self::NoSources) and [`ClientAuthConfig`](Self::ClientAuthConfig) are *final*: [`Builder::spawn`](crate::Builder::spawn)
/// returns them. All others are *reports*: the reloader records the latest in the route's
/// status ([`Status::last_error`](crate::Status::last_error) for the default route), logs it,
/// keeps serving the last good certificate and installs the next good bundle the source yields.
/// [`Validator::validate`](crate::Validator::validate) returns them too. Messages never contain
/// key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No crypto provider was given and none is installed as the process default.
    #[error("no rustls crypto provider: {}", PROVIDER_FEATURES)]
    NoCryptoProvider,

    /// With [`ClientAuth`](crate::ClientAuth): the `ServerConfig` for client authentication
    /// cannot be built (the provider supports no safe protocol version).
    #[error("cannot set up client authentication: {reason}")]
    ClientAuthConfig {
        /// What rustls said.
        reason: String,
    },

    /// With [`ClientAuth::from_bundle`](crate::ClientAuth::from_bundle): the bundle has no CA
    /// certificate (`ca.crt`), so it says whom to trust for client certificates.
    #[error("{origin}: no CA certificate (ca.crt) to trust client certificates with")]
    NoClientCa {
        /// Where the bundle came from.
        origin: Origin,
    },

    /// A route name given to [`Builder::route`](crate::Builder::route) is not a DNS name or a
    /// one-label wildcard (`*.example.com`).
    #[error("invalid SNI route name {name:?}: {reason}")]
    InvalidRouteName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The reloader was given nothing to serve: no source and no route.
    #[error("no certificate source: give spawn a source, or add a route")]
    NoSources,

    /// The client-CA source's input cannot be used (it could not be read, holds no CA
    /// certificate, or one does not parse); the trusted CAs stay as they were.
    #[error("client CAs: {reason}; keeping the trusted ones")]
    ClientCas {
        /// What is wrong.
        reason: String,
    },

    /// The source reported a problem (a missing file, malformed PEM, a deleted Secret).
    #[error(transparent)]
    Source(#[from] tls_source::Error),

    /// The bundle's chain is empty.
    #[error("{origin}: no certificate in the chain")]
    EmptyChain {
        /// Where the bundle came from.
        origin: Origin,
    },

    /// The chain holds more certificates than [`Policy::max_chain_len`](crate::Policy::max_chain_len).
    #[error(
        "{origin}: the chain holds {count} certificates, more than the limit of {limit} (Policy::max_chain_len)"
    )]
    ChainTooLong {
        /// Where the bundle came from.
        origin: Origin,
        /// How many certificates it holds.
        count: usize,
        /// The limit.
        limit: usize,
    },

    /// The chain is larger than [`Policy::max_chain_bytes`](crate::Policy::max_chain_bytes).
    #[error(
        "{origin}: the chain is {bytes} bytes of DER, more than the limit of {limit} bytes \
         (Policy::max_chain_bytes; OpenSSL clients refuse certificate lists over 100 KiB)"
    )]
    ChainTooLarge {
        /// Where the bundle came from.
        origin: Origin,
        /// Its size in bytes of DER.
        bytes: usize,
        /// The limit.
        limit: usize,
    },

    /// A certificate of the chain is not issued by the one after it.
    #[error(
        "{origin}: the chain is out of order: {link}; put the leaf first, each certificate \
         followed by its issuer"
    )]
    ChainOrder {
        /// Where the bundle came from.
        origin: Origin,
        /// The position of the certificate whose issuer does not follow it (0 is the leaf).
        position: usize,
        /// Which certificate is followed by which, by subject and issuer.
        link: String,
    },

    /// The leaf's extended key usage does not allow what it is for.
    #[error("{origin}: the certificate's extended key usage does not allow {purpose}")]
    Purpose {
        /// Where the bundle came from.
        origin: Origin,
        /// What it was needed for.
        purpose: crate::Purpose,
    },

    /// The leaf does not cover a name it must (a required name, or its SNI route).
    #[error(
        "{origin}: the certificate does not cover {name} (it is for {})",
        Names(names)
    )]
    NameNotCovered {
        /// Where the bundle came from.
        origin: Origin,
        /// The name it must cover.
        name: String,
        /// The DNS names and IP addresses it does cover.
        names: Vec<String>,
    },

    /// A certificate of a keyed source has no DNS name and no IP address, so no route can
    /// serve it.
    #[error("{origin}: the certificate has no DNS names or IP addresses to route by")]
    NoNames {
        /// Where the bundle came from.
        origin: Origin,
    },

    /// The chain does not verify against the roots of [`Policy::verify_against`](crate::Policy::verify_against).
    #[error("{origin}: the chain does not verify against the trusted roots: {reason}")]
    Untrusted {
        /// Where the bundle came from.
        origin: Origin,
        /// Why not.
        reason: String,
    },

    /// The certificate being served has expired and nothing valid has replaced it. It keeps
    /// being served (there is nothing better) while the status says so.
    #[error("{origin}: the served certificate expired at {}; no valid replacement has arrived", Rfc3339(*not_after))]
    ServedExpired {
        /// Where the served bundle came from.
        origin: Origin,
        /// When it expired.
        not_after: SystemTime,
    },

    /// Checking this input panicked (a bug: ours, a dependency's, or in a user's
    /// [`Clock`](tls_source::clock::Clock)). The input is rejected, the route keeps its current
    /// certificate and takes the next input as usual. Reason `internal`. Needs
    /// `panic = "unwind"` (the default): with `panic = "abort"` the process ends instead.
    #[error("{origin} (route {route}): internal error while checking it, rejected: {message}")]
    Internal {
        /// The route it was for (`default` for the default route).
        route: String,
        /// Where the bundle came from.
        origin: Origin,
        /// The panic message.
        message: String,
    },

    /// The route's certificate source panicked in `poll_next` and was dropped: the route keeps
    /// serving its current certificate and will not rotate until the process restarts
    /// ([`RouteStatus::stopped`](crate::RouteStatus::stopped) says so). Reason `internal`.
    #[error(
        "route {route}: its certificate source panicked and was dropped; serving the current \
         certificate, no further rotation: {message}"
    )]
    SourcePanicked {
        /// The route (`default` for the default route), a keyed source's routes, or
        /// `client CAs` for a client-CA source.
        route: String,
        /// The panic message.
        message: String,
    },

    /// The leaf certificate is not a valid X.509 certificate.
    #[error("{origin}: the leaf certificate cannot be parsed: {reason}")]
    Parse {
        /// Where the bundle came from.
        origin: Origin,
        /// What the parser said.
        reason: String,
    },

    /// The crypto provider cannot use the private key (unsupported algorithm, corrupt key).
    #[error("{origin}: the private key cannot be used: {source}")]
    Key {
        /// Where the bundle came from.
        origin: Origin,
        /// What rustls said.
        #[source]
        source: Box<rustls::Error>,
    },

    /// The private key does not belong to the leaf certificate: a torn or mixed-up pair.
    #[error("{origin}: the private key does not match the leaf certificate")]
    KeyMismatch {
        /// Where the bundle came from.
        origin: Origin,
    },

    /// The leaf certificate has expired (see [`Policy::reject_expired`](crate::Policy::reject_expired)).
    #[error("{origin}: the certificate expired at {}", Rfc3339(*not_after))]
    Expired {
        /// Where the bundle came from.
        origin: Origin,
        /// When it expired.
        not_after: SystemTime,
    },

    /// The leaf certificate is not valid yet (see
    /// [`Policy::reject_not_yet_valid`](crate::Policy::reject_not_yet_valid)). The reloader tries
    /// it again when it becomes valid, unless a newer bundle arrives first.
    #[error("{origin}: the certificate is not valid before {}", Rfc3339(*not_before))]
    NotYetValid {
        /// Where the bundle came from.
        origin: Origin,
        /// When it becomes valid.
        not_before: SystemTime,
    },
}

impl Error {
    /// A short, stable name for why an input was refused: the `reason` label of the
    /// `tls_reload_rejections_total` metric (feature `metrics`). One of `parse` (the leaf or
    /// the PEM/DER does not parse, an empty or keyless file), `key` (a key rustls cannot use),
    /// `key_mismatch`, `expired`, `not_yet_valid`, `chain` (empty, out of order), `too_large`
    /// (too many certificates or bytes), `name` (a name not covered, no names to route by),
    /// `purpose` (extended key usage), `untrusted` (not verified by the configured roots),
    /// `no_client_ca`, `served_expired` (the served certificate expired with no replacement),
    /// `internal` (checking the input, or its source, panicked),
    /// `source` (the source could not read: I/O, API errors), `config` (the final errors of
    /// `spawn`). New variants may add values; these keep their meaning.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoCryptoProvider
            | Self::ClientAuthConfig { .. }
            | Self::InvalidRouteName { .. }
            | Self::NoSources => "config",
            Self::Source(err) => match err {
                tls_source::Error::TooLarge { .. } => "too_large",
                tls_source::Error::Empty { .. }
                | tls_source::Error::NoCertificate { .. }
                | tls_source::Error::NoKey { .. }
                | tls_source::Error::MultipleKeys { .. }
                | tls_source::Error::EncryptedKey { .. }
                | tls_source::Error::Malformed { .. } => "parse",
                _ => "source",
            },
            Self::NoClientCa { .. } | Self::ClientCas { .. } => "no_client_ca",
            Self::EmptyChain { .. } | Self::ChainOrder { .. } => "chain",
            Self::ChainTooLong { .. } | Self::ChainTooLarge { .. } => "too_large",
            Self::Purpose { .. } => "purpose",
            Self::NameNotCovered { .. } | Self::NoNames { .. } => "name",
            Self::Untrusted { .. } => "untrusted",
            Self::ServedExpired { .. } => "served_expired",
            Self::Parse { .. } => "parse",
            Self::Key { .. } => "key",
            Self::KeyMismatch { .. } => "key_mismatch",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::Internal { .. } | Self::SourcePanicked { .. } => "internal",
        }
    }

    /// Whether this is a source's report of input it could not decode (counted as a
    /// rejection as well as a source error).
    pub(crate) fn is_undecodable_input(&self) -> bool {
        matches!(self, Self::Source(_)) && matches!(self.reason(), "parse" | "too_large")
    }
}

/// Why [`Reloader::ready`](crate::Reloader::ready) (or its variants) gave up.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The time-out passed first.
    #[error("no certificate installed after {waited:?}: {}", LastError(last_error.as_deref()))]
    TimedOut {
        /// How long was waited.
        waited: Duration,
        /// The last rejection or source error, if any.
        last_error: Option<Arc<Error>>,
    },
    /// The time-out passed with some certificates installed and these without one: with SNI
    /// routes, readiness waits for every route, and one whose source fails holds it.
    #[error(
        "no certificate installed for {} after {waited:?} (the others are): {}",
        Missing(missing),
        LastError(last_error.as_deref())
    )]
    RoutesMissing {
        /// How long was waited.
        waited: Duration,
        /// What has no certificate: `the default`, `route api.example.com`, … (in that order).
        missing: Vec<String>,
        /// The first of those with an error: its last rejection or source error (for files,
        /// naming the path), if any.
        last_error: Option<Arc<Error>>,
    },
    /// With client authentication: the certificate is installed, but no client CA is trusted
    /// yet when the time-out passed (every client would be refused).
    #[error(
        "the certificate is installed, but no client CA is trusted after {waited:?}: {}",
        LastError(last_error.as_deref())
    )]
    NoTrustedClientCa {
        /// How long was waited.
        waited: Duration,
        /// Why the client CAs were not taken, if known.
        last_error: Option<Arc<Error>>,
    },
    /// [`Reloader::ready_or_first_error`](crate::Reloader::ready_or_first_error): the default
    /// route reported an error (a rejected bundle, a source error) before it was ready, or in
    /// the same breath as its first certificate.
    #[error("{error}")]
    Failed {
        /// The error.
        error: Arc<Error>,
    },
    /// The reloader stopped (cancelled, its sources ended, it panicked) without installing
    /// anything.
    #[error("the reloader stopped before any certificate was installed: {}", LastError(last_error.as_deref()))]
    Stopped {
        /// The last rejection or source error, if any.
        last_error: Option<Arc<Error>>,
    },
}

struct LastError<'a>(Option<&'a Error>);

impl fmt::Display for LastError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(err) => write!(f, "last error: {err}"),
            None => f.write_str("the source has not produced anything"),
        }
    }
}

/// The routes without a certificate, the first few by name (a keyed list may hold thousands).
struct Missing<'a>(&'a [String]);

impl fmt::Display for Missing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 5;
        f.write_str(&self.0[..self.0.len().min(SHOWN)].join(", "))?;
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

struct Names<'a>(&'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("no names")
        } else {
            f.write_str(&self.0.join(", "))
        }
    }
}

/// What [`Error::NoCryptoProvider`]'s message says to write
/// (only a build with neither feature can return it).
pub(crate) const PROVIDER_FEATURES: &str = "enable one of tls-reload's features: tls-reload = { \
     version = \"0.1\", features = [\"aws-lc-rs\"] } (or [\"ring\"]); or pass one to \
     Builder::crypto_provider; or install a process default with CryptoProvider::install_default \
     before building the reloader";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_missing_names_the_first_few_and_counts_the_rest() {
        let missing: Vec<String> = (1..=7).map(|i| format!("route r{i}.example.com")).collect();
        let message = NotReady::RoutesMissing {
            waited: Duration::from_secs(30),
            missing,
            last_error: None,
        }
        .to_string();
        assert!(
            message.starts_with(
                "no certificate installed for route r1.example.com, route r2.example.com, \
                 route r3.example.com, route r4.example.com, route r5.example.com and 2 more \
                 after 30s (the others are)"
            ),
            "{message}"
        );
        assert!(!message.contains("r6"), "{message}");
    }
}
