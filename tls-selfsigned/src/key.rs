//! Key algorithms of generated certificates, and the renewal rule.

use std::fmt;
use std::time::Duration;

use rcgen::KeyPair;

use crate::Error;

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
