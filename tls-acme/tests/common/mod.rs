//! What the tests against Pebble share: a server of ours serving an [`Acme`]'s certificates,
//! waiting on its status, checking what it serves.

#![allow(dead_code, unreachable_pub)] // each test binary uses a part

use std::net::SocketAddr;

use rustls::pki_types::CertificateDer;
use tls_acme::{Acme, AcmeBuilder, AcmeStatus, NameState};
use tls_reload::Reloader;
use tls_test::{PATIENCE, probe_trusting};
use tokio::net::TcpListener;

/// The tests' provider (aws-lc-rs).
pub use tls_test::provider;

/// A server of ours: the ACME certificates as SNI routes (strict), TLS-ALPN-01 answered in its
/// accept stream.
pub struct Server {
    pub acme: Acme,
    pub reloader: Reloader,
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
        self.reloader.stop();
    }
}

impl Server {
    pub fn start(builder: AcmeBuilder, listener: TcpListener) -> Self {
        let acme = builder.build().expect("a valid configuration");
        let reloader = Reloader::builder()
            .crypto_provider(provider())
            .routes(acme.source().expect("the source"))
            .handshake_hook(acme.challenges())
            .sni_strict(true)
            .spawn_routes()
            .expect("a reloader");
        let addr = listener.local_addr().unwrap();
        let incoming = reloader.incoming(listener).unwrap();
        let task = tls_test::answer_each(incoming);
        Self {
            acme,
            reloader,
            addr,
            task,
        }
    }

    pub async fn until(&self, what: &str, pred: impl FnMut(&AcmeStatus) -> bool) -> AcmeStatus {
        until(self.acme.status(), what, pred).await
    }
}

/// A client of `directory` (Pebble, or a layer in front of it), its state in `state`.
pub fn client_at(
    directory: &str,
    pebble: &tls_test::Pebble,
    state: &std::path::Path,
) -> AcmeBuilder {
    Acme::builder(directory)
        .contact("ops@example.com")
        .directory_roots(vec![pebble.https_ca_der()])
        .crypto_provider(provider())
        .state_dir(state)
        .stagger(std::time::Duration::from_millis(10))
}

/// A listener on loopback for a server of ours, and Pebble as `configure` sets it up (validity,
/// nonce rejection) validating TLS-ALPN-01 at the listener's port.
pub async fn pebble_at_listener(
    configure: impl FnOnce(tls_test::PebbleBuilder) -> tls_test::PebbleBuilder,
) -> (TcpListener, tls_test::Pebble) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let pebble = configure(tls_test::Pebble::builder().tls_port(port))
        .start_required()
        .await;
    (listener, pebble)
}

/// Waits (longer than [`PATIENCE`]: a CA validates and issues) until the status satisfies
/// `pred`.
pub async fn until(
    mut rx: tokio::sync::watch::Receiver<AcmeStatus>,
    what: &str,
    mut pred: impl FnMut(&AcmeStatus) -> bool,
) -> AcmeStatus {
    let found = tokio::time::timeout(PATIENCE * 3, async {
        rx.wait_for(|s| pred(s)).await.map(|s| s.clone())
    })
    .await;
    match found {
        Ok(Ok(status)) => status,
        _ => panic!(
            "timed out waiting for {what}; last status: {:#?}",
            *rx.borrow()
        ),
    }
}

pub fn all_valid(status: &AcmeStatus) -> bool {
    status.names.values().all(|n| n.state == NameState::Valid)
}

/// Every name is served a chain that verifies against Pebble's root, for that name.
pub async fn assert_served(addr: SocketAddr, names: &[&str], root: &CertificateDer<'static>) {
    for name in names {
        let served = probe_trusting(addr, name, std::slice::from_ref(root))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(served.chain.len() >= 2, "{name}: leaf and intermediate");
    }
}

/// Every name is served a chain that verifies against Pebble's root, within
/// [`PATIENCE`]: for a fleet's replica whose status is the leader's (read from one Secret)
/// while its certificates arrive through another watch.
pub async fn until_served(addr: SocketAddr, names: &[&str], root: &CertificateDer<'static>) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for name in names {
        loop {
            match probe_trusting(addr, name, std::slice::from_ref(root)).await {
                Ok(served) => {
                    assert!(served.chain.len() >= 2, "{name}: leaf and intermediate");
                    break;
                }
                Err(e) if tokio::time::Instant::now() > deadline => panic!("{name}: {e}"),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }
}

/// Binds `addr` once it is free again (a server just dropped, a connection that used it).
pub async fn rebind(addr: SocketAddr) -> TcpListener {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => return listener,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("the port is free again")
}
