//! `CaFileSource`: a CA bundle file followed like the certificate files.

use std::time::Duration;

use futures::StreamExt as _;
use tls_source::CaFileSource;
use tls_test::{KubeDir, TestCa, replace_by_rename};

async fn next(source: &mut CaFileSource) -> Result<Vec<String>, String> {
    tokio::time::timeout(Duration::from_secs(20), source.next())
        .await
        .expect("the source says something in time")
        .expect("the source goes on")
        .map(|cas| {
            cas.iter()
                .map(|ca| tls_test::fingerprint(ca.as_ref()))
                .collect()
        })
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_ca_file_is_followed_through_renames_and_kubelet_swaps_and_bad_content_is_named() {
    let (a, b) = (TestCa::new("A"), TestCa::new("B"));
    let fp = |ca: &TestCa| tls_test::fingerprint(ca.cert_der().as_ref());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients.pem");
    std::fs::write(&path, a.cert_pem()).unwrap();
    // The poll is an hour away: only the watch can deliver.
    let mut source = CaFileSource::builder(&path)
        .poll_interval(Duration::from_secs(3600))
        .build();
    assert_eq!(next(&mut source).await.unwrap(), [fp(&a)]);

    replace_by_rename(
        &path,
        format!("{}{}", a.cert_pem(), b.cert_pem()).as_bytes(),
    )
    .unwrap();
    assert_eq!(next(&mut source).await.unwrap(), [fp(&a), fp(&b)]);

    replace_by_rename(&path, b"not a certificate").unwrap();
    let err = next(&mut source).await.unwrap_err();
    assert!(
        err.contains(&path.display().to_string()),
        "names the file: {err}"
    );

    replace_by_rename(&path, b.cert_pem().as_bytes()).unwrap();
    assert_eq!(next(&mut source).await.unwrap(), [fp(&b)]);

    // A kubelet-style directory's ca.crt, swapped through ..data.
    let kube = KubeDir::new(dir.path().join("secret")).unwrap();
    kube.write(&[("ca.crt", a.cert_pem().as_bytes())]).unwrap();
    let mut mounted = CaFileSource::builder(kube.file("ca.crt"))
        .poll_interval(Duration::from_secs(3600))
        .build();
    assert_eq!(next(&mut mounted).await.unwrap(), [fp(&a)]);
    kube.write(&[("ca.crt", b.cert_pem().as_bytes())]).unwrap();
    assert_eq!(next(&mut mounted).await.unwrap(), [fp(&b)]);
}
