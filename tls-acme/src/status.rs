//! [`AcmeStatus`]: what each name is doing and why, as `serve`'s status page shows it under
//! `acme`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize, Serializer};
use tls_source::clock::Rfc3339;

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
    /// When it will be renewed.
    #[serde(serialize_with = "rfc3339")]
    pub renew_after: Option<SystemTime>,
    /// In `backoff`: when it will be tried again.
    #[serde(serialize_with = "rfc3339")]
    pub retry_at: Option<SystemTime>,
    /// The last failure, with the CA's reason.
    pub last_error: Option<String>,
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

/// The names' status as the leader of a fleet publishes it for the other replicas (times in
/// seconds since the epoch).
#[cfg(feature = "k8s")]
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct StoredNames(BTreeMap<String, StoredName>);

#[cfg(feature = "k8s")]
#[derive(Debug, Serialize, Deserialize)]
struct StoredName {
    state: NameState,
    not_after: Option<u64>,
    renew_after: Option<u64>,
    retry_at: Option<u64>,
    last_error: Option<String>,
}

#[cfg(feature = "k8s")]
impl StoredNames {
    pub(crate) fn of(names: &BTreeMap<String, NameStatus>) -> Self {
        let secs = |t: Option<SystemTime>| t.map(crate::store::to_unix);
        Self(
            names
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        StoredName {
                            state: s.state,
                            not_after: secs(s.not_after),
                            renew_after: secs(s.renew_after),
                            retry_at: secs(s.retry_at),
                            last_error: s.last_error.clone(),
                        },
                    )
                })
                .collect(),
        )
    }

    /// Sets the names this replica is configured with to what the leader says.
    pub(crate) fn apply(&self, names: &mut BTreeMap<String, NameStatus>) {
        let time = |t: Option<u64>| t.map(crate::store::from_unix);
        for (name, status) in names.iter_mut() {
            if let Some(stored) = self.0.get(name) {
                *status = NameStatus {
                    state: stored.state,
                    not_after: time(stored.not_after),
                    renew_after: time(stored.renew_after),
                    retry_at: time(stored.retry_at),
                    last_error: stored.last_error.clone(),
                };
            }
        }
    }
}
