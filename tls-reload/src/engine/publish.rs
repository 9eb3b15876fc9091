//! The end of every batch: the SNI table when names changed, readiness, and the batch's status
//! changes, published last so that a status never says a certificate is in before the
//! resolver serves it.
//!
//! `publish.rs`: the end of a batch (the table if names changed, readiness, `Publish`). Each
//! keyed source's initial list (`List` in `mod.rs`: unheard, loading after
//! `KeyedUpdate::Listing`, complete after `Listed`, at a first item of a source that never
//! announces one, or when it panics) keeps its routes out of the table and, unless
//! `ready_before_lists`, the engine unready until it is complete: a listed name is never served
//! a partial list's answer, and the list is one table build.
//!

use std::sync::Arc;

use super::{Effect, Engine, Event, Label, List, TrustSet};
use crate::Error;
use crate::status::{RouteStatus, TrustedCa};

/// The status changes of a batch.
#[derive(Debug, Default)]
pub(crate) struct Publish {
    pub(crate) ready: bool,
    /// The routes whose status changed (`None`: the default route, the top-level fields).
    pub(crate) routes: Vec<(Option<Label>, Arc<RouteStatus>)>,
    /// The labels of routes removed.
    pub(crate) removed: Vec<Label>,
    /// The trusted client CAs and the trust source's error, when they changed.
    pub(crate) trust: Option<(Vec<TrustedCa>, Option<Arc<Error>>)>,
}

impl Engine {
    /// The end of a batch: the SNI table if its names changed, readiness, the status.
    pub(crate) fn finish(&mut self) -> Vec<Effect> {
        // A keyed source's routes are served once its initial list is in: until then a listed
        // name is not served half a list's view, and the list is one table build.
        let lists = &self.lists;
        let complete = |source: usize| lists.get(source).is_none_or(|l| *l == List::Complete);
        let touched = std::mem::take(&mut self.touched);
        if std::mem::take(&mut self.table_dirty) {
            let mut events = Vec::new();
            let table = self.routes.table(&mut events, complete);
            self.out.extend(events.into_iter().map(Effect::Event));
            self.out.push(Effect::Table(table));
        } else if !touched.is_empty() {
            // One change, one edit: the names it touched, each to its holder now.
            let mut names = touched;
            names.sort_unstable();
            names.dedup();
            let mut events = Vec::new();
            let edits = names
                .into_iter()
                .map(|name| {
                    let slot = self.routes.serve(&name, complete, &mut events);
                    (name, slot)
                })
                .collect();
            self.out.extend(events.into_iter().map(Effect::Event));
            self.out.push(Effect::TableEdit(edits));
        }
        // With client authentication, a server that trusts no CA yet refuses everyone.
        let ready = self.routes.ready()
            && (!self.lists_gate_ready || self.lists_complete())
            && self.trust.as_ref().is_none_or(TrustSet::trusts_any);
        self.event(Event::Ready(ready));
        let earliest = self.keyed_expiry.first().map(|(at, _)| *at);
        if earliest != self.keyed_earliest {
            self.keyed_earliest = earliest;
            self.event(Event::KeyedEarliest {
                not_after: earliest,
            });
        }
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        let routes = changed
            .into_iter()
            .filter_map(|id| self.routes.get(id))
            .map(|route| (route.label.clone(), Arc::clone(&route.status)))
            .collect();
        let trust = std::mem::take(&mut self.trust_dirty)
            .then(|| self.trust.as_ref().map(TrustSet::status))
            .flatten()
            .map(|cas| (cas, self.trust_error.clone()));
        self.out.push(Effect::Publish(Publish {
            ready,
            routes,
            removed: std::mem::take(&mut self.removed),
            trust,
        }));
        std::mem::take(&mut self.out)
    }
}
