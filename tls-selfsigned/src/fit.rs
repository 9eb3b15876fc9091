//! "Does the existing certificate still fit?": regenerate only when it must.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{KeyPair, PublicKeyData as _};
use tls_source::clock::Validity;
use tls_source::x509::LeafInfo;
use x509_parser::prelude::{FromDer as _, X509Certificate};

/// Which half of a pair an [`Unfit`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The certificate (`tls.crt`).
    Certificate,
    /// The private key (`tls.key`).
    PrivateKey,
}

impl Part {
    /// The file (or Secret data key) the part is kept in: `tls.crt` or `tls.key`.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Certificate => "tls.crt",
            Self::PrivateKey => "tls.key",
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Certificate => "certificate",
            Self::PrivateKey => "private key",
        })
    }
}

/// Why a certificate must be regenerated. Generation is the expensive step: the check comes first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unfit {
    /// The certificate or the key is missing.
    Missing {
        /// Which.
        what: Part,
    },
    /// The certificate or the key cannot be parsed.
    Unparsable {
        /// Which.
        what: Part,
        /// What the parser said (never key bytes).
        reason: String,
    },
    /// The key does not belong to the certificate.
    KeyMismatch,
    /// The certificate has expired.
    Expired {
        /// When.
        not_after: SystemTime,
    },
    /// The certificate is inside its renewal window.
    RenewalDue {
        /// When it expires.
        not_after: SystemTime,
    },
    /// The certificate's validity has not started (the clock was stepped back).
    NotYetValid {
        /// When it starts.
        not_before: SystemTime,
    },
    /// Wanted DNS names are not on the certificate.
    MissingDnsNames(Vec<String>),
    /// Wanted IP addresses are not on the certificate.
    MissingIpAddresses(Vec<IpAddr>),
    /// In CA mode: the certificate was not signed by the current CA (or there is no CA yet).
    WrongIssuer,
    /// Leaves for clients were asked for ([`Builder::client_auth`](crate::Builder::client_auth))
    /// and the certificate's extended key usage does not allow clientAuth.
    NotForClients,
}

impl Unfit {
    /// Whether the input is broken (missing, unparsable, or a key of another pair), as opposed
    /// to a sound certificate that no longer fits (expired, due, names, issuer). Broken input
    /// is worth reporting; the rest is ordinary renewal.
    pub fn is_broken(&self) -> bool {
        matches!(
            self,
            Self::Missing { .. } | Self::Unparsable { .. } | Self::KeyMismatch
        )
    }
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { what } => write!(f, "the {what} is missing"),
            Self::Unparsable { what, reason } => write!(f, "the {what} cannot be parsed: {reason}"),
            Self::KeyMismatch => f.write_str("the private key does not match the certificate"),
            Self::Expired { not_after } => {
                write!(f, "the certificate expired at {}", unix(*not_after))
            }
            Self::RenewalDue { not_after } => {
                write!(
                    f,
                    "the certificate is due for renewal (it expires at {})",
                    unix(*not_after)
                )
            }
            Self::NotYetValid { not_before } => {
                write!(
                    f,
                    "the certificate is not valid before {}",
                    unix(*not_before)
                )
            }
            Self::MissingDnsNames(names) => write!(f, "the certificate lacks DNS names {names:?}"),
            Self::MissingIpAddresses(ips) => {
                write!(f, "the certificate lacks IP addresses {ips:?}")
            }
            Self::WrongIssuer => f.write_str("the certificate was not signed by the current CA"),
            Self::NotForClients => f.write_str(
                "the certificate's extended key usage does not allow TLS client authentication",
            ),
        }
    }
}

impl std::error::Error for Unfit {}

fn unix(t: SystemTime) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => format!("{}s after the Unix epoch", d.as_secs()),
        Err(_) => "a time before the Unix epoch".to_owned(),
    }
}

/// Expired, not yet valid, or inside the renewal window `window` at `now`.
pub(crate) fn check_times(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
    window: Duration,
) -> Result<(), Unfit> {
    match Validity::at(now, not_before, not_after) {
        Validity::Expired => return Err(Unfit::Expired { not_after }),
        Validity::NotYetValid => return Err(Unfit::NotYetValid { not_before }),
        Validity::Valid => {}
    }
    if not_after.duration_since(now).unwrap_or_default() < window {
        return Err(Unfit::RenewalDue { not_after });
    }
    Ok(())
}

pub(crate) fn key_matches(key: &KeyPair, cert: &LeafInfo) -> bool {
    key.subject_public_key_info() == cert.spki_der
}

/// Whether `leaf`'s signature verifies with `ca`'s public key.
pub(crate) fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        X509Certificate::from_der(leaf),
        X509Certificate::from_der(ca),
    ) else {
        return false;
    };
    leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// Parses a certificate with the workspace's one X.509 reader, its reason as a string.
pub(crate) fn parse(der: &[u8]) -> Result<LeafInfo, String> {
    LeafInfo::parse(der).map_err(|e| e.to_string())
}
