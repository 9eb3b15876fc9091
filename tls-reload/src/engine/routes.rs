//! The routes the engine serves: the static ones (the default and the named SNI routes, fixed
//! at build), and the keyed ones that come and go with their keys, each in a slab place that a
//! removed route gives back.
//!
//! `routes.rs`: the route slab (static routes first, keyed ones reusing freed places), `Kind`
//! and its `Rule` (what the route needs beyond the policy: `validate.rs`'s `validate_as`:
//! `NoClientCa`, `NoNames`, a named route's name, a client identity's roots), the claims index
//! (each name, the routes that claim it, and its holder), the SNI table build and readiness (a
//! count of installed keyed routes, not a scan).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use foldhash::fast::RandomState;

use tls_source::{CertBundle, Digest};

use super::events::Event;
use super::{Due, Label, RouteId};
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
    /// Where the route is shown in the status (`None`: the top-level fields), shared with the
    /// status's map and the events.
    pub(crate) label: Option<Label>,
    /// Where its certificate goes: its own slot in the SNI table, or (`None`) the default.
    pub(crate) slot: Option<Arc<Slot>>,
    /// The digest and names of the certificate installed.
    pub(crate) installed: Option<(Digest, Vec<RouteName>)>,
    /// Shared with the published status: a change copies it once ([`Route::status_mut`]),
    /// publishing it copies a pointer.
    pub(crate) status: Arc<RouteStatus>,
    /// A not-yet-valid bundle waiting for its `notBefore` ([`Due::Retry`](super::Due::Retry)),
    /// and that time (boxed: rare, and every route would carry its size).
    pub(crate) retry: Option<Box<(SystemTime, CertBundle)>>,
    /// When the installed certificate enters its warning window, while that timer is armed.
    pub(crate) expiring_at: Option<SystemTime>,
    /// When it expires, while that is still to come: its timer is armed once the warning's
    /// has fired (one timer per route at a time, however many routes: `expiry_timer`).
    pub(crate) expired_at: Option<SystemTime>,
    /// The keyed source it comes from.
    source: Option<usize>,
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

    /// The route's status, to change (copied first if the published status still shares it).
    pub(crate) fn status_mut(&mut self) -> &mut RouteStatus {
        Arc::make_mut(&mut self.status)
    }

    /// The one expiry timer of route `id` armed now, and its time: the warning's while it is
    /// to come, then the expiry's.
    pub(crate) fn expiry_timer(&self, id: RouteId) -> Option<(Due, SystemTime)> {
        match (self.expiring_at, self.expired_at) {
            (Some(at), _) => Some((Due::Expiring(id), at)),
            (None, Some(at)) => Some((Due::Expired(id), at)),
            (None, None) => None,
        }
    }

    fn new(kind: Kind, label: Option<Label>, slot: Option<Arc<Slot>>) -> Self {
        let names = match &kind {
            Kind::Named(name) => vec![name.to_string()],
            _ => Vec::new(),
        };
        Self {
            kind,
            label,
            slot,
            installed: None,
            status: Arc::new(RouteStatus {
                names,
                ..RouteStatus::default()
            }),
            retry: None,
            expiring_at: None,
            expired_at: None,
            source: None,
        }
    }

    /// Whether the route is served by its certificate's names: keyed ones, and the default
    /// under strict SNI (it has a slot then).
    pub(crate) fn by_names(&self) -> bool {
        match self.kind {
            Kind::Keyed => true,
            Kind::Default => self.slot.is_some(),
            Kind::Named(_) | Kind::Client(_) => false,
        }
    }

    /// The keyed source the route comes from (`None`: a static route).
    pub(crate) fn source(&self) -> Option<usize> {
        self.source
    }

    /// The names this route serves by (its installed certificate's), if it serves by names.
    pub(crate) fn served_names(&self) -> &[RouteName] {
        self.installed
            .as_ref()
            .map_or(&[], |(_, names)| names.as_slice())
    }
}

