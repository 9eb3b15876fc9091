//! The lean reader against x509-parser: on every certificate it reads it must say what
//! x509-parser says, and it must never accept one x509-parser refuses.

use std::net::IpAddr;

use proptest::prelude::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};

use super::{LeafInfo, full, lean};

#[derive(Debug, Clone)]
struct Shape {
    dns: Vec<String>,
    ips: Vec<IpAddr>,
    cn: Option<String>,
    org: Option<String>,
    before: (i32, u8, u8),
    after: (i32, u8, u8),
    ca: Option<Option<u8>>,
    eku: Vec<u8>,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec("[a-z]{1,8}(\\.[a-z]{1,8}){0,2}", 0..4),
        prop::collection::vec(any::<[u8; 4]>().prop_map(IpAddr::from), 0..2),
        prop::option::of("[A-Za-z0-9 .-]{1,16}"),
        prop::option::of("[A-Za-z0-9 ]{1,12}"),
        (1950i32..2100, 1u8..=12, 1u8..=28),
        (1950i32..10000, 1u8..=12, 1u8..=28),
        prop::option::of(prop::option::of(0u8..5)),
        prop::collection::vec(0u8..3, 0..3),
    )
        .prop_map(|(dns, ips, cn, org, before, after, ca, eku)| Shape {
            dns,
            ips,
            cn,
            org,
            before,
            after,
            ca,
            eku,
        })
}

fn certificate(shape: &Shape) -> Vec<u8> {
    let mut params = CertificateParams::default();
    params.subject_alt_names = shape
        .dns
        .iter()
        .map(|n| SanType::DnsName(n.clone().try_into().unwrap()))
        .chain(shape.ips.iter().map(|ip| SanType::IpAddress(*ip)))
        .collect();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = &shape.cn {
        params
            .distinguished_name
            .push(DnType::CommonName, cn.as_str());
    }
    if let Some(org) = &shape.org {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org.as_str());
    }
    let (y, m, d) = shape.before;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = shape.after;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    params.is_ca = match shape.ca {
        None => IsCa::NoCa,
        Some(None) => IsCa::Ca(BasicConstraints::Unconstrained),
        Some(Some(n)) => IsCa::Ca(BasicConstraints::Constrained(n)),
    };
    params.extended_key_usages = shape
        .eku
        .iter()
        .map(|k| match k {
            0 => ExtendedKeyUsagePurpose::ServerAuth,
            1 => ExtendedKeyUsagePurpose::ClientAuth,
            _ => ExtendedKeyUsagePurpose::Any,
        })
        .collect();
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

fn same(der: &[u8]) -> Result<(), TestCaseError> {
    if let Some(lean) = lean::parse(der) {
        match full(der) {
            Ok(full) => prop_assert_eq!(lean, full),
            Err(err) => prop_assert!(
                false,
                "the lean reader accepted what x509-parser refuses: {err}"
            ),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// What rcgen (and so the self-signed generator and most tests) writes is read by the
    /// lean reader, and read as x509-parser reads it.
    #[test]
    fn generated_certificates_are_read_lean_and_alike(shape in shape()) {
        let der = certificate(&shape);
        let lean = lean::parse(&der);
        prop_assert!(lean.is_some(), "declined: {shape:?}");
        same(&der)?;
        prop_assert_eq!(LeafInfo::parse(&der).unwrap(), full(&der).unwrap());
    }

    /// A certificate with bytes changed, cut short or followed by more: whatever the lean reader still
    /// accepts, x509-parser accepts too, with the same reading.
    #[test]
    fn mutated_certificates_are_never_read_differently(
        shape in shape(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
        tail in prop::collection::vec(any::<u8>(), 1..3),
    ) {
        let mut der = certificate(&shape);
        for (at, byte) in &flips {
            let at = at.index(der.len());
            der[at] = *byte;
        }
        same(&der)?;
        // Bytes after the certificate: x509-parser refuses them.
        same(&[der.as_slice(), &tail].concat())?;
        if let Some(cut) = cut {
            let cut = cut.index(der.len());
            same(&der[..cut])?;
        }
    }
}

#[test]
fn names_as_x509_parser_writes_them() {
    let mut params = CertificateParams::new(vec!["a.example".to_owned()]).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CountryName, "DE");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Example");
    params
        .distinguished_name
        .push(DnType::CommonName, "a.example");
    let key = KeyPair::generate().unwrap();
    let der = params.self_signed(&key).unwrap().der().to_vec();
    let lean = lean::parse(&der).expect("read lean");
    assert_eq!(lean.subject, "C=DE, O=Example, CN=a.example");
    assert_eq!(lean, full(&der).unwrap());
}

#[test]
fn what_the_lean_reader_declines_gets_x509_parsers_verdict() {
    let key = KeyPair::generate().unwrap();
    // A URI among the alternative names: not read by the lean reader.
    let mut params = CertificateParams::new(vec!["a.example".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::URI("https://a.example/".try_into().unwrap()));
    let der = params.self_signed(&key).unwrap().der().to_vec();
    assert!(lean::parse(&der).is_none());
    let info = LeafInfo::parse(&der).unwrap();
    assert_eq!(info.dns_names, ["a.example"]);
    // Garbage: x509-parser's message.
    let err = LeafInfo::parse(&[0x30, 0x03, 0x02, 0x01]).unwrap_err();
    assert!(!err.to_string().is_empty());
}
