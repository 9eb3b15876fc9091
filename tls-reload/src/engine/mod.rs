//! The reload engine: every route's state and every decision of the reload core, with no I/O,
//! no timers and no clock of its own. Inputs and `now` go in ([`Engine::handle`], then
//! [`Engine::finish`]; [`Engine::due`]); [`Effect`]s come out, in the order they must be applied: install a
//! certificate, rebuild the SNI table, change the client trust, publish the status, arm or
//! cancel a timer, emit an event. The task ([`crate::task`]) owns the sources and the timers
//! and applies the effects; tests drive the engine with a stepped clock.
//!
//! The one ordering rule: a batch's status is published last, after its installs and its
//! table, so that a status never says a certificate is in before the resolver serves it.
//!
//! # How it works
//!
//! Timers are named by a [`Due`] (a route's retry, expiry warning or expiry; the trust's next
//! departure), each armed at a `SystemTime`; a due timer called early arms itself again, so
//! the engine is safe to drive by hand, as its unit tests (`tests.rs`) do with a stepped `now`.
//! Each route's `RouteStatus`, its `CertInfo` and its label are `Arc`s shared with the
//! published status and the events: publishing costs a pointer. Checking an input runs in
//! `catch_unwind`, so a panic rejects that input (`Error::Internal`, reason `internal`) before
//! anything changes. What each file decides is in its own docs.

mod ahead;
mod events;
mod input;
mod publish;
mod routes;
#[cfg(test)]
mod tests;
mod trust;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;
use tls_source::clock::{Validity, saturating_add};
use tls_source::{CertBundle, Keyed, KeyedUpdate, panic_message};

pub(crate) use events::Event;
pub(crate) use input::{Input, Place};
pub(crate) use publish::Publish;
pub(crate) use routes::Kind;
pub use trust::TrustItem;
pub(crate) use trust::TrustSet;

use crate::tls::{RouteName, Slot, Table, TableEdit};
use crate::{Error, Validated, Validator};
use ahead::Ahead;
use routes::Routes;

/// A route's place in the engine: static routes first (in the order given to
/// [`Engine::new`]), then keyed ones.
pub(crate) type RouteId = usize;

/// A route's label (its name, or its key), shared by the engine, the status and the events.
pub(crate) type Label = Arc<str>;

/// What a timer is for: one entry per thing that can be due, so a timer names what it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Due {
    /// A not-yet-valid bundle of the route is tried again.
    Retry(RouteId),
    /// The route's certificate enters the expiry-warning window.
    Expiring(RouteId),
    /// The route's certificate expires.
    Expired(RouteId),
    /// The next client CA to leave does (the end of its overlap).
    TrustLeaves,
}

/// What the engine asks of the task, in order.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Serve a certificate: in the route's slot of the SNI table, or (`None`) as the default
    /// (on the client side: as the identity, its CA certificates the roots).
    Install {
        slot: Option<Arc<Slot>>,
        validated: Validated,
        /// The default route's (its addresses serve handshakes without a server name).
        default: bool,
    },
    /// The SNI table to serve from now on.
    Table(Table),
    /// Edit the SNI table: each name to the slot that serves it now (`None`: nothing).
    TableEdit(Vec<TableEdit>),
    /// The client CAs to trust from now on; with `invalidate` (a CA left), no session from
    /// before may be resumed.
    Trust {
        roots: Vec<CertificateDer<'static>>,
        invalidate: bool,
    },
    /// The end of a batch: what the status must show.
    Publish(Publish),
    /// Call [`Engine::due`] once the clock reaches the time (replacing any timer for it).
    Arm(Due, SystemTime),
    /// Forget the timer.
    Cancel(Due),
    /// Log it, count it.
    Event(Event),
}

