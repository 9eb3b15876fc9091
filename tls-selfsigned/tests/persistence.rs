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
    // A corrupt CA key: an error naming it, and nothing replaced (clients pin the CA)...
    fs::write(dir.path().join("ca.key"), "garbage").unwrap();
    let mut source = g().into_source();
    let err = source.next().await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("ca.key") && err.contains("not replaced"),
        "{err}"
    );
    drop(source);
    assert_eq!(fs::read(dir.path().join("ca.key")).unwrap(), b"garbage");
    // ...unless a new CA is asked for: reported, a new CA, and a new leaf signed by it.
    let replacing = builder(dir.path(), &["localhost"])
        .ca()
        .replace_corrupt_ca(true)
        .build()
        .unwrap();
    let (reports, fresh) = start(replacing).await;
    assert!(reports.iter().any(|r| r.contains("ca.key")), "{reports:?}");
    assert_ne!(fresh.ca(), first.ca());
}

#[tokio::test(start_paused = true)]
async fn a_ca_renewed_while_running_is_persisted_and_served_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
    // Leaves for 30 days, the CA for 60: 41 days on, the CA is inside its renewal window.
    let g = || {
        builder(dir.path(), &["localhost"])
            .ca()
            .ca_validity(Duration::from_secs(60 * 86400))
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let mut source = g().into_source();
    let first = source.next().await.unwrap().unwrap();
    clock.step(Duration::from_secs(41 * 86400));
    let renewed = source.next().await.unwrap().unwrap();
    assert_ne!(renewed.ca(), first.ca(), "the CA was renewed with the leaf");
    drop(source);
    let on_disk = tls_source::Decoder::new()
        .certificates("ca.crt", &fs::read(dir.path().join("ca.crt")).unwrap())
        .unwrap();
    assert_eq!(on_disk, renewed.ca(), "the renewed CA is on disk");
    let (reports, again) = start(g()).await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(
        again.ca(),
        renewed.ca(),
        "after a restart: the same CA, not a third"
    );
    assert_eq!(again.digest(), renewed.digest(), "and the same leaf");
}

#[cfg(unix)]
#[tokio::test]
async fn each_generation_is_one_atomic_swap_in_the_kubelet_layout() {
    let dir = tempfile::tempdir().unwrap();
    let g = builder(dir.path(), &["localhost"]).ca().build().unwrap();
    let (_, first) = start(g.clone()).await;
    let link = |name: &str| fs::read_link(dir.path().join(name)).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt", "ca.key"] {
        assert_eq!(
            link(name),
            Path::new("..data").join(name),
            "{name} goes through ..data"
        );
    }
    let generation = link("..data");
    // A new generation (new names) replaces the whole set by one rename of ..data.
    let wider = builder(dir.path(), &["localhost", "api.test"])
        .ca()
        .build()
        .unwrap();
    let (_, second) = start(wider).await;
    assert_ne!(first.digest(), second.digest());
    assert_ne!(link("..data"), generation, "a new generation directory");
    assert!(
        !dir.path().join(&generation).exists(),
        "the previous one is removed"
    );
    // What FileSource reads there is the new pair.
    let mut files = tls_source::FileSource::kubernetes_dir(dir.path())
        .notify(false)
        .build();
    let read = files.next().await.unwrap().unwrap();
    assert_eq!(read.chain()[0], second.chain()[0]);
}

/// The next item of `source`, at most [`PATIENCE`](tls_test::PATIENCE) away.
async fn next(source: &mut tls_selfsigned::SelfSignedSource) -> Result<CertBundle, String> {
    tokio::time::timeout(tls_test::PATIENCE, source.next())
        .await
        .expect("the source yields")
        .expect("the source goes on")
        .map_err(|e| e.to_string())
}

