//! A rotation made while the process has no file descriptors left is seen within a second of
//! their return, not at the next poll. Its own test binary: it lowers the process's limit.
#![cfg(unix)]

use std::fs::File;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tls_source::{Error, FileSource};
use tls_test::{KubeDir, TestCa};

/// Opens files until the process is out of descriptors, and holds them.
fn exhaust() -> Vec<File> {
    let mut held = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(err) if err.raw_os_error() == Some(24) => return held,
            Err(err) => panic!("unexpected error while exhausting descriptors: {err}"),
        }
    }
}

#[tokio::test]
async fn a_rotation_during_descriptor_exhaustion_is_seen_soon_after_recovery() {
    let ca = TestCa::new("descriptors");
    let (first, second) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    let files = |cert: &tls_test::TestCert| {
        [
            ("tls.crt", cert.chain_pem.clone().into_bytes()),
            ("tls.key", cert.key_pem.clone().into_bytes()),
        ]
    };
    let write = |cert| {
        let files = files(cert);
        let files: Vec<(&str, &[u8])> = files.iter().map(|(n, c)| (*n, c.as_slice())).collect();
        kube.stage(&files).unwrap()
    };
    let staged = write(&first);
    staged.swap().unwrap();
    staged.finish().unwrap();

    // The poll is an hour away: only the watch and the source's own retry can deliver.
    let mut source = FileSource::kubernetes_dir(kube.path())
        .poll_interval(Duration::from_secs(3600))
        .build();
    let bundle = source.next().await.unwrap().unwrap();
    assert_eq!(bundle.chain()[0].as_ref(), first.cert_der.as_ref());
    let next = write(&second);

    // A low limit, so exhausting it is quick; restored before the test ends.
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    rlimit::Resource::NOFILE.set(256.min(hard), hard).unwrap();
    let held = exhaust();
    // The swap opens no file: it happens while nothing can be opened.
    next.swap().unwrap();
    let during = tokio::time::timeout(Duration::from_secs(10), source.next())
        .await
        .expect("the swap's event is read, and the read fails")
        .unwrap();
    let err = during.expect_err("nothing can be read without descriptors");
    assert!(matches!(&err, Error::Read { .. }), "{err}");
    assert!(err.to_string().contains("Too many open files"), "{err}");

    // While descriptors stay exhausted, the retries fail the same way and say nothing new; the
    // swap's other events are used up meanwhile, so only the retry can see the recovery.
    let quiet = tokio::time::timeout(Duration::from_millis(600), source.next()).await;
    assert!(quiet.is_err(), "nothing new while exhausted: {quiet:?}");

    let recovered = Instant::now();
    drop(held);
    let bundle = tokio::time::timeout(Duration::from_secs(10), source.next())
        .await
        .expect("the rotation is read after recovery, not at the poll an hour away")
        .unwrap()
        .unwrap();
    let waited = recovered.elapsed();
    rlimit::Resource::NOFILE.set(soft, hard).unwrap();
    assert_eq!(bundle.chain()[0].as_ref(), second.cert_der.as_ref());
    // Reported, not asserted as a timing: the retry is every 250 ms.
    eprintln!("served {waited:?} after descriptors came back");
    next.finish().unwrap();
}
