//! Zero-downtime TLS certificate rotation for rustls servers: the one dependency to write.
//!
//! Everything of the reload core ([`tls_reload`]) is here at the root: [`Reloader`],
//! [`ClientTls`], [`ClientAuth`], [`Policy`], [`Status`], the accept stream. The sources come
//! by feature:
//!
//! | feature | what it brings |
//! |---|---|
//! | (always) | [`FileSource`]: files and the kubelet's `..data` layout; [`tls_source`]: the `CertSource` contract, its combinators, PEM decoding, clocks |
//! | `accept` (default) | [`Reloader::incoming`]: a hardened stream of TLS connections |
//! | `axum`, `tonic` | the accept stream as an `axum::serve::Listener`; connections as tonic's `Connected` |
//! | `k8s` | `tls_rotation::k8s`: a Kubernetes Secret, or many by label selector (tls-k8s) |
//! | `self-signed` | `tls_rotation::selfsigned`: self-signed and CA-signed certificates, renewed before expiry; with `k8s`, one for every replica (`k8s::SharedSelfSigned`, its CA sealed at rest with `k8s::seal`) |
//! | `metrics` | metrics on the `metrics` facade, for every crate turned on |
//! | `ring`, `aws-lc-rs` | the rustls crypto provider used when the process installed none |
//!
//! No crypto provider is forced on you: with neither `ring` nor `aws-lc-rs`, install one
//! yourself (`rustls::crypto::ring::default_provider().install_default()`) or pass it to
//! [`Builder::crypto_provider`].
//!
//! ```no_run
//! use tls_rotation::{FileSource, Reloader};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let reloader = Reloader::builder()
//!     .spawn(FileSource::kubernetes_dir("/etc/tls").build())?; // tls.crt, tls.key, ca.crt
//! reloader.ready().await?;
//! let config = reloader.server_config()?; // for tokio-rustls, hyper, …
//! # let _ = config; Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tls_reload::*;

/// Kubernetes: the Secret sources, the Lease, the shared store (the `tls-k8s` crate).
#[cfg(feature = "k8s")]
pub use tls_k8s as k8s;

/// Self-signed and CA-signed certificates as a source (the `tls-selfsigned` crate).
#[cfg(feature = "self-signed")]
pub use tls_selfsigned as selfsigned;

/// Certificates from an ACME CA for many names (the `tls-acme` crate).
#[cfg(feature = "acme")]
pub use tls_acme as acme;
