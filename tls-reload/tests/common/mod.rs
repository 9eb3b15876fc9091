//! Shared set-up of the tls-reload integration tests: a directory of files, a `FileSource`, a
//! Reloader and a real TLS server in front of it.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tls_reload::{Reloader, Status};
use tls_source::inline::Inline;
use tls_source::{FileSource, Trigger};
use tls_test::{KubeDir, PATIENCE, TestCert, TestServer};

/// The tests' provider (aws-lc-rs).
pub use tls_test::provider;

/// How the files are watched.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// Notify on, poll effectively off: only the fast path can deliver.
    Notify,
    /// Notify off, poll every 100 ms.
    Poll,
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub kube: KubeDir,
    pub reloader: Reloader,
    pub server: TestServer,
    pub trigger: Trigger,
}

pub fn kube_files(cert: &TestCert) -> [(&'static str, Vec<u8>); 2] {
    [
        ("tls.crt", cert.chain_pem.clone().into_bytes()),
        ("tls.key", cert.key_pem.clone().into_bytes()),
    ]
}

pub fn write_kube(kube: &KubeDir, cert: &TestCert) {
    let files = kube_files(cert);
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, c)| (*n, c.as_slice())).collect();
    kube.write(&refs).expect("kubelet-style write");
}

pub fn source(kube: &KubeDir, mode: Mode) -> Inline<FileSource> {
    let builder = FileSource::builder(kube.file("tls.crt"), kube.file("tls.key"));
    match mode {
        Mode::Notify => builder
            .notify(true)
            .poll_interval(Duration::from_secs(3600)),
        Mode::Poll => builder
            .notify(false)
            .poll_interval(Duration::from_millis(100)),
    }
    .build()
}

impl Harness {
    /// Files for `first` in a kubelet-style directory, served through a reloader.
    pub async fn kube(first: &TestCert, mode: Mode) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kube = KubeDir::new(dir.path().join("tls")).expect("kube dir");
        write_kube(&kube, first);
        let source = source(&kube, mode);
        Self::start(dir, kube, source, first).await
    }

    /// Plain files (no symlinks) for `first`.
    pub async fn plain(first: &TestCert, mode: Mode) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kube = KubeDir::new(dir.path().join("tls")).expect("dir");
        std::fs::write(kube.file("tls.crt"), &first.chain_pem).unwrap();
        std::fs::write(kube.file("tls.key"), &first.key_pem).unwrap();
        let source = source(&kube, mode);
        Self::start(dir, kube, source, first).await
    }

    async fn start(
        dir: tempfile::TempDir,
        kube: KubeDir,
        source: Inline<FileSource>,
        first: &TestCert,
    ) -> Self {
        let trigger = source.trigger();
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .spawn(source)
            .expect("spawn reloader");
        reloader
            .ready_timeout(PATIENCE)
            .await
            .expect("first certificate installed");
        let server = TestServer::start(reloader.resolver()).await;
        let harness = Self {
            dir,
            kube,
            reloader,
            server,
            trigger,
        };
        assert_eq!(harness.served().await, first.fingerprint);
        harness
    }

    /// The fingerprint a fresh handshake is served.
    pub async fn served(&self) -> String {
        tls_test::served(self.server.addr()).await
    }

    pub fn status(&self) -> Status {
        self.reloader.status().borrow().clone()
    }

    /// Waits until the status satisfies `pred`.
    pub async fn wait_for(&self, what: &str, pred: impl FnMut(&Status) -> bool) -> Status {
        tls_test::wait_for(self.reloader.status(), what, pred).await
    }

    /// Waits until the last error mentions `expected`, then checks that nothing new was
    /// installed and that `still` keeps serving. Returns that status.
    pub async fn expect_refused(
        &self,
        expected: &str,
        still: &TestCert,
        generation: u64,
    ) -> Status {
        let status = self
            .wait_for(expected, |s| {
                s.last_error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains(expected))
            })
            .await;
        assert_eq!(status.generation, generation, "nothing new was installed");
        assert_eq!(installed(&status), Some(still.fingerprint.as_str()));
        assert_eq!(
            self.served().await,
            still.fingerprint,
            "the last good certificate keeps serving"
        );
        status
    }

    /// Waits until `cert` is installed, then checks that a handshake is served it.
    pub async fn expect_served(&self, cert: &TestCert) {
        tls_test::expect_served(self.server.addr(), self.reloader.status(), installed, cert).await;
    }
}

