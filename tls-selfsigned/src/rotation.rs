//! CA mode on the generator: its CA (read, generated, renewed while it fits no longer), and
//! [`CaRotation`], the vocabulary of a writer that renews the CA on its own schedule (the
//! Kubernetes shared store).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::ca::{Ca, CaPem};
use crate::config::{CaSource, DEFAULT_CA_VALIDITY, Redacted, default_ca};
use crate::{Error, SelfSigned, fit};

impl SelfSigned {
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
    pub(crate) fn generate_ca(&self) -> Result<CaPem, Error> {
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
    pub(crate) fn with_ca(&self, ca: &CaPem) -> Result<SelfSigned, Error> {
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
    pub(crate) fn check_ca(&self, cert_pem: &[u8], now: SystemTime) -> Result<(), crate::Unfit> {
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
        fit::check_times(parsed.not_before, parsed.not_after, now, self.ca_window())
    }

    /// Whether leaves are signed by a CA (the builder's `ca`, `ca_from_pem`...).
    pub(crate) fn is_ca_mode(&self) -> bool {
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
    pub(crate) fn ca_window(&self) -> Duration {
        let validity = self
            .config
            .ca
            .as_ref()
            .map_or(DEFAULT_CA_VALIDITY, |c| c.validity);
        self.config.renewal.window(validity).min(validity / 3)
    }

    /// Whether a CA that cannot be read back may be replaced
    /// ([`Builder::replace_corrupt_ca`]).
    pub(crate) fn replaces_corrupt_ca(&self) -> bool {
        self.config.replace_corrupt_ca
    }
}

/// What a writer that renews the CA on its own schedule needs of a generator in CA mode
/// ([`SelfSigned::ca_rotation`]): new CAs that are not installed, a generator signing with a
/// given CA, the fit check of a CA at a given time, and the CA's renewal window. The
/// Kubernetes shared store (`tls-k8s`'s `SharedSelfSigned`) announces a renewed CA in `ca.crt`
/// before leaves are signed by it, with these.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_selfsigned::{Clock as _, SelfSigned, SystemClock};
///
/// let generator = SelfSigned::builder().dns_name("api.internal").ca().build()?;
/// let rotation = generator.ca_rotation().expect("CA mode");
/// let next = rotation.generate()?;
/// assert!(rotation.check(next.cert_pem.as_bytes(), SystemClock.now()).is_ok());
/// let signer = rotation.signer(&next)?;
/// assert_eq!(signer.ca_pem()?.as_deref(), Some(next.cert_pem.as_str()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CaRotation {
    generator: SelfSigned,
}

impl SelfSigned {
    /// The CA-rotation vocabulary, in CA mode (the builder's `ca` or `ca_from_pem`); `None`
    /// otherwise.
    pub fn ca_rotation(&self) -> Option<CaRotation> {
        self.is_ca_mode().then(|| CaRotation {
            generator: self.clone(),
        })
    }
}

impl CaRotation {
    /// A new CA for this configuration (its validity and key algorithm), not installed: the
    /// generator keeps signing with its current CA.
    ///
    /// # Errors
    /// [`Error::Generate`].
    pub fn generate(&self) -> Result<CaPem, Error> {
        self.generator.generate_ca()
    }

    /// The same configuration, signing with `ca` (which it never replaces, as with
    /// [`Builder::ca_from_pem`](crate::Builder::ca_from_pem)).
    ///
    /// # Errors
    /// [`Error::Ca`] for a CA that cannot be used (not a CA, a key that is not its own).
    pub fn signer(&self, ca: &CaPem) -> Result<SelfSigned, Error> {
        self.generator.with_ca(ca)
    }

    /// Whether a CA certificate (PEM) can still sign at `now`: parsable, a CA, and neither
    /// expired nor inside its renewal window ([`window`](Self::window)). Pure.
    ///
    /// # Errors
    /// Why not: [`Unfit::RenewalDue`](crate::Unfit::RenewalDue) inside the window, another
    /// [`Unfit`](crate::Unfit) when it cannot sign at all.
    pub fn check(&self, cert_pem: &[u8], now: SystemTime) -> Result<(), crate::Unfit> {
        self.generator.check_ca(cert_pem, now)
    }

    /// How long before a CA's expiry it is renewed: the renewal rule applied to the CA
    /// validity, at most a third of it.
    pub fn window(&self) -> Duration {
        self.generator.ca_window()
    }

    /// Whether a stored CA that cannot be read back may be replaced
    /// ([`Builder::replace_corrupt_ca`](crate::Builder::replace_corrupt_ca)).
    pub fn replaces_corrupt(&self) -> bool {
        self.generator.replaces_corrupt_ca()
    }
}
