//! [`AcmeStatus`]: what each name is doing and why, as `serve`'s status page shows it under
//! `acme`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize, Serializer};
use tls_source::clock::Rfc3339;

pub use crate::record::RenewReason;

/// The ACME client's state: the directory, the account and each certificate's name.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct AcmeStatus {
    /// The directory URL.
    pub directory: String,
    /// The account URL, once registered or loaded.
    pub account: Option<String>,
    /// Why the account could not be used, while it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_error: Option<String>,
    /// Set when a new account was registered although certificates were stored: the stored
    /// account was gone (its Secret or file deleted) or was for another directory. Says when
    /// and why; kept with the new account, so it stays until the next replacement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_replaced: Option<String>,
    /// Each certificate, by its first name.
    pub names: BTreeMap<String, NameStatus>,
}

/// One certificate's state.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct NameStatus {
    /// What it is doing.
    pub state: NameState,
    /// The served certificate's end, if one is stored.
    #[serde(serialize_with = "rfc3339")]
    pub not_after: Option<SystemTime>,
    /// When it will be renewed (the time renewal is due).
    #[serde(serialize_with = "rfc3339")]
    pub renew_after: Option<SystemTime>,
    /// Why then: by the certificate's lifetime, or inside the CA's ARI window.
    pub renew_reason: Option<RenewReason>,
    /// When the CA's ARI is asked next (the CA may move the window, e.g. ahead of a
    /// revocation).
    #[serde(serialize_with = "rfc3339")]
    pub ari_next: Option<SystemTime>,
    /// In `backoff`: when it will be tried again.
    #[serde(serialize_with = "rfc3339")]
    pub retry_at: Option<SystemTime>,
    /// The last failure, with the CA's reason.
    pub last_error: Option<String>,
    /// When this replica's ACME client last decided what to do about the certificate (wait,
    /// ask ARI, order, back off); `None` until it has, and on a fleet's other replicas, which
    /// show what the leader stored.
    #[serde(serialize_with = "rfc3339")]
    pub decided_at: Option<SystemTime>,
    /// The profile the served certificate was ordered under (none: the CA's default).
    pub profile: Option<String>,
    /// Why the profile asked for ([`AcmeBuilder::profile`](crate::AcmeBuilder::profile)) was
    /// not used at the last order (the CA does not advertise it), while that holds.
    pub profile_note: Option<String>,
    /// The directory URL of the CA that issued the served certificate.
    pub issuer: Option<String>,
    /// Why the served certificate is not from the preferred CA
    /// ([`AcmeBuilder::fallback`](crate::AcmeBuilder::fallback)): what the CAs before its
    /// issuer answered. `None` when it is from the preferred one.
    pub fallback_reason: Option<String>,
}

/// What a certificate is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum NameState {
    /// Served, and renewed at `renew_after`.
    Valid,
    /// An order is in progress (or about to be).
    #[default]
    Ordering,
    /// The last attempt failed; it will be retried at `retry_at`.
    Backoff,
    /// It will not be retried until the configuration changes (the CA refused the
    /// identifier, a wildcard without DNS-01).
    Failed,
}

#[allow(clippy::ref_option)] // serde's serialize_with passes the field by reference
fn rfc3339<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(&Rfc3339(*t)),
        None => s.serialize_none(),
    }
}

impl NameStatus {
    /// The status a fleet's other replicas show for a certificate, from the record its leader
    /// stored, at `now`.
    #[cfg(any(feature = "k8s", feature = "etcd"))]
    pub(crate) fn from_record(record: &crate::record::Record, now: SystemTime) -> Self {
        use crate::record::from_unix;
        let retry_at = record.retry_at.map(from_unix).filter(|t| *t > now);
        let state = if record.failed {
            NameState::Failed
        } else if retry_at.is_some() {
            NameState::Backoff
        } else if record.cert.is_some() && record.renew_at.is_some_and(|t| from_unix(t) > now) {
            NameState::Valid
        } else {
            NameState::Ordering
        };
        Self {
            state,
            not_after: record.not_after.map(from_unix),
            renew_after: record.renew_at.map(from_unix),
            renew_reason: record.renew_reason,
            ari_next: record.ari_next.map(from_unix),
            retry_at,
            last_error: record.last_error.clone(),
            decided_at: None,
            profile: record.profile.clone(),
            profile_note: None,
            issuer: record.issuer.clone(),
            fallback_reason: record.fallback_reason.clone(),
        }
    }
}