/// Every route's state, and what to do about each input.
#[derive(Debug)]
pub(crate) struct Engine {
    validator: Validator,
    routes: Routes,
    /// With client authentication: the trusted CAs.
    trust: Option<TrustSet>,
    /// Why the client-CA source's last input was not taken.
    trust_error: Option<Arc<Error>>,
    /// What the batch changed, published at its end.
    changed: Vec<RouteId>,
    removed: Vec<Label>,
    /// The SNI table is rebuilt whole at the end of the batch (at the start, when a list is in).
    table_dirty: bool,
    /// Else, the names whose entries are edited.
    touched: Vec<RouteName>,
    /// The keyed routes' `notAfter`s: their metrics are one series for all of them (the
    /// earliest), so that routes that come and go leave no series behind.
    keyed_expiry: std::collections::BTreeSet<(SystemTime, RouteId)>,
    /// The earliest `notAfter` of the keyed routes last recorded.
    keyed_earliest: Option<SystemTime>,
    trust_dirty: bool,
    /// Each keyed source's initial list: until it is complete, its routes are not served and
    /// (with `lists_gate_ready`) the engine is not ready.
    lists: Vec<List>,
    lists_gate_ready: bool,
    out: Vec<Effect>,
}

/// Where a keyed source is with its initial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    /// Nothing heard yet.
    Unheard,
    /// It said [`KeyedUpdate::Listing`]: its initial list is coming.
    Loading,
    /// Its list is in (it said `Listed`, or it never announces one and sent its first item, or
    /// it panicked).
    Complete,
}

impl List {
    /// What the list is after `update` from its source.
    fn after(self, update: &KeyedUpdate) -> Self {
        match (self, update) {
            (Self::Complete, _) | (Self::Loading, KeyedUpdate::Listed) => Self::Complete,
            (Self::Unheard | Self::Loading, KeyedUpdate::Listing) => Self::Loading,
            (Self::Loading, _) => Self::Loading,
            (Self::Unheard, _) => Self::Complete,
        }
    }
}

// ===== impl Engine =====

impl Engine {
    /// An engine for the static routes `statics` (`RouteId` 0, 1, … in this order) and, with
    /// client authentication, the trust.
    /// Under strict SNI: the default route is served by the names its certificate covers,
    /// through a slot in the SNI table like any route, and never to other names.
    pub(crate) fn serve_default_by_name(&mut self) {
        self.routes.serve_default_by_name();
    }

    pub(crate) fn new(validator: Validator, statics: Vec<Kind>, trust: Option<TrustSet>) -> Self {
        let routes = Routes::new(statics);
        Self {
            validator,
            // The static routes are in the status from the start.
            changed: routes.statics().collect(),
            routes,
            trust,
            trust_error: None,
            removed: Vec::new(),
            table_dirty: true,
            touched: Vec::new(),
            keyed_expiry: std::collections::BTreeSet::new(),
            keyed_earliest: None,
            trust_dirty: false,
            lists: Vec::new(),
            lists_gate_ready: true,
            out: Vec::new(),
        }
    }

    /// There are `count` keyed sources (numbered from 0): each one's routes are served once
    /// its initial list is complete, and with `gate_ready` the engine is ready only once every
    /// list is (else the static routes alone decide: "serve the default while the lists
    /// load").
    pub(crate) fn keyed_sources(&mut self, count: usize, gate_ready: bool) {
        self.lists = vec![List::Unheard; count];
        self.lists_gate_ready = gate_ready;
    }

    /// Names whose holder may have changed: the table is edited for them at the end of the
    /// batch (unless it is rebuilt whole).
    fn touch(&mut self, names: Vec<RouteName>) {
        if !self.table_dirty {
            self.touched.extend(names);
        }
    }

    /// Whether every keyed source's initial list is in.
    fn lists_complete(&self) -> bool {
        self.lists.iter().all(|l| *l == List::Complete)
    }

    /// What keyed source `source` said, for its list.
    fn heard(&mut self, source: usize, update: &KeyedUpdate) {
        let Some(list) = self.lists.get_mut(source) else {
            return;
        };
        let before = *list;
        *list = before.after(update);
        if before != List::Complete && *list == List::Complete {
            self.list_complete(source);
        }
    }

