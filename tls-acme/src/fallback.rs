//! More than one CA ([`AcmeBuilder::fallback`](crate::AcmeBuilder::fallback)): the directory
//! of [`Acme::builder`](crate::Acme::builder) is preferred; an order that fails for a reason of
//! the CA's is placed with the next one at once.
//!
//! - **The CA's reasons** (the next CA is asked): the directory or the account cannot be
//!   reached or used (unreachable, not trusted, a 5xx), a request failed on the way, the CA
//!   answered `serverInternal`, or `rateLimited`; a required profile the CA does not offer.
//! - **The name's own** (no other CA is asked: it would fail there too): a failed validation,
//!   `caa`, `rejectedIdentifier`, the weekly budget, the DNS-01 solver.
//!
//! Each certificate records its issuer: ARI is asked of it, and an order `replaces` a
//! certificate only at the CA that issued it. Every order starts with the preferred CA again,
//! so the renewal of a certificate from a fallback goes back to the preferred one when it
//! works. Each CA has its account, stored per directory (and sealed in a fleet).

use std::fmt;
use std::path::PathBuf;

use rustls::pki_types::CertificateDer;

use crate::Error;
use crate::order::Trust;

/// Another ACME CA, asked when the ones before it fail for a reason of theirs (see
/// [`AcmeBuilder::fallback`](crate::AcmeBuilder::fallback)).
///
/// ```
/// let acme = tls_acme::Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
///     .fallback(
///         tls_acme::FallbackCa::new("https://acme.zerossl.com/v2/DV90")
///             .external_account("kid-from-zerossl", b"hmac-key-from-zerossl".to_vec()),
///     )
///     .name("www.example.com")
///     .state_dir("/var/lib/acme");
/// # drop(acme);
/// ```
#[must_use = "a fallback CA does nothing until given to AcmeBuilder::fallback"]
pub struct FallbackCa {
    pub(crate) url: String,
    pub(crate) eab: Option<(String, Vec<u8>)>,
    pub(crate) trust: Result<Trust, String>,
}

impl fmt::Debug for FallbackCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackCa")
            .field("url", &self.url)
            .field("external_account", &self.eab.as_ref().map(|(kid, _)| kid))
            .finish_non_exhaustive()
    }
}

impl FallbackCa {
    /// The CA of the ACME directory at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            eab: None,
            trust: Ok(Trust::default()),
        }
    }

    /// Trusts the CA certificates of this PEM file for its directory's HTTPS, besides the web
    /// PKI's roots.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.trust = Trust::with_file(&path.into()).map_err(|e| e.to_string());
        self
    }

    /// Trusts these CA certificates for its directory's HTTPS, besides the web PKI's roots.
    pub fn roots(mut self, roots: Vec<CertificateDer<'static>>) -> Self {
        self.trust = Ok(Trust::Extra(roots));
        self
    }

    /// External account binding for this CA: the key id and the HMAC key.
    pub fn external_account(mut self, key_id: impl Into<String>, hmac_key: Vec<u8>) -> Self {
        self.eab = Some((key_id.into(), hmac_key));
        self
    }
}

/// One CA as the driver uses it.
#[derive(Clone)]
pub(crate) struct CaConfig {
    pub(crate) url: String,
    pub(crate) eab: Option<(String, Vec<u8>)>,
    pub(crate) trust: Trust,
}

/// Whether an order's failure is the CA's, so that the next CA is asked.
pub(crate) fn ca_fault(e: &Error) -> bool {
    match e {
        Error::Directory { .. } | Error::Account { .. } | Error::RateLimited { .. } => true,
        // A request that failed on the way (unreachable, reset, a 5xx without a problem),
        // or the CA's own error.
        Error::Order { source, reason, .. } => {
            source.is_some() || reason.contains("urn:ietf:params:acme:error:serverInternal")
        }
        _ => false,
    }
}

/// The scheme, host and port of a URL (`https://ca.example:14000` of
/// `https://ca.example:14000/order/1`): an order belongs to the CA whose directory has its
/// origin.
pub(crate) fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cas_failures_move_on_and_the_names_own_do_not() {
        let order = |reason: &str, source: bool| Error::Order {
            name: "a.example.com".into(),
            reason: reason.into(),
            source: source.then(|| "connection refused".into()),
        };
        assert!(ca_fault(&order("the request to the CA failed", true)));
        assert!(ca_fault(&order(
            "API error: boom (urn:ietf:params:acme:error:serverInternal)",
            false
        )));
        assert!(ca_fault(&Error::Directory {
            url: "https://ca.example/dir".into(),
            reason: "cannot be used".into(),
            source: None,
        }));
        assert!(ca_fault(&Error::RateLimited {
            name: "a.example.com".into(),
            until: std::time::SystemTime::UNIX_EPOCH,
            reason: "too many".into(),
        }));
        assert!(!ca_fault(&order(
            "the DNS-01 solver could not publish _acme-challenge.a.example.com: refused",
            false
        )));
        assert!(!ca_fault(&Error::Refused {
            name: "a.example.com".into(),
            reason: "caa".into(),
        }));
        assert!(!ca_fault(&Error::Rejected {
            name: "a.example.com".into(),
            reason: "rejectedIdentifier".into(),
        }));
    }

    #[test]
    fn an_order_belongs_to_the_directory_of_its_origin() {
        assert_eq!(
            origin("https://localhost:14000/my-order/abc"),
            "https://localhost:14000"
        );
        assert_eq!(
            origin("https://acme-v02.api.letsencrypt.org/directory"),
            "https://acme-v02.api.letsencrypt.org"
        );
        assert_eq!(origin("https://ca.example"), "https://ca.example");
    }
}
