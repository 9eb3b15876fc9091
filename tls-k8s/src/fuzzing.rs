//! Entry points for the fuzz targets (`fuzz/` in the repository): the parsers that read what
//! other processes wrote into the API. Not a public API: behind the `fuzzing` feature, and
//! free to change.

/// Decodes `json` as a Secret the way [`SecretSource`](crate::SecretSource) does (base64
/// values, the three keys, the PEM/DER bundle; once as stored and once opening `tls.key`
/// with a seal), ignoring the outcome.
pub fn secret(json: &[u8]) {
    static SEAL: std::sync::OnceLock<tls_seal::KeyRing> = std::sync::OnceLock::new();
    let Ok(secret) = serde_json::from_slice::<kube::api::DynamicObject>(json) else {
        return;
    };
    let seal = SEAL.get_or_init(|| {
        tls_seal::KeyRing::from_keys([tls_seal::SealKey::from_bytes([7; 32])])
            .expect("a key")
            .adopt_unsealed(true)
    });
    let _ = crate::secret::digest(&secret, &crate::secret::Keys::default());
    for seal in [None, Some(seal as &dyn tls_seal::Seal)] {
        let _ = crate::secret::read(
            &secret,
            &crate::secret::Keys::default(),
            &tls_source::Decoder::new(),
            seal,
        );
    }
}

/// Reads a Secret's fence (`tls-rotation.io/round` and `holder`) as a writer does.
pub fn fence(json: &[u8]) -> Option<crate::store::Fence> {
    let secret = serde_json::from_slice::<kube::api::DynamicObject>(json).ok()?;
    crate::fenced::stored_fence(&secret)
}

/// Reads a shared store's CA Secret (its data and the `switch-after` annotation) as the
/// writer does.
#[cfg(feature = "self-signed")]
pub fn ca_secret(data: &[(String, Vec<u8>)], switch_after: Option<&str>) {
    crate::shared::fuzz_ca_state(data, switch_after);
}
