//! Key bytes never appear in the `Debug` output of public types or in error messages.

mod common;

use common::{Harness, Mode};
use tls_reload::NotReady;
use tls_source::{Decoder, Origin};
use tls_test::{TestCa, assert_no_key_material};

#[tokio::test]
async fn no_key_material_in_debug_or_errors() {
    let ca = TestCa::new("redaction");
    let good = ca.leaf(&["localhost"]);
    let other = ca.leaf(&["localhost"]);
    let h = Harness::kube(&good, Mode::Notify).await;
    let mut shown = vec![
        format!("{:?}", h.reloader),
        format!("{:#?}", h.reloader.status().borrow()),
        format!("{:?}", h.reloader.resolver()),
        format!("{:?}", h.reloader.resolver().current()),
    ];

    // A mismatched pair, a key where the certificate should be, a corrupt key.
    let mismatched = good.with_key_of(&other);
    let mut corrupt_key = other.key_pem.clone();
    corrupt_key.insert_str(40, "!!");
    for (cert, key) in [
        (mismatched.chain_pem.as_str(), mismatched.key_pem.as_str()),
        (other.key_pem.as_str(), other.key_pem.as_str()),
        (good.chain_pem.as_str(), corrupt_key.as_str()),
    ] {
        h.kube
            .write(&[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())])
            .unwrap();
        let status = h.wait_for("a rejection", |s| s.last_error.is_some()).await;
        let err = status.last_error.clone().unwrap();
        shown.push(err.to_string());
        shown.push(format!("{err:?}"));
        shown.push(format!("{status:?}"));
        // Back to good, so the next case's error is its own.
        common::write_kube(&h.kube, &good);
        h.wait_for("recovery", |s| s.last_error.is_none()).await;
    }

    // Decoder errors and a bundle.
    let d = Decoder::new();
    shown.push(format!(
        "{:?}",
        d.certificates("k", other.key_pem.as_bytes()).unwrap_err()
    ));
    let bundle = d
        .bundle(
            ("c", other.cert_pem.as_bytes()),
            ("k", other.key_pem.as_bytes()),
            None,
            Origin::SelfSigned,
        )
        .unwrap();
    shown.push(format!("{bundle:?}"));
    shown.push(NotReady::Stopped { last_error: None }.to_string());

    for text in &shown {
        assert_no_key_material(text, &good);
        assert_no_key_material(text, &other);
    }
}
