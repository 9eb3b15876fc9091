//! Self-signed TLS certificates as a [`CertSource`](tls_source::CertSource), renewed before
//! they expire.
//!
//! The embedded default of a server that has no certificate yet, and the certificate of many
//! internal services. Keys are ECDSA P-256 (fast to generate, small, accepted everywhere).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tls_selfsigned::SelfSigned;
//!
//! let generator = SelfSigned::builder()
//!     .dns_name("localhost")
//!     .ip_address("127.0.0.1".parse().unwrap())
//!     .validity(Duration::from_secs(24 * 3600))
//!     .build();
//! let bundle = generator.generate().unwrap();
//! assert_eq!(bundle.chain().len(), 1);
//!
//! // As a source: one bundle now, a fresh one whenever a third of the lifetime remains.
//! let mut source = generator.into_source();
//! let first = source.next().await.unwrap().unwrap();
//! # }
//! ```

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use futures::stream::BoxStream;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tls_source::{CertBundle, Origin};

/// The default lifetime of a generated certificate: 90 days.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// How far back `not_before` is set, so that clients with a slightly slow clock accept a
/// certificate generated this second.
const BACKDATE: Duration = Duration::from_secs(60);

/// The longest the source sleeps before looking at the wall clock again, so that a suspend or a
/// clock step does not delay renewal by more than this.
const MAX_NAP: Duration = Duration::from_secs(30);

/// Why a certificate could not be generated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A DNS name is not valid in a certificate.
    #[error("invalid DNS name {name:?}: {source}")]
    InvalidName {
        /// The name.
        name: String,
        /// What rcgen said.
        #[source]
        source: rcgen::Error,
    },
    /// Key generation or signing failed.
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[source] rcgen::Error),
}

/// Generates self-signed certificates; made by [`SelfSigned::builder`].
#[derive(Debug, Clone)]
pub struct SelfSigned {
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
    validity: Duration,
}

/// Configures a [`SelfSigned`] generator.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    inner: SelfSigned,
}

// ===== impl Builder =====

impl Builder {
    /// Adds a DNS name (e.g. `localhost`, `api.internal`, `*.svc.cluster.local`).
    pub fn dns_name(mut self, name: impl Into<String>) -> Self {
        self.inner.dns_names.push(name.into());
        self
    }

    /// Adds an IP address.
    pub fn ip_address(mut self, ip: IpAddr) -> Self {
        self.inner.ip_addresses.push(ip);
        self
    }

    /// Adds a name that may be either: an IP address when it parses as one, else a DNS name.
    pub fn name(self, name: &str) -> Self {
        match name.parse::<IpAddr>() {
            Ok(ip) => self.ip_address(ip),
            Err(_) => self.dns_name(name),
        }
    }

    /// The lifetime of each certificate (default: [`DEFAULT_VALIDITY`], 90 days). A new one is
    /// generated when a third of it remains.
    pub fn validity(mut self, validity: Duration) -> Self {
        self.inner.validity = validity;
        self
    }

    /// The generator.
    pub fn build(self) -> SelfSigned {
        self.inner
    }
}

// ===== impl SelfSigned =====

impl SelfSigned {
    /// Starts configuring a generator with no names and the default validity.
    pub fn builder() -> Builder {
        Builder {
            inner: Self {
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                validity: DEFAULT_VALIDITY,
            },
        }
    }

    /// The certificate lifetime.
    pub fn validity(&self) -> Duration {
        self.validity
    }

    /// Generates a fresh key and a self-signed certificate for the configured names.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a name that cannot be in a certificate; [`Error::Generate`] if
    /// key generation or signing fails.
    pub fn generate(&self) -> Result<CertBundle, Error> {
        let (cert, key) = self.generate_rcgen()?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        Ok(CertBundle::new(chain, key, Origin::SelfSigned))
    }