    /// Keyed source `source`'s list is in: its routes go into the table.
    fn list_complete(&mut self, source: usize) {
        if let Some(list) = self.lists.get_mut(source) {
            *list = List::Complete;
        }
        self.table_dirty = true;
        let routes = self.routes.of_source(source);
        let serving = routes
            .iter()
            .filter_map(|id| self.routes.get(*id))
            .filter(|r| r.installed.is_some())
            .count();
        let refused = routes
            .iter()
            .filter_map(|id| self.routes.get(*id))
            .filter(|r| r.installed.is_none() && r.status.last_error.is_some())
            .count();
        self.event(Event::ListComplete {
            source,
            routes: routes.len(),
            serving,
            refused,
        });
    }

    /// The effects before any input: the empty table, the static routes in the status.
    pub(crate) fn start(&mut self) -> Vec<Effect> {
        // The static routes' counters exist (at 0) from the first scrape, so that an alert on
        // `increase()` sees the first rejection.
        let routes = self
            .routes
            .statics()
            .filter_map(|id| self.routes.get(id))
            .filter(|r| !matches!(r.kind, Kind::Client(_)))
            .map(|r| r.label.clone())
            .collect();
        self.event(Event::Declared { routes });
        self.finish()
    }

    /// [`handle`](Self::handle) and [`finish`](Self::finish) in one, for the tests.
    #[cfg(test)]
    pub(crate) fn batch(&mut self, batch: Vec<Input>, now: SystemTime) -> Vec<Effect> {
        let mut effects = self.handle(batch, now);
        effects.extend(self.finish());
        effects
    }

    /// Handles a batch of inputs in order; of several bundles for one route only the last is
    /// considered (latest wins), and anything newer for a route cancels its pending retry.
    /// Returns the effects so far (the installs, their timers and events): they may be applied
    /// at once, so that a new certificate is served before the rest of the batch is worked
    /// out. The caller then applies [`finish`](Self::finish)'s effects, which hold the table
    /// and the status (a status never says a certificate is in before the resolver serves it).
    pub(crate) fn handle(&mut self, batch: Vec<Input>, now: SystemTime) -> Vec<Effect> {
        let superseded = input::superseded(&batch);
        // The keyed bundles the engine would check (new material for its route), checked
        // ahead on every core; the rest in place.
        let ahead = ahead::check(
            &self.validator,
            &batch,
            |i, source, keyed| !superseded[i] && self.routes.is_new(source, keyed),
            now,
        );
        let mut ahead = ahead.into_iter();
        for (input, superseded) in batch.into_iter().zip(superseded) {
            self.input(input, superseded, ahead.next().flatten(), now);
        }
        std::mem::take(&mut self.out)
    }

    /// A batch that came when the clock could not be read (it panicked, with `message`): its
    /// bundles cannot be judged and are rejected ([`Error::Internal`]); the rest is handled
    /// at `fallback`.
    pub(crate) fn unjudged(
        &mut self,
        batch: Vec<Input>,
        message: &str,
        fallback: SystemTime,
    ) -> Vec<Effect> {
        for input in batch {
            let (id, bundle) = match input {
                Input::Route(id, Ok(bundle)) => (id, bundle),
                Input::Keyed(
                    source,
                    Ok(Keyed {
                        key,
                        update: KeyedUpdate::Put(bundle),
                    }),
                ) => (self.routes.keyed(source, key), bundle),
                other => {
                    self.input(other, false, None, fallback);
                    continue;
                }
            };
            self.cancel_retry(id);
            let error = internal(
                self.routes.label(id).as_deref(),
                &bundle,
                message.to_owned(),
            );
            self.reject(id, error, bundle);
        }
        self.finish()
    }

