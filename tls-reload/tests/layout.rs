//! The fast path follows the layout: with the poll an hour away, every change below is served
//! from the notify watch alone, after the directories were removed, created late, written behind
//! the kubelet's links, or reached through a link retargeted into another directory.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::{Harness, Mode, write_kube};
use tls_reload::Reloader;
use tls_source::FileSource;
use tls_source::inline::Inline;
use tls_test::{KubeDir, PATIENCE, TestCa, TestCert, TestServer, overwrite_in_place};

/// A source with notify on and the poll an hour away: only the watch can deliver in time.
fn watch_only(cert: &Path, key: &Path) -> Inline<FileSource> {
    FileSource::builder(cert, key)
        .poll_interval(Duration::from_secs(3600))
        .build()
}

/// Replaces `link` with a symlink to `target`, atomically (a new link renamed over it).
fn retarget(link: &Path, target: &Path) {
    let tmp = link.with_extension("tmp-link");
    symlink(target, &tmp).unwrap();
    fs::rename(&tmp, link).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_removed_and_laid_out_again_is_followed() {
    let ca = TestCa::new("layout remove");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let h = Harness::kube(&a, Mode::Notify).await;
    fs::remove_dir_all(h.kube.path()).unwrap();
    h.wait_for("the removal reported", |s| s.last_error.is_some())
        .await;
    assert_eq!(
        h.served().await,
        a.fingerprint,
        "the last good keeps serving"
    );

    let again = KubeDir::new(h.kube.path()).unwrap();
    write_kube(&again, &b);
    h.expect_served(&b).await;
    // And the next kubelet swap in the re-created directory too.
    write_kube(&again, &c);
    h.expect_served(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_directory_that_appears_after_start_is_served() {
    let cert = TestCa::new("layout late").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("not/yet/there");
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(watch_only(&late.join("tls.crt"), &late.join("tls.key")))
        .unwrap();
    tls_test::wait_for(reloader.status(), "the missing files reported", |s| {
        s.last_error.is_some()
    })
    .await;
    let kube = KubeDir::new(&late).unwrap();
    write_kube(&kube, &cert);
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(tls_test::served(server.addr()).await, cert.fingerprint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_write_behind_the_kubelet_links_is_served() {
    let ca = TestCa::new("layout behind");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let h = Harness::kube(&a, Mode::Notify).await;
    // The files the `..data` links lead to, written in place: no event in the directory the
    // paths name, only in the timestamped one.
    let cert = fs::canonicalize(h.kube.file("tls.crt")).unwrap();
    let key = fs::canonicalize(h.kube.file("tls.key")).unwrap();
    assert_ne!(cert.parent(), Some(h.kube.path()));
    overwrite_in_place(&key, b.key_pem.as_bytes()).unwrap();
    overwrite_in_place(&cert, b.chain_pem.as_bytes()).unwrap();
    h.expect_served(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kubelet_swap_an_in_place_write_into_the_new_generation_is_served() {
    let ca = TestCa::new("layout after swap");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let h = Harness::kube(&a, Mode::Notify).await;
    let first = fs::canonicalize(h.kube.file("tls.crt")).unwrap();
    // The swap is served first; the watch moves to the new generation's directory after.
    write_kube(&h.kube, &b);
    h.expect_served(&b).await;
    let cert = fs::canonicalize(h.kube.file("tls.crt")).unwrap();
    let key = fs::canonicalize(h.kube.file("tls.key")).unwrap();
    assert_ne!(cert.parent(), first.parent(), "a new generation");
    overwrite_in_place(&key, c.key_pem.as_bytes()).unwrap();
    overwrite_in_place(&cert, c.chain_pem.as_bytes()).unwrap();
    h.expect_served(&c).await;
}

/// Keys nested in a projected volume (`sub/tls.crt`): the kubelet links `sub` to `..data/sub`.
/// Swaps are served, and after each an in-place write into the new generation's `sub` (a
/// directory below the generation, followed with the layout) is served too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_nested_below_a_kubelet_generation_are_followed_through_swaps() {
    let ca = TestCa::new("layout nested");
    let [a, b, c, d] = ca.leaves(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    let nested = |cert: &TestCert| {
        kube.write(&[
            ("sub/tls.crt", cert.chain_pem.as_bytes()),
            ("sub/tls.key", cert.key_pem.as_bytes()),
        ])
        .unwrap();
    };
    nested(&a);
    let (cert, key) = (
        kube.path().join("sub/tls.crt"),
        kube.path().join("sub/tls.key"),
    );
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(watch_only(&cert, &key))
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(tls_test::served(server.addr()).await, a.fingerprint);

    let mut generations = Vec::new();
    for (swap, write) in [(&b, &c), (&d, &a)] {
        nested(swap);
        tls_test::expect_served(server.addr(), reloader.status(), common::installed, swap).await;
        let real = fs::canonicalize(&cert).unwrap();
        assert!(real.ends_with("sub/tls.crt"), "{}", real.display());
        assert!(!generations.contains(&real), "a new generation each time");
        generations.push(real.clone());
        overwrite_in_place(&fs::canonicalize(&key).unwrap(), write.key_pem.as_bytes()).unwrap();
        overwrite_in_place(&real, write.chain_pem.as_bytes()).unwrap();
        tls_test::expect_served(server.addr(), reloader.status(), common::installed, write).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_retargeted_into_another_directory_are_followed_there() {
    let ca = TestCa::new("layout links");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, cert: &TestCert| {
        let target = dir.path().join(name);
        fs::create_dir(&target).unwrap();
        fs::write(target.join("cert.pem"), &cert.chain_pem).unwrap();
        fs::write(target.join("key.pem"), &cert.key_pem).unwrap();
        target
    };
    let (first, second) = (put("first", &a), put("second", &b));
    let links = dir.path().join("links");
    fs::create_dir(&links).unwrap();
    symlink(first.join("cert.pem"), links.join("tls.crt")).unwrap();
    symlink(first.join("key.pem"), links.join("tls.key")).unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .spawn(watch_only(&links.join("tls.crt"), &links.join("tls.key")))
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    assert_eq!(tls_test::served(server.addr()).await, a.fingerprint);

    // The links now lead into another directory.
    retarget(&links.join("tls.key"), &second.join("key.pem"));
    retarget(&links.join("tls.crt"), &second.join("cert.pem"));
    tls_test::expect_served(server.addr(), reloader.status(), common::installed, &b).await;

    // An in-place write there, which only a watch on that directory sees.
    overwrite_in_place(&second.join("key.pem"), c.key_pem.as_bytes()).unwrap();
    overwrite_in_place(&second.join("cert.pem"), c.chain_pem.as_bytes()).unwrap();
    tls_test::expect_served(server.addr(), reloader.status(), common::installed, &c).await;
}
