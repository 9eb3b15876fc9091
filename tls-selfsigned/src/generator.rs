//! The generator: [`SelfSigned`] and leaf generation (its configuration is `config.rs`'s, made by
//! `builder.rs`; its CA `ca.rs`'s; the CA-mode methods `rotation.rs`'s).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tls_source::{CertBundle, Origin};

use crate::ca::Ca;
use crate::config::{Config, MAX_BACKDATE};
use crate::dn::distinguished_name;
use crate::{Clock, Error, fit, persist};

/// Generates self-signed (or CA-signed) certificates; made by [`SelfSigned::builder`].
///
/// Cheap to clone; clones share the CA.
#[derive(Debug, Clone)]
pub struct SelfSigned {
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) ca: Arc<Mutex<Option<Arc<Ca>>>>,
}

// ===== impl SelfSigned =====

/// A newly generated leaf: the bundle, its PEM, when it expires, and the CA that signed it.
pub(crate) struct Generated {
    pub(crate) bundle: CertBundle,
    pub(crate) pem: PemPair,
    pub(crate) not_after: SystemTime,
    pub(crate) ca: Option<Arc<Ca>>,
}

impl SelfSigned {
    /// The clock "now" comes from, for generation and every fit check (the builder's
    /// [`clock`](crate::Builder::clock)).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The leaf lifetime.
    pub fn validity(&self) -> Duration {
        self.config.validity
    }

    /// How long before a leaf's expiry it is renewed.
    pub fn renewal_window(&self) -> Duration {
        self.config.renewal.window(self.config.validity)
    }

    /// Generates a fresh key and certificate for the configured names (signed by the CA in CA
    /// mode). Does not read or write the persistence directory; the source does.
    ///
    /// # Errors
    /// [`Error::Generate`] if key generation or signing fails.
    pub fn generate(&self) -> Result<CertBundle, Error> {
        Ok(self.generate_leaf()?.bundle)
    }

    /// Like [`generate`](Self::generate), as PEM for writing to files.
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_pem(&self) -> Result<PemPair, Error> {
        Ok(self.generate_leaf()?.pem)
    }

