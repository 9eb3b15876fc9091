//! Real certificates for tests.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use sha2::{Digest as _, Sha256};

/// A certificate authority made for one test.
#[derive(Debug)]
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    cert: rcgen::Certificate,
}

/// A leaf certificate and its key, as PEM and DER.
#[derive(Debug, Clone)]
pub struct TestCert {
    /// The leaf certificate, PEM.
    pub cert_pem: String,
    /// The leaf's private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The leaf certificate, DER.
    pub cert_der: CertificateDer<'static>,
    /// The leaf's private key, PKCS#8 DER.
    pub key_der: Vec<u8>,
    /// The leaf followed by the CA certificate, PEM.
    pub chain_pem: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// SHA-256 of the leaf's DER, lower-case hex: what a status reports and a probe sees.
    pub fingerprint: String,
}

impl TestCa {
    /// A new P-256 CA with the given common name.
    ///
    /// # Panics
    /// If rcgen fails, which it does not for these parameters.
    pub fn new(name: &str) -> Self {
        let (params, key) = Self::ca_params(name);
        let cert = params.self_signed(&key).expect("self-sign CA");
        Self { params, key, cert }
    }

    /// An intermediate CA with the given common name, signed by this CA.
    ///
    /// # Panics
    /// If rcgen fails, which it does not for these parameters.
    pub fn intermediate(&self, name: &str) -> Self {
        let (params, key) = Self::ca_params(name);
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign intermediate");
        Self { params, key, cert }
    }

    fn ca_params(name: &str) -> (CertificateParams, KeyPair) {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + Duration::from_secs(365 * 86400)).into();
        let key = KeyPair::generate().expect("generate CA key");
        (params, key)
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// `N` distinct leaves for the same `names`, as [`leaf`](Self::leaf) makes them: the
    /// certificates a test rotates through (`let [a, b, c] = ca.leaves(&["localhost"]);`).
    pub fn leaves<const N: usize>(&self, names: &[&str]) -> [TestCert; N] {
        std::array::from_fn(|_| self.leaf(names))
    }

    /// A leaf for `names` (DNS names or IP addresses), valid from an hour ago for a day.
    pub fn leaf(&self, names: &[&str]) -> TestCert {
        let (not_before, not_after) = valid_now();
        self.leaf_valid(names, not_before, not_after)
    }

    /// A leaf for `names` whose validity ended a minute ago.
    pub fn expired_leaf(&self, names: &[&str]) -> TestCert {
        let now = SystemTime::now();
        self.leaf_valid(
            names,
            now - Duration::from_secs(86400),
            now - Duration::from_secs(60),
        )
    }

