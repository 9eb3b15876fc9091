//! The generator's configuration: [`Builder`], and everything `build` checks.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ca::Ca;
use crate::config::{
    CaConfig, CaSource, Config, DEFAULT_VALIDITY, MIN_RENEWAL_WINDOW, MIN_VALIDITY, Redacted,
    default_ca,
};
use crate::{Clock, Error, KeyAlgorithm, Renewal, SelfSigned, SystemClock};

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
                client_auth: false,
            },
            clock: Arc::new(SystemClock),
        }
    }
}

/// Configures a [`SelfSigned`] generator.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    pub(crate) config: Config,
    pub(crate) clock: Arc<dyn Clock>,
}

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

    /// Leaves usable as client certificates too: extended key usage clientAuth beside
    /// serverAuth (mTLS both ways; `serve --connect` presents them). A kept or stored leaf
    /// without clientAuth no longer fits ([`Unfit::NotForClients`](crate::Unfit::NotForClients))
    /// and is replaced.
    pub fn client_auth(mut self) -> Self {
        self.config.client_auth = true;
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

    /// The lifetime of a generated CA (default: [`DEFAULT_CA_VALIDITY`](crate::DEFAULT_CA_VALIDITY), 10 years). Turns on CA
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

    /// Where "now" comes from (default: [`SystemClock`](crate::SystemClock)); for tests.
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
