//! The contract of a keyed source: many certificates, each under a key, added, replaced and
//! removed (e.g. every TLS Secret matching a label selector, for SNI).

use std::pin::Pin;

use futures::Stream;

use crate::{CertBundle, Error};

/// What happened to one key of a [`KeyedCertSource`].
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyedUpdate {
    /// New material for the key (added, or replacing what it had).
    Put(CertBundle),
    /// The key is gone (a deleted Secret, a removed label): its certificate is no longer served.
    Remove,
    /// The key's input is bad (malformed data, missing keys): a report; whatever the key served
    /// last keeps serving.
    Invalid(Error),
    /// The source's initial state follows, and [`Listed`](Self::Listed) will say when it is
    /// complete: every key the source holds at start put (or reported invalid). Sent first by
    /// a source that can tell (tls-k8s's `SecretsSource`, from its watch's initial list); the
    /// reload core is then ready, and serves the source's routes, only once it is `Listed`, so
    /// that no listed name is served the wrong certificate (or, under strict SNI, refused)
    /// while the list loads. A source that never sends it counts as complete at its first
    /// item. Its key is empty ([`Keyed::listing`]).
    Listing,
    /// The initial state announced by [`Listing`](Self::Listing) is complete. Its key is empty
    /// ([`Keyed::listed`]). Later `Listing`/`Listed` pairs (a relist) change nothing: routes
    /// keep serving through them.
    Listed,
}

/// One update from a [`KeyedCertSource`]: a key and what happened to it.
#[derive(Debug)]
pub struct Keyed {
    /// The key, e.g. `namespace/name` of a Secret. Stable for as long as the thing it names lives.
    pub key: String,
    /// What happened.
    pub update: KeyedUpdate,
}

impl Keyed {
    /// A source's announcement that its initial state follows ([`KeyedUpdate::Listing`]).
    pub fn listing() -> Self {
        Self {
            key: String::new(),
            update: KeyedUpdate::Listing,
        }
    }

    /// A source's announcement that its initial state is complete ([`KeyedUpdate::Listed`]).
    pub fn listed() -> Self {
        Self {
            key: String::new(),
            update: KeyedUpdate::Listed,
        }
    }
}

/// A source of many certificates, each under a key: a `Stream` of [`Keyed`] updates, or of
/// reports that concern no single key (`Err`: a failed watch), after which the source carries on.
///
/// The same rules as [`CertSource`](crate::CertSource): an `Err` is never the end; the end of the
/// stream means the source has nothing more to say (what it put keeps serving); dropping it stops it.
pub trait KeyedCertSource: Stream<Item = Result<Keyed, Error>> + Send {}

impl<S> KeyedCertSource for S where S: Stream<Item = Result<Keyed, Error>> + Send {}

/// A type-erased [`KeyedCertSource`].
pub type BoxKeyedCertSource = Pin<Box<dyn KeyedCertSource + 'static>>;
