//! Certificate sources for zero-downtime TLS rotation.
//!
//! This crate is the contract between the places a certificate comes from and the reload core
//! (`tls-reload`) that serves it:
//!
//! - [`CertBundle`]: a certificate chain (leaf first), its private key, an optional CA bundle,
//!   where it came from ([`Origin`]) and a digest of the material. Its `Debug` never shows key bytes.
//! - [`CertSource`]: any `Stream` of `Result<CertBundle, Error>` that is `Send`. An `Err` item is a
//!   report, never the end: the source carries on and the core keeps the last good certificate.
//!   The end of the stream means the source has nothing more to say. A source is stopped by
//!   dropping it.
//! - [`CertSourceExt`]: combinators: [`dedup`](CertSourceExt::dedup),
//!   [`debounce`](CertSourceExt::debounce), [`fallback`](CertSourceExt::fallback),
//!   [`boxed_source`](CertSourceExt::boxed_source).
//! - [`Decoder`]: PEM (or DER) decoding with a size limit and errors that name the input.
//! - [`FileSource`]: files, followed through Kubernetes-style `..data` symlink swaps, with a
//!   notify fast path, a poll backstop and a manual [`Trigger`]; [`FileReader`] is its reading
//!   half, for callers that schedule reads themselves.
//! - [`inline`]: items handed to the consumer on the thread that produced them instead of down
//!   the stream ([`Inline`](inline::Inline), the file source's; the reload core installs a
//!   rotation there). [`BoxCertSource`] keeps an inline source's handoff; [`IntoCertSource`]
//!   is what the builders take.
//! - [`KeyedCertSource`]: many certificates under keys, put and removed (SNI routes).
//! - [`clock`]: the one [`Clock`](clock::Clock) and validity rule of the workspace; a
//!   `SteppedClock` for tests behind the `test-util` feature. [`Backoff`]: retry waits as a value.
//! - `x509` (feature `x509`): what a certificate says about itself (names, validity, public key).
//!
//! # Example
//! ```no_run
//! use futures::StreamExt;
//! use tls_source::{CertSourceExt, FileSource};
//!
//! # async fn run() {
//! // The kubernetes.io/tls layout of a mounted Secret: tls.crt, tls.key, ca.crt.
//! let mut source = FileSource::kubernetes_dir("/etc/tls").build().dedup();
//! while let Some(item) = source.next().await {
//!     match item {
//!         Ok(bundle) => println!("{} certificates from {}", bundle.chain().len(), bundle.origin()),
//!         Err(err) => eprintln!("keeping the last good certificate: {err}"),
//!     }
//! }
//! # }
//! ```

mod backoff;
mod bundle;
pub mod clock;
mod debounce;
mod dedup;
mod error;
mod fallback;
mod file;
pub mod inline;
mod keyed;
pub mod layout;
mod pem;
mod trigger;
#[cfg(feature = "x509")]
pub mod x509;

use std::time::Duration;

use futures::Stream;

pub use backoff::Backoff;
pub use bundle::{CertBundle, Digest, Origin};
pub use debounce::Debounce;
pub use dedup::Dedup;
pub use error::{Error, panic_message};
pub use fallback::Fallback;
pub use file::{
    CaFileSource, CaFileSourceBuilder, DEFAULT_IN_PLACE_QUIET, DEFAULT_POLL_INTERVAL, FileReader,
    FileSource, FileSourceBuilder,
};
pub use inline::{BoxCertSource, IntoCertSource};
pub use keyed::{BoxKeyedCertSource, Keyed, KeyedCertSource, KeyedState, KeyedUpdate};
pub use pem::{DEFAULT_MAX_SIZE, Decoder};
pub use trigger::Trigger;

/// Re-exported so that users name the same DER types as this crate.
pub use rustls_pki_types;

/// A source of certificates: a `Stream` of bundles or reports.
///
/// Implemented for every `Stream<Item = Result<CertBundle, Error>> + Send`; write a source as a
/// stream and it is one.
///
/// The contract:
/// - `Ok(bundle)`: new material. Sources should avoid repeating unchanged material
///   ([`CertSourceExt::dedup`] does it for any source).
/// - `Err(error)`: a report (a missing file, a deleted Secret). The source keeps going; the
///   consumer keeps what it has.
/// - The end of the stream: the source has nothing more to say.
/// - Dropping the stream stops the source; it holds no thread or task that outlives it.
pub trait CertSource: Stream<Item = Result<CertBundle, Error>> + Send {}

impl<S> CertSource for S where S: Stream<Item = Result<CertBundle, Error>> + Send {}

/// Combinators for [`CertSource`]s.
pub trait CertSourceExt: CertSource {
    /// Skips bundles whose material is unchanged since the last one; see [`Dedup`].
    fn dedup(self) -> Dedup<Self>
    where
        Self: Sized,
    {
        Dedup::new(self)
    }

    /// Yields the latest item once the source has been quiet for `quiet`; see [`Debounce`].
    fn debounce(self, quiet: Duration) -> Debounce<Self>
    where
        Self: Sized,
    {
        Debounce::new(self, quiet)
    }

    /// Serves from `self`, and from `secondary` until `self` has produced a good bundle; see
    /// [`Fallback`].
    ///
    /// ```no_run
    /// # fn self_signed() -> futures::stream::Empty<Result<tls_source::CertBundle, tls_source::Error>> { futures::stream::empty() }
    /// use tls_source::{CertSourceExt, FileSource};
    ///
    /// let source = FileSource::kubernetes_dir("/etc/tls").build().fallback(self_signed());
    /// ```
    fn fallback<S>(self, secondary: S) -> Fallback<Self, S>
    where
        Self: Sized,
        S: CertSource,
    {
        Fallback::new(self, secondary)
    }

    /// Boxes the source, erasing its type. (Not `boxed`, which would clash with
    /// `futures::StreamExt::boxed` wherever both traits are imported.)
    fn boxed_source(self) -> BoxCertSource
    where
        Self: Sized + 'static,
    {
        BoxCertSource::new(self)
    }
}

impl<S: CertSource + ?Sized> CertSourceExt for S {}

#[cfg(test)]
mod test_support {
    use crate::{CertBundle, Decoder, Error, Origin};

    /// A bundle with a fresh self-signed certificate for `name`.
    pub(crate) fn bundle(name: &str) -> CertBundle {
        let cert = tls_test::TestCa::new("combinator tests").leaf(&[name]);
        Decoder::new()
            .bundle(
                ("crt", cert.cert_pem.as_bytes()),
                ("key", cert.key_pem.as_bytes()),
                None,
                Origin::Other(name.to_owned()),
            )
            .unwrap()
    }

    pub(crate) fn err(what: &str) -> Error {
        Error::source("test", what.to_owned())
    }
}