/// What a certificate is served by when its route serves by names: its DNS names, then (a
/// keyed route's) its IP addresses, for handshakes without a server name. The default's
/// addresses are the resolver's to check (`CertResolver::store_default_addrs`): they come after
/// every route's, and do not make it "the one IP certificate".
pub(crate) fn served_by(info: &crate::CertInfo, kind: &Kind) -> Vec<RouteName> {
    let ips = if matches!(kind, Kind::Keyed) {
        info.ip_addresses.as_slice()
    } else {
        &[]
    };
    info.dns_names
        .iter()
        .filter_map(|n| RouteName::parse(n).ok())
        .chain(ips.iter().map(|ip| RouteName::Ip(ip.to_canonical())))
        .collect()
}

/// Every route, by [`RouteId`].
#[derive(Debug)]
pub(crate) struct Routes {
    slab: Vec<Option<Route>>,
    /// Keyed routes by source, then key (the key shared with the route's label).
    keyed: Vec<BTreeMap<Label, RouteId>>,
    /// Places of removed keyed routes, for reuse.
    free: Vec<RouteId>,
    /// How many routes are static, all at the front.
    statics: usize,
    /// Every name some route serves by, and the routes that claim it: the table is kept from
    /// this one name at a time (the holder of a name is its best claimant, see `rank`).
    claims: HashMap<RouteName, Vec<RouteId>, RandomState>,
    /// How many keyed routes have a certificate installed.
    installed_keyed: usize,
}