    fn input(&mut self, input: Input, superseded: bool, ahead: Ahead, now: SystemTime) {
        match input {
            Input::Route(id, Ok(bundle)) => self.put(id, bundle, superseded, None, now),
            Input::Route(id, Err(err)) => self.source_error(id, err),
            Input::Keyed(source, Ok(Keyed { key, update })) => {
                self.heard(source, &update);
                match update {
                    KeyedUpdate::Put(bundle) => {
                        let id = self.routes.keyed(source, key);
                        self.put(id, bundle, superseded, ahead, now);
                    }
                    KeyedUpdate::Invalid(err) => {
                        let id = self.routes.keyed(source, key);
                        self.source_error(id, err);
                    }
                    KeyedUpdate::Remove => self.remove_keyed(source, &key),
                    // Listing and Listed: the list's state only (`heard`).
                    _ => {}
                }
            }
            Input::Keyed(source, Err(err)) => {
                let error = Arc::new(Error::Source(err));
                self.event(Event::KeyedSourceError {
                    error: Arc::clone(&error),
                });
                for id in self.routes.of_source(source) {
                    self.record(id, Arc::clone(&error));
                }
            }
            Input::Trust(item) if !superseded => self.trust_from_source(item, now),
            Input::Trust(_) => {}
            Input::Panicked(place, message) => self.source_panicked(place, message),
        }
    }

    /// A timer armed by [`Effect::Arm`] is due. Called early (before the clock reaches the
    /// time), it arms it again; a timer cancelled meanwhile does nothing.
    pub(crate) fn due(&mut self, due: Due, now: SystemTime) -> Vec<Effect> {
        match self.armed_at(due) {
            Some(at) if now < at => self.out.push(Effect::Arm(due, at)),
            Some(_) => self.fire(due, now),
            None => {}
        }
        self.finish()
    }

    /// When `due` is armed for, if it is: what the engine keeps of each timer.
    fn armed_at(&self, due: Due) -> Option<SystemTime> {
        match due {
            Due::Retry(id) => self.routes.get(id)?.retry.as_ref().map(|retry| retry.0),
            Due::Expiring(id) | Due::Expired(id) => self
                .routes
                .get(id)?
                .expiry_timer(id)
                .filter(|(armed, _)| *armed == due)
                .map(|(_, at)| at),
            Due::TrustLeaves => self.trust.as_ref()?.next_leave().map(past),
        }
    }

    /// An armed timer whose time has come.
    fn fire(&mut self, due: Due, now: SystemTime) {
        match due {
            Due::Retry(id) => {
                if let Some(retry) = self.routes.get_mut(id).and_then(|r| r.retry.take()) {
                    self.consider(id, retry.1, None, now);
                }
            }
            Due::Expiring(id) => self.expiring(id),
            Due::Expired(id) => self.expired(id),
            Due::TrustLeaves => {
                if let Some(trust) = self.trust.as_mut() {
                    let change = trust.expire(now);
                    self.trust_changed(change);
                }
            }
        }
    }

    /// The route's certificate entered its warning window without being replaced.
    fn expiring(&mut self, id: RouteId) {
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        route.expiring_at = None;
        // Now the expiry's timer.
        if let Some((due, at)) = route.expiry_timer(id) {
            self.out.push(Effect::Arm(due, at));
        }
        route.status_mut().expiring = true;
        if let Some(info) = route.status.current.clone() {
            let route = route.label.clone();
            self.event(Event::ExpiringNotReplaced { route, info });
        }
        self.changed.push(id);
    }

    /// The route's certificate expired (its timer is armed a millisecond past `notAfter`).
    fn expired(&mut self, id: RouteId) {
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        route.expired_at = None;
        let Some(info) = route.status.current.as_ref() else {
            return;
        };
        let error = Arc::new(Error::ServedExpired {
            origin: info.origin.clone(),
            not_after: info.not_after,
        });
        let status = route.status_mut();
        status.expired = true;
        status.expiring = true;
        status.last_error = Some(Arc::clone(&error));
        let (route, keyed) = (route.label.clone(), matches!(route.kind, Kind::Keyed));
        self.event(Event::ServedExpired {
            route,
            error,
            keyed,
        });
        self.changed.push(id);
    }

