//! What the validator accepts.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;

/// The default [`Policy::expiry_warning`]: 7 days.
pub const DEFAULT_EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default [`Policy::max_chain_bytes`]: 64 KiB of DER, well under the 100 KiB certificate
/// list that OpenSSL clients accept by default.
pub const DEFAULT_MAX_CHAIN_BYTES: usize = 64 * 1024;

/// The default [`Policy::max_chain_len`]: 10 certificates, leaf included.
pub const DEFAULT_MAX_CHAIN_LEN: usize = 10;

/// What a certificate must be good for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Purpose {
    /// A TLS server (`id-kp-serverAuth`). The default.
    #[default]
    ServerAuth,
    /// A TLS client (`id-kp-clientAuth`), for the client side of mTLS.
    ClientAuth,
    /// Anything: the extended key usage is not checked.
    Any,
}

impl std::fmt::Display for Purpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ServerAuth => "TLS server authentication (serverAuth)",
            Self::ClientAuth => "TLS client authentication (clientAuth)",
            Self::Any => "any purpose",
        })
    }
}

/// What the chain must verify against, if anything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Roots {
    /// No verification against roots (the default): the key, validity, names, purpose and chain
    /// order are still checked.
    #[default]
    None,
    /// The bundle's own CA bundle (`ca.crt`, the kubernetes.io/tls convention): a bundle
    /// without one is refused.
    BundleCa,
    /// These trust anchors.
    Given(Arc<[CertificateDer<'static>]>),
}

/// What the [`Validator`](crate::Validator) accepts, beyond "the key matches the certificate"
/// (which is always checked).
///
/// The checks, in order: the chain's size (count and bytes), the leaf parses, the key matches,
/// validity (expired, not yet valid), purpose (extended key usage, when the leaf has one),
/// required names, the chain's order (each certificate issued by the next), and optionally
/// verification against [`Roots`].
///
/// ```
/// use std::time::Duration;
/// use tls_reload::{Policy, Purpose, Roots};
///
/// let policy = Policy::default()
///     .expiry_warning(Duration::from_secs(14 * 24 * 3600))
///     .require_name("api.example.com")
///     .purpose(Purpose::ServerAuth)
///     .max_chain_bytes(32 * 1024)
///     .verify_against(Roots::BundleCa);
/// assert!(policy.rejects_expired());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Policy {
    reject_expired: bool,
    reject_not_yet_valid: bool,
    expiry_warning: Duration,
    required_names: Vec<String>,
    purpose: Purpose,
    max_chain_len: usize,
    max_chain_bytes: usize,
    check_chain_order: bool,
    roots: Roots,
}

impl Default for Policy {
    /// Rejects expired and not-yet-valid leaves, leaves not for server authentication, chains
    /// out of order, over [`DEFAULT_MAX_CHAIN_LEN`] certificates or [`DEFAULT_MAX_CHAIN_BYTES`];
    /// warns 7 days before expiry; requires no names and no roots.
    fn default() -> Self {
        Self {
            reject_expired: true,
            reject_not_yet_valid: true,
            expiry_warning: DEFAULT_EXPIRY_WARNING,
            required_names: Vec::new(),
            purpose: Purpose::ServerAuth,
            max_chain_len: DEFAULT_MAX_CHAIN_LEN,
            max_chain_bytes: DEFAULT_MAX_CHAIN_BYTES,
            check_chain_order: true,
            roots: Roots::None,
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

    /// Whether a leaf whose validity has not started is rejected (default: yes). The reloader
    /// tries a rejected one again when it becomes valid, unless anything newer arrives first.
    pub fn reject_not_yet_valid(mut self, reject: bool) -> Self {
        self.reject_not_yet_valid = reject;
        self
    }

    /// The window before expiry in which the served certificate counts as expiring: a warning
    /// is logged when it starts and the status says so (default: 7 days).
    pub fn expiry_warning(mut self, window: Duration) -> Self {
        self.expiry_warning = window;
        self
    }

    /// A name (DNS name or IP address) the leaf must cover; repeatable. SNI routes check their
    /// own name in addition.
    pub fn require_name(mut self, name: impl Into<String>) -> Self {
        self.required_names.push(name.into());
        self
    }

    /// What the leaf must be good for (default: [`Purpose::ServerAuth`]). Checked against the
    /// leaf's extended key usage when it has one; a leaf without one is good for anything.
    pub fn purpose(mut self, purpose: Purpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// The most certificates a chain may hold, leaf included (default
    /// [`DEFAULT_MAX_CHAIN_LEN`]).
    pub fn max_chain_len(mut self, count: usize) -> Self {
        self.max_chain_len = count;
        self
    }

    /// The most bytes of DER a chain may hold (default [`DEFAULT_MAX_CHAIN_BYTES`]). Clients
    /// refuse oversized certificate lists: OpenSSL's default limit is 100 KiB.
    pub fn max_chain_bytes(mut self, bytes: usize) -> Self {
        self.max_chain_bytes = bytes;
        self
    }

    /// Whether each certificate of the chain must be issued by the next one (default: yes).
    /// Clients that do not reorder fail on a chain out of order.
    pub fn check_chain_order(mut self, check: bool) -> Self {
        self.check_chain_order = check;
        self
    }

    /// What the chain must verify against (default [`Roots::None`]).
    pub fn verify_against(mut self, roots: Roots) -> Self {
        self.roots = roots;
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

    /// The names every leaf must cover.
    pub fn required_names(&self) -> &[String] {
        &self.required_names
    }

    /// What the leaf must be good for.
    pub fn required_purpose(&self) -> Purpose {
        self.purpose
    }

    /// The chain limits: (certificates, bytes of DER).
    pub fn chain_limits(&self) -> (usize, usize) {
        (self.max_chain_len, self.max_chain_bytes)
    }

    /// Whether the chain's order is checked.
    pub fn checks_chain_order(&self) -> bool {
        self.check_chain_order
    }

    /// What the chain must verify against.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }
}
