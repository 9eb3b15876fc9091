//! Self-signed and CA-signed TLS certificates as a [`CertSource`](tls_source::CertSource),
//! renewed before they expire and, if you like, reused across restarts.
//!
//! The embedded default of a server that has no certificate yet, and the certificate of many
//! internal services (admission webhooks, sidecars, pod-to-pod traffic).
//!
//! - ECDSA P-256 by default (generated in well under a millisecond), P-384, Ed25519; RSA with the
//!   `aws-lc-rs` feature.
//! - Renewal when a third of the validity remains (or a fraction or duration you choose), checked
//!   against the wall clock so suspend/resume and clock steps do not make it late.
//! - CA mode: a long-lived CA signs short-lived leaves; the CA is in the bundle's
//!   [`ca`](tls_source::CertBundle::ca) so clients can pin it across rotations.
//! - [`SelfSigned::check`]: "does the existing certificate still fit?", so nothing is generated
//!   that need not be.
//! - Persistence: the pair (and CA) kept in a directory, key files 0600, reused on restart while
//!   it fits, so clients that pinned it keep working.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tls_selfsigned::Error> {
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tls_selfsigned::SelfSigned;
//!
//! let generator = SelfSigned::builder()
//!     .dns_name("localhost")
//!     .ip_address("127.0.0.1".parse().unwrap())
//!     .validity(Duration::from_secs(24 * 3600))
//!     .ca() // leaves signed by a generated CA
//!     .build()?;
//! let bundle = generator.generate()?;
//! assert_eq!(bundle.ca().len(), 1);
//!
//! // As a source: one bundle now, a fresh one when a third of the lifetime remains.
//! let mut source = generator.into_source();
//! let first = source.next().await.unwrap().unwrap();
//! # Ok(()) }
//! ```

mod builder;
mod ca;
mod check;
mod config;
mod dn;
mod error;
mod fit;
pub mod fleet;
mod generator;
mod key;
mod keygen;
mod persist;
mod rotation;
mod source;

pub use builder::Builder;
pub use ca::CaPem;
pub use config::{DEFAULT_CA_VALIDITY, DEFAULT_VALIDITY, MIN_RENEWAL_WINDOW, MIN_VALIDITY};
pub use error::Error;
pub use fit::{Part, Unfit};
pub use generator::{PemPair, SelfSigned};
pub use key::{KeyAlgorithm, Renewal};
pub use rotation::CaRotation;
pub use source::{MAX_NAP, MIN_RENEWAL_GAP, SelfSignedSource};
/// The workspace's clock (from `tls-source`): renewal asks it for "now".
pub use tls_source::clock::{Clock, SystemClock};
