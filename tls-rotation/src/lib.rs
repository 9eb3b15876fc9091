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
//! | `axum` | the accept stream as an `axum::serve::Listener` |
//! | `tonic` | accepted connections as tonic's `Connected` (`serve_with_incoming`) |
//! | `hyper` | `http::serve_http`: any tower service or axum `Router` on the accept stream through hyper-util, with graceful closes and each request's `TlsInfo`; `ClientTls::connector` for hyper-util's pool |
//! | `k8s` | `tls_rotation::k8s`: a Kubernetes Secret, or many by label selector (tls-k8s), and the `kube` client they take; with `acme`, the ACME fleet's Kubernetes store (`acme::AcmeBuilder::kubernetes`) |
//! | `self-signed` | `tls_rotation::selfsigned`: self-signed and CA-signed certificates, renewed before expiry; with `k8s`, one for every replica (`k8s::SharedSelfSigned`, its CA sealed at rest with `k8s::seal`) |
//! | `acme` | `tls_rotation::acme`: certificates from an ACME CA for many names, one SNI route each, challenges answered in the accept stream or over HTTP (tls-acme) |
//! | `acme-rfc2136` | `tls_rotation::acme::rfc2136`: DNS-01 on any standard DNS server (BIND, Knot, `PowerDNS`, Windows DNS) by RFC 2136 updates signed with TSIG, for wildcards; turns `acme` on |
//! | `etcd` | `tls_rotation::etcd`: the certificate at an etcd key, or every one under a prefix as SNI routes (tls-etcd), over TLS on a rustls config of yours; building it needs `protoc` |
//! | `metrics` | metrics on the `metrics` facade, for every crate turned on |
//! | `serde` | `Serialize` for [`Status`] and its parts, and with `k8s` for the fleet's `k8s::Leadership` and `k8s::StateAccess` (`acme::AcmeStatus` always serializes) |
//! | `aws-lc-rs` | the rustls crypto provider used when given none: aws-lc-rs, with the post-quantum key exchange current clients offer first (recommended) |
//! | `ring` | the same with *ring*, for builds where AWS-LC cannot be compiled (no post-quantum key exchange); with both, aws-lc-rs |
//!
//! No crypto provider is forced on you or installed: with neither `aws-lc-rs` nor `ring`, install
//! one yourself (`rustls::crypto::aws_lc_rs::default_provider().install_default()`) or pass it
//! to [`Builder::crypto_provider`]. Kubernetes' client (`k8s`) takes the process default, or the
//! one provider rustls's features name.
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
//!
//! The status as JSON (feature `serde`), e.g. for a status page or a readiness probe:
//!
//! ```
//! use tls_rotation::{FileSource, Reloader};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let reloader = Reloader::spawn(FileSource::kubernetes_dir("/nonexistent/tls").build())?;
//! let json = serde_json::to_value(&*reloader.status().borrow())?;
//! assert_eq!(json["generation"], 0); // nothing installed (yet)
//! assert_eq!(json["ready"], false);
//! println!("{json}");
//! # Ok(()) }
//! ```
//!
//! An ACME fleet in Kubernetes (features `acme` and `k8s`): the replica holding the Lease orders
//! and renews, every replica serves.
//!
//! ```no_run
//! use tls_rotation::{Reloader, acme::Acme, k8s::kube};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let acme = Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
//!     .contact("admin@example.com")
//!     .name("example.com")
//!     .kubernetes(client, "web", "web", std::env::var("POD_NAME")?)
//!     .build()?;
//! let reloader = Reloader::builder()
//!     .routes(acme.source().expect("taken once"))
//!     .handshake_hook(acme.challenges())
//!     .spawn_routes()?;
//! # drop(reloader); Ok(()) }
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

/// Certificates kept in etcd: one key, or every key under a prefix (the `tls-etcd` crate).
#[cfg(feature = "etcd")]
pub use tls_etcd as etcd;
