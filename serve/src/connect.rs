//! `--connect HOST:PORT --client-listen ADDR`: outbound mTLS for an app that cannot do TLS.
//! Each plain connection the app makes to the listener is carried to the server over TLS,
//! presenting the certificate the source flags choose (it rotates through `ClientTls`: each
//! new connection presents the current one), the server verified against `--connect-ca`
//! (followed like the certificate files) or the system's roots, as `--connect-sni`.

use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use tls_rotation::rustls::pki_types::{CertificateDer, ServerName};
use tls_rotation::tls_source::{BoxCertSource, CaFileSource, CertBundle, CertSourceExt as _};
use tls_rotation::{ClientTls, rustls};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::{Args, ConnectArgs};

/// The client identity: `source`'s bundles, trusting `--connect-ca`'s certificates (each
/// change of either makes a new bundle) or the system's roots.
pub(crate) async fn client(
    args: &Args,
    options: &ConnectArgs,
    source: BoxCertSource,
    shutdown: &CancellationToken,
) -> anyhow::Result<ClientTls> {
    let builder = ClientTls::builder()
        .crypto_provider(crate::cli::crypto_provider())
        .cancellation_token(shutdown.clone());
    let client = match &options.ca {
        Some(path) => {
            let cas = CaFileSource::builder(path)
                .poll_interval(args.poll)
                .notify(args.notify)
                .build();
            builder.spawn(with_roots(source, cas).boxed_source())?
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for err in &native.errors {
                tracing::warn!(error = %err, "reading the system's roots");
            }
            anyhow::ensure!(
                !native.certs.is_empty(),
                "--connect without --connect-ca: no system roots found (give --connect-ca PATH)"
            );
            builder
                .bundle_roots(false)
                .roots(native.certs)
                .spawn(source)?
        }
    };
    client
        .ready_timeout(args.ready_timeout)
        .await
        .context("the client certificate")?;
    Ok(client)
}

/// `identity`'s bundles with `cas` as their CA certificates (the roots `ClientTls` trusts),
/// once both have given one; errors of either pass on.
fn with_roots(
    identity: BoxCertSource,
    cas: CaFileSource,
) -> impl futures::Stream<Item = Result<CertBundle, tls_rotation::tls_source::Error>> + Send {
    enum Item {
        Identity(Result<CertBundle, tls_rotation::tls_source::Error>),
        Roots(Result<Vec<CertificateDer<'static>>, tls_rotation::tls_source::Error>),
    }
    let mut bundle: Option<CertBundle> = None;
    let mut roots: Option<Vec<CertificateDer<'static>>> = None;
    futures::stream::select(identity.map(Item::Identity), cas.map(Item::Roots)).filter_map(
        move |item| {
            let out = match item {
                Item::Identity(Ok(new)) => {
                    bundle = Some(new);
                    None
                }
                Item::Roots(Ok(new)) => {
                    roots = Some(new);
                    None
                }
                Item::Identity(Err(err)) | Item::Roots(Err(err)) => Some(Err(err)),
            };
            let out = out.or_else(|| match (&bundle, &roots) {
                (Some(bundle), Some(roots)) => Some(Ok(bundle.clone().with_ca(roots.clone()))),
                _ => None,
            });
            futures::future::ready(out)
        },
    )
}

/// Accepts on `--client-listen` until `shutdown`, carrying each connection; then gives open
/// ones `grace` to finish.
pub(crate) async fn serve(
    options: &ConnectArgs,
    client: ClientTls,
    shutdown: CancellationToken,
    grace: std::time::Duration,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("--client-listen {}: cannot listen", options.listen))?;
    let sni = ServerName::try_from(options.sni.clone()).map_err(|_| {
        anyhow::anyhow!(
            "--connect-sni {}: not a DNS name or IP address",
            options.sni
        )
    })?;
    let addr = listener.local_addr()?;
    println!(
        "listening on tcp://{addr}, carried to {} over TLS",
        options.server
    );
    let server = Arc::new(options.server.clone());
    let tasks = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (app, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "--client-listen: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (client, server, sni) = (client.clone(), Arc::clone(&server), sni.clone());
        tasks.spawn(async move {
            if let Err(err) = carry(app, &client, &server, sni).await {
                tracing::warn!(%peer, server = %server, error = %format!("{err:#}"), "connection closed");
            }
        });
    }
    tasks.close();
    if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
        tracing::warn!(
            ?grace,
            "drain period over; dropping the remaining connections"
        );
    }
    Ok(())
}

/// One app connection, carried over TLS until either side closes.
async fn carry(
    mut app: TcpStream,
    client: &ClientTls,
    server: &str,
    sni: ServerName<'static>,
) -> anyhow::Result<()> {
    let mut config = client.client_config()?;
    // Every connection a full handshake, so that the next connection after a rotation
    // presents the new identity: a session ticket that a connection made just before the
    // rotation receives just after it would otherwise be resumed with the old one (a resumed
    // TLS 1.3 session sends no certificate).
    config.resumption = rustls::client::Resumption::disabled();
    let tcp = TcpStream::connect(server)
        .await
        .with_context(|| format!("cannot connect to {server}"))?;
    tcp.set_nodelay(true)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector
        .connect(sni, tcp)
        .await
        .with_context(|| format!("the TLS handshake with {server}"))?;
    let _ = app.set_nodelay(true);
    match tokio::io::copy_bidirectional(&mut app, &mut tls).await {
        Ok(_) => Ok(()),
        // A TLS alert from the server after the handshake (it refused our certificate) shows
        // here: say so.
        Err(err) => match err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            Some(tls_err) => Err(anyhow::anyhow!("TLS with {server}: {tls_err}")),
            None => Ok(()),
        },
    }
}
