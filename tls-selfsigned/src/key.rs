//! Key algorithms of generated certificates, and the renewal rule.

use std::fmt;
use std::time::Duration;

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
