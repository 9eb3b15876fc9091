//! The generator's configuration as `build` leaves it, and the defaults and bounds it is checked
//! against: the layer below the builder, the CA and the generator, which all read it.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{KeyAlgorithm, Renewal};

/// The default lifetime of a leaf certificate: 90 days.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// The default lifetime of a generated CA: 10 years.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The shortest leaf validity accepted: certificate times have one-second precision, so a
/// shorter leaf can be due for renewal (or expired) the moment it is made.
pub const MIN_VALIDITY: Duration = Duration::from_secs(3);

/// The shortest renewal window accepted: a leaf is replaced at least this long before it
/// expires, time for every server to install its successor.
pub const MIN_RENEWAL_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) enum CaSource {
    Generate,
    Pem { cert_pem: String, key_pem: Redacted },
}

/// A key's PEM that `Debug` does not show.
#[derive(Clone)]
pub(crate) struct Redacted(pub(crate) String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CaConfig {
    pub(crate) source: CaSource,
    pub(crate) validity: Duration,
    pub(crate) in_chain: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) dns_names: Vec<String>,
    pub(crate) ip_addresses: Vec<IpAddr>,
    pub(crate) validity: Duration,
    pub(crate) renewal: Renewal,
    pub(crate) algorithm: KeyAlgorithm,
    pub(crate) organization: Option<String>,
    pub(crate) common_name: Option<String>,
    pub(crate) ca: Option<CaConfig>,
    pub(crate) persist: Option<PathBuf>,
    pub(crate) replace_corrupt_ca: bool,
    /// Leaves for TLS clients too (extended key usage clientAuth beside serverAuth).
    pub(crate) client_auth: bool,
}

/// How far back `not_before` is set at most, so that clients whose clock is a little behind accept
/// a certificate made this second (a tenth of the validity for very short lifetimes).
pub(crate) const MAX_BACKDATE: Duration = Duration::from_secs(60);

/// The CA configuration when CA mode was asked for without one: a generated CA of the default
/// validity, outside the served chain.
pub(crate) fn default_ca() -> CaConfig {
    CaConfig {
        source: CaSource::Generate,
        validity: DEFAULT_CA_VALIDITY,
        in_chain: false,
    }
}
