//! What a certificate says about itself (feature `x509`): names, validity, public key.
//!
//! Shared by the reload core (policy and status) and the self-signed generator (the fit check),
//! so both read certificates the same way.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer as _, X509Certificate};

/// The parts of an X.509 certificate that rotation cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeafInfo {
    /// The subject, e.g. `CN=example.com, O=Example`.
    pub subject: String,
    /// The DNS names among the subject alternative names.
    pub dns_names: Vec<String>,
    /// The IP addresses among the subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// The `SubjectPublicKeyInfo`, DER: equal to a private key's public half when they match.
    pub spki_der: Vec<u8>,
    /// Whether basicConstraints says CA.
    pub is_ca: bool,
}

/// A certificate that is not valid X.509 DER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCertificate {
    reason: String,
}

impl fmt::Display for InvalidCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for InvalidCertificate {}

impl LeafInfo {
    /// Parses a DER certificate.
    ///
    /// ```
    /// use tls_source::x509::LeafInfo;
    ///
    /// let err = LeafInfo::parse(b"not DER").unwrap_err();
    /// assert!(!err.to_string().is_empty());
    /// ```
    ///
    /// # Errors
    /// [`InvalidCertificate`] for anything but one well-formed certificate.
    pub fn parse(der: &[u8]) -> Result<Self, InvalidCertificate> {
        let invalid = |reason: String| InvalidCertificate { reason };
        let (rest, cert) = X509Certificate::from_der(der).map_err(|e| invalid(e.to_string()))?;
        if !rest.is_empty() {
            return Err(invalid("trailing bytes after the certificate".to_owned()));
        }
        let mut dns_names = Vec::new();
        let mut ip_addresses = Vec::new();
        let san = cert
            .subject_alternative_name()
            .map_err(|e| invalid(format!("subject alternative names: {e}")))?;
        for name in san.iter().flat_map(|san| san.value.general_names.iter()) {
            match name {
                GeneralName::DNSName(dns) => dns_names.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                        ip_addresses.push(IpAddr::from(v4));
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                        ip_addresses.push(IpAddr::from(v6));
                    }
                }
                _ => {}
            }
        }
        let validity = cert.validity();
        Ok(Self {
            subject: cert.subject().to_string(),
            dns_names,
            ip_addresses,
            not_before: from_unix(validity.not_before.timestamp()),
            not_after: from_unix(validity.not_after.timestamp()),
            spki_der: cert.public_key().raw.to_vec(),
            is_ca: cert.is_ca(),
        })
    }
}

fn from_unix(secs: i64) -> SystemTime {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}
