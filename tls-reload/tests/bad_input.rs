//! Bad input never replaces a good certificate: each case is reported in the status while the
//! old certificate keeps serving, and a good pair afterwards is picked up by itself.

mod common;

use std::fs;

use common::{Harness, Mode, write_kube};
use tls_test::{KubeDir, TestCa, TestCert};

/// Starts on a good pair, breaks the files with `break_files`, checks that the old certificate
/// keeps serving and the status says `expected`, then restores with a new good pair.
async fn survives(mode: Mode, expected: &str, break_files: impl FnOnce(&KubeDir, &TestCert)) {
    let ca = TestCa::new("bad input");
    let (good, next) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let h = Harness::kube(&good, mode).await;
    let generation = h.status().generation;

    break_files(&h.kube, &good);
    h.expect_refused(expected, &good, generation).await;

    // Recovery: clear what the case left where the kubelet puts its symlinks, write a good pair.
    for name in ["tls.crt", "tls.key"] {
        let path = h.kube.file(name);
        if path.is_dir() {
            fs::remove_dir(&path).unwrap();
        }
    }
    write_kube(&h.kube, &next);
    h.expect_served(&next).await;
    let status = h.status();
    assert!(status.last_error.is_none(), "{:?}", status.last_error);
    assert_eq!(status.generation, generation + 1);
}

fn write(kube: &KubeDir, cert: &[u8], key: &[u8]) {
    kube.write(&[("tls.crt", cert), ("tls.key", key)]).unwrap();
}

async fn all_cases(mode: Mode) {
    survives(mode, "does not match the leaf certificate", |kube, good| {
        let other = TestCa::new("other").leaf(&["localhost"]);
        write(kube, good.chain_pem.as_bytes(), other.key_pem.as_bytes());
    })
    .await;
    survives(mode, "not PEM (no BEGIN line) and not DER", |kube, good| {
        write(
            kube,
            b"this is not a certificate\n",
            good.key_pem.as_bytes(),
        );
    })
    .await;
    survives(mode, "tls.crt is empty", |kube, _| write(kube, b"", b"")).await;
    survives(mode, "truncated PEM", |kube, good| {
        let half = &good.chain_pem.as_bytes()[..good.chain_pem.len() / 3];
        write(kube, half, good.key_pem.as_bytes());
    })
    .await;
    survives(mode, "the certificate expired at", |kube, _| {
        let expired = TestCa::new("expired").expired_leaf(&["localhost"]);
        write(
            kube,
            expired.chain_pem.as_bytes(),
            expired.key_pem.as_bytes(),
        );
    })
    .await;
    survives(mode, "cannot read", |kube, _| {
        fs::remove_file(kube.file("tls.crt")).unwrap();
        fs::remove_file(kube.file("tls.key")).unwrap();
    })
    .await;
    survives(mode, "No such file or directory", |kube, _| {
        kube.dangle().unwrap();
    })
    .await;
    survives(mode, "is not a regular file", |kube, _| {
        fs::remove_file(kube.file("tls.crt")).unwrap();
        fs::create_dir(kube.file("tls.crt")).unwrap();
    })
    .await;
    survives(mode, "no private key found", |kube, good| {
        write(kube, good.chain_pem.as_bytes(), good.chain_pem.as_bytes());
    })
    .await;
}

#[tokio::test]
async fn bad_input_with_notify() {
    all_cases(Mode::Notify).await;
}

#[tokio::test]
async fn bad_input_polling() {
    all_cases(Mode::Poll).await;
}

#[tokio::test]
async fn a_not_yet_valid_certificate_is_installed_when_it_becomes_valid() {
    use std::time::{Duration, SystemTime};
    let ca = TestCa::new("future");
    let now = SystemTime::now();
    let good = ca.leaf(&["localhost"]);
    let future = ca.leaf_valid(
        &["localhost"],
        now + Duration::from_secs(2),
        now + Duration::from_secs(3600),
    );
    let h = Harness::kube(&good, Mode::Notify).await;
    write_kube(&h.kube, &future);
    h.wait_for("the rejection", |s| {
        s.last_error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("is not valid before"))
    })
    .await;
    assert_eq!(h.served().await, good.fingerprint);
    // No file changes after this: the reloader retries by itself at not_before.
    h.expect_served(&future).await;
}