    /// `ahead`: the bundle's check, when it was done ahead ([`ahead::check`]).
    fn put(
        &mut self,
        id: RouteId,
        bundle: CertBundle,
        superseded: bool,
        ahead: Ahead,
        now: SystemTime,
    ) {
        self.cancel_retry(id);
        if superseded {
            let origin = bundle.origin().clone();
            self.event(Event::Superseded { origin });
        } else {
            self.consider(id, bundle, ahead, now);
        }
    }

    fn source_error(&mut self, id: RouteId, err: tls_source::Error) {
        self.cancel_retry(id);
        let error = Arc::new(Error::Source(err));
        let route = self.routes.label(id);
        let serving = self.serving(id);
        self.event(Event::SourceError {
            route,
            error: Arc::clone(&error),
            serving,
            keyed: self.is_keyed(id),
        });
        self.record(id, error);
    }

    fn remove_keyed(&mut self, source: usize, key: &str) {
        let Some((id, route)) = self.routes.remove_keyed(source, key) else {
            return;
        };
        if route.retry.is_some() {
            self.out.push(Effect::Cancel(Due::Retry(id)));
        }
        if let Some((due, _)) = route.expiry_timer(id) {
            self.out.push(Effect::Cancel(due));
        }
        let label = route.label.clone().unwrap_or_else(|| Label::from(key));
        self.event(Event::RouteRemoved {
            route: Arc::clone(&label),
        });
        if let Some(info) = &route.status.current {
            self.keyed_expiry.remove(&(info.not_after, id));
        }
        self.touch(route.served_names().to_vec());
        self.removed.push(label);
    }

