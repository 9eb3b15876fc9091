//! Against a real CA: Let's Encrypt's staging environment, over the internet. Ignored by
//! default: it needs the network and a DNS name of yours whose address is this machine, with
//! TCP port 443 reachable from the internet (the CA validates with TLS-ALPN-01 on 443).
//!
//! ```text
//! TLS_ACME_STAGING_NAME=host.example.org cargo test -p tls-acme --test letsencrypt -- --ignored
//! ```
//!
//! Optional: `TLS_ACME_STAGING_LISTEN` (default `0.0.0.0:443`; another address when 443 is
//! forwarded to it), `TLS_ACME_STAGING_EMAIL` (the account's contact).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::*;
use tls_acme::Acme;
use tokio::net::TcpListener;

const STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

/// A real CA takes longer than Pebble: validation from several vantage points, a queue.
const PATIENCE: Duration = Duration::from_secs(300);

fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

async fn start(name: &str, listen: SocketAddr, state: &std::path::Path) -> Server {
    let mut builder = Acme::builder(STAGING)
        .crypto_provider(provider())
        .state_dir(state)
        .name(name);
    if let Some(email) = setting("TLS_ACME_STAGING_EMAIL") {
        builder = builder.contact(email);
    }
    let listener = TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| panic!("listen on {listen} (TLS_ACME_STAGING_LISTEN): {e}"));
    Server::start(builder, listener)
}

/// Where a client on this machine reaches a server listening on `listen`.
fn local(listen: SocketAddr) -> SocketAddr {
    if listen.ip().is_unspecified() {
        SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()))
    } else {
        listen
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs network"]
async fn lets_encrypt_staging_issues_a_name_it_validated_here_and_a_restart_serves_it_again() {
    let name = setting("TLS_ACME_STAGING_NAME").expect(
        "TLS_ACME_STAGING_NAME: a DNS name whose address is this machine, TCP 443 reachable \
         from the internet",
    );
    let listen: SocketAddr = setting("TLS_ACME_STAGING_LISTEN")
        .unwrap_or_else(|| "0.0.0.0:443".into())
        .parse()
        .expect("TLS_ACME_STAGING_LISTEN: an address and port");
    let state = tempfile::tempdir().unwrap();

    let server = start(&name, listen, state.path()).await;
    let mut rx = server.acme.status();
    let issued = tokio::time::timeout(PATIENCE, async {
        rx.wait_for(all_valid).await.map(|s| s.clone())
    })
    .await;
    let Ok(Ok(status)) = issued else {
        panic!("not issued in {PATIENCE:?}: {:#?}", *rx.borrow());
    };
    assert!(status.account.is_some(), "{status:#?}");
    // The staging roots are not in any trust store: the chain is checked for shape, and the
    // key against the leaf (the probe does), not against a root.
    let served = tls_test::probe(local(listen), &name)
        .await
        .expect("the issued certificate is served");
    assert!(served.chain.len() >= 2, "leaf and intermediate");

    // Restarted on the same state: the same certificate, served at once, nothing ordered.
    drop(server);
    let server = start(&name, listen, state.path()).await;
    server
        .reloader
        .ready_timeout(Duration::from_secs(10))
        .await
        .expect("ready from the stored state");
    let again = tls_test::probe(local(listen), &name)
        .await
        .expect("served after the restart");
    assert_eq!(
        again.fingerprint, served.fingerprint,
        "the stored certificate"
    );
    let status = server
        .until("the stored certificate scheduled for renewal", |s| {
            all_valid(s) && s.names.values().all(|n| n.renew_after.is_some())
        })
        .await;
    assert!(
        status.names[name.as_str()].last_error.is_none(),
        "{status:#?}"
    );
}
