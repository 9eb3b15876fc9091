//! The end of every batch: the SNI table when names changed, readiness, and the batch's status
//! changes, published last so that a status never says a certificate is in before the
//! resolver serves it.

use std::sync::Arc;

use super::{Effect, Engine, Event, TrustSet};
use crate::Error;
use crate::status::{RouteStatus, TrustedCa};

/// The status changes of a batch.
#[derive(Debug, Default)]
pub(crate) struct Publish {
    pub(crate) ready: bool,
    /// The routes whose status changed (`None`: the default route, the top-level fields).
    pub(crate) routes: Vec<(Option<String>, RouteStatus)>,
    /// The labels of routes removed.
    pub(crate) removed: Vec<String>,
    /// The trusted client CAs and the trust source's error, when they changed.
    pub(crate) trust: Option<(Vec<TrustedCa>, Option<Arc<Error>>)>,
}

impl Engine {
    /// The end of a batch: the SNI table if its names changed, readiness, the status.
    pub(super) fn finish(&mut self) -> Vec<Effect> {
        if std::mem::take(&mut self.table_dirty) {
            let mut events = Vec::new();
            let table = self.routes.table(&mut events);
            self.out.extend(events.into_iter().map(Effect::Event));
            self.out.push(Effect::Table(table));
        }
        // With client authentication, a server that trusts no CA yet refuses everyone.
        let ready = self.routes.ready() && self.trust.as_ref().is_none_or(TrustSet::trusts_any);
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
            .map(|route| (route.label.clone(), route.status.clone()))
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
