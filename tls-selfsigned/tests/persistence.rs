//! Keeping the pair (and CA) across restarts: reused while it fits, replaced when not, key files
//! 0600, a corrupt file reported and replaced.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use tls_selfsigned::SelfSigned;
use tls_source::CertBundle;
use tls_source::clock::SteppedClock;

fn builder(dir: &Path, names: &[&str]) -> tls_selfsigned::Builder {
    names
        .iter()
        .fold(SelfSigned::builder(), |b, n| b.name(n))
        .validity(Duration::from_secs(30 * 86400))
        .persist(dir)
}

/// Starts a source and returns what it yields before its first bundle (reports) and the bundle.
async fn start(generator: SelfSigned) -> (Vec<String>, CertBundle) {
    let mut source = generator.into_source();
    let mut reports = Vec::new();
    loop {
        match source.next().await.unwrap() {
            Ok(bundle) => return (reports, bundle),
            Err(err) => reports.push(err.to_string()),
        }
    }
}

#[tokio::test]
async fn reused_across_restarts_with_private_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let (reports, first) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    assert!(reports.is_empty(), "{reports:?}");
    let (_, again) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    assert_eq!(
        first.digest(),
        again.digest(),
        "the same pair after a restart"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(dir.path().join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A narrower wanted set still fits: no churn.
    let (_, narrower) = start(builder(dir.path(), &[]).build().unwrap()).await;
    assert_eq!(first.digest(), narrower.digest());
}

#[tokio::test]
async fn regenerated_for_new_names_and_the_files_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (_, first) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    let g = builder(dir.path(), &["localhost", "api.test"])
        .build()
        .unwrap();
    let (_, second) = start(g.clone()).await;
    assert_ne!(first.digest(), second.digest());
    assert_eq!(g.check_bundle(&second), Ok(()));
    let on_disk = (
        fs::read(dir.path().join("tls.crt")).unwrap(),
        fs::read(dir.path().join("tls.key")).unwrap(),
    );
    assert_eq!(g.check(Some(&on_disk.0), Some(&on_disk.1)), Ok(()));
    let (_, third) = start(
        builder(dir.path(), &["localhost", "api.test"])
            .build()
            .unwrap(),
    )
    .await;
    assert_eq!(
        second.digest(),
        third.digest(),
        "and the new pair is what is reused next"
    );
}

#[tokio::test(start_paused = true)]
async fn regenerated_when_expired_or_due() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
    let g = || {
        builder(dir.path(), &["localhost"])
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (_, first) = start(g()).await;
    clock.step(Duration::from_secs(10 * 86400));
    let (_, still) = start(g()).await;
    assert_eq!(first.digest(), still.digest(), "a third used: kept");
    clock.step(Duration::from_secs(11 * 86400));
    let (_, renewed) = start(g()).await;
    assert_ne!(
        first.digest(),
        renewed.digest(),
        "inside the renewal window: replaced"
    );
    clock.step(Duration::from_secs(60 * 86400));
    let (_, after_expiry) = start(g()).await;
    assert_ne!(renewed.digest(), after_expiry.digest(), "expired: replaced");
}

#[tokio::test]
async fn a_corrupt_file_is_reported_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (_, first) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    fs::write(
        dir.path().join("tls.crt"),
        "-----BEGIN CERTIFICATE-----\ntruncated",
    )
    .unwrap();
    let g = builder(dir.path(), &["localhost"]).build().unwrap();
    let (reports, replaced) = start(g.clone()).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        reports[0].contains("tls.crt") && reports[0].contains("replacing it"),
        "{}",
        reports[0]
    );
    assert_ne!(first.digest(), replaced.digest());
    let cert = fs::read(dir.path().join("tls.crt")).unwrap();
    let key = fs::read(dir.path().join("tls.key")).unwrap();
    assert_eq!(
        g.check(Some(&cert), Some(&key)),
        Ok(()),
        "the file on disk is good again"
    );

    // A key from another pair is reported too.
    let other = SelfSigned::builder()
        .dns_name("localhost")
        .build()
        .unwrap()
        .generate_pem()
        .unwrap();
    fs::write(dir.path().join("tls.key"), other.key_pem).unwrap();
    let (reports, _) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    assert!(
        reports.len() == 1 && reports[0].contains("does not match"),
        "{reports:?}"
    );
}

#[tokio::test]
async fn the_ca_is_kept_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let g = || builder(dir.path(), &["localhost"]).ca().build().unwrap();
    let (_, first) = start(g()).await;
    assert_eq!(first.ca().len(), 1);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let (reports, again) = start(g()).await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(first.digest(), again.digest(), "leaf and CA reused");
    // A new name: a new leaf from the same CA.
    let wider = builder(dir.path(), &["localhost", "api.test"])
        .ca()
        .build()
        .unwrap();
    let (_, renamed) = start(wider).await;
    assert_ne!(first.leaf(), renamed.leaf());
    assert_eq!(
        first.ca(),
        renamed.ca(),
        "clients pinning the CA keep working"
    );
    // A corrupt CA key: reported, a new CA, and a new leaf signed by it.
    fs::write(dir.path().join("ca.key"), "garbage").unwrap();
    let (reports, fresh) = start(g()).await;
    assert!(reports.iter().any(|r| r.contains("ca.crt")), "{reports:?}");
    assert_ne!(fresh.ca(), first.ca());
}
