//! What the sources give the engine, and which of a batch's items are superseded (latest wins).
//!
//! `input.rs`: what the sources give (`Input`, tagged by `Place`) and `superseded`, latest wins
//! per route, per key and for the trust (only new material supersedes: an error never does).
//!

use std::collections::HashMap;

use tls_source::{CertBundle, Keyed, KeyedUpdate};

use super::RouteId;
use super::trust::TrustItem;

/// One item from one source, tagged with where it goes.
#[derive(Debug)]
pub(crate) enum Input {
    /// From the source of a static route (the default or a named one).
    Route(RouteId, Result<CertBundle, tls_source::Error>),
    /// From keyed source number `.0`.
    Keyed(usize, Result<Keyed, tls_source::Error>),
    /// From the client-CA trust source of its own.
    Trust(TrustItem),
    /// A source panicked in `poll_next`; it has been dropped.
    Panicked(Place, String),
}

/// Which source an input came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Route(RouteId),
    Keyed(usize),
    Trust,
}

/// What an input replaces, for latest-wins within a batch: a static route, a key of a keyed
/// source, or the trust.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Target<'a> {
    Route(RouteId),
    Key(usize, &'a str),
    Trust,
}

impl Input {
    /// What this input replaces, if it is new material. Only new material supersedes: a later
    /// bundle (or removal) for the same target. A later error does not, or a good bundle
    /// followed at once by a report (a watch that fails right after delivering an update)
    /// would never be installed.
    fn target(&self) -> Option<Target<'_>> {
        match self {
            Self::Route(id, Ok(_)) => Some(Target::Route(*id)),
            Self::Keyed(
                source,
                Ok(Keyed {
                    key,
                    update: KeyedUpdate::Put(_) | KeyedUpdate::Remove,
                }),
            ) => Some(Target::Key(*source, key)),
            Self::Trust(Ok(_)) => Some(Target::Trust),
            _ => None,
        }
    }
}

/// For each input of `batch`, whether a later one of the same batch supersedes it.
pub(crate) fn superseded(batch: &[Input]) -> Vec<bool> {
    if batch.len() < 2 {
        // Nothing to supersede (and no hash map: an inline batch is one input).
        return vec![false; batch.len()];
    }
    let mut last = HashMap::new();
    for (i, input) in batch.iter().enumerate() {
        if let Some(target) = input.target() {
            last.insert(target, i);
        }
    }
    batch
        .iter()
        .enumerate()
        .map(|(i, input)| input.target().is_some_and(|t| last[&t] != i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::bundle;

    fn put(source: usize, key: &str) -> Input {
        Input::Keyed(
            source,
            Ok(Keyed {
                key: key.to_owned(),
                update: KeyedUpdate::Put(bundle("a.example.com")),
            }),
        )
    }

    fn remove(source: usize, key: &str) -> Input {
        Input::Keyed(
            source,
            Ok(Keyed {
                key: key.to_owned(),
                update: KeyedUpdate::Remove,
            }),
        )
    }

    fn error() -> tls_source::Error {
        tls_source::Error::source("test", "the watch failed")
    }

    #[test]
    fn the_last_bundle_for_a_route_wins() {
        let batch = [
            Input::Route(0, Ok(bundle("a.example.com"))),
            Input::Route(1, Ok(bundle("b.example.com"))),
            Input::Route(0, Ok(bundle("a.example.com"))),
        ];
        assert_eq!(superseded(&batch), [true, false, false]);
    }

    /// The defect a property test found: an error right after a bundle superseded it, so the
    /// bundle was never installed.
    #[test]
    fn an_error_after_a_bundle_does_not_supersede_it() {
        let batch = [
            Input::Route(0, Ok(bundle("a.example.com"))),
            Input::Route(0, Err(error())),
        ];
        assert_eq!(superseded(&batch), [false, false]);
        let keyed = [
            put(0, "ns/a"),
            Input::Keyed(
                0,
                Ok(Keyed {
                    key: "ns/a".to_owned(),
                    update: KeyedUpdate::Invalid(error()),
                }),
            ),
            Input::Keyed(0, Err(error())),
        ];
        assert_eq!(superseded(&keyed), [false, false, false]);
    }

    #[test]
    fn a_removal_supersedes_a_put_of_the_same_key_and_a_put_a_removal() {
        let batch = [put(0, "ns/a"), remove(0, "ns/a"), put(0, "ns/b")];
        assert_eq!(superseded(&batch), [true, false, false]);
        let batch = [remove(0, "ns/a"), put(0, "ns/a")];
        assert_eq!(superseded(&batch), [true, false]);
    }

    #[test]
    fn the_same_key_in_two_keyed_sources_is_two_routes() {
        let batch = [put(0, "ns/a"), put(1, "ns/a")];
        assert_eq!(superseded(&batch), [false, false]);
    }

    #[test]
    fn the_last_good_trust_wins_and_a_bad_one_supersedes_nothing() {
        let ca = bundle("ca.example.com").chain().to_vec();
        let batch = [
            Input::Trust(Ok(ca.clone())),
            Input::Trust(Err(error())),
            Input::Trust(Ok(ca)),
        ];
        assert_eq!(superseded(&batch), [true, false, false]);
    }

    #[test]
    fn panics_are_never_superseded() {
        let batch = [
            Input::Panicked(Place::Route(0), "boom".into()),
            Input::Route(0, Ok(bundle("a.example.com"))),
        ];
        assert_eq!(superseded(&batch), [false, false]);
    }
}
