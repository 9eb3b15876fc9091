//! The generator: configuration, the CA, leaf generation.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tls_source::{CertBundle, Origin};

use crate::fit;
use crate::{Clock, Error, SystemClock, persist};

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

/// How far back `not_before` is set at most, so that clients whose clock is a little behind accept
/// a certificate made this second (a tenth of the validity for very short lifetimes).
const MAX_BACKDATE: Duration = Duration::from_secs(60);

/// The key algorithm of generated certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// ECDSA on P-256 with SHA-256: fast to generate, small, accepted everywhere. The default.
    #[default]
    EcdsaP256,
    /// ECDSA on P-384 with SHA-384.
    EcdsaP384,
    /// Ed25519 (not accepted by every client: browsers do not).
    Ed25519,
    /// RSA 2048 (needs the `aws-lc-rs` feature; generation takes tens of milliseconds).
    Rsa2048,
    /// RSA 3072 (needs the `aws-lc-rs` feature).
    Rsa3072,
    /// RSA 4096 (needs the `aws-lc-rs` feature; generation can take seconds).
    Rsa4096,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EcdsaP256 => "ECDSA P-256",
            Self::EcdsaP384 => "ECDSA P-384",
            Self::Ed25519 => "Ed25519",
            Self::Rsa2048 => "RSA-2048",
            Self::Rsa3072 => "RSA-3072",
            Self::Rsa4096 => "RSA-4096",
        })
    }
}

impl KeyAlgorithm {
    /// Whether this build can generate keys of this algorithm.
    pub fn is_available(self) -> bool {
        !self.is_rsa() || cfg!(feature = "aws-lc-rs")
    }

    fn is_rsa(self) -> bool {
        matches!(self, Self::Rsa2048 | Self::Rsa3072 | Self::Rsa4096)
    }

    pub(crate) fn generate(self) -> Result<KeyPair, Error> {
        let alg = match self {
            Self::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            Self::Ed25519 => &rcgen::PKCS_ED25519,
            Self::Rsa2048 | Self::Rsa3072 | Self::Rsa4096 => return self.generate_rsa(),
        };
        KeyPair::generate_for(alg).map_err(Error::Generate)
    }

    #[cfg(feature = "aws-lc-rs")]
    fn generate_rsa(self) -> Result<KeyPair, Error> {
        let size = match self {
            Self::Rsa3072 => rcgen::RsaKeySize::_3072,
            Self::Rsa4096 => rcgen::RsaKeySize::_4096,
            _ => rcgen::RsaKeySize::_2048,
        };
        KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size).map_err(Error::Generate)
    }

    #[cfg(not(feature = "aws-lc-rs"))]
    fn generate_rsa(self) -> Result<KeyPair, Error> {
        Err(Error::Unsupported {
            algorithm: self,
            feature: "aws-lc-rs",
        })
    }
}

/// When a certificate is renewed: once less than this remains of its validity.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Renewal {
    /// When this fraction of the configured validity remains (default: a third).
    Fraction(f64),
    /// When this much time remains.
    Before(Duration),
}

impl Default for Renewal {
    fn default() -> Self {
        Self::Fraction(1.0 / 3.0)
    }
}

impl Renewal {
    /// The renewal window for a certificate of the given validity.
    pub fn window(&self, validity: Duration) -> Duration {
        match *self {
            Self::Fraction(f) => validity.mul_f64(f),
            Self::Before(before) => before,
        }
    }
}

#[derive(Debug, Clone)]
enum CaSource {
    Generate,
    Pem { cert_pem: String, key_pem: Redacted },
}

/// A key's PEM that `Debug` does not show.
#[derive(Clone)]
struct Redacted(String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CaConfig {
    source: CaSource,
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
}

/// Generates self-signed (or CA-signed) certificates; made by [`SelfSigned::builder`].
///
/// Cheap to clone; clones share the CA.
#[derive(Debug, Clone)]
pub struct SelfSigned {
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Arc<dyn Clock>,
    ca: Arc<Mutex<Option<Arc<Ca>>>>,
}

/// Configures a [`SelfSigned`] generator.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    config: Config,
    clock: Arc<dyn Clock>,
}

// ===== impl Builder =====

impl Builder {
    /// Adds a DNS name (e.g. `localhost`, `api.internal`, `*.svc.cluster.local`).
    pub fn dns_name(mut self, name: impl Into<String>) -> Self {
        self.config.dns_names.push(name.into());
        self
    }

