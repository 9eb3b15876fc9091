//! [`Validator`]: turns a bundle into something rustls can serve, or says why not.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use tls_source::clock::{Clock, SystemClock, Validity};
use tls_source::x509::LeafInfo;
use tls_source::{CertBundle, Digest};

use crate::status::CertInfo;
use crate::{Error, Policy, Purpose, Roots, tls};

/// Validates [`CertBundle`]s against a [`Policy`]: pure (the clock is its only input besides the
/// bundle), usable on its own, and what the reloader runs before every swap.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let leaf = tls_test::TestCa::new("doc").leaf(&["api.example.com"]);
/// # let (cert_pem, key_pem) = (leaf.chain_pem.as_bytes(), leaf.key_pem.as_bytes());
/// use std::sync::Arc;
/// use tls_reload::{Policy, Validator};
/// use tls_source::{Decoder, Origin};
///
/// let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
/// let validator = Validator::new(provider, Policy::default().require_name("api.example.com"));
/// let bundle = Decoder::new().bundle(("tls.crt", cert_pem), ("tls.key", key_pem), None, Origin::SelfSigned)?;
/// let validated = validator.validate(&bundle)?;
/// assert_eq!(validated.info().dns_names, ["api.example.com"]);
/// let refused = validator.validate_for(&bundle, "www.example.com").unwrap_err();
/// assert!(refused.to_string().contains("does not cover www.example.com"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Validator {
    provider: Arc<CryptoProvider>,
    policy: Policy,
    clock: Arc<dyn Clock>,
}

/// A bundle that passed validation: the rustls `CertifiedKey` to serve, the CA bundle that came
/// with it, what the leaf says and the digest of the material.
#[derive(Clone)]
pub struct Validated {
    certified: Arc<CertifiedKey>,
    ca: Vec<CertificateDer<'static>>,
    info: Arc<CertInfo>,
    digest: Digest,
}