/// Starts `generator`'s source on a directory it cannot persist to: it serves a certificate
/// at once (one that fits), and the reason follows. Returns the source, the certificate and
/// the reason.
async fn served_unpersisted(
    generator: &SelfSigned,
) -> (tls_selfsigned::SelfSignedSource, CertBundle, String) {
    let mut source = generator.clone().into_source();
    let served = next(&mut source).await.expect("a certificate to serve");
    assert_eq!(generator.check_bundle(&served), Ok(()));
    let err = next(&mut source).await.unwrap_err();
    (source, served, err)
}

/// Polls `source` in the background (its retries run only while it is polled) until `file`
/// exists, then checks it holds `served` and that the source generated nothing new meanwhile
/// (only reports of its retries).
async fn expect_stored(source: tls_selfsigned::SelfSignedSource, file: &Path, served: &CertBundle) {
    let (stored, yielded) = until_stored(source, file).await;
    assert_eq!(
        leaf_of(&stored),
        served.chain()[0],
        "the served certificate, stored"
    );
    assert!(
        yielded.iter().all(Result::is_err),
        "nothing new generated: {yielded:?}"
    );
}

async fn until_stored(
    mut source: tls_selfsigned::SelfSignedSource,
    file: &Path,
) -> (Vec<u8>, Vec<Result<CertBundle, String>>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Some(item) = source.next().await {
            let _ = tx.send(item.map_err(|e| e.to_string()));
        }
    });
    let stored = tokio::time::timeout(tls_test::PATIENCE, async {
        loop {
            if let Ok(stored) = fs::read(file) {
                return stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("persisted once it can be");
    task.abort();
    let mut yielded = Vec::new();
    while let Ok(item) = rx.try_recv() {
        yielded.push(item);
    }
    (stored, yielded)
}

fn leaf_of(pem: &[u8]) -> rustls_pki_types::CertificateDer<'static> {
    tls_source::Decoder::new()
        .certificates("tls.crt", pem)
        .unwrap()
        .remove(0)
}

#[tokio::test]
async fn a_directory_where_tls_crt_should_be_still_serves_and_recovers_when_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("tls.crt")).unwrap();
    let generator = builder(dir.path(), &["localhost"]).ca().build().unwrap();
    // Served at once; the reason follows, naming the file.
    let (source, served, err) = served_unpersisted(&generator).await;
    assert!(
        err.contains("tls.crt") && err.contains("Is a directory"),
        "{err}"
    );

    // It is tried again with backoff; once the directory is gone, what is served is stored.
    fs::remove_dir(dir.path().join("tls.crt")).unwrap();
    expect_stored(source, &dir.path().join("tls.crt"), &served).await;
    // With its CA: a restart serves the same.
    let (reports, again) = start(builder(dir.path(), &["localhost"]).ca().build().unwrap()).await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(again.digest(), served.digest());
}

#[tokio::test]
async fn a_directory_that_cannot_be_made_still_serves_and_persists_when_it_can() {
    let parent = tempfile::tempdir().unwrap();
    // Not writable, even for root: a file where a directory on the way should be.
    let blocker = parent.path().join("blocker");
    fs::write(&blocker, b"").unwrap();
    let dir = blocker.join("tls");
    let generator = builder(&dir, &["localhost"]).build().unwrap();
    let (source, served, err) = served_unpersisted(&generator).await;
    assert!(err.contains(&blocker.display().to_string()), "{err}");

    fs::remove_file(&blocker).unwrap();
    expect_stored(source, &dir.join("tls.crt"), &served).await;
}

#[tokio::test]
async fn a_stored_pair_that_fits_is_served_from_a_directory_that_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let (_, first) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    // The directory becomes unusable for writing (a stale temporary name blocks the swap) but
    // what is stored still reads and fits: it is served, with nothing to report.
    fs::create_dir(dir.path().join("..data_tmp")).unwrap();
    let (reports, again) = start(builder(dir.path(), &["localhost"]).build().unwrap()).await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(again.digest(), first.digest());
}
