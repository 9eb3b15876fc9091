//! The routes the engine serves: the static ones (the default and the named SNI routes, fixed
//! at build), and the keyed ones that come and go with their keys, each in a slab place that a
//! removed route gives back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tls_source::{CertBundle, Digest};

use super::RouteId;
use super::events::Event;
use crate::status::RouteStatus;
use crate::tls::{RouteName, Slot, Table};
use crate::validate::Rule;

/// What a route serves, and so what its bundles are checked against.
#[derive(Debug)]
pub(crate) enum Kind {
    /// The certificate served when no SNI route matches.
    Default,
    /// A route with a name of its own: the leaf must cover it.
    Named(RouteName),
    /// A route of a keyed source, served by the DNS names of its certificate (its key is the
    /// label).
    Keyed,
    /// The identity a client presents ([`ClientTls`](crate::ClientTls)): its CA certificates
    /// are the roots servers are trusted with (with the extra roots configured).
    Client(crate::tls::client::Roots),
}

/// One route's state.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) kind: Kind,
    /// Where the route is shown in the status (`None`: the top-level fields).
    pub(crate) label: Option<String>,
    /// Where its certificate goes: its own slot in the SNI table, or (`None`) the default.
    pub(crate) slot: Option<Arc<Slot>>,
    /// The digest and names of the certificate installed.
    pub(crate) installed: Option<(Digest, Vec<RouteName>)>,
    pub(crate) status: RouteStatus,
    /// A not-yet-valid bundle waiting for its `notBefore` ([`Due::Retry`](super::Due::Retry)),
    /// and that time.
    pub(crate) retry: Option<(SystemTime, CertBundle)>,
    /// When the installed certificate enters its warning window, and when it expires, while
    /// those timers are armed.
    pub(crate) expiring_at: Option<SystemTime>,
    pub(crate) expired_at: Option<SystemTime>,
}

impl Route {
    /// What a bundle for this route must pass besides the policy; `client_ca`: the default
    /// route carries the client CAs.
    pub(crate) fn rule(&self, client_ca: bool) -> Rule<'_> {
        match (&self.kind, &self.label) {
            (Kind::Default, _) if client_ca => Rule::ClientCa,
            (Kind::Named(_), Some(name)) => Rule::Name(name),
            (Kind::Default | Kind::Named(_), _) => Rule::Policy,
            (Kind::Keyed, _) => Rule::Names,
            (Kind::Client(roots), _) => Rule::ServerRoots(roots),
        }
    }

    fn new(kind: Kind, label: Option<String>, slot: Option<Arc<Slot>>) -> Self {
        let names = match &kind {
            Kind::Named(name) => vec![name.to_string()],
            _ => Vec::new(),
        };
        Self {
            kind,
            label,
            slot,
            installed: None,
            status: RouteStatus {
                names,
                ..RouteStatus::default()
            },
            retry: None,
            expiring_at: None,
            expired_at: None,
        }
    }
}

/// Every route, by [`RouteId`].
#[derive(Debug)]
pub(crate) struct Routes {
    slab: Vec<Option<Route>>,
    /// Keyed routes by (source, key).
    keyed: BTreeMap<(usize, String), RouteId>,
    /// Places of removed keyed routes, for reuse.
    free: Vec<RouteId>,
    /// How many routes are static, all at the front.
    statics: usize,
}

impl Routes {
    /// The static routes, in the order their sources are tagged (`RouteId` 0, 1, …).
    pub(crate) fn new(statics: Vec<Kind>) -> Self {
        let slab: Vec<_> = statics
            .into_iter()
            .map(|kind| {
                Some(match kind {
                    Kind::Named(name) => {
                        let label = Some(name.to_string());
                        Route::new(Kind::Named(name), label, Some(Arc::default()))
                    }
                    kind => Route::new(kind, None, None),
                })
            })
            .collect();
        Self {
            statics: slab.len(),
            slab,
            keyed: BTreeMap::new(),
            free: Vec::new(),
        }
    }

    /// Gives the default route a slot of its own, served in the table by its names.
    pub(crate) fn serve_default_by_name(&mut self) {
        for route in self.slab[..self.statics].iter_mut().flatten() {
            if matches!(route.kind, Kind::Default) {
                route.slot = Some(Arc::default());
            }
        }
    }

    pub(crate) fn statics(&self) -> std::ops::Range<RouteId> {
        0..self.statics
    }

    pub(crate) fn get(&self, id: RouteId) -> Option<&Route> {
        self.slab.get(id)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: RouteId) -> Option<&mut Route> {
        self.slab.get_mut(id)?.as_mut()
    }

    pub(crate) fn label(&self, id: RouteId) -> Option<String> {
        self.get(id).and_then(|r| r.label.clone())
    }

    /// The keyed route for `key` of `source`, made on first sight.
    pub(crate) fn keyed(&mut self, source: usize, key: String) -> RouteId {
        if let Some(id) = self.keyed.get(&(source, key.clone())) {
            return *id;
        }
        let route = Some(Route::new(
            Kind::Keyed,
            Some(key.clone()),
            Some(Arc::default()),
        ));
        // A removed route's place is reused (its timers went with it), so churn does not grow
        // the table of routes.
        let id = match self.free.pop() {
            Some(id) => {
                self.slab[id] = route;
                id
            }
            None => {
                self.slab.push(route);
                self.slab.len() - 1
            }
        };
        self.keyed.insert((source, key), id);
        id
    }

    /// Removes the keyed route for `key`, if there is one.
    pub(crate) fn remove_keyed(&mut self, source: usize, key: &str) -> Option<(RouteId, Route)> {
        let id = self.keyed.remove(&(source, key.to_owned()))?;
        let route = self.slab[id].take()?;
        self.free.push(id);
        Some((id, route))
    }

    /// The routes of keyed source `source`.
    pub(crate) fn of_source(&self, source: usize) -> Vec<RouteId> {
        self.keyed
            .range((source, String::new())..(source + 1, String::new()))
            .map(|(_, id)| *id)
            .collect()
    }

    /// The SNI table: the named routes first, then each keyed route's names, then (under strict
    /// SNI) the default's (a name already taken stays with the route that took it; between
    /// keyed routes that is reported in `events`).
    pub(crate) fn table(&self, events: &mut Vec<Event>) -> Table {
        let mut table = Table::default();
        for route in self.slab[..self.statics].iter().flatten() {
            if let (Kind::Named(name), Some(slot)) = (&route.kind, &route.slot) {
                table.insert(name, slot);
            }
        }
        for id in self.keyed.values() {
            let Some((route, slot)) = self.slab[*id]
                .as_ref()
                .and_then(|r| Some((r, r.slot.as_ref()?)))
            else {
                continue;
            };
            for name in route.installed.iter().flat_map(|(_, names)| names) {
                if !table.insert(name, slot) {
                    events.push(Event::NameTaken {
                        route: route.label.clone(),
                        name: name.to_string(),
                    });
                }
            }
        }
        for route in self.slab[..self.statics].iter().flatten() {
            if let (Kind::Default, Some(slot), Some((_, names))) =
                (&route.kind, &route.slot, &route.installed)
            {
                for name in names {
                    table.insert(name, slot);
                }
            }
        }
        table
    }

    /// Whether every static route has a certificate (with keyed routes only: whether any has).
    pub(crate) fn ready(&self) -> bool {
        let statics = &self.slab[..self.statics];
        if statics.is_empty() {
            self.slab.iter().flatten().any(|r| r.installed.is_some())
        } else {
            statics.iter().flatten().all(|r| r.installed.is_some())
        }
    }
}
