//! Who a client certificate names: what an authorization rule is matched against.

use std::fmt;

use x509_parser::extensions::GeneralName;

use super::{InvalidCertificate, certificate};
use crate::Digest;

/// The names in a (client) certificate that authorization rules match: the subject's common
/// name, the DNS names and the URIs among the subject alternative names (a SPIFFE ID is a URI
/// SAN), and the certificate's SHA-256 digest.
///
/// ```
/// # let der = tls_test::TestCa::new("doc").leaf(&["web.example.com"]).cert_der;
/// use tls_source::x509::Identity;
///
/// let client = Identity::parse(&der).unwrap();
/// assert_eq!(client.dns_names, ["web.example.com"]);
/// assert_eq!(client.spiffe_id(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Identity {
    /// The subject, e.g. `CN=web, O=Example`.
    pub subject: String,
    /// The subject's (first) common name.
    pub common_name: Option<String>,
    /// The DNS names among the subject alternative names.
    pub dns_names: Vec<String>,
    /// The URIs among the subject alternative names.
    pub uris: Vec<String>,
    /// The SHA-256 digest of the certificate's DER.
    pub digest: Digest,
}

impl Identity {
    /// Reads the names of a DER certificate.
    ///
    /// # Errors
    /// [`InvalidCertificate`] for anything but one well-formed certificate.
    pub fn parse(der: &[u8]) -> Result<Self, InvalidCertificate> {
        let cert = certificate(der, true)?;
        let mut dns_names = Vec::new();
        let mut uris = Vec::new();
        let san = cert
            .subject_alternative_name()
            .map_err(|e| InvalidCertificate {
                reason: format!("subject alternative names: {e}"),
            })?;
        for name in san.iter().flat_map(|san| san.value.general_names.iter()) {
            match name {
                GeneralName::DNSName(dns) => dns_names.push((*dns).to_owned()),
                GeneralName::URI(uri) => uris.push((*uri).to_owned()),
                _ => {}
            }
        }
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        Ok(Self {
            subject: cert.subject().to_string(),
            common_name,
            dns_names,
            uris,
            digest: Digest::of(der),
        })
    }

    /// The client's SPIFFE ID: its URI SAN when it has exactly one and that starts with
    /// `spiffe://` (a certificate with more than one URI SAN is no SPIFFE identity, as the
    /// X.509-SVID specification says).
    pub fn spiffe_id(&self) -> Option<&str> {
        match self.uris.as_slice() {
            [only] if only.starts_with("spiffe://") => Some(only),
            _ => None,
        }
    }
}

/// One line for logs: the common name, the SANs and the digest, never the key.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "subject \"{}\"", self.subject)?;
        if !self.dns_names.is_empty() {
            write!(f, ", DNS {}", self.dns_names.join(","))?;
        }
        if !self.uris.is_empty() {
            write!(f, ", URI {}", self.uris.join(","))?;
        }
        write!(f, ", sha256 {}", self.digest)
    }
}