    /// A client certificate for `name` (extended key usage clientAuth), valid from an hour ago
    /// for a day.
    pub fn client_leaf(&self, name: &str) -> TestCert {
        let (not_before, not_after) = valid_now();
        self.leaf_with(
            &[name],
            not_before,
            not_after,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A client certificate (extended key usage clientAuth) with the common name `cn` and
    /// these URI SANs (a SPIFFE ID: `spiffe://example.org/ns/prod/sa/web`), no DNS name, valid
    /// from an hour ago for a day.
    ///
    /// # Panics
    /// If a URI is not a valid IA5 string.
    pub fn uri_client_leaf(&self, cn: &str, uris: &[&str]) -> TestCert {
        let (not_before, not_after) = valid_now();
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|uri| {
                rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*uri).expect("a URI"))
            })
            .collect();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a test key");
        self.signed(&params, &key)
    }

    /// A client certificate for `name`, valid between the two instants.
    ///
    /// # Panics
    /// If the name is not a valid DNS name or IP address.
    pub fn client_leaf_valid(
        &self,
        name: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> TestCert {
        self.leaf_with(
            &[name],
            not_before,
            not_after,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A client certificate whose validity ended a minute ago.
    pub fn expired_client_leaf(&self, name: &str) -> TestCert {
        let now = SystemTime::now();
        self.leaf_with(
            &[name],
            now - Duration::from_secs(86400),
            now - Duration::from_secs(60),
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A leaf for `names`, valid between the two instants.
    ///
    /// # Panics
    /// If a name is not a valid DNS name or IP address.
    pub fn leaf_valid(
        &self,
        names: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> TestCert {
        self.leaf_with(
            names,
            not_before,
            not_after,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A new leaf for `names` with the key of `of`: a renewal that keeps the key (what
    /// cert-manager does with `rotationPolicy: Never`).
    ///
    /// # Panics
    /// If a name is not a valid DNS name or IP address, or `of`'s key does not parse.
    pub fn renewed(&self, names: &[&str], of: &TestCert) -> TestCert {
        let key = KeyPair::from_pem(&of.key_pem).expect("a test key");
        let (not_before, not_after) = valid_now();
        self.leaf_keyed(
            names,
            not_before,
            not_after,
            ExtendedKeyUsagePurpose::ServerAuth,
            &key,
        )
    }

    fn leaf_with(
        &self,
        names: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
        purpose: ExtendedKeyUsagePurpose,
    ) -> TestCert {
        let key = KeyPair::generate().expect("generate leaf key");
        self.leaf_keyed(names, not_before, not_after, purpose, &key)
    }

    fn leaf_keyed(
        &self,
        names: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
        purpose: ExtendedKeyUsagePurpose,
        key: &KeyPair,
    ) -> TestCert {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("valid names");
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.distinguished_name = dn;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.extended_key_usages = vec![purpose];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.signed(&params, key)
    }

    fn signed(&self, params: &CertificateParams, key: &KeyPair) -> TestCert {
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(key, &issuer).expect("sign leaf");
        let cert_pem = cert.pem();
        TestCert {
            chain_pem: format!("{cert_pem}{}", self.cert.pem()),
            ca_pem: self.cert.pem(),
            cert_pem,
            key_pem: key.serialize_pem(),
            fingerprint: fingerprint(cert.der()),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

/// A leaf's validity when a test does not choose it: from an hour ago (so clock skew between
/// the writer and the reader does not matter) for a day.
fn valid_now() -> (SystemTime, SystemTime) {
    let now = SystemTime::now();
    (
        now - Duration::from_secs(3600),
        now + Duration::from_secs(86400),
    )
}

impl TestCert {
    /// This certificate with another certificate's key: a mismatched pair.
    pub fn with_key_of(&self, other: &Self) -> Self {
        Self {
            key_pem: other.key_pem.clone(),
            key_der: other.key_der.clone(),
            ..self.clone()
        }
    }
}

/// SHA-256 of a certificate's DER, lower-case hex.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Private key formats among the fixtures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFormat {
    /// `PRIVATE KEY` (P-256).
    Pkcs8,
    /// `EC PRIVATE KEY` (P-256).
    Sec1,
    /// `RSA PRIVATE KEY` (RSA-2048).
    Pkcs1,
}

/// A fixture certificate and its key in the given format (see `fixtures/README.md`).
pub fn fixture_pair(format: KeyFormat) -> TestCert {
    let (cert_pem, key_pem) = match format {
        KeyFormat::Pkcs8 => (
            include_str!("../fixtures/ec-pkcs8.crt"),
            include_str!("../fixtures/ec-pkcs8.key"),
        ),
        KeyFormat::Sec1 => (
            include_str!("../fixtures/ec-sec1.crt"),
            include_str!("../fixtures/ec-sec1.key"),
        ),
        KeyFormat::Pkcs1 => (
            include_str!("../fixtures/rsa-pkcs1.crt"),
            include_str!("../fixtures/rsa-pkcs1.key"),
        ),
    };
    let ca_pem = include_str!("../fixtures/ca.crt");
    let cert_der = pem_body(cert_pem);
    TestCert {
        cert_pem: cert_pem.to_owned(),
        key_pem: key_pem.to_owned(),
        fingerprint: fingerprint(&cert_der),
        cert_der: CertificateDer::from(cert_der),
        key_der: pem_body(key_pem),
        chain_pem: format!("{cert_pem}{ca_pem}"),
        ca_pem: ca_pem.to_owned(),
    }
}

/// The fixture P-256 key, encrypted with a passphrase.
pub fn fixture_encrypted_key() -> &'static str {
    include_str!("../fixtures/encrypted-pkcs8.key")
}

fn pem_body(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::{PemObject as _, SectionKind};
    let (_, der) = <(SectionKind, Vec<u8>)>::from_pem_slice(pem.as_bytes()).expect("fixture PEM");
    der
}

/// Asserts that `text` shows none of `cert`'s private key: no line of its PEM body, no run of
/// its secret bytes as hex or as a Rust byte list.
///
/// # Panics
/// When key material is found.
pub fn assert_no_key_material(text: &str, cert: &TestCert) {
    for line in cert.key_pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "key PEM line found in: {text}");
    }
    // As a Kubernetes Secret carries it: the base64 of the PEM file.
    let encoded = base64::engine::general_purpose::STANDARD.encode(&cert.key_pem);
    for chunk in encoded.as_bytes().chunks(32) {
        let chunk = String::from_utf8_lossy(chunk);
        assert!(
            !text.contains(chunk.as_ref()),
            "base64 of the key found in: {text}"
        );
    }
    let lower = text.to_lowercase();
    for window in secret_bytes(&cert.key_der).windows(16) {
        let hex: String = window.iter().map(|b| format!("{b:02x}")).collect();
        let list = format!("{window:?}");
        let list = list.trim_matches(|c| c == '[' || c == ']');
        assert!(!lower.contains(&hex), "key bytes (hex) found in: {text}");
        assert!(!text.contains(list), "key bytes (list) found in: {text}");
    }
}

/// The secret part of a key's DER: for an EC key, the private scalar (the DER also holds the
/// public key, which the certificate shows too); otherwise the whole DER.
fn secret_bytes(der: &[u8]) -> &[u8] {
    // ECPrivateKey: version 1 (02 01 01), then privateKey OCTET STRING of 32 bytes (04 20).
    const EC_SCALAR: [u8; 5] = [0x02, 0x01, 0x01, 0x04, 0x20];
    der.windows(EC_SCALAR.len())
        .position(|w| w == EC_SCALAR)
        .and_then(|at| der.get(at + EC_SCALAR.len()..at + EC_SCALAR.len() + 32))
        .unwrap_or(der)
}

/// `year`-01-01T00:00:00Z, for certificates dated anywhere a certificate can be (1950, 9999).
///
/// # Panics
/// If `year` is outside what the `time` crate represents (±9999).
pub fn new_year(year: i32) -> SystemTime {
    time::Date::from_calendar_date(year, time::Month::January, 1)
        .expect("a year time can represent")
        .midnight()
        .assume_utc()
        .into()
}
