//! What is stored for each certificate besides its PEM: one versioned record, read and written
//! whole by every store (`names/NAME/schedule.json` in a state directory, `acme.json` of the
//! certificate's state Secret in a fleet).
//!
//! The record is a superset of the `schedule.json` earlier versions wrote (`retry_at`,
//! `failures`, `last_error`, `failed`, `failed_for`, same names and meanings), so a replica of
//! an earlier version reads what this one wrote, and this one reads what it wrote. Fields this
//! version does not know (written by a later one) are kept as they were (`other`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The record's format: 1 was `schedule.json` (no `version` field).
pub(crate) const FORMAT: u32 = 2;

/// One certificate's stored state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    // ===== format 1 (schedule.json) =====
    /// Not tried again before then (seconds since the epoch).
    #[serde(default)]
    pub(crate) retry_at: Option<u64>,
    /// Failed attempts in a row.
    #[serde(default)]
    pub(crate) failures: u32,
    /// The last failure, with the CA's reason.
    #[serde(default)]
    pub(crate) last_error: Option<String>,
    /// Not retried until the configuration changes (or a retry is asked for).
    #[serde(default)]
    pub(crate) failed: bool,
    /// The configuration the failures were made with: another one tries again at once.
    #[serde(default)]
    pub(crate) failed_for: Option<String>,

    // ===== format 2 =====
    #[serde(default)]
    pub(crate) version: u32,
    /// What the last failure was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<FailureKind>,
    /// When the last order was attempted (retries asked for wait a minute after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempted_at: Option<u64>,
    /// When validations failed in the last hour (a CA allows a few per name an hour).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) refusals: Vec<u64>,
    /// The certificate the renewal fields are for (its ARI certificate identifier): another
    /// certificate gets fields of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cert: Option<String>,
    /// The certificate's end (seconds since the epoch), for the status of a fleet's other
    /// replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) not_after: Option<u64>,
    /// A number in [0, 1) drawn once per certificate: where in its renewal span it renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) jitter: Option<f64>,
    /// When it is renewed (seconds since the epoch), and why then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) renew_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) renew_reason: Option<RenewReason>,
    /// The CA's suggested renewal window (ARI) for the certificate, as last fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ari: Option<Window>,
    /// When ARI is asked next (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ari_next: Option<u64>,
    /// ARI requests failed in a row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) ari_failures: u32,
    /// The window the certificate was renewed under: a CA suggesting it again for the new
    /// certificate is stale, and is not followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) renewed_under: Option<Window>,
    /// The profile the certificate was ordered under (none: the CA's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) profile: Option<String>,
    /// The directory of the CA that issued the certificate (none: stored before there was a
    /// choice, the preferred one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) issuer: Option<String>,
    /// Why the certificate is not from the preferred CA: what the CAs before its issuer
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fallback_reason: Option<String>,

    /// Fields of later formats, kept as they were.
    #[serde(flatten)]
    pub(crate) other: BTreeMap<String, serde_json::Value>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a certificate renews when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RenewReason {
    /// By its lifetime: once a third of it remains (half, under ten days).
    Lifetime,
    /// Inside the CA's suggested window (ARI, RFC 9773).
    Ari,
}

/// A renewal window (seconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Window {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// What kind of failure the last one was: it decides the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FailureKind {
    /// The CA could not validate the name (the challenge was not answered where it looked).
    Validation,
    /// The CA will not issue for the identifier, or offers no challenge of the configured type.
    Identifier,
    /// The CA said to wait.
    RateLimited,
    /// The weekly budget of first orders is spent.
    Budget,
    /// The CA issued something that cannot be served.
    BadCertificate,
    /// Anything else (the network, the CA's server error, the store).
    Transient,
}

impl Record {
    /// A record read from a store: format 1 is read as it is (its fields mean the same).
    pub(crate) fn from_json(json: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(json)
    }

    /// The record as stored (always the current format).
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let mut record = self.clone();
        record.version = FORMAT;
        serde_json::to_vec(&record).unwrap_or_default()
    }

    /// Clears what a failure left (not the refusals: the CA counts them by the hour).
    pub(crate) fn clear_failure(&mut self) {
        self.retry_at = None;
        self.failures = 0;
        self.last_error = None;
        self.failed = false;
        self.failed_for = None;
        self.failure = None;
    }
}

pub(crate) fn to_unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The time `secs` after the epoch, read from stored state (a file, a Secret another replica
/// wrote): a value past the year 9999 reads as the end of 9999, never an overflow.
pub(crate) fn from_unix(secs: u64) -> SystemTime {
    tls_source::clock::saturating_add(UNIX_EPOCH, Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `schedule.json` as the previous version defined it.
    #[derive(Debug, Default, Deserialize)]
    #[allow(dead_code)]
    struct ScheduleV1 {
        retry_at: Option<u64>,
        failures: u32,
        last_error: Option<String>,
        #[serde(default)]
        failed: bool,
        #[serde(default)]
        failed_for: Option<String>,
    }

    #[test]
    fn stored_times_far_past_or_beyond_9999_read_without_overflow() {
        assert_eq!(from_unix(0), UNIX_EPOCH);
        let end = from_unix(u64::MAX);
        assert_eq!(to_unix(end), 253_402_300_799, "clamped to the end of 9999");
        // A time before the epoch (a certificate from 1950) is stored as 0, not a panic.
        let y1950 = UNIX_EPOCH - Duration::from_secs(20 * 365 * 86_400);
        assert_eq!(to_unix(y1950), 0);
    }

    #[test]
    fn a_schedule_of_the_previous_version_reads_as_a_record() {
        let old = br#"{"retry_at":1800000000,"failures":2,"last_error":"refused","failed":false,"failed_for":null}"#;
        let record = Record::from_json(old).expect("format 1");
        assert_eq!(record.retry_at, Some(1_800_000_000));
        assert_eq!(record.failures, 2);
        assert_eq!(record.last_error.as_deref(), Some("refused"));
        assert_eq!(record.version, 0);
    }

    #[test]
    fn the_previous_version_reads_a_record_and_fields_of_later_ones_are_kept() {
        let mut record = Record {
            retry_at: Some(1_800_000_060),
            failures: 1,
            last_error: Some("the CA refused".into()),
            failed_for: Some("a.example.com|tls-alpn-01".into()),
            failure: Some(FailureKind::Validation),
            jitter: Some(0.25),
            renew_reason: Some(RenewReason::Ari),
            ..Record::default()
        };
        record.profile = Some("shortlived".into());
        record.issuer = Some("https://ca.example/dir".into());
        record.other.insert(
            "a_later_field".into(),
            serde_json::json!({"of": "a later version"}),
        );
        let json = record.to_json();
        let old: ScheduleV1 = serde_json::from_slice(&json).expect("an earlier reader");
        assert_eq!(old.retry_at, Some(1_800_000_060));
        assert_eq!(old.failures, 1);
        assert_eq!(old.failed_for.as_deref(), Some("a.example.com|tls-alpn-01"));
        let back = Record::from_json(&json).unwrap();
        assert_eq!(
            back.other["a_later_field"]["of"], "a later version",
            "a later field is kept"
        );
        assert_eq!(back.issuer.as_deref(), Some("https://ca.example/dir"));
        assert_eq!(
            back.profile.as_deref(),
            Some("shortlived"),
            "the profile is kept"
        );
        assert_eq!(back.version, FORMAT);
        assert_eq!(back.jitter, Some(0.25));
        assert_eq!(Record::from_json(&back.to_json()).unwrap(), back);
    }
}
