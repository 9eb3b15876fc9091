//! The fleet of the shared-store tests (`shared.rs`, `seal.rs`): replicas of
//! `SharedSelfSigned`, each through its own emulator endpoint and serving behind a real TLS
//! server, and what to wait for and read back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use tls_k8s::{Leadership, SharedSelfSigned, SharedSource, StateAccess, WriterStats};
use tls_reload::{Reloader, Status};
use tls_selfsigned::SelfSigned;
use tls_test::{Endpoint, KubeApi, PATIENCE, TestServer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Test timings: a 1.5 s lease, renewed every 200 ms, given up after 1 s.
pub const LEASE: Duration = Duration::from_millis(1500);
pub const RENEW_DEADLINE: Duration = Duration::from_millis(1000);
pub const RETRY: Duration = Duration::from_millis(200);

pub struct Replica {
    pub id: String,
    pub endpoint: Endpoint,
    pub leadership: watch::Receiver<Leadership>,
    pub stats: watch::Receiver<WriterStats>,
    pub access: watch::Receiver<StateAccess>,
    pub reloader: Reloader,
    pub server: TestServer,
}

pub fn client_of(endpoint: &Endpoint) -> kube::Client {
    super::client_at(&endpoint.url())
}

pub fn generator(names: &[&str], ca: bool) -> SelfSigned {
    let builder = names.iter().fold(SelfSigned::builder(), |b, n| b.name(n));
    let builder = if ca { builder.ca() } else { builder };
    builder.build().expect("generator")
}

impl Replica {
    pub async fn start(api: &KubeApi, id: &str, generator: SelfSigned) -> Self {
        Self::start_with(api, id, generator, |s| s).await
    }

    pub async fn start_with(
        api: &KubeApi,
        id: &str,
        generator: SelfSigned,
        configure: impl FnOnce(SharedSelfSigned) -> SharedSelfSigned,
    ) -> Self {
        let endpoint = api.endpoint().await;
        let shared = configure(
            SharedSelfSigned::new(client_of(&endpoint), "default", "tls", id, generator)
                .lease_timing(LEASE, RENEW_DEADLINE, RETRY),
        )
        .start(&CancellationToken::new());
        Self::serve(id, endpoint, shared).await
    }

    pub async fn serve(id: &str, endpoint: Endpoint, shared: SharedSource) -> Self {
        let leadership = shared.leadership();
        let stats = shared.stats();
        let access = shared.access();
        let reloader = Reloader::builder()
            .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .spawn(shared)
            .expect("spawn");
        let server = TestServer::start(reloader.resolver()).await;
        Self {
            id: id.to_owned(),
            endpoint,
            leadership,
            stats,
            access,
            reloader,
            server,
        }
    }

    /// Killed: it stops without a word, as on SIGKILL (its API connection is cut first, so a
    /// leader cannot release its Lease: the others take over when it expires), and serves no
    /// more.
    pub async fn kill(self) {
        self.endpoint.partition(tls_test::Link::Reset);
        self.stop().await;
    }

    /// Stopped gracefully, as on SIGTERM in a rollout: its reloader ends and drops the source
    /// (a leader releases its Lease on the way out), and it serves no more.
    pub async fn stop(self) {
        self.reloader.stop();
        let _ = tokio::time::timeout(tls_test::PATIENCE, self.reloader.stopped())
            .await
            .expect("the killed replica stops");
    }

    pub fn status(&self) -> Status {
        self.reloader.status().borrow().clone()
    }

    pub fn leading(&self) -> bool {
        self.leadership.borrow().leading
    }

    pub fn stats(&self) -> WriterStats {
        self.stats.borrow().clone()
    }

    /// The fingerprint this replica serves, by a real handshake.
    pub async fn served(&self) -> String {
        tls_test::served(self.server.addr()).await
    }
}

/// The Secret's data value `key`, decoded.
pub fn secret_value(api: &KubeApi, name: &str, key: &str) -> Option<Vec<u8>> {
    let secret = api.get("secrets", "default", name)?;
    let text = secret["data"][key].as_str()?;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

pub fn annotation(api: &KubeApi, name: &str, key: &str) -> Option<String> {
    api.get("secrets", "default", name)?["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

pub fn stored_round(api: &KubeApi) -> Option<u64> {
    annotation(api, "tls", tls_k8s::store::ROUND_ANNOTATION)?
        .parse()
        .ok()
}

/// The leaf's fingerprint in the Secret.
pub fn secret_leaf(api: &KubeApi) -> Option<String> {
    let pem = secret_value(api, "tls", "tls.crt")?;
    let chain = tls_source::Decoder::new()
        .certificates("tls.crt", &pem)
        .ok()?;
    Some(tls_test::fingerprint(&chain[0]))
}

pub fn certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    tls_source::Decoder::new()
        .certificates("ca.crt", pem)
        .expect("PEM")
}

/// Waits until `pred` holds, or panics with `what` after `PATIENCE`.
pub async fn until(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every replica serves the Secret's leaf (by handshake); returns it.
pub async fn converged(api: &KubeApi, replicas: &[&Replica]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(leaf) = secret_leaf(api) {
            let mut all = true;
            for replica in replicas {
                all &= tls_test::served_as(replica.server.addr(), "localhost")
                    .await
                    .is_ok_and(|served| served == leaf);
            }
            if all {
                return leaf;
            }
        }
        assert!(Instant::now() < deadline, "the replicas did not converge");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The one replica that leads, once exactly one does.
pub async fn leader<'a>(replicas: &[&'a Replica]) -> &'a Replica {
    until("exactly one leader", || {
        replicas.iter().filter(|r| r.leading()).count() == 1
    })
    .await;
    replicas.iter().find(|r| r.leading()).expect("one leads")
}

pub fn total(replicas: &[&Replica], of: impl Fn(&WriterStats) -> u64) -> u64 {
    replicas.iter().map(|r| of(&r.stats())).sum()
}

pub async fn three(api: &KubeApi, ca: bool) -> [Replica; 3] {
    let (a, b, c) = tokio::join!(
        Replica::start(api, "a", generator(&["localhost"], ca)),
        Replica::start(api, "b", generator(&["localhost"], ca)),
        Replica::start(api, "c", generator(&["localhost"], ca)),
    );
    [a, b, c]
}
