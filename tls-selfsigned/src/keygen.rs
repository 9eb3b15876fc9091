//! Generating a key of a [`KeyAlgorithm`] (with rcgen), or saying why this build cannot.

use rcgen::KeyPair;

use crate::{Error, KeyAlgorithm};

impl KeyAlgorithm {
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