impl Routes {
    /// The static routes, in the order their sources are tagged (`RouteId` 0, 1, …).
    pub(crate) fn new(statics: Vec<Kind>) -> Self {
        let slab: Vec<_> = statics
            .into_iter()
            .map(|kind| {
                Some(match kind {
                    Kind::Named(name) => {
                        let label = Some(Label::from(name.to_string()));
                        Route::new(Kind::Named(name), label, Some(Arc::default()))
                    }
                    kind => Route::new(kind, None, None),
                })
            })
            .collect();
        let mut claims: HashMap<RouteName, Vec<RouteId>, RandomState> = HashMap::default();
        for (id, route) in slab.iter().enumerate() {
            if let Some(Route {
                kind: Kind::Named(name),
                ..
            }) = route
            {
                claims.entry(name.clone()).or_default().push(id);
            }
        }
        Self {
            statics: slab.len(),
            slab,
            keyed: Vec::new(),
            free: Vec::new(),
            claims,
            installed_keyed: 0,
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

    pub(crate) fn label(&self, id: RouteId) -> Option<Label> {
        self.get(id).and_then(|r| r.label.clone())
    }

    /// The keyed route for `key` of `source`, if there is one.
    fn find(&self, source: usize, key: &str) -> Option<RouteId> {
        self.keyed.get(source)?.get(key).copied()
    }

    /// The keyed route for `key` of `source`, made on first sight.
    pub(crate) fn keyed(&mut self, source: usize, key: String) -> RouteId {
        if let Some(id) = self.find(source, &key) {
            return id;
        }
        let key = Label::from(key);
        let mut route = Route::new(Kind::Keyed, Some(Arc::clone(&key)), Some(Arc::default()));
        route.source = Some(source);
        let route = Some(route);
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
        if self.keyed.len() <= source {
            self.keyed.resize_with(source + 1, BTreeMap::new);
        }
        self.keyed[source].insert(key, id);
        id
    }

    /// Whether `keyed` (a put) brings material its route does not serve: a new key, or a
    /// digest other than the installed one.
    pub(crate) fn is_new(&self, source: usize, keyed: &tls_source::Keyed) -> bool {
        let tls_source::KeyedUpdate::Put(bundle) = &keyed.update else {
            return false;
        };
        self.find(source, &keyed.key)
            .and_then(|id| self.get(id))
            .and_then(|r| r.installed.as_ref())
            .is_none_or(|(digest, _)| *digest != bundle.digest())
    }

    /// Removes the keyed route for `key`, if there is one.
    pub(crate) fn remove_keyed(&mut self, source: usize, key: &str) -> Option<(RouteId, Route)> {
        let id = self.keyed.get_mut(source)?.remove(key)?;
        let route = self.slab[id].take()?;
        self.free.push(id);
        self.unclaim(id, route.served_names());
        if route.installed.is_some() {
            self.installed_keyed -= 1;
        }
        Some((id, route))
    }

    /// Route `id` now serves by `names` instead of what it served by: its claims follow.
    /// Returns the names whose holder may have changed.
    pub(crate) fn set_installed(
        &mut self,
        id: RouteId,
        installed: (Digest, Vec<RouteName>),
    ) -> Vec<RouteName> {
        let Some(route) = self.slab.get_mut(id).and_then(Option::as_mut) else {
            return Vec::new();
        };
        let new = installed.1.clone();
        let old = route.installed.replace(installed);
        if matches!(route.kind, Kind::Keyed) && old.is_none() {
            self.installed_keyed += 1;
        }
        if !route.by_names() {
            return Vec::new();
        }
        let old = old.map(|(_, names)| names).unwrap_or_default();
        if old == new {
            return Vec::new();
        }
        self.unclaim(id, &old);
        for name in &new {
            self.claims.entry(name.clone()).or_default().push(id);
        }
        let mut touched = old;
        touched.extend(new);
        touched
    }

    fn unclaim(&mut self, id: RouteId, names: &[RouteName]) {
        for name in names {
            if let Some(claimants) = self.claims.get_mut(name) {
                claimants.retain(|c| *c != id);
                if claimants.is_empty() {
                    self.claims.remove(name);
                }
            }
        }
    }

    /// The order in which routes claim a name: the named routes, then the keyed ones by source
    /// and key (the smallest key keeps a name two keys share), then the default.
    fn rank(&self, id: RouteId) -> (u8, usize, &str) {
        match self.get(id) {
            Some(Route {
                kind: Kind::Named(_),
                ..
            }) => (0, id, ""),
            Some(
                route @ Route {
                    kind: Kind::Keyed, ..
                },
            ) => (
                1,
                route.source.unwrap_or_default(),
                route.label.as_deref().unwrap_or_default(),
            ),
            _ => (2, id, ""),
        }
    }

    /// The route that serves `name`: its best claimant whose source's list is in.
    pub(crate) fn holder(
        &self,
        name: &RouteName,
        complete: impl Fn(usize) -> bool,
    ) -> Option<RouteId> {
        self.claims
            .get(name)?
            .iter()
            .copied()
            .filter(|id| {
                self.get(*id)
                    .is_some_and(|r| r.source.is_none_or(&complete))
            })
            .min_by(|a, b| self.rank(*a).cmp(&self.rank(*b)))
    }

    /// The slot route `id` is served from.
    pub(crate) fn slot(&self, id: RouteId) -> Option<&Arc<Slot>> {
        self.get(id)?.slot.as_ref()
    }

    /// The slot that serves `name` now (its holder's), reporting in `events` each keyed route
    /// whose list is in that claims it and lost it to a better claimant.
    pub(crate) fn serve(
        &self,
        name: &RouteName,
        complete: impl Fn(usize) -> bool,
        events: &mut Vec<Event>,
    ) -> Option<Arc<Slot>> {
        let holder = self.holder(name, &complete)?;
        for id in self.claims.get(name).into_iter().flatten() {
            let Some(route) = self.get(*id) else { continue };
            if *id != holder
                && matches!(route.kind, Kind::Keyed)
                && route.source.is_none_or(&complete)
            {
                events.push(Event::NameTaken {
                    route: route.label.clone(),
                    name: name.to_string(),
                });
            }
        }
        self.slot(holder).cloned()
    }

    /// The routes of keyed source `source`.
    pub(crate) fn of_source(&self, source: usize) -> Vec<RouteId> {
        self.keyed
            .get(source)
            .map(|keys| keys.values().copied().collect())
            .unwrap_or_default()
    }

    /// The SNI table: each claimed name with its holder (a name taken by a better claimant is
    /// reported in `events` for the keyed route that lost it).
    pub(crate) fn table(&self, events: &mut Vec<Event>, complete: impl Fn(usize) -> bool) -> Table {
        let mut table = Table::default();
        for name in self.claims.keys() {
            if let Some(slot) = self.serve(name, &complete, events) {
                table.set(name, Some(&slot));
            }
        }
        table
    }

    /// Whether every static route has a certificate (with keyed routes only: whether any has).
    pub(crate) fn ready(&self) -> bool {
        let statics = &self.slab[..self.statics];
        if statics.is_empty() {
            self.installed_keyed > 0
        } else {
            statics.iter().flatten().all(|r| r.installed.is_some())
        }
    }
}
