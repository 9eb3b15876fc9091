//! The README's walk-through of the `rotate` example with `serve`: certificates written the
//! kubelet's way, served, refused with their dates when they are out of date.
//!
//! `cargo test --workspace` builds the examples before it runs this; the binaries are found
//! beside the test binary (`target/<profile>/examples/`).

use tls_test::{Serve, example};
use tokio::process::Command;

/// `rotate DIR ARGS…`, which must succeed.
async fn rotate(dir: &std::path::Path, args: &[&str]) {
    let output = Command::new(example("rotate"))
        .arg(dir)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "rotate {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `rotate --not-before/--not-after` writes an expired or a not-yet-valid certificate on purpose;
/// `serve` refuses each with its dates, keeps serving, and takes the next good one.
#[tokio::test]
async fn rotate_writes_expired_and_not_yet_valid_certificates_that_serve_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    rotate(&certs, &[]).await;
    let serve = Serve::start(&example("serve"), &["--cert-dir", certs.to_str().unwrap()]).await;
    let first = serve.status().await;

    rotate(
        &certs,
        &[
            "--not-before",
            "2020-01-01T00:00:00Z",
            "--not-after",
            "2020-02-01T00:00:00Z",
        ],
    )
    .await;
    let status = serve
        .wait_status("the expired one refused", |s| !s["last_error"].is_null())
        .await;
    let error = status["last_error"].as_str().unwrap();
    assert!(error.contains("expired at 2020-02-01T00:00:00Z"), "{error}");
    assert_eq!(status["fingerprint_sha256"], first["fingerprint_sha256"]);

    rotate(
        &certs,
        &[
            "--not-before",
            "2999-01-01T00:00:00Z",
            "--not-after",
            "2999-12-31T00:00:00Z",
        ],
    )
    .await;
    let status = serve
        .wait_status("the future one refused", |s| {
            s["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("2999-01-01T00:00:00Z"))
        })
        .await;
    assert_eq!(status["fingerprint_sha256"], first["fingerprint_sha256"]);

    // A date the user mistyped, or dates the wrong way round: a usage error naming the flag.
    for bad in [
        &["--not-after", "yesterday"][..],
        &[
            "--not-before",
            "2030-01-01T00:00:00Z",
            "--not-after",
            "2029-01-01T00:00:00Z",
        ],
    ] {
        let output = Command::new(example("rotate"))
            .arg(&certs)
            .args(bad)
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--not-"),
            "{bad:?}"
        );
    }

    rotate(&certs, &[]).await;
    let status = serve
        .wait_status("recovery", |s| {
            s["last_error"].is_null() && s["generation"] == 2
        })
        .await;
    assert_ne!(status["fingerprint_sha256"], first["fingerprint_sha256"]);

    // The widest dates a certificate can carry: from 1950 (UTCTime) to 9999 (RFC 5280's "no
    // expiration"), written and served.
    rotate(
        &certs,
        &[
            "--not-before",
            "1950-01-01T00:00:00Z",
            "--not-after",
            "9999-12-31T23:59:59Z",
        ],
    )
    .await;
    let status = serve
        .wait_status("the widest dates", |s| s["generation"] == 3)
        .await;
    assert_eq!(status["not_after"], "9999-12-31T23:59:59Z");
    assert_eq!(status["last_error"], serde_json::Value::Null);
}