    pub(crate) fn generate_leaf(&self) -> Result<Generated, Error> {
        let ca = self.current_ca()?;
        let config = &self.config;
        let mut params = CertificateParams::default();
        for name in &config.dns_names {
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
            .extend(config.ip_addresses.iter().copied().map(SanType::IpAddress));
        let common_name = config
            .common_name
            .clone()
            .or_else(|| config.dns_names.first().cloned())
            .or_else(|| config.ip_addresses.first().map(ToString::to_string))
            .unwrap_or_else(|| "self-signed".to_owned());
        params.distinguished_name =
            distinguished_name(&common_name, config.organization.as_deref());
        let now = self.clock.now();
        let mut not_after = now + config.validity;
        if let Some(ca) = &ca {
            // A leaf never outlives its CA.
            not_after = not_after.min(ca.not_after);
        }
        params.not_before = (now - MAX_BACKDATE.min(config.validity / 10)).into();
        params.not_after = not_after.into();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if config.client_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.use_authority_key_identifier_extension = ca.is_some();
        let key = config.algorithm.generate()?;
        let cert = match &ca {
            Some(ca) => params.signed_by(&key, &ca.issuer),
            None => params.self_signed(&key),
        }
        .map_err(Error::Generate)?;
        let parsed =
            fit::parse(cert.der()).map_err(|reason| Error::Generate(rcgen::Error::X509(reason)))?;
        Ok(self.assemble(cert.der().clone(), cert.pem(), &key, ca, parsed.not_after))
    }

    /// Builds the bundle and PEM of a leaf (generated or loaded) with the CA.
    pub(crate) fn assemble(
        &self,
        leaf_der: CertificateDer<'static>,
        leaf_pem: String,
        key: &KeyPair,
        ca: Option<Arc<Ca>>,
        not_after: SystemTime,
    ) -> Generated {
        let in_chain = self.config.ca.as_ref().is_some_and(|c| c.in_chain);
        let mut chain = vec![leaf_der];
        let mut cert_pem = leaf_pem;
        let mut ca_certs = Vec::new();
        if let Some(ca) = &ca {
            if in_chain {
                chain.push(ca.cert_der.clone());
                cert_pem.push_str(&ca.cert_pem);
            }
            ca_certs.push(ca.cert_der.clone());
        }
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let origin = match &self.config.persist {
            Some(dir) => Origin::Other(format!("self-signed, kept in {}", dir.display())),
            None => Origin::SelfSigned,
        };
        Generated {
            bundle: CertBundle::new(chain, key_der, origin).with_ca(ca_certs),
            pem: PemPair {
                cert_pem,
                key_pem: key.serialize_pem(),
                ca_pem: ca.as_ref().map(|ca| ca.cert_pem.clone()),
            },
            not_after,
            ca,
        }
    }

    pub(crate) fn persist_dir(&self) -> Option<&std::path::Path> {
        self.config.persist.as_deref()
    }

    pub(crate) fn write_leaf(&self, generated: &Generated) -> Result<(), Error> {
        match self.persist_dir() {
            Some(dir) => {
                // The CA (in CA mode) goes with the leaf it signs, in the same swap: a CA renewed
                // while running is on disk before (never after) a leaf signed by it.
                let ca = &generated.ca;
                let mut files = vec![
                    ("tls.crt", generated.pem.cert_pem.as_str(), 0o644),
                    ("tls.key", generated.pem.key_pem.as_str(), 0o600),
                ];
                if let Some(ca) = &ca {
                    files.push(("ca.crt", ca.cert_pem.as_str(), 0o644));
                    files.push(("ca.key", ca.key_pem.as_str(), 0o600));
                }
                persist::write_set(dir, &files)
            }
            None => Ok(()),
        }
    }
}

/// A generated certificate and its private key as PEM. `Debug` does not show the key.
#[derive(Clone)]
pub struct PemPair {
    /// The certificate chain, PEM (the leaf, then the CA when it is in the chain).
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The CA certificate in CA mode, PEM.
    pub ca_pem: Option<String>,
}

impl fmt::Debug for PemPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemPair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("ca_pem", &self.ca_pem)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    use super::*;
    use crate::{KeyAlgorithm, Renewal};

    #[test]
    fn every_available_algorithm_generates_a_usable_pair() {
        for algorithm in [
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
            KeyAlgorithm::Ed25519,
        ] {
            let g = SelfSigned::builder()
                .dns_name("localhost")
                .key_algorithm(algorithm)
                .build()
                .unwrap();
            let bundle = g.generate().unwrap();
            assert_eq!(g.check_bundle(&bundle), Ok(()), "{algorithm}");
        }
    }

    #[test]
    fn rsa_without_its_feature_is_a_clear_error() {
        let built = SelfSigned::builder()
            .key_algorithm(KeyAlgorithm::Rsa2048)
            .build();
        if cfg!(feature = "aws-lc-rs") {
            assert!(built.is_ok());
        } else {
            assert_eq!(
                built.unwrap_err().to_string(),
                "RSA-2048 keys cannot be generated by this build: enable the `aws-lc-rs` feature of tls-selfsigned"
            );
        }
    }

