//! What the crate's unit tests share: bundles from `tls-test`'s certificates, the provider.

use tls_source::{CertBundle, Decoder, Origin};
use tls_test::{TestCa, TestCert};

/// `cert` as a bundle, with `ca`'s certificate as its `ca.crt` when given.
pub(crate) fn bundle(cert: &TestCert, ca: Option<&TestCa>) -> CertBundle {
    let origin = Origin::Other(format!("test {}", &cert.fingerprint[..8]));
    bundle_from(cert, ca, origin)
}

/// The same, from `origin`.
pub(crate) fn bundle_from(cert: &TestCert, ca: Option<&TestCa>, origin: Origin) -> CertBundle {
    let ca_pem = ca.map(TestCa::cert_pem);
    Decoder::new()
        .bundle(
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
            ca_pem.as_deref().map(|pem| ("ca.crt", pem.as_bytes())),
            origin,
        )
        .expect("a valid test bundle")
}

pub(crate) use tls_test::provider;