/// What a kind of route needs beyond the policy ([`Validator::validate_as`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rule<'a> {
    /// The policy only: the default route.
    Policy,
    /// The default route when client CAs come from the served bundle: it must carry some
    /// ([`Error::NoClientCa`]).
    ClientCa,
    /// A named SNI route: the leaf covers the name.
    Name(&'a str),
    /// A keyed route, served by its leaf's DNS names: it has some ([`Error::NoNames`]).
    Names,
    /// A client identity ([`ClientTls`](crate::ClientTls)): its CA certificates are the roots
    /// servers are trusted with, so they must make a verifier ([`Error::Untrusted`]).
    ServerRoots(&'a crate::tls::client::Roots),
}

// ===== impl Validator =====

impl Validator {
    /// A validator loading keys with `provider`, checking `policy`, on the system clock.
    pub fn new(provider: Arc<CryptoProvider>, policy: Policy) -> Self {
        Self {
            provider,
            policy,
            clock: Arc::new(SystemClock),
        }
    }

    /// Judges validity by `clock` instead of the system clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The policy checked.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock validity is judged by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The crypto provider that loads keys.
    pub fn crypto_provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    /// Checks `bundle` against the policy.
    ///
    /// # Errors
    /// The first check that fails, naming the bundle's origin: [`Error::EmptyChain`],
    /// [`Error::ChainTooLong`], [`Error::ChainTooLarge`], [`Error::Parse`], [`Error::Key`],
    /// [`Error::KeyMismatch`], [`Error::Expired`], [`Error::NotYetValid`], [`Error::Purpose`],
    /// [`Error::NameNotCovered`], [`Error::ChainOrder`], [`Error::Untrusted`].
    pub fn validate(&self, bundle: &CertBundle) -> Result<Validated, Error> {
        self.check(bundle, None, self.clock.now())
    }

    /// Like [`validate`](Self::validate), and the leaf must also cover `name`: a DNS name, an IP
    /// address or a wildcard (`*.example.com`, covered only by the same wildcard). What an SNI
    /// route checks.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn validate_for(&self, bundle: &CertBundle, name: &str) -> Result<Validated, Error> {
        self.check(bundle, Some(name), self.clock.now())
    }

    /// What a route of the reload engine checks: the policy at `now`, then the [`Rule`] of the
    /// route's kind.
    pub(crate) fn validate_as(
        &self,
        bundle: &CertBundle,
        rule: &Rule<'_>,
        now: SystemTime,
    ) -> Result<Validated, Error> {
        let origin = || bundle.origin().clone();
        match rule {
            Rule::Policy => self.check(bundle, None, now),
            Rule::ClientCa if bundle.ca().is_empty() => Err(Error::NoClientCa { origin: origin() }),
            Rule::ClientCa => self.check(bundle, None, now),
            Rule::Name(name) => self.check(bundle, Some(name), now),
            Rule::Names => self.check(bundle, None, now).and_then(|v| {
                if v.info.dns_names.is_empty() && v.info.ip_addresses.is_empty() {
                    Err(Error::NoNames { origin: origin() })
                } else {
                    Ok(v)
                }
            }),
            Rule::ServerRoots(roots) => self.check(bundle, None, now).and_then(|v| {
                tls::client::Verifier::for_roots(&v.ca, roots, &self.provider)
                    .map_err(|reason| Error::Untrusted {
                        origin: origin(),
                        reason,
                    })
                    .map(|_| v)
            }),
        }
    }

    fn check(
        &self,
        bundle: &CertBundle,
        route: Option<&str>,
        now: SystemTime,
    ) -> Result<Validated, Error> {
        let origin = bundle.origin();
        let chain = bundle.chain();
        let leaf = bundle.leaf().ok_or_else(|| Error::EmptyChain {
            origin: origin.clone(),
        })?;
        let (max_len, max_bytes) = self.policy.chain_limits();
        if chain.len() > max_len {
            return Err(Error::ChainTooLong {
                origin: origin.clone(),
                count: chain.len(),
                limit: max_len,
            });
        }
        let bytes = chain.iter().map(|c| c.len()).sum::<usize>();
        if bytes > max_bytes {
            return Err(Error::ChainTooLarge {
                origin: origin.clone(),
                bytes,
                limit: max_bytes,
            });
        }
        let parse = |der: &[u8], what: &str| {
            LeafInfo::parse(der).map_err(|e| Error::Parse {
                origin: origin.clone(),
                reason: format!("{what}: {e}"),
            })
        };
        let parsed = parse(leaf, "the leaf")?;
        let certified = tls::certify(bundle, &parsed.spki_der, &self.provider)?;
        match Validity::at(now, parsed.not_before, parsed.not_after) {
            Validity::Expired if self.policy.rejects_expired() => {
                return Err(Error::Expired {
                    origin: origin.clone(),
                    not_after: parsed.not_after,
                });
            }
            Validity::NotYetValid if self.policy.rejects_not_yet_valid() => {
                return Err(Error::NotYetValid {
                    origin: origin.clone(),
                    not_before: parsed.not_before,
                });
            }
            _ => {}
        }
        let purpose = self.policy.required_purpose();
        if let Some(eku) = parsed.extended_key_usage {
            let allowed = eku.any
                || match purpose {
                    Purpose::ServerAuth => eku.server_auth,
                    Purpose::ClientAuth => eku.client_auth,
                    Purpose::Any => true,
                };
            if !allowed {
                return Err(Error::Purpose {
                    origin: origin.clone(),
                    purpose,
                });
            }
        }
        let required = self.policy.required_names().iter().map(String::as_str);
        for name in required.chain(route) {
            if !parsed.covers(name) {
                let info = CertInfo::new(bundle, leaf, parsed, now);
                return Err(Error::NameNotCovered {
                    origin: origin.clone(),
                    name: name.to_owned(),
                    names: info.names(),
                });
            }
        }
        if self.policy.checks_chain_order() {
            // Names as DER only (a shallow parse); the readable names only for the message.
            let mut issuer_der = parsed.issuer_der.clone();
            for (position, cert) in chain.iter().enumerate().skip(1) {
                let (subject_der, next_issuer) =
                    LeafInfo::names_der(cert).map_err(|e| Error::Parse {
                        origin: origin.clone(),
                        reason: format!("certificate {position} of the chain: {e}"),
                    })?;
                if subject_der != issuer_der {
                    let names = |der: &[u8]| LeafInfo::parse(der).map(|c| (c.subject, c.issuer));
                    let (subject, issuer) = names(&chain[position - 1]).unwrap_or_default();
                    let (next, _) = names(cert).unwrap_or_default();
                    return Err(Error::ChainOrder {
                        origin: origin.clone(),
                        position: position - 1,
                        link: format!(
                            "certificate {} ({subject}, issued by {issuer}) is followed by {next}",
                            position - 1,
                        ),
                    });
                }
                issuer_der = next_issuer;
            }
        }
        let roots = match self.policy.roots() {
            Roots::None => None,
            Roots::BundleCa if bundle.ca().is_empty() => {
                return Err(Error::Untrusted {
                    origin: origin.clone(),
                    reason: "the bundle has no CA certificates (ca.crt) to verify against".into(),
                });
            }
            Roots::BundleCa => Some(bundle.ca()),
            Roots::Given(roots) => Some(&roots[..]),
        };
        if let Some(roots) = roots {
            tls::verify_chain(bundle, roots, purpose, now, &self.provider)?;
        }
        Ok(Validated {
            certified,
            ca: bundle.ca().to_vec(),
            info: Arc::new(CertInfo::new(bundle, leaf, parsed, now)),
            digest: bundle.digest(),
        })
    }
}

// ===== impl Validated =====

impl Validated {
    /// What rustls serves: the chain and the loaded signing key.
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.certified
    }

    /// The CA bundle that came with the certificate (`ca.crt`); empty when there was none.
    pub fn ca(&self) -> &[CertificateDer<'static>] {
        &self.ca
    }

    /// What the leaf says about itself, and where it came from.
    pub fn info(&self) -> &CertInfo {
        &self.info
    }

    /// The same, shared: what the status and the events hold of an installed certificate.
    pub(crate) fn shared_info(&self) -> &Arc<CertInfo> {
        &self.info
    }

    /// The digest of the bundle's material.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

impl fmt::Debug for Validated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Validated")
            .field("info", &self.info)
            .field("ca_len", &self.ca.len())
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}
