//! Fixtures (feature `test-util`): state written through the store as the driver writes it,
//! without a CA, for benches and tests of a restart with many stored certificates.

use std::path::Path;

use crate::Error;
use crate::store::dir::DirStore;
use crate::store::{AcmeStore as _, StoredCert};

/// Stores `chain_pem` and `key_pem` as the certificate of `name` (its first name) in the state
/// directory `state_dir`, as an order would have.
///
/// # Errors
/// [`Error::State`]: the directory cannot be written.
pub async fn store_certificate(
    state_dir: &Path,
    name: &str,
    chain_pem: &[u8],
    key_pem: &[u8],
) -> Result<(), Error> {
    DirStore::new(state_dir)
        .save_cert(
            name,
            &StoredCert {
                chain_pem: chain_pem.to_vec(),
                key_pem: key_pem.to_vec(),
            },
        )
        .await
}
