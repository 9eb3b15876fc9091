//! Test support shared by every crate of the tls-rotation workspace (not published).
//!
//! - [`TestCa`] / [`TestCert`]: real certificates from a generated CA, valid, expired or not yet
//!   valid; [`fixture_pair`] for key formats rcgen does not write (SEC1, PKCS#1).
//! - [`KubeDir`]: writes files the way the kubelet updates a Secret volume (a new timestamped
//!   directory, a `..data` symlink renamed over the old one), plus the other ways files change.
//! - [`probe`]: a real TLS handshake that reports the certificate served.
//! - [`TestServer`]: a rustls accept loop on loopback around any certificate resolver.
//! - [`KubeApi`]: a Kubernetes API emulator (Secrets, Leases; list, watch, writes with
//!   preconditions) with fault injection, for `kube::Client` to talk to; an [`Endpoint`] per
//!   client partitions or pauses one replica while the others carry on.
//! - [`Pebble`]: Let's Encrypt's ACME test server and its DNS server, per test, on free ports.
//! - [`EtcdCluster`]: a real etcd cluster of three members on loopback, shared by a test binary
//!   or started by one test, whose members a test can kill and start again.

mod bind;
mod certs;
mod etcd;
mod kube_api;
mod kube_dir;
mod logs;
mod pebble;
mod probe;
mod serve_process;
mod server;
mod tcp_link;

pub use bind::{Bind, BindBuilder, UNGRANTED_KEY, UPDATE_KEY};
pub use certs::{
    KeyFormat, TestCa, TestCert, assert_no_key_material, fingerprint, fixture_encrypted_key,
    fixture_pair, new_year,
};
pub use etcd::{EtcdCluster, EtcdClusterBuilder};
pub use kube_api::{Endpoint, KubeApi, Link, kubeconfig};
pub use kube_dir::{KubeDir, Staged, overwrite_in_place, replace_by_rename};
pub use logs::Logs;
pub use pebble::{AcmeLayer, Pebble, PebbleBuilder, free_port};
pub use probe::{
    Served, client_config, client_config_with_cert, connect, https_get, https_get_as, plain_get,
    probe, probe_trusting,
};
pub use serve_process::{Announced, Serve, announced};
pub use server::{TestServer, answer_each};
pub use tcp_link::TcpLink;

/// The crypto provider of the workspace's tests, clients and test servers: aws-lc-rs, the
/// default of `serve` and the examples (a test of ring says so where it builds its own).
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The example binary `name`, built beside the running test binary
/// (`target/<profile>/examples/NAME`): what the examples' tests run.
///
/// # Panics
/// When it is not there (the examples were not built: `cargo test --workspace` builds them).
pub fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace` (or `cargo build --examples`) first",
        path.display()
    );
    path
}

/// How long tests wait for something that should happen in milliseconds.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits until the value on `rx` satisfies `pred` and returns it, or panics after [`PATIENCE`]
/// showing `what` and the last value (a reloader's status, say).
///
/// # Panics
/// On time-out, or if the sender is gone before the value satisfies `pred`.
pub async fn wait_for<T: std::fmt::Debug + Clone>(
    mut rx: tokio::sync::watch::Receiver<T>,
    what: &str,
    mut pred: impl FnMut(&T) -> bool,
) -> T {
    let found = tokio::time::timeout(PATIENCE, async {
        rx.wait_for(|value| pred(value))
            .await
            .map(|value| value.clone())
    })
    .await;
    match found {
        Ok(Ok(value)) => value,
        _ => panic!(
            "timed out waiting for {what}; last value: {:#?}",
            *rx.borrow()
        ),
    }
}

/// The fingerprint of the certificate a fresh handshake with `addr` (as `localhost`) is served.
///
/// # Panics
/// If the handshake fails.
pub async fn served(addr: std::net::SocketAddr) -> String {
    served_as(addr, "localhost").await.expect("handshake")
}

/// The fingerprint of the certificate a fresh handshake with `addr` for `server_name` (SNI; an
/// IP address sends none) is served.
///
/// # Errors
/// Connection and handshake failures: what a client of a server that refuses the name sees.
pub async fn served_as(addr: std::net::SocketAddr, server_name: &str) -> std::io::Result<String> {
    probe(addr, server_name)
        .await
        .map(|served| served.fingerprint)
}

/// Waits until `installed` reads `cert`'s fingerprint from `rx` (what a reloader says it
/// installed), then checks that a fresh handshake with `addr` is served `cert`.
///
/// # Panics
/// On time-out (see [`wait_for`]) or if the handshake is served anything else.
pub async fn expect_served<T: std::fmt::Debug + Clone>(
    addr: std::net::SocketAddr,
    rx: tokio::sync::watch::Receiver<T>,
    installed: impl Fn(&T) -> Option<&str>,
    cert: &TestCert,
) {
    wait_for(rx, "the new certificate installed", |value| {
        installed(value) == Some(cert.fingerprint.as_str())
    })
    .await;
    assert_eq!(
        served(addr).await,
        cert.fingerprint,
        "a handshake is served the new certificate"
    );
}
