//! Zero-downtime TLS certificate rotation for rustls servers.
//!
//! A [`Reloader`] drives a certificate source (files, a Kubernetes Secret, a self-signed
//! generator: anything implementing [`tls_source::CertSource`]), validates each new bundle (the
//! key matches the leaf, the leaf is within its validity), and swaps it atomically into a
//! [`CertResolver`] that rustls asks on every handshake. A bad update is reported in the
//! [`Status`] and logged while the last good certificate keeps serving; the next good one is
//! picked up by itself.
//!
//! - Wait-free, allocation-free reads: `resolve` is one atomic load (arc-swap).
//! - [`Reloader::ready`]: accept connections only once a certificate is installed.
//! - [`Reloader::status`]: a `watch` channel of [`Status`] (fingerprint, names, validity, origin,
//!   generation, last error).
//! - Stops with a `tokio_util` `CancellationToken`, the same one your accept loop watches.
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

mod driver;
mod error;
mod policy;
mod reloader;
mod status;
mod tls;
mod validate;

pub use error::{Error, NotReady};
pub use policy::{
    DEFAULT_EXPIRY_WARNING, DEFAULT_MAX_CHAIN_BYTES, DEFAULT_MAX_CHAIN_LEN, Policy, Purpose, Roots,
};
pub use reloader::{Builder, ReloadTask, Reloader};
pub use status::{CertInfo, Ended, RouteStatus, Status};
pub use tls::CertResolver;
pub use validate::{Validated, Validator};

/// Re-exported so that one dependency line is enough for the common case.
pub use tls_source;

/// The root README's Rust examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