    /// Adds an IP address.
    pub fn ip_address(mut self, ip: IpAddr) -> Self {
        self.config.ip_addresses.push(ip);
        self
    }

    /// Adds a name that may be either: an IP address when it parses as one, else a DNS name.
    pub fn name(self, name: &str) -> Self {
        match name.parse::<IpAddr>() {
            Ok(ip) => self.ip_address(ip),
            Err(_) => self.dns_name(name),
        }
    }

    /// The lifetime of each leaf (default: [`DEFAULT_VALIDITY`], 90 days).
    pub fn validity(mut self, validity: Duration) -> Self {
        self.config.validity = validity;
        self
    }

    /// When to renew (default: when a third of the validity remains).
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.config.renewal = renewal;
        self
    }

    /// The key algorithm (default: ECDSA P-256).
    pub fn key_algorithm(mut self, algorithm: KeyAlgorithm) -> Self {
        self.config.algorithm = algorithm;
        self
    }

    /// The subject's organization (O).
    pub fn organization(mut self, organization: impl Into<String>) -> Self {
        self.config.organization = Some(organization.into());
        self
    }

    /// The subject's common name (CN). Default: the first DNS name, else the first IP address.
    pub fn common_name(mut self, common_name: impl Into<String>) -> Self {
        self.config.common_name = Some(common_name.into());
        self
    }

    /// CA mode with a generated CA: a long-lived CA signs short-lived leaves, and is set as the
    /// bundle's CA so clients can trust it across leaf rotations. With
    /// [`persist`](Self::persist) the CA is kept and reused too.
    pub fn ca(mut self) -> Self {
        self.config.ca.get_or_insert_with(default_ca).source = CaSource::Generate;
        self
    }

    /// CA mode with a CA you supply, as PEM (the key in PKCS#8). The CA is never regenerated.
    pub fn ca_from_pem(mut self, cert_pem: impl Into<String>, key_pem: impl Into<String>) -> Self {
        self.config.ca.get_or_insert_with(default_ca).source = CaSource::Pem {
            cert_pem: cert_pem.into(),
            key_pem: Redacted(key_pem.into()),
        };
        self
    }

    /// The lifetime of a generated CA (default: [`DEFAULT_CA_VALIDITY`], 10 years). Turns on CA
    /// mode.
    pub fn ca_validity(mut self, validity: Duration) -> Self {
        self.config.ca.get_or_insert_with(default_ca).validity = validity;
        self
    }

    /// Whether the served chain includes the CA after the leaf (default: no; clients that trust
    /// the CA already have it). Turns on CA mode.
    pub fn ca_in_chain(mut self, in_chain: bool) -> Self {
        self.config.ca.get_or_insert_with(default_ca).in_chain = in_chain;
        self
    }

    /// With [`persist`](Self::persist) in CA mode: replace a persisted CA that cannot be read
    /// back (a corrupt `ca.key`) with a new one, instead of failing with
    /// [`Error::Corrupt`](crate::Error::Corrupt). Off by default: clients pin the CA, and a new
    /// one breaks them.
    pub fn replace_corrupt_ca(mut self, replace: bool) -> Self {
        self.config.replace_corrupt_ca = replace;
        self
    }

    /// Keeps the generated pair (and CA) in `dir` (`tls.crt`, `tls.key`, `ca.crt`, `ca.key`; key
    /// files mode 0600; each generation made visible by one atomic swap of a `..data` symlink,
    /// the layout `FileSource` follows) and reuses them on start while they still fit; see
    /// [`SelfSigned::into_source`].
    pub fn persist(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.persist = Some(dir.into());
        self
    }

    /// Where "now" comes from (default: [`SystemClock`]); for tests.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks the configuration and builds the generator.
    ///
    /// # Errors
    /// [`Error::Config`] for a validity under [`MIN_VALIDITY`] or ending after the year 9999,
    /// a renewal window under [`MIN_RENEWAL_WINDOW`] or not shorter than the validity; [`Error::Unsupported`] for an algorithm this build cannot generate;
    /// [`Error::InvalidName`]; [`Error::Ca`] for a supplied CA that cannot be used.
    pub fn build(self) -> Result<SelfSigned, Error> {
        let config = self.config;
        fn config_err<T>(reason: String) -> Result<T, Error> {
            Err(Error::Config { reason })
        }
        if config.validity < MIN_VALIDITY {
            return config_err(format!(
                "a validity of {:?} is too short to renew safely: at least {MIN_VALIDITY:?} (certificate times have one-second precision)",
                config.validity
            ));
        }
        match config.renewal {
            Renewal::Fraction(f) if !(f > 0.0 && f < 1.0) => {
                return config_err(format!(
                    "the renewal fraction must be between 0 and 1, not {f}"
                ));
            }
            Renewal::Before(before) if before >= config.validity => {
                return config_err(format!(
                    "renewing {before:?} before expiry needs a validity longer than that, not {:?}",
                    config.validity
                ));
            }
            _ => {}
        }
        let window = config.renewal.window(config.validity);
        if window < MIN_RENEWAL_WINDOW {
            return config_err(format!(
                "renewing {window:?} before expiry leaves no time to install the next certificate: at least {MIN_RENEWAL_WINDOW:?} (a longer validity, or a larger renewal window)"
            ));
        }
        let latest = |validity: Duration, what: &str| match self.clock.now().checked_add(validity) {
            Some(end) if end <= tls_source::clock::latest() => Ok(()),
            _ => config_err(format!(
                "a {what} validity of {validity:?} ends after the year 9999, the latest a certificate can express"
            )),
        };
        latest(config.validity, "leaf")?;
        if let Some(ca) = &config.ca {
            if ca.validity < MIN_VALIDITY {
                return config_err(format!(
                    "a CA validity of {:?} is too short: at least {MIN_VALIDITY:?}",
                    ca.validity
                ));
            }
            latest(ca.validity, "CA")?;
        }
        if !config.algorithm.is_available() {
            return Err(Error::Unsupported {
                algorithm: config.algorithm,
                feature: "aws-lc-rs",
            });
        }
        for name in &config.dns_names {
            rcgen::string::Ia5String::try_from(name.as_str()).map_err(|source| {
                Error::InvalidName {
                    name: name.clone(),
                    source,
                }
            })?;
        }
        let ca = match &config.ca {
            Some(CaConfig {
                source: CaSource::Pem { cert_pem, key_pem },
                ..
            }) => Some(Arc::new(Ca::from_pem(cert_pem, &key_pem.0)?)),
            _ => None,
        };
        Ok(SelfSigned {
            config: Arc::new(config),
            clock: self.clock,
            ca: Arc::new(Mutex::new(ca)),
        })
    }
}