    /// Validates a bundle for its route and installs it, or records why not.
    fn consider(&mut self, id: RouteId, bundle: CertBundle, ahead: Ahead, now: SystemTime) {
        let client_ca = self.trust.as_ref().is_some_and(TrustSet::is_the_bundles);
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        if route.installed.as_ref().map(|(d, _)| *d) == Some(bundle.digest()) {
            // The same material again, e.g. after a transient error: a recovery, not a rotation.
            if !route.status.expired && route.status.last_error.is_some() {
                route.status_mut().last_error = None;
                let keyed = matches!(route.kind, Kind::Keyed);
                let (route, origin) = (route.label.clone(), bundle.origin().clone());
                self.event(Event::Recovered {
                    route,
                    origin,
                    keyed,
                });
                self.changed.push(id);
            }
            return;
        }
        let route = &*route;
        // Checking changes nothing, so a panic in it (a parser's) is contained here: the input
        // is rejected and every route, timer and status stays as it was.
        let checked = ahead.unwrap_or_else(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                #[cfg(feature = "__test-hooks")]
                crate::hooks::before_check(&bundle);
                self.validator
                    .validate_as(&bundle, &route.rule(client_ca), now)
            }))
            .unwrap_or_else(|panic| {
                let message = panic_message(panic.as_ref());
                Err(internal(route.label.as_deref(), &bundle, message))
            })
        });
        match checked {
            Ok(validated) => self.install(id, validated, now),
            Err(err) => self.reject(id, err, bundle),
        }
    }

    /// `bundle` is refused for its route, which keeps what it serves; one not valid yet is
    /// tried again at its `notBefore`.
    /// Whether route `id` is a keyed one (its metrics are the keyed routes' together).
    fn is_keyed(&self, id: RouteId) -> bool {
        self.routes
            .get(id)
            .is_some_and(|r| matches!(r.kind, Kind::Keyed))
    }

    /// Whether route `id` has a certificate installed (serves something).
    fn serving(&self, id: RouteId) -> bool {
        self.routes.get(id).is_some_and(|r| r.installed.is_some())
    }

    fn reject(&mut self, id: RouteId, err: Error, bundle: CertBundle) {
        let error = Arc::new(err);
        self.event(Event::Rejected {
            route: self.routes.label(id),
            error: Arc::clone(&error),
            serving: self.serving(id),
            keyed: self.is_keyed(id),
        });
        if let Error::NotYetValid { not_before, .. } = &*error
            && let Some(route) = self.routes.get_mut(id)
        {
            route.retry = Some(Box::new((*not_before, bundle)));
            self.out.push(Effect::Arm(Due::Retry(id), *not_before));
        }
        self.record(id, error);
    }

    fn install(&mut self, id: RouteId, validated: Validated, now: SystemTime) {
        #[cfg(feature = "__test-hooks")]
        crate::hooks::before_install(validated.info());
        let window = self.validator.policy().expiry_warning_window();
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        let info = Arc::clone(validated.shared_info());
        // Armed timers are replaced by the new ones, or cancelled. One timer at a time: the
        // warning's, then (armed when it fires) the expiry's.
        let expiring_at = info.not_after.checked_sub(window).filter(|at| *at >= now);
        let expired = Validity::at(now, info.not_before, info.not_after) == Validity::Expired;
        let expired_at = (!expired).then(|| past(info.not_after));
        let before = route.expiry_timer(id);
        route.expiring_at = expiring_at;
        route.expired_at = expired_at;
        let after = route.expiry_timer(id);
        if let Some((due, _)) = before
            && after.is_none_or(|(now, _)| now != due)
        {
            self.out.push(Effect::Cancel(due));
        }
        if let Some((due, at)) = after {
            self.out.push(Effect::Arm(due, at));
        }
        let names = if route.by_names() {
            routes::served_by(&info, &route.kind)
        } else {
            Vec::new()
        };
        let touched = self.routes.set_installed(id, (validated.digest(), names));
        self.touch(touched);
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        let listing = route
            .source()
            .is_some_and(|s| self.lists.get(s).is_some_and(|l| *l != List::Complete));
        let keyed = matches!(route.kind, Kind::Keyed);
        let status = Arc::make_mut(&mut route.status);
        status.generation += 1;
        status.last_error = None;
        status.expiring = expiring_at.is_none();
        status.expired = expired;
        if keyed {
            status.names.clone_from(&info.dns_names);
            status
                .names
                .extend(info.ip_addresses.iter().map(ToString::to_string));
            if let Some(old) = &status.current {
                self.keyed_expiry.remove(&(old.not_after, id));
            }
            self.keyed_expiry.insert((info.not_after, id));
        }
        let event = Event::Installed {
            route: route.label.clone(),
            info: Arc::clone(&info),
            generation: status.generation,
            expiring: status.expiring,
            keyed,
            listing,
        };
        status.current = Some(info);
        let default = matches!(route.kind, Kind::Default);
        let cas = default.then(|| validated.ca().to_vec());
        self.out.push(Effect::Install {
            slot: route.slot.clone(),
            validated,
            default,
        });
        self.event(event);
        self.changed.push(id);
        if let Some(cas) = cas {
            self.set_trust(&cas, now);
        }
    }

    /// A source panicked and was dropped: its routes keep their certificates, and say they
    /// will not rotate.
    fn source_panicked(&mut self, place: Place, message: String) {
        let ids = match place {
            Place::Route(id) => vec![id],
            Place::Keyed(source) => {
                // What it listed is served; it will list no more.
                if self.lists.get(source).is_some_and(|l| *l != List::Complete) {
                    self.list_complete(source);
                }
                self.routes.of_source(source)
            }
            Place::Trust => {
                self.trust_error = Some(Arc::new(Error::SourcePanicked {
                    route: "client CAs".to_owned(),
                    message: message.clone(),
                }));
                self.trust_dirty = true;
                self.event(Event::TrustSourcePanicked { message });
                return;
            }
        };
        let routes = ids.iter().map(|id| self.routes.label(*id)).collect();
        self.event(Event::SourcePanicked {
            routes,
            message: message.clone(),
            keyed: matches!(place, Place::Keyed(_)),
        });
        for id in ids {
            self.cancel_retry(id);
            let label = self.routes.label(id);
            if let Some(route) = self.routes.get_mut(id) {
                route.status_mut().stopped = true;
            }
            let error = Error::SourcePanicked {
                route: route_name(label.as_deref()),
                message: message.clone(),
            };
            self.record(id, Arc::new(error));
        }
    }

    /// With client authentication from the bundle: the CAs of the default bundle just
    /// installed become the trust (the certificate and its trust change in the same batch).
    fn set_trust(&mut self, cas: &[CertificateDer<'static>], now: SystemTime) {
        if let Some(trust) = self.trust.as_mut().filter(|t| t.is_the_bundles()) {
            let change = trust.set(cas, now);
            self.trust_changed(change);
        }
    }

    /// What the trust source of its own yielded: the new trust once every certificate in it
    /// parses; otherwise nothing changes.
    fn trust_from_source(&mut self, item: TrustItem, now: SystemTime) {
        let checked = item.map_err(|e| e.to_string()).and_then(|cas| {
            if cas.is_empty() {
                return Err("no CA certificate".to_owned());
            }
            for ca in &cas {
                tls_source::x509::LeafInfo::parse(ca).map_err(|e| e.to_string())?;
            }
            Ok(cas)
        });
        match checked {
            Ok(cas) => {
                if self.trust_error.take().is_some() {
                    self.trust_dirty = true;
                }
                if let Some(trust) = self.trust.as_mut() {
                    let change = trust.set(&cas, now);
                    self.trust_changed(change);
                }
            }
            Err(reason) => {
                self.trust_error = Some(Arc::new(Error::ClientCas {
                    reason: reason.clone(),
                }));
                self.trust_dirty = true;
                self.event(Event::TrustRejected { reason });
            }
        }
    }

    /// The trust changed: a config for the CAs trusted now, the status, the next CA's timer.
    fn trust_changed(&mut self, change: trust::Change) {
        let Some(trust) = self.trust.as_ref() else {
            return;
        };
        if change.rebuild {
            self.trust_dirty = true;
            self.out.push(Effect::Trust {
                roots: trust.roots(),
                invalidate: change.invalidate,
            });
        }
        let next = trust.next_leave();
        for fingerprint in change.left {
            self.event(Event::CaLeft { fingerprint });
        }
        self.out.push(match next {
            Some(at) => Effect::Arm(Due::TrustLeaves, past(at)),
            None => Effect::Cancel(Due::TrustLeaves),
        });
    }

    fn cancel_retry(&mut self, id: RouteId) {
        if let Some(route) = self.routes.get_mut(id)
            && route.retry.take().is_some()
        {
            self.out.push(Effect::Cancel(Due::Retry(id)));
        }
    }

    fn record(&mut self, id: RouteId, err: Arc<Error>) {
        if let Some(route) = self.routes.get_mut(id) {
            route.status_mut().last_error = Some(err);
            self.changed.push(id);
        }
    }

    fn event(&mut self, event: Event) {
        self.out.push(Effect::Event(event));
    }
}

/// A timer past a deadline (a CA's leaving, a certificate's end): a millisecond after it, so
/// that the deadline itself has passed when it fires. Saturating: the year 9999 is a deadline
/// too.
fn past(at: SystemTime) -> SystemTime {
    saturating_add(at, Duration::from_millis(1))
}

/// How a route is named in errors: its label, or `default`.
fn route_name(label: Option<&str>) -> String {
    label.unwrap_or("default").to_owned()
}

/// The error for a bundle that could not be judged: its check panicked, or the clock did.
fn internal(route: Option<&str>, bundle: &CertBundle, message: String) -> Error {
    Error::Internal {
        route: route_name(route),
        origin: bundle.origin().clone(),
        message,
    }
}
