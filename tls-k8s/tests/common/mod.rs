//! Shared set-up of the tls-k8s tests: a client for the emulator (or a real cluster), and a
//! Secret served through a reloader behind a real TLS server.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

#[cfg(feature = "self-signed")]
pub mod fleet;

use tls_k8s::SecretSource;
use tls_reload::{Reloader, Status};
use tls_test::{KubeApi, PATIENCE, TestCert, TestServer};

/// A `kube::Client` for the emulator, through an ordinary `kube::Config`.
pub fn client(api: &KubeApi) -> kube::Client {
    client_at(&api.url())
}

/// A `kube::Client` for `url`: the emulator, or one client's own endpoint of it.
pub fn client_at(url: &str) -> kube::Client {
    let mut config = kube::Config::new(url.parse().expect("emulator URL"));
    config.default_namespace = "default".into();
    kube::Client::try_from(config).expect("client")
}

pub fn tls_data(cert: &TestCert) -> [(&'static str, Vec<u8>); 2] {
    [
        ("tls.crt", cert.chain_pem.clone().into_bytes()),
        ("tls.key", cert.key_pem.clone().into_bytes()),
    ]
}

/// Writes `cert` into the Secret `default/tls` on the emulator.
pub fn put(api: &KubeApi, cert: &TestCert) -> u64 {
    put_named(api, "tls", cert)
}

/// Writes `cert` into the Secret `default/NAME` on the emulator.
pub fn put_named(api: &KubeApi, name: &str, cert: &TestCert) -> u64 {
    let data = tls_data(cert);
    let refs: Vec<(&str, &[u8])> = data.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    api.put_secret("default", name, &refs)
}

/// A reloader serving `source`'s Secrets as SNI routes.
pub fn routes_reloader(source: tls_k8s::SecretsSource) -> Reloader {
    Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .routes(source)
        .spawn_routes()
        .expect("spawn")
}

pub struct Served {
    pub reloader: Reloader,
    pub server: TestServer,
}

impl Served {
    /// Serves the Secret `namespace/name` through `client`; waits for the first certificate.
    pub async fn start(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self::serve(SecretSource::builder(client, namespace, name).build()).await
    }

    /// Serves `source`; waits for the first certificate.
    pub async fn serve(source: SecretSource) -> Self {
        let reloader = Reloader::builder()
            .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .spawn(source)
            .expect("spawn");
        reloader
            .ready_timeout(PATIENCE)
            .await
            .expect("first certificate");
        let server = TestServer::start(reloader.resolver()).await;
        Self { reloader, server }
    }

    pub async fn served(&self) -> String {
        tls_test::served(self.server.addr()).await
    }

    pub fn status(&self) -> Status {
        self.reloader.status().borrow().clone()
    }

    pub async fn wait_for(&self, what: &str, pred: impl FnMut(&Status) -> bool) -> Status {
        tls_test::wait_for(self.reloader.status(), what, pred).await
    }

    /// Waits until `cert` is installed, then checks a handshake is served it.
    pub async fn expect_served(&self, cert: &TestCert) {
        tls_test::expect_served(self.server.addr(), self.reloader.status(), installed, cert).await;
    }

    /// Waits until the last error mentions `needle`; checks `still` keeps serving.
    pub async fn expect_reported(&self, needle: &str, still: &TestCert) -> Status {
        let status = self
            .wait_for(needle, |s| {
                s.last_error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains(needle))
            })
            .await;
        assert_eq!(
            self.served().await,
            still.fingerprint,
            "the last good certificate keeps serving"
        );
        status
    }

    /// Waits until the last error is cleared (the source recovered).
    pub async fn expect_recovered(&self) {
        self.wait_for("recovery", |s| s.last_error.is_none()).await;
    }
}

/// The fingerprint a status says is installed.
pub fn installed(status: &Status) -> Option<&str> {
    status
        .current
        .as_ref()
        .map(|c| c.fingerprint_sha256.as_str())
}