    /// Like [`generate`](Self::generate), as PEM text for writing to files (`tls.crt`,
    /// `tls.key`; the key is PKCS#8).
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_pem(&self) -> Result<PemPair, Error> {
        let (cert, key) = self.generate_rcgen()?;
        Ok(PemPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn generate_rcgen(&self) -> Result<(rcgen::Certificate, KeyPair), Error> {
        let mut params = CertificateParams::default();
        for name in &self.dns_names {
            let ia5 = name
                .clone()
                .try_into()
                .map_err(|source| Error::InvalidName {
                    name: name.clone(),
                    source,
                })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(self.ip_addresses.iter().copied().map(SanType::IpAddress));
        let mut dn = DistinguishedName::new();
        let common_name = self
            .dns_names
            .first()
            .cloned()
            .or_else(|| self.ip_addresses.first().map(ToString::to_string))
            .unwrap_or_else(|| "self-signed".to_owned());
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + self.validity).into();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(Error::Generate)?;
        let cert = params.self_signed(&key).map_err(Error::Generate)?;
        Ok((cert, key))
    }

    /// The generator as a source: a bundle at once, then a new one each time a third of the
    /// current certificate's lifetime remains. The wall clock is checked at least every 30
    /// seconds, so a suspend or a clock step does not delay renewal. A generation failure is an
    /// `Err` item, retried with backoff.
    pub fn into_source(self) -> SelfSignedSource {
        let inner = futures::stream::unfold(
            (self, None::<SystemTime>, Duration::from_secs(1)),
            |(generator, renew_at, backoff)| async move {
                if let Some(renew_at) = renew_at {
                    wait_for_wall_clock(renew_at).await;
                }
                match generator.generate() {
                    Ok(bundle) => {
                        let renew_at = SystemTime::now() + generator.validity * 2 / 3;
                        Some((
                            Ok(bundle),
                            (generator, Some(renew_at), Duration::from_secs(1)),
                        ))
                    }
                    Err(err) => {
                        let retry_at = SystemTime::now() + backoff;
                        let backoff = (backoff * 2).min(Duration::from_secs(60));
                        let err = tls_source::Error::source("self-signed", err);
                        Some((Err(err), (generator, Some(retry_at), backoff)))
                    }
                }
            },
        );
        SelfSignedSource {
            inner: Box::pin(inner),
        }
    }
}

async fn wait_for_wall_clock(at: SystemTime) {
    loop {
        let Ok(remaining) = at.duration_since(SystemTime::now()) else {
            return;
        };
        tokio::time::sleep(remaining.min(MAX_NAP)).await;
    }
}

/// A generated certificate and its private key as PEM. `Debug` does not show the key.
#[derive(Clone)]
pub struct PemPair {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl fmt::Debug for PemPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemPair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The stream made by [`SelfSigned::into_source`].
#[must_use = "streams do nothing unless polled"]
pub struct SelfSignedSource {
    inner: BoxStream<'static, Result<CertBundle, tls_source::Error>>,
}

impl Stream for SelfSignedSource {
    type Item = Result<CertBundle, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for SelfSignedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelfSignedSource").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};

    #[test]
    fn covers_the_names_for_the_validity() {
        let bundle = SelfSigned::builder()
            .name("localhost")
            .name("127.0.0.1")
            .name("::1")
            .validity(Duration::from_secs(3600))
            .build()
            .generate()
            .unwrap();
        let (_, cert) = X509Certificate::from_der(bundle.leaf().unwrap()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => (*d).to_owned(),
                GeneralName::IPAddress(ip) => format!("ip:{}", ip.len()),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(names, ["localhost", "ip:4", "ip:16"]);
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert!(
            (3600..=3600 + 61).contains(&lifetime),
            "lifetime {lifetime}"
        );
        assert!(matches!(bundle.origin(), Origin::SelfSigned));
    }

    #[test]
    fn refuses_a_bad_dns_name() {
        let err = SelfSigned::builder()
            .dns_name("bad\u{e9}name")
            .build()
            .generate()
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid DNS name \"bad\u{e9}name\""),
            "{err}"
        );
    }

    #[tokio::test]
    async fn renews_when_a_third_of_the_lifetime_remains() {
        use futures::StreamExt as _;
        let mut source = SelfSigned::builder()
            .dns_name("renew.test")
            .validity(Duration::from_secs(3))
            .build()
            .into_source();
        let first = source.next().await.unwrap().unwrap();
        let second = source.next().await.unwrap().unwrap();
        assert_ne!(first.digest(), second.digest());
    }
}
