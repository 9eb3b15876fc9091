//! The contract of a keyed source: many certificates, each under a key, added, replaced and
//! removed (e.g. every TLS Secret matching a label selector, for SNI).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;

use futures::Stream;

use crate::{CertBundle, Digest, Error};

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

/// What a keyed source that lists and then watches (a label selector's Secrets, an etcd
/// prefix) has passed on, by key: so that material that did not change is neither read nor
/// passed on again, and a relist removes what it no longer holds.
///
/// ```
/// use tls_source::{Digest, KeyedState, KeyedUpdate};
///
/// let mut state = KeyedState::new();
/// assert!(matches!(state.listing().update, KeyedUpdate::Listing));
/// assert!(state.changed("a", Digest::of(b"a1")), "new: read it and pass it on");
/// assert!(state.changed("b", Digest::of(b"b1")));
/// assert!(matches!(state.listed().as_slice(), [l] if matches!(l.update, KeyedUpdate::Listed)));
/// assert!(!state.changed("a", Digest::of(b"a1")), "the same bytes again: nothing to do");
///
/// // A relist that no longer holds "b": its removal, then the end of the list.
/// state.listing();
/// assert!(!state.changed("a", Digest::of(b"a1")));
/// let listed = state.listed();
/// assert_eq!(listed[0].key, "b");
/// assert!(matches!(listed[0].update, KeyedUpdate::Remove));
/// assert!(state.remove("b").is_none(), "removed once");
/// ```
#[derive(Debug, Default)]
pub struct KeyedState {
    /// Every key passed on, with the digest of the material last passed on for it.
    known: HashMap<String, Digest>,
    /// The keys seen since the (re)list under way began.
    listed: HashSet<String>,
}

impl KeyedState {
    /// Nothing passed on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A (re)list begins: the announcement to pass on.
    pub fn listing(&mut self) -> Keyed {
        self.listed.clear();
        Keyed::listing()
    }

    /// `key` holds material whose digest is `digest` (listed, or seen by the watch): whether it
    /// is new or changed, so that the source reads it and passes it on.
    pub fn changed(&mut self, key: &str, digest: Digest) -> bool {
        self.listed.insert(key.to_owned());
        self.known.insert(key.to_owned(), digest) != Some(digest)
    }

    /// `key` is gone (deleted, or no longer selected): its removal, if it had been passed on.
    pub fn remove(&mut self, key: &str) -> Option<Keyed> {
        self.known.remove(key)?;
        Some(Keyed {
            key: key.to_owned(),
            update: KeyedUpdate::Remove,
        })
    }

    /// The (re)list is complete: the removal of every key it no longer holds (gone while the
    /// watch was down), then the announcement.
    pub fn listed(&mut self) -> Vec<Keyed> {
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|key| !self.listed.contains(*key))
            .cloned()
            .collect();
        let mut updates: Vec<Keyed> = gone.iter().filter_map(|key| self.remove(key)).collect();
        updates.push(Keyed::listed());
        updates
    }
}