    #[test]
    fn nonsense_configurations_are_refused() {
        let errs = [
            SelfSigned::builder()
                .validity(Duration::ZERO)
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .validity(Duration::from_secs(1))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .validity(Duration::from_millis(1))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .validity(Duration::from_secs(3_650_000 * 86_400))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .ca_validity(Duration::MAX)
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .validity(Duration::from_secs(10))
                .renewal(Renewal::Fraction(0.01))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .renewal(Renewal::Fraction(1.5))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .validity(Duration::from_secs(60))
                .renewal(Renewal::Before(Duration::from_secs(60)))
                .build()
                .unwrap_err(),
            SelfSigned::builder()
                .dns_name("bad\u{e9}name")
                .build()
                .unwrap_err(),
        ];
        for err in errs {
            assert!(
                matches!(err, Error::Config { .. } | Error::InvalidName { .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn too_short_and_overflowing_validities_say_why() {
        let short = SelfSigned::builder()
            .validity(Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert_eq!(
            short.to_string(),
            "invalid self-signed configuration: a validity of 1s is too short to renew safely: at least 3s (certificate times have one-second precision)"
        );
        let long = SelfSigned::builder()
            .validity(Duration::from_secs(3_650_000 * 86_400))
            .build()
            .unwrap_err();
        assert!(
            long.to_string().contains("ends after the year 9999"),
            "{long}"
        );
        // The longest that fits still generates (no panic in the time conversion).
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .validity(Duration::from_secs(7_000 * 365 * 86_400))
            .build()
            .unwrap();
        assert!(g.generate().is_ok());
    }

    #[test]
    fn subject_names_and_validity() {
        let g = SelfSigned::builder()
            .name("localhost")
            .name("127.0.0.1")
            .name("::1")
            .organization("Example Org")
            .common_name("example")
            .validity(Duration::from_secs(3600))
            .build()
            .unwrap();
        let bundle = g.generate().unwrap();
        let (_, cert) = X509Certificate::from_der(bundle.leaf().unwrap()).unwrap();
        assert_eq!(cert.subject().to_string(), "CN=example, O=Example Org");
        let parsed = fit::parse(bundle.leaf().unwrap()).unwrap();
        assert_eq!(parsed.dns_names, ["localhost"]);
        assert_eq!(parsed.ip_addresses.len(), 2);
        let lifetime = parsed.not_after.duration_since(parsed.not_before).unwrap();
        assert!((3600..=3661).contains(&lifetime.as_secs()), "{lifetime:?}");
        assert!(bundle.ca().is_empty());
    }

    #[test]
    fn ca_mode_signs_leaves_with_one_ca() {
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let (a, b) = (g.generate().unwrap(), g.generate().unwrap());
        assert_eq!(a.chain().len(), 1, "the CA is not in the chain by default");
        assert_eq!(a.ca(), b.ca(), "one CA across leaves");
        assert_ne!(a.leaf(), b.leaf());
        let (_, ca) = X509Certificate::from_der(&a.ca()[0]).unwrap();
        assert!(ca.is_ca());
        let with_chain = SelfSigned::builder()
            .dns_name("localhost")
            .ca_in_chain(true)
            .build()
            .unwrap();
        let bundle = with_chain.generate().unwrap();
        assert_eq!(bundle.chain().len(), 2);
        assert_eq!(bundle.chain()[1], bundle.ca()[0]);
    }

    #[test]
    fn a_supplied_ca_signs_and_a_bad_one_is_refused() {
        let owner = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let ca = owner.current_ca().unwrap().unwrap();
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .ca_from_pem(ca.cert_pem.clone(), ca.key_pem.clone())
            .build()
            .unwrap();
        assert_eq!(g.generate().unwrap().ca()[0], ca.cert_der);
        let leaf = g.generate_pem().unwrap();
        let err = SelfSigned::builder()
            .ca_from_pem(leaf.cert_pem, leaf.key_pem.clone())
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the CA cannot be used: the certificate is not a CA (basicConstraints CA:TRUE)"
        );
        assert!(!format!("{err:?}").contains(&leaf.key_pem[40..80]));
    }

    #[test]
    fn debug_shows_no_key() {
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let pair = g.generate_pem().unwrap();
        let ca = g.current_ca().unwrap().unwrap();
        let body = |pem: &str| pem.lines().nth(1).unwrap().to_owned();
        for shown in [format!("{pair:?}"), format!("{g:?}"), format!("{ca:?}")] {
            assert!(!shown.contains(&body(&pair.key_pem)), "{shown}");
            assert!(!shown.contains(&body(&ca.key_pem)), "{shown}");
        }
    }
}
