//! What the reloader reports.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use tls_source::x509::LeafInfo;
use tls_source::{CertBundle, Origin};

use crate::Error;

/// The reloader's state, published on a `tokio::sync::watch` channel
/// ([`Reloader::status`](crate::Reloader::status)).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Status {
    /// The certificate being served; `None` until the first one is installed.
    pub current: Option<CertInfo>,
    /// How many certificates have been installed (0 before the first).
    pub generation: u64,
    /// The last rejected update or source error since the last successful load; `None` when the
    /// latest input was good.
    pub last_error: Option<Arc<Error>>,
    /// Whether the reload task is still running (it stops on cancellation or when the source ends;
    /// the last certificate keeps being served either way).
    pub running: bool,
}

/// What is known about an installed certificate. Holds no key material.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CertInfo {
    /// SHA-256 of the leaf's DER, lower-case hex (as `openssl x509 -fingerprint -sha256` shows,
    /// without colons).
    pub fingerprint_sha256: String,
    /// The leaf's subject, e.g. `CN=example.com`.
    pub subject: String,
    /// The DNS names among the leaf's subject alternative names.
    pub dns_names: Vec<String>,
    /// The IP addresses among the leaf's subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Where the bundle came from.
    pub origin: Origin,
    /// When it was installed.
    pub loaded_at: SystemTime,
    /// How many certificates the chain holds (leaf included).
    pub chain_len: usize,
    /// SHA-256 of each certificate of the bundle's CA bundle (`ca.crt`), lower-case hex; empty
    /// when there is none.
    pub ca_fingerprints_sha256: Vec<String>,
}

impl CertInfo {
    /// Parses the leaf certificate of `bundle`.
    pub(crate) fn inspect(bundle: &CertBundle) -> Result<Self, Error> {
        let origin = bundle.origin();
        let leaf = bundle.leaf().ok_or_else(|| Error::EmptyChain {
            origin: origin.clone(),
        })?;
        let parsed = LeafInfo::parse(leaf).map_err(|e| Error::Parse {
            origin: origin.clone(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            fingerprint_sha256: tls_source::Digest::of(leaf).to_string(),
            subject: parsed.subject,
            dns_names: parsed.dns_names,
            ip_addresses: parsed.ip_addresses,
            not_before: parsed.not_before,
            not_after: parsed.not_after,
            origin: origin.clone(),
            loaded_at: SystemTime::now(),
            chain_len: bundle.chain().len(),
            ca_fingerprints_sha256: bundle
                .ca()
                .iter()
                .map(|ca| tls_source::Digest::of(ca).to_string())
                .collect(),
        })
    }
}