/// Runs `f` with a time-out of [`PATIENCE`].
pub async fn patiently<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The fingerprint a status says is installed.
pub fn installed(status: &Status) -> Option<&str> {
    status
        .current
        .as_ref()
        .map(|c| c.fingerprint_sha256.as_str())
}

/// A bundle of `cert`'s chain and key, as a source would yield it.
pub fn bundle(cert: &TestCert) -> tls_source::CertBundle {
    tls_source::Decoder::new()
        .bundle(
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
            None,
            tls_source::Origin::Other(format!("test bundle {}", &cert.fingerprint[..8])),
        )
        .expect("a valid test bundle")
}

/// A kubelet-style directory `parent/name` holding `cert`, and a notify-driven source on it.
pub fn kube_source(
    parent: &std::path::Path,
    name: &str,
    cert: &TestCert,
) -> (KubeDir, Inline<FileSource>) {
    let kube = KubeDir::new(parent.join(name)).expect("kube dir");
    write_kube(&kube, cert);
    let source = source(&kube, Mode::Notify);
    (kube, source)
}

/// The fingerprint a route's status says is installed.
pub fn route_installed<'a>(status: &'a Status, route: &str) -> Option<&'a str> {
    status
        .routes
        .get(route)
        .and_then(|r| r.current.as_ref())
        .map(|c| c.fingerprint_sha256.as_str())
}

/// `cert`'s chain and key with `cas` as the bundle's CA certificates (`ca.crt`).
pub fn bundle_with_cas(cert: &TestCert, cas: &[&tls_test::TestCa]) -> tls_source::CertBundle {
    let ca_pem: String = cas.iter().map(|ca| ca.cert_pem()).collect();
    tls_source::Decoder::new()
        .bundle(
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
            Some(("ca.crt", ca_pem.as_bytes())),
            tls_source::Origin::Other(format!("test bundle {}", &cert.fingerprint[..8])),
        )
        .expect("a valid test bundle")
}

/// What feeds a reloader on a channel: send a bundle or a report, the reloader takes it next.
pub type Feed =
    futures::channel::mpsc::UnboundedSender<Result<tls_source::CertBundle, tls_source::Error>>;

/// A reloader on a channel whose first item is `first`, judging validity by `clock`.
pub fn clocked(clock: Arc<dyn tls_source::clock::Clock>, first: &TestCert) -> (Feed, Reloader) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(bundle(first))).unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .clock(clock)
        .spawn(rx)
        .unwrap();
    (tx, reloader)
}

/// A reloader requiring client certificates trusted by its bundle's `ca.crt`
/// (`ClientAuth::from_bundle`), on a channel whose first item is `first`, ready.
pub async fn mtls(first: tls_source::CertBundle) -> (Feed, Reloader) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(first)).unwrap();
    let reloader = Reloader::builder()
        .crypto_provider(provider())
        .client_auth(tls_reload::ClientAuth::from_bundle())
        .spawn(rx)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    (tx, reloader)
}

/// A `ClientTls` on a channel with `first` installed.
pub async fn client_tls(first: tls_source::CertBundle) -> (tls_reload::ClientTls, Feed) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(first)).unwrap();
    let client = tls_reload::ClientTls::builder()
        .crypto_provider(provider())
        .spawn(rx)
        .unwrap();
    client.ready_timeout(PATIENCE).await.unwrap();
    (client, tx)
}
