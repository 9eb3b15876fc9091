//! What the reloader accepts.

use std::time::Duration;

/// The default [`Policy::expiry_warning`]: 7 days.
pub const DEFAULT_EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// What the reloader accepts before it swaps, beyond "the key matches the certificate" (which is
/// always checked).
///
/// ```
/// use std::time::Duration;
/// use tls_reload::Policy;
///
/// let policy = Policy::default()
///     .expiry_warning(Duration::from_secs(14 * 24 * 3600))
///     .reject_not_yet_valid(false);
/// assert!(policy.rejects_expired());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Policy {
    reject_expired: bool,
    reject_not_yet_valid: bool,
    expiry_warning: Duration,
}

impl Default for Policy {
    /// Rejects expired and not-yet-valid leaves; warns 7 days before expiry.
    fn default() -> Self {
        Self {
            reject_expired: true,
            reject_not_yet_valid: true,
            expiry_warning: DEFAULT_EXPIRY_WARNING,
        }
    }
}

impl Policy {
    /// Whether an expired leaf is rejected (default: yes). Serving an expired certificate makes
    /// every verifying client fail; turn this off only where clients do not check.
    pub fn reject_expired(mut self, reject: bool) -> Self {
        self.reject_expired = reject;
        self
    }

    /// Whether a leaf whose validity has not started is rejected (default: yes). A rejected one
    /// is tried again when it becomes valid.
    pub fn reject_not_yet_valid(mut self, reject: bool) -> Self {
        self.reject_not_yet_valid = reject;
        self
    }

    /// Logs a warning when an installed leaf expires within this window (default: 7 days).
    pub fn expiry_warning(mut self, window: Duration) -> Self {
        self.expiry_warning = window;
        self
    }

    /// Whether expired leaves are rejected.
    pub fn rejects_expired(&self) -> bool {
        self.reject_expired
    }

    /// Whether not-yet-valid leaves are rejected.
    pub fn rejects_not_yet_valid(&self) -> bool {
        self.reject_not_yet_valid
    }

    /// The expiry warning window.
    pub fn expiry_warning_window(&self) -> Duration {
        self.expiry_warning
    }
}