fn default_ca() -> CaConfig {
    CaConfig {
        source: CaSource::Generate,
        validity: DEFAULT_CA_VALIDITY,
        in_chain: false,
    }
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
    /// Starts configuring a generator: no names, 90 days, P-256, renewal at a third.
    pub fn builder() -> Builder {
        Builder {
            config: Config {
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                validity: DEFAULT_VALIDITY,
                renewal: Renewal::default(),
                algorithm: KeyAlgorithm::default(),
                organization: None,
                common_name: None,
                ca: None,
                persist: None,
                replace_corrupt_ca: false,
            },
            clock: Arc::new(SystemClock),
        }
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

    /// The CA certificate in CA mode (generating the CA if it does not exist yet), as PEM.
    ///
    /// # Errors
    /// [`Error::Generate`] if the CA must be generated and that fails.
    pub fn ca_pem(&self) -> Result<Option<String>, Error> {
        Ok(self.current_ca()?.map(|ca| ca.cert_pem.clone()))
    }

    /// The CA certificate and key in CA mode (generating the CA if it does not exist yet): for
    /// keeping it elsewhere, e.g. in a Secret only the writer can read.
    ///
    /// # Errors
    /// [`Error::Generate`] if the CA must be generated and that fails.
    pub fn ca_pair(&self) -> Result<Option<CaPem>, Error> {
        Ok(self.current_ca()?.map(|ca| CaPem {
            cert_pem: ca.cert_pem.clone(),
            key_pem: ca.key_pem.clone(),
        }))
    }

    /// A new CA for this configuration (its validity and key algorithm), not installed: the
    /// generator keeps signing with its current CA. For a writer that renews the CA on its own
    /// schedule (announcing the new CA before leaves are signed by it).
    ///
    /// # Errors
    /// [`Error::Generate`].
    pub fn generate_ca(&self) -> Result<CaPem, Error> {
        let config = self.config.ca.clone().unwrap_or_else(default_ca);
        let ca = Ca::generate(&config, self.config.algorithm, &*self.clock)?;
        Ok(CaPem {
            cert_pem: ca.cert_pem,
            key_pem: ca.key_pem,
        })
    }

    /// The same configuration, signing with `ca` (which it never replaces, as with
    /// [`Builder::ca_from_pem`]).
    ///
    /// # Errors
    /// [`Error::Ca`] for a CA that cannot be used.
    pub fn with_ca(&self, ca: &CaPem) -> Result<SelfSigned, Error> {
        let loaded = Ca::from_pem(&ca.cert_pem, &ca.key_pem)?;
        let mut config = (*self.config).clone();
        config.ca.get_or_insert_with(default_ca).source = CaSource::Pem {
            cert_pem: ca.cert_pem.clone(),
            key_pem: Redacted(ca.key_pem.clone()),
        };
        Ok(SelfSigned {
            config: Arc::new(config),
            clock: Arc::clone(&self.clock),
            ca: Arc::new(Mutex::new(Some(Arc::new(loaded)))),
        })
    }

    /// Whether a CA certificate (PEM) can still sign for this configuration: parsable, a CA,
    /// and neither expired nor inside its renewal window (the renewal rule applied to the CA
    /// validity, at most a third of it). Pure: generates nothing.
    ///
    /// # Errors
    /// Why not.
    pub fn check_ca(&self, cert_pem: &[u8]) -> Result<(), crate::Unfit> {
        let der = tls_source::Decoder::new()
            .certificates("CA certificate", cert_pem)
            .map_err(|e| crate::Unfit::Unparsable {
                what: crate::Part::Certificate,
                reason: e.to_string(),
            })?
            .remove(0);
        let parsed = fit::parse(&der).map_err(|reason| crate::Unfit::Unparsable {
            what: crate::Part::Certificate,
            reason,
        })?;
        if !parsed.is_ca {
            return Err(crate::Unfit::Unparsable {
                what: crate::Part::Certificate,
                reason: "not a CA (basicConstraints CA:TRUE)".into(),
            });
        }
        fit::check_times(
            parsed.not_before,
            parsed.not_after,
            self.clock.now(),
            self.ca_window(),
        )
    }

    /// Whether leaves are signed by a CA (the builder's `ca`, `ca_from_pem`...).
    pub fn is_ca_mode(&self) -> bool {
        self.config.ca.is_some()
    }

    /// The CA to sign with: the current one while it fits, else a new one.
    pub(crate) fn current_ca(&self) -> Result<Option<Arc<Ca>>, Error> {
        let Some(ca_config) = &self.config.ca else {
            return Ok(None);
        };
        let mut slot = self
            .ca
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ca) = slot.as_ref() {
            let supplied = matches!(ca_config.source, CaSource::Pem { .. });
            if supplied || self.ca_fits(ca).is_ok() {
                return Ok(Some(Arc::clone(ca)));
            }
        }
        let ca = Arc::new(Ca::generate(
            ca_config,
            self.config.algorithm,
            &*self.clock,
        )?);
        *slot = Some(Arc::clone(&ca));
        Ok(Some(ca))
    }

    /// The CA installed now, if any: never generates one (the fit check is pure).
    pub(crate) fn installed_ca(&self) -> Option<Arc<Ca>> {
        self.ca
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Installs a CA loaded from the persistence directory.
    pub(crate) fn set_ca(&self, ca: Ca) {
        *self
            .ca
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(ca));
    }

    pub(crate) fn ca_fits(&self, ca: &Ca) -> Result<(), crate::Unfit> {
        fit::check_times(
            ca.not_before,
            ca.not_after,
            self.clock.now(),
            self.ca_window(),
        )
    }

    /// How long before a CA's expiry it is renewed: the renewal rule applied to the CA
    /// validity, at most a third of it.
    pub fn ca_window(&self) -> Duration {
        let validity = self
            .config
            .ca
            .as_ref()
            .map_or(DEFAULT_CA_VALIDITY, |c| c.validity);
        self.config.renewal.window(validity).min(validity / 3)
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

    /// Whether a CA that cannot be read back may be replaced
    /// ([`Builder::replace_corrupt_ca`]).
    pub fn replaces_corrupt_ca(&self) -> bool {
        self.config.replace_corrupt_ca
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

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        dn.push(DnType::OrganizationName, organization);
    }
    dn
}

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
    fn generate(
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
