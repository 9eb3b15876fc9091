//! A real handshake is served the new certificate after each way files change, with the notify
//! fast path and with polling only.

mod common;

use common::{Harness, Mode, write_kube};
use tls_test::{TestCa, overwrite_in_place, replace_by_rename};

async fn kubelet_swap(mode: Mode) {
    let ca = TestCa::new("rotation");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let h = Harness::kube(&a, mode).await;
    write_kube(&h.kube, &b);
    h.expect_served(&b).await;
    // A second swap: a watch on the old files would have died with the first.
    write_kube(&h.kube, &c);
    h.expect_served(&c).await;
    assert_eq!(h.status().generation, 3);
    assert!(h.status().last_error.is_none());
}

#[tokio::test]
async fn kubelet_data_swap_with_notify() {
    kubelet_swap(Mode::Notify).await;
}

#[tokio::test]
async fn kubelet_data_swap_polling() {
    kubelet_swap(Mode::Poll).await;
}

async fn in_place(mode: Mode) {
    let ca = TestCa::new("rotation");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let h = Harness::plain(&a, mode).await;
    // Certificate first, then key: in between, the files are a mismatched pair.
    overwrite_in_place(&h.kube.file("tls.crt"), b.chain_pem.as_bytes()).unwrap();
    overwrite_in_place(&h.kube.file("tls.key"), b.key_pem.as_bytes()).unwrap();
    h.expect_served(&b).await;
    // Whatever was seen half-way, the latest input was good.
    h.wait_for("no error left", |s| s.last_error.is_none())
        .await;
}

#[tokio::test]
async fn in_place_overwrite_with_notify() {
    in_place(Mode::Notify).await;
}

#[tokio::test]
async fn in_place_overwrite_polling() {
    in_place(Mode::Poll).await;
}

async fn rename_over(mode: Mode) {
    let ca = TestCa::new("rotation");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let h = Harness::plain(&a, mode).await;
    replace_by_rename(&h.kube.file("tls.key"), b.key_pem.as_bytes()).unwrap();
    replace_by_rename(&h.kube.file("tls.crt"), b.chain_pem.as_bytes()).unwrap();
    h.expect_served(&b).await;
    h.wait_for("no error left", |s| s.last_error.is_none())
        .await;
}

#[tokio::test]
async fn rename_over_the_file_with_notify() {
    rename_over(Mode::Notify).await;
}

#[tokio::test]
async fn rename_over_the_file_polling() {
    rename_over(Mode::Poll).await;
}

#[tokio::test]
async fn trigger_forces_a_read_without_any_event() {
    let ca = TestCa::new("rotation");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    // Neither notify nor a poll will come: only the trigger can deliver.
    let dir = tempfile::tempdir().unwrap();
    let kube = tls_test::KubeDir::new(dir.path().join("tls")).unwrap();
    write_kube(&kube, &a);
    let source = tls_source::FileSource::builder(kube.file("tls.crt"), kube.file("tls.key"))
        .notify(false)
        .poll_interval(std::time::Duration::from_secs(3600))
        .build();
    let trigger = source.trigger();
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(tls_test::PATIENCE).await.unwrap();
    write_kube(&kube, &b);
    trigger.trigger();
    let fp = b.fingerprint.clone();
    tls_test::wait_for(reloader.status(), "the triggered read", |s| {
        s.current
            .as_ref()
            .is_some_and(|c| c.fingerprint_sha256 == fp)
    })
    .await;
}

#[tokio::test]
async fn chain_and_ca_are_served_and_reported() {
    let ca = TestCa::new("rotation chain");
    let leaf = ca.leaf(&["localhost", "127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let kube = tls_test::KubeDir::new(dir.path().join("tls")).unwrap();
    kube.write(&[
        ("tls.crt", leaf.chain_pem.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("ca.crt", leaf.ca_pem.as_bytes()),
    ])
    .unwrap();
    let source = tls_source::FileSource::kubernetes_dir(kube.path()).build();
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(tls_test::PATIENCE).await.unwrap();
    let server = tls_test::TestServer::start(reloader.resolver()).await;
    // A client that trusts only the CA verifies the served chain, by name.
    let served = tls_test::probe_trusting(server.addr(), "localhost", &[ca.cert_der()])
        .await
        .expect("verified handshake");
    assert_eq!(served.chain.len(), 2);
    let info = reloader.status().borrow().current.clone().unwrap();
    assert_eq!(info.fingerprint_sha256, leaf.fingerprint);
    assert_eq!(info.dns_names, ["localhost"]);
    assert_eq!(
        info.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(info.subject, "CN=localhost");
    assert_eq!(info.chain_len, 2);
    assert!(
        info.origin.to_string().ends_with("tls.key"),
        "{}",
        info.origin
    );
}

/// With a file source, a rotation is installed on the thread that read the files: a
/// runtime whose only thread is busy (here: blocked by this test, so the reload task cannot
/// run at all) still serves the new certificate, and its status says so.
#[test]
fn a_kubelet_swap_is_served_while_the_runtime_is_blocked() {
    use std::time::{Duration, Instant};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = TestCa::new("blocked runtime");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let kube = tls_test::KubeDir::new(dir.path().join("tls")).unwrap();
    write_kube(&kube, &a);
    let reloader = runtime.block_on(async {
        let reloader = tls_reload::Reloader::builder()
            .crypto_provider(common::provider())
            .spawn(common::source(&kube, Mode::Notify))
            .unwrap();
        common::patiently("the first certificate", reloader.ready())
            .await
            .unwrap();
        // Let the file source set its watches up (a read's layout is followed on the task).
        tokio::time::sleep(Duration::from_millis(200)).await;
        reloader
    });
    let resolver = reloader.resolver();
    let served = |cert: &tls_test::TestCert| {
        resolver
            .current()
            .is_some_and(|k| k.cert[0] == cert.cert_der)
    };
    assert!(served(&a));
    // From here on the runtime's one thread is this one, and it never yields to the runtime.
    write_kube(&kube, &b);
    let since = Instant::now();
    while !served(&b) {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the rotation waited for the runtime"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The status is published right after the install, on the same thread.
    let status = loop {
        let status = reloader.status().borrow().clone();
        if status.generation >= 2 {
            break status;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the status waited for the runtime: {status:#?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(status.generation, 2);
    assert_eq!(common::installed(&status), Some(b.fingerprint.as_str()));
    drop(runtime);
}
