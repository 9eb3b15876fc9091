//! CA mode's CA: the one that signs leaves (generated, supplied or persisted, kept behind the
//! generator's mutex), and [`CaPem`]. What the generator does with it is `rotation.rs`'s.

use std::fmt;
use std::time::SystemTime;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::CertificateDer;

use crate::config::{CaConfig, MAX_BACKDATE};
use crate::dn::distinguished_name;
use crate::{Clock, Error, KeyAlgorithm, fit};

/// A certificate authority that signs leaves.
pub(crate) struct Ca {
    pub(crate) issuer: Issuer<'static, KeyPair>,
    pub(crate) cert_der: CertificateDer<'static>,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) not_before: SystemTime,
    pub(crate) not_after: SystemTime,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("fingerprint", &tls_source::Digest::of(&self.cert_der))
            .finish_non_exhaustive()
    }
}

impl Ca {
    pub(crate) fn generate(
        config: &CaConfig,
        algorithm: KeyAlgorithm,
        clock: &dyn Clock,
    ) -> Result<Self, Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name("tls-rotation self-signed CA", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = clock.now();
        params.not_before = (now - MAX_BACKDATE.min(config.validity / 10)).into();
        params.not_after = (now + config.validity).into();
        let key = algorithm.generate()?;
        let cert = params.self_signed(&key).map_err(Error::Generate)?;
        tracing::info!(
            fingerprint = %tls_source::Digest::of(cert.der()),
            "generated a new self-signed CA"
        );
        Self::from_parts(cert.der().clone(), cert.pem(), key)
    }

    /// A CA from PEM (a supplied one, or one persisted earlier).
    pub(crate) fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        let ca_err = |reason: String| Error::Ca { reason };
        let der = tls_source::Decoder::new()
            .certificates("CA certificate", cert_pem.as_bytes())
            .map_err(|e| ca_err(e.to_string()))?
            .remove(0);
        let key_der = tls_source::Decoder::new()
            .private_key("CA key", key_pem.as_bytes())
            .map_err(|e| ca_err(e.to_string()))?;
        let key = KeyPair::try_from(&key_der)
            .map_err(|_| ca_err("the CA key is not a PKCS#8 ECDSA, Ed25519 or RSA key".into()))?;
        Self::from_parts(der, cert_pem.to_owned(), key)
    }

    fn from_parts(
        cert_der: CertificateDer<'static>,
        cert_pem: String,
        key: KeyPair,
    ) -> Result<Self, Error> {
        let ca_err = |reason: String| Error::Ca { reason };
        let parsed = fit::parse(&cert_der).map_err(|e| ca_err(e.to_string()))?;
        if !parsed.is_ca {
            return Err(ca_err(
                "the certificate is not a CA (basicConstraints CA:TRUE)".into(),
            ));
        }
        if !fit::key_matches(&key, &parsed) {
            return Err(ca_err(
                "the CA key does not match the CA certificate".into(),
            ));
        }
        let key_pem = key.serialize_pem();
        let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| ca_err(e.to_string()))?;
        Ok(Self {
            issuer,
            cert_pem,
            key_pem,
            not_before: parsed.not_before,
            not_after: parsed.not_after,
            cert_der,
        })
    }
}

/// A CA certificate and its private key, PEM (the key PKCS#8). `Debug` does not show the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CaPem {
    /// The CA certificate.
    pub cert_pem: String,
    /// The CA's private key.
    pub key_pem: String,
}

impl fmt::Debug for CaPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}
