//! Zero-downtime TLS certificate rotation for rustls servers.
//!
//! A [`Reloader`] drives certificate sources (files, a Kubernetes Secret, a self-signed
//! generator: anything implementing [`tls_source::CertSource`]), validates each new bundle with a
//! [`Validator`], and swaps it atomically into a [`CertResolver`] that rustls asks on every
//! handshake. A bad update is reported in the [`Status`] and logged while the last good
//! certificate keeps serving; the next good one is picked up by itself.
//!
//! - [`Validator`] + [`Policy`], usable on their own: the key matches the leaf, validity,
//!   required names, purpose (EKU), chain order and size (clients refuse oversized chains), and
//!   optionally verification against [`Roots`].
//! - One certificate, or many by SNI: [`Builder::route`] (exact names and one-label wildcards)
//!   and [`Builder::routes`] (a [`tls_source::KeyedCertSource`], e.g. Secrets by label selector),
//!   a default for unknown names or [`Builder::sni_strict`]. One task serves every route.
//! - Wait-free, allocation-free reads: with one certificate, `resolve` is one atomic load and a
//!   reference-count increment (a per-thread cache in front of arc-swap); with SNI routes, a hash
//!   lookup of the name and an arc-swap load.
//! - [`Reloader::ready`]: accept connections only once every route has a certificate.
//! - [`Reloader::status`]: a `watch` channel of [`Status`] (fingerprint, names, validity, origin,
//!   generation, last error, expiring/expired; the same per SNI route).
//! - An owned task: it stops with a `tokio_util` `CancellationToken` (the same one your accept
//!   loop watches) or when every handle and resolver is gone, and [`Reloader::stopped`] says how
//!   it [`Ended`], a panic included. [`Builder::build`] hands it to you to run.
//! - Never forces a crypto provider: the process default, or the one you give.
//!
//! # Example: an axum server on rotating files
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tls_reload::Reloader;
//! use tls_source::FileSource;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! rustls::crypto::ring::default_provider().install_default().ok();
//! let shutdown = CancellationToken::new();
//! let reloader = Reloader::builder()
//!     .cancellation_token(shutdown.clone())
//!     .spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
//! reloader.ready_timeout(Duration::from_secs(10)).await?;
//!
//! let mut config = reloader.server_config()?;
//! config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
//! let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
//! let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
//! loop {
//!     let (tcp, _) = tokio::select! {
//!         () = shutdown.cancelled() => break,
//!         accepted = listener.accept() => accepted?,
//!     };
//!     let (acceptor, app) = (acceptor.clone(), app.clone());
//!     tokio::spawn(async move {
//!         let Ok(tls) = acceptor.accept(tcp).await else { return };
//!         let service = hyper_util::service::TowerToHyperService::new(app);
//!         let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
//!             .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
//!             .await;
//!     });
//! }
//! # Ok(()) }
//! ```

#[cfg(feature = "accept")]
mod accept;
mod driver;
mod error;
mod policy;
mod reloader;
mod status;
mod tls;
mod validate;

#[cfg(feature = "accept")]
pub use accept::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES, Incoming, IncomingBuilder, TlsConnection,
};
pub use error::{Error, NotReady};
pub use policy::{
    DEFAULT_EXPIRY_WARNING, DEFAULT_MAX_CHAIN_BYTES, DEFAULT_MAX_CHAIN_LEN, Policy, Purpose, Roots,
};
pub use reloader::{Builder, ReloadTask, Reloader};
/// What the common cases need, so that `tls-reload` is the one dependency line.
pub use rustls;
pub use status::{CertInfo, Ended, RouteStatus, Status};
pub use tls::CertResolver;
#[cfg(feature = "k8s")]
pub use tls_k8s as k8s;
#[cfg(feature = "self-signed")]
pub use tls_selfsigned as selfsigned;
pub use tls_source as source;
pub use tls_source::{CertSource, CertSourceExt, FileSource};
pub use tokio_util::sync::CancellationToken;
pub use validate::{Validated, Validator};

/// Re-exported so that one dependency line is enough for the common case.
pub use tls_source;

/// The root README's Rust examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
