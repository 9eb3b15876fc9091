//! What a certificate says about itself (feature `x509`): names, validity, public key.
//!
//! Shared by the reload core (policy and status) and the self-signed generator (the fit check),
//! so both read certificates the same way.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::certificate::X509CertificateParser;
use x509_parser::extensions::GeneralName;
use x509_parser::nom::Parser as _;
use x509_parser::prelude::X509Certificate;

mod identity;
mod lean;

pub use identity::Identity;

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
    /// The issuer, e.g. `CN=Example CA`.
    pub issuer: String,
    /// The subject name as DER, for exact comparison with the issuer of another certificate.
    pub subject_der: Vec<u8>,
    /// The issuer name as DER.
    pub issuer_der: Vec<u8>,
    /// The extended key usage extension; `None` when the certificate has none (any use).
    pub extended_key_usage: Option<ExtendedKeyUsage>,
}

/// What a certificate's extended key usage extension allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtendedKeyUsage {
    /// `id-kp-serverAuth`: a TLS server.
    pub server_auth: bool,
    /// `id-kp-clientAuth`: a TLS client.
    pub client_auth: bool,
    /// `anyExtendedKeyUsage`.
    pub any: bool,
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
        lean::parse(der).map_or_else(|| full(der), Ok)
    }

    /// A certificate's subject and issuer names as DER: what a chain-order check compares.
    /// Read as [`parse`](Self::parse) reads a certificate; what its lean reader declines gets
    /// a shallow parse by x509-parser (extensions split but not decoded).
    ///
    /// ```
    /// # let ca = tls_test::TestCa::new("doc");
    /// # let leaf = ca.leaf(&["example.com"]);
    /// use tls_source::x509::LeafInfo;
    ///
    /// let info = LeafInfo::parse(&leaf.cert_der).unwrap();
    /// let (subject, issuer) = LeafInfo::names_der(&leaf.cert_der).unwrap();
    /// assert_eq!((subject, issuer), (info.subject_der, info.issuer_der));
    /// ```
    ///
    /// # Errors
    /// [`InvalidCertificate`] for anything but one well-formed certificate.
    pub fn names_der(der: &[u8]) -> Result<(Vec<u8>, Vec<u8>), InvalidCertificate> {
        if let Some(info) = lean::parse(der) {
            return Ok((info.subject_der, info.issuer_der));
        }
        let cert = certificate(der, false)?;
        Ok((
            cert.subject().as_raw().to_vec(),
            cert.issuer().as_raw().to_vec(),
        ))
    }

    /// Whether this certificate is valid for `name`: a DNS name (matched case-insensitively
    /// against its DNS names, where `*.example.com` covers exactly one label, `a.example.com` but
    /// neither `example.com` nor `a.b.example.com`) or an IP address. A wildcard `name` is covered
    /// only by the same wildcard.
    ///
    /// ```
    /// # let der = tls_test::TestCa::new("doc").leaf(&["*.example.com"]).cert_der;
    /// use tls_source::x509::LeafInfo;
    ///
    /// let leaf = LeafInfo::parse(&der).unwrap(); // a certificate for *.example.com
    /// assert!(leaf.covers("a.example.com"));
    /// assert!(leaf.covers("*.example.com"));
    /// assert!(!leaf.covers("a.b.example.com"));
    /// assert!(!leaf.covers("example.com"));
    /// ```
    pub fn covers(&self, name: &str) -> bool {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.ip_addresses.contains(&ip);
        }
        let name = name.strip_suffix('.').unwrap_or(name);
        self.dns_names.iter().any(|san| {
            let san = san.strip_suffix('.').unwrap_or(san);
            san.eq_ignore_ascii_case(name)
                || san.strip_prefix("*.").is_some_and(|suffix| {
                    !name.starts_with("*.")
                        && name.split_once('.').is_some_and(|(label, rest)| {
                            !label.is_empty() && rest.eq_ignore_ascii_case(suffix)
                        })
                })
        })
    }
}

/// [`LeafInfo::parse`] by x509-parser: for what the [`lean`] reader declines, with the error
/// message when the certificate is not valid.
fn full(der: &[u8]) -> Result<LeafInfo, InvalidCertificate> {
    let invalid = |reason: String| InvalidCertificate { reason };
    let cert = certificate(der, true)?;
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
    let extended_key_usage = cert
        .extended_key_usage()
        .map_err(|e| invalid(format!("extended key usage: {e}")))?
        .map(|eku| ExtendedKeyUsage {
            server_auth: eku.value.server_auth,
            client_auth: eku.value.client_auth,
            any: eku.value.any,
        });
    let validity = cert.validity();
    Ok(LeafInfo {
        subject: cert.subject().to_string(),
        dns_names,
        ip_addresses,
        not_before: from_unix(validity.not_before.timestamp()),
        not_after: from_unix(validity.not_after.timestamp()),
        spki_der: cert.public_key().raw.to_vec(),
        is_ca: cert.is_ca(),
        issuer: cert.issuer().to_string(),
        subject_der: cert.subject().as_raw().to_vec(),
        issuer_der: cert.issuer().as_raw().to_vec(),
        extended_key_usage,
    })
}

/// Exactly one certificate in `der`; its extensions decoded only with `deep`.
fn certificate(der: &[u8], deep: bool) -> Result<X509Certificate<'_>, InvalidCertificate> {
    let invalid = |reason: String| InvalidCertificate { reason };
    let (rest, cert) = X509CertificateParser::new()
        .with_deep_parse_extensions(deep)
        .parse(der)
        .map_err(|e| invalid(e.to_string()))?;
    if !rest.is_empty() {
        return Err(invalid("trailing bytes after the certificate".to_owned()));
    }
    Ok(cert)
}

fn from_unix(secs: i64) -> SystemTime {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

#[cfg(test)]
mod tests;
