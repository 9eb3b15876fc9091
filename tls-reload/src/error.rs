//! Errors of the reload core.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tls_source::Origin;

/// Why a bundle was not installed, or why the reloader could not start.
///
/// Except [`NoCryptoProvider`](Self::NoCryptoProvider), which [`Builder::spawn`](crate::Builder::spawn)
/// returns, these are *reports*: the reloader records the latest in
/// [`Status::last_error`](crate::Status::last_error), logs it, keeps serving the last good
/// certificate and installs the next good bundle the source yields. Messages never contain key
/// material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No crypto provider was given and none is installed as the process default.
    #[error(
        "no rustls crypto provider: pass one to Builder::crypto_provider, or install a process \
         default, e.g. rustls::crypto::ring::default_provider().install_default()"
    )]
    NoCryptoProvider,

    /// The source reported a problem (a missing file, malformed PEM, a deleted Secret).
    #[error(transparent)]
    Source(#[from] tls_source::Error),

    /// The bundle's chain is empty.
    #[error("{origin}: no certificate in the chain")]
    EmptyChain {
        /// Where the bundle came from.
        origin: Origin,
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

/// Why [`Reloader::ready`](crate::Reloader::ready) gave up: nothing was installed.
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
    /// The reloader stopped (cancelled, or its source ended) without installing anything.
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

/// Formats a time as RFC 3339 in UTC, to the second (`2026-12-01T10:00:00Z`).
#[derive(Debug, Clone, Copy)]
pub struct Rfc3339(pub SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = time::OffsetDateTime::from(self.0);
        let t = t.replace_nanosecond(0).unwrap_or(t);
        match t.format(&time::format_description::well_known::Rfc3339) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}
