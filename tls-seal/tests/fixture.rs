//! A value sealed by an earlier version stays readable: the fixture was written on 2026-12-06,
//! before etcd locations existed, with the key of 32 bytes 7, at `default/web-ca ca.key`.

use tls_seal::{KeyRing, Location, Seal, SealKey};

const FIXTURE: &[u8] = include_bytes!("fixtures/sealed-2026-12-06.bin");
const PLAINTEXT: &[u8] = b"-----BEGIN PRIVATE KEY-----\nfixture\n-----END PRIVATE KEY-----\n";

fn ring() -> KeyRing {
    KeyRing::from_keys([SealKey::from_bytes([7; 32])]).unwrap()
}

#[test]
fn a_value_sealed_in_a_kubernetes_object_before_etcd_locations_still_opens() {
    let opened = ring()
        .open(Location::new("default", "web-ca", "ca.key"), FIXTURE)
        .expect("the stored value opens where it was sealed");
    assert_eq!(opened.plaintext(), PLAINTEXT);
    // Only there.
    assert!(
        ring()
            .open(Location::new("default", "web-ca", "tls.key"), FIXTURE)
            .is_err()
    );
    assert!(
        ring()
            .open(Location::etcd("default/web-ca/ca.key"), FIXTURE)
            .is_err()
    );
}

#[test]
fn a_value_sealed_at_an_etcd_key_opens_only_at_that_key() {
    let at = Location::etcd("/tls-rotation/fleets/web/ca.key");
    let sealed = ring().seal(at, PLAINTEXT).unwrap();
    assert_eq!(ring().open(at, &sealed).unwrap().plaintext(), PLAINTEXT);
    let err = ring()
        .open(Location::etcd("/tls-rotation/fleets/other/ca.key"), &sealed)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("etcd /tls-rotation/fleets/other/ca.key"),
        "{err}"
    );
    assert!(
        ring()
            .open(Location::new("tls-rotation", "fleets", "web"), &sealed)
            .is_err()
    );
}
