//! The reload task: one driver for every route, fed by every source.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt as _, StreamExt as _};
use tls_source::clock::Validity;
use tls_source::{
    BoxCertSource, BoxKeyedCertSource, CertBundle, CertSourceExt as _, Digest, Keyed, KeyedUpdate,
    panic_message,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use rustls::pki_types::CertificateDer;

use crate::client_auth::{Trust, TrustItem};
use crate::error::Rfc3339;
use crate::status::{Ended, RouteStatus};
use crate::tls::{CertResolver, RouteName, Slot, Table};
use crate::{Error, Status, Validated, Validator};

/// A `tracing` event about a route's certificate, with the fields every such event carries.
macro_rules! cert_event {
    ($level:ident, $info:expr, $route:expr, $($rest:tt)+) => {
        tracing::$level!(
            fingerprint = %$info.fingerprint_sha256,
            not_after = %Rfc3339($info.not_after),
            origin = %$info.origin,
            route = $route.as_deref(),
            $($rest)+
        )
    };
}

/// The most items taken from the sources in one go before the latest wins.
const MAX_BATCH: usize = 64;

/// The longest a timer is armed for. tokio-util's `DelayQueue` takes deadlines up to about
/// 795 days (2^36 ms) and panics past that; a certificate can be valid until 9999. A deadline
/// further away is armed at this, with the rest carried in the entry and armed again when it
/// fires ([`Driver::on_expired`]), until it is due.
const MAX_TIMER: Duration = Duration::from_secs(365 * 24 * 3600);

/// A route's place in [`Driver::routes`].
type RouteId = usize;

/// What a route serves, and what it is checked against.
#[derive(Debug)]
enum Kind {
    /// The certificate served when no SNI route matches.
    Default,
    /// A route with a name of its own: the leaf must cover it.
    Named(RouteName),
    /// A route of a keyed source, served by the DNS names of its certificate (its key is the
    /// label).
    Keyed,
}

/// One item from one source.
enum Input {
    Route(RouteId, Result<CertBundle, tls_source::Error>),
    Keyed(usize, Result<Keyed, tls_source::Error>),
    /// The client-CA trust source of its own.
    Trust(TrustItem),
    /// A source panicked in `poll_next`; it has been dropped.
    Panicked(Place, String),
}

/// Which source an input came from.
#[derive(Debug, Clone, Copy)]
enum Place {
    Route(RouteId),
    Keyed(usize),
    Trust,
}

/// What an input is about, for latest-wins within a batch: a route of a single source, or a
/// key of a keyed source. A keyed source's own errors are about no one route.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Target {
    Route(RouteId),
    Key(usize, String),
    Trust,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// A not-yet-valid bundle is tried again.
    Retry,
    /// The served certificate enters the expiry-warning window.
    Expiring,
    /// The served certificate expires.
    Expired,
    /// A client CA's overlap ends (with client authentication; on the default route).
    TrustLeaves,
}

struct Route {
    kind: Kind,
    /// Where the route is shown in the status (`None`: the top-level fields).
    label: Option<String>,
    /// Where its certificate goes: its own slot in the SNI table, or (`None`) the resolver's
    /// default.
    slot: Option<Arc<Slot>>,
    /// The digest and names of the certificate installed.
    installed: Option<(Digest, Vec<RouteName>)>,
    status: RouteStatus,
    retry: Option<(delay_queue::Key, CertBundle)>,
    expiring: Option<delay_queue::Key>,
    expired: Option<delay_queue::Key>,
}

/// The sources, each item tagged with where it goes.
pub(crate) struct Inputs(SelectAll<BoxStream<'static, Input>>);

/// Owns every route's state; runs inside the reload task.
pub(crate) struct Driver {
    validator: Validator,
    /// Weak: the task must not keep the resolver alive (it ends when the resolver is gone).
    resolver: Weak<CertResolver>,
    status: watch::Sender<Status>,
    routes: Vec<Option<Route>>,
    /// Keyed routes by (source, key).
    keyed: BTreeMap<(usize, String), RouteId>,
    /// Places of removed keyed routes, for reuse.
    free: Vec<RouteId>,
    /// How many routes are static (the default and the named ones), all at the front.
    statics: usize,
    /// Each entry: the route, the timer, and how much of its wait is left after this one
    /// ([`MAX_TIMER`]).
    timers: DelayQueue<(RouteId, Timer, Duration)>,
    table_dirty: bool,
    /// Routes whose status changed in this batch, and labels of routes removed: published
    /// together at the end of the batch, after the SNI table, so that a status never says a
    /// certificate is in before the resolver serves it.
    changed: Vec<RouteId>,
    removed: Vec<String>,
    /// Client authentication: the trusted CAs (from the default route's bundles), the timer of
    /// the next CA to leave, and whether the status must show a change.
    trust: Option<Trust>,
    trust_timer: Option<delay_queue::Key>,
    trust_dirty: bool,
    /// Why the client-CA source's last input was not taken.
    trust_error: Option<Arc<Error>>,
}

/// What the builder hands the driver.
pub(crate) struct Plan {
    pub(crate) default: Option<BoxCertSource>,
    pub(crate) named: Vec<(RouteName, BoxCertSource)>,
    pub(crate) keyed: Vec<BoxKeyedCertSource>,
    pub(crate) trust: Option<Trust>,
}

// ===== impl Driver =====

impl Driver {
    pub(crate) fn new(
        validator: Validator,
        resolver: Weak<CertResolver>,
        status: watch::Sender<Status>,
        plan: Plan,
    ) -> (Self, Inputs) {
        let mut inputs = SelectAll::new();
        let mut routes = Vec::new();
        let mut add =
            |kind: Kind, label: Option<String>, slot: Option<Arc<Slot>>, source: BoxCertSource| {
                let id = routes.len();
                let names = match &kind {
                    Kind::Named(name) => vec![name.to_string()],
                    _ => Vec::new(),
                };
                routes.push(Some(Route {
                    kind,
                    label,
                    slot,
                    installed: None,
                    status: RouteStatus {
                        names,
                        ..RouteStatus::default()
                    },
                    retry: None,
                    expiring: None,
                    expired: None,
                }));
                // Unchanged material is skipped once, here, for every route.
                inputs.push(guarded(source.dedup(), Place::Route(id), move |item| {
                    Input::Route(id, item)
                }));
            };
        if let Some(source) = plan.default {
            add(Kind::Default, None, None, source);
        }
        for (name, source) in plan.named {
            add(
                Kind::Named(name.clone()),
                Some(name.to_string()),
                Some(Arc::default()),
                source,
            );
        }
        for (index, source) in plan.keyed.into_iter().enumerate() {
            inputs.push(guarded(source, Place::Keyed(index), move |item| {
                Input::Keyed(index, item)
            }));
        }
        let mut trust = plan.trust;
        if let Some(source) = trust.as_mut().and_then(Trust::take_source) {
            inputs.push(guarded(source, Place::Trust, Input::Trust));
        }
        let statics = routes.len();
        let mut driver = Self {
            validator,
            resolver,
            status,
            routes,
            keyed: BTreeMap::new(),
            free: Vec::new(),
            statics,
            timers: DelayQueue::new(),
            table_dirty: true,
            // The static routes are in the status from the start.
            changed: (0..statics).collect(),
            removed: Vec::new(),
            trust,
            trust_timer: None,
            trust_dirty: false,
            trust_error: None,
        };
        driver.finish_batch();
        (driver, Inputs(inputs))
    }

    /// Runs until cancelled, every handle is gone, or every source has ended.
    pub(crate) async fn run(
        mut self,
        mut inputs: Inputs,
        cancel: CancellationToken,
        gone: CancellationToken,
    ) -> Ended {
        crate::metrics::describe();
        let ended = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break Ended::Cancelled,
                () = gone.cancelled() => break Ended::HandlesDropped,
                Some(expired) = self.timers.next(), if !self.timers.is_empty() => {
                    let (id, timer, rest) = expired.into_inner();
                    self.on_expired(id, timer, rest);
                    self.finish_batch();
                }
                item = inputs.0.next() => {
                    let Some(first) = item else { break Ended::SourcesEnded };
                    let mut batch = vec![first];
                    let mut ended = false;
                    while batch.len() < MAX_BATCH {
                        match inputs.0.next().now_or_never() {
                            Some(Some(item)) => batch.push(item),
                            Some(None) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    self.handle(batch);
                    self.finish_batch();
                    if ended {
                        break Ended::SourcesEnded;
                    }
                }
            }
        };
        // The sources go first, so that "ended" means "dropped its sources".
        drop(inputs);
        ended
    }

    /// Handles a batch in order; of several bundles for one route only the last is considered
    /// (latest wins), and anything newer for a route cancels its pending retry.
    fn handle(&mut self, batch: Vec<Input>) {
        // Only new material supersedes: a later bundle (or removal) for the same route. A
        // later error does not, or a good bundle followed at once by a report (a watch that
        // fails right after delivering an update) would never be installed.
        let target = |input: &Input| match input {
            Input::Route(id, Ok(_)) => Some(Target::Route(*id)),
            Input::Keyed(
                source,
                Ok(Keyed {
                    key,
                    update: KeyedUpdate::Put(_) | KeyedUpdate::Remove,
                }),
            ) => Some(Target::Key(*source, key.clone())),
            Input::Trust(Ok(_)) => Some(Target::Trust),
            _ => None,
        };
        let mut last = HashMap::new();
        for (i, input) in batch.iter().enumerate() {
            if let Some(t) = target(input) {
                last.insert(t, i);
            }
        }
        for (i, input) in batch.into_iter().enumerate() {
            let superseded = target(&input).is_some_and(|t| last.get(&t) != Some(&i));
            match input {
                Input::Route(id, Ok(bundle)) => self.put(id, bundle, superseded),
                Input::Route(id, Err(err)) => self.source_error(id, err),
                Input::Keyed(source, Ok(Keyed { key, update })) => match update {
                    KeyedUpdate::Put(bundle) => {
                        let id = self.keyed_route(source, key);
                        self.put(id, bundle, superseded);
                    }
                    KeyedUpdate::Invalid(err) => {
                        let id = self.keyed_route(source, key);
                        self.source_error(id, err);
                    }
                    KeyedUpdate::Remove => self.remove_keyed(source, &key),
                    _ => {}
                },
                Input::Trust(item) if !superseded => self.trust_from_source(item),
                Input::Trust(_) => {}
                Input::Panicked(place, message) => self.source_panicked(place, &message),
                Input::Keyed(source, Err(err)) => {
                    tracing::warn!(error = %err, "certificate source error; keeping the current certificates");
                    crate::metrics::source_error(None);
                    let err = Arc::new(Error::Source(err));
                    let ids: Vec<_> = self
                        .keyed
                        .range((source, String::new())..(source + 1, String::new()))
                        .map(|(_, id)| *id)
                        .collect();
                    for id in ids {
                        self.record(id, Arc::clone(&err));
                    }
                }
            }
        }
    }

    fn put(&mut self, id: RouteId, bundle: CertBundle, superseded: bool) {
        self.cancel_timer(id, Timer::Retry);
        if superseded {
            tracing::debug!(origin = %bundle.origin(), "certificate superseded by a newer one before it was checked");
        } else {
            self.consider(id, bundle);
        }
    }

    fn source_error(&mut self, id: RouteId, err: tls_source::Error) {
        self.cancel_timer(id, Timer::Retry);
        let route = self.route_label(id);
        tracing::warn!(error = %err, route, "certificate source error; keeping the current certificate");
        let err = Error::Source(err);
        crate::metrics::source_error(route);
        if err.is_undecodable_input() {
            crate::metrics::rejected(route, err.reason());
        }
        self.record(id, Arc::new(err));
    }

    /// The keyed route for `key`, made on first sight.
    fn keyed_route(&mut self, source: usize, key: String) -> RouteId {
        if let Some(id) = self.keyed.get(&(source, key.clone())) {
            return *id;
        }
        let route = Some(Route {
            label: Some(key.clone()),
            kind: Kind::Keyed,
            slot: Some(Arc::default()),
            installed: None,
            status: RouteStatus::default(),
            retry: None,
            expiring: None,
            expired: None,
        });
        // A removed route's place is reused (its timers went with it), so churn does not grow
        // the table of routes.
        let id = match self.free.pop() {
            Some(id) => {
                self.routes[id] = route;
                id
            }
            None => {
                self.routes.push(route);
                self.routes.len() - 1
            }
        };
        self.keyed.insert((source, key), id);
        id
    }

    fn remove_keyed(&mut self, source: usize, key: &str) {
        let Some(id) = self.keyed.remove(&(source, key.to_owned())) else {
            return;
        };
        for timer in [Timer::Retry, Timer::Expiring, Timer::Expired] {
            self.cancel_timer(id, timer);
        }
        if let Some(route) = self.routes[id].take() {
            self.free.push(id);
            tracing::info!(route = key, "route removed");
            if route.installed.is_some() {
                self.table_dirty = true;
            }
            self.removed.push(key.to_owned());
        }
    }

    /// Validates a bundle for its route and installs it, or records why not.
    fn consider(&mut self, id: RouteId, bundle: CertBundle) {
        let Some(route) = self.routes[id].as_mut() else {
            return;
        };
        if route.installed.as_ref().map(|(d, _)| *d) == Some(bundle.digest()) {
            // The same material again, e.g. after a transient error: a recovery, not a rotation.
            if !route.status.expired && route.status.last_error.take().is_some() {
                tracing::info!(origin = %bundle.origin(), route = route.label.as_deref(), "certificate source recovered; certificate unchanged");
                crate::metrics::recovered(route.label.as_deref());
                self.publish(id);
            }
            return;
        }
        let Some(route) = self.routes[id].as_ref() else {
            return;
        };
        // Checking changes nothing, so a panic in it (a parser's, a user clock's) is contained
        // here: the input is rejected and every route, timer and status stays as it was.
        let checked = std::panic::catch_unwind(AssertUnwindSafe(|| self.check(route, &bundle)))
            .unwrap_or_else(|panic| {
                let message = panic_message(panic.as_ref());
                tracing::error!(route = route.label.as_deref().unwrap_or("default"), origin = %bundle.origin(), panic = %message, "checking a certificate panicked; rejected, keeping the current certificate");
                Err(Error::Internal {
                    route: route.label.clone().unwrap_or_else(|| "default".to_owned()),
                    origin: bundle.origin().clone(),
                    message,
                })
            });
        match checked {
            Ok(validated) => self.install(id, &validated),
            Err(err) => {
                if !matches!(err, Error::Internal { .. }) {
                    tracing::warn!(error = %err, route = route.label.as_deref(), "certificate rejected; keeping the current certificate");
                }
                crate::metrics::rejected(route.label.as_deref(), err.reason());
                if let Error::NotYetValid { not_before, .. } = &err {
                    let key = self.arm(id, Timer::Retry, self.until(*not_before));
                    if let Some(route) = self.routes[id].as_mut() {
                        route.retry = Some((key, bundle));
                    }
                }
                self.record(id, Arc::new(err));
            }
        }
    }

    /// Whether `bundle` may be served on `route`: the validator, then the route kind's own
    /// rules. Pure: it changes no state.
    fn check(&self, route: &Route, bundle: &CertBundle) -> Result<Validated, Error> {
        #[cfg(feature = "__test-hooks")]
        crate::hooks::before_check(bundle);
        match &route.kind {
            Kind::Default
                if self.trust.as_ref().is_some_and(Trust::is_the_bundles)
                    && bundle.ca().is_empty() =>
            {
                Err(Error::NoClientCa {
                    origin: bundle.origin().clone(),
                })
            }
            Kind::Default => self.validator.validate(bundle),
            Kind::Named(name) => self.validator.validate_for(bundle, &name.to_string()),
            Kind::Keyed => self.validator.validate(bundle).and_then(|v| {
                if v.info().dns_names.is_empty() {
                    Err(Error::NoNames {
                        origin: bundle.origin().clone(),
                    })
                } else {
                    Ok(v)
                }
            }),
        }
    }

    /// A source panicked and was dropped: its routes keep their certificates, and say they
    /// will not rotate.
    fn source_panicked(&mut self, place: Place, message: &str) {
        let ids: Vec<RouteId> = match place {
            Place::Route(id) => vec![id],
            Place::Keyed(source) => self
                .keyed
                .range((source, String::new())..(source + 1, String::new()))
                .map(|(_, id)| *id)
                .collect(),
            Place::Trust => {
                tracing::error!(panic = %message, "the client CA source panicked and was dropped; keeping the trusted CAs, which will not change again");
                crate::metrics::rejected(None, "internal");
                self.trust_error = Some(Arc::new(Error::SourcePanicked {
                    route: "client CAs".to_owned(),
                    message: message.to_owned(),
                }));
                self.trust_dirty = true;
                return;
            }
        };
        tracing::error!(?place, routes = ids.len(), panic = %message, "a certificate source panicked and was dropped; its routes keep their certificates and will not rotate");
        for id in ids {
            self.cancel_timer(id, Timer::Retry);
            let label = self.route_label(id).map(str::to_owned);
            crate::metrics::rejected(label.as_deref(), "internal");
            if let Some(route) = self.routes[id].as_mut() {
                route.status.stopped = true;
            }
            let route = label.unwrap_or_else(|| "default".to_owned());
            self.record(
                id,
                Arc::new(Error::SourcePanicked {
                    route,
                    message: message.to_owned(),
                }),
            );
        }
    }

    fn install(&mut self, id: RouteId, validated: &Validated) {
        #[cfg(feature = "__test-hooks")]
        crate::hooks::before_install(validated.info());
        for timer in [Timer::Expiring, Timer::Expired] {
            self.cancel_timer(id, timer);
        }
        let window = self.validator.policy().expiry_warning_window();
        let info = validated.info().clone();
        let now = self.validator.clock().now();
        let until_expiring = info
            .not_after
            .checked_sub(window)
            .and_then(|at| at.duration_since(now).ok());
        let expired = Validity::at(now, info.not_before, info.not_after) == Validity::Expired;
        let expiring_key = until_expiring.map(|wait| self.arm(id, Timer::Expiring, wait));
        let expired_key = (!expired).then(|| {
            let wait = self.until(info.not_after) + Duration::from_millis(1);
            self.arm(id, Timer::Expired, wait)
        });
        let Some(route) = self.routes[id].as_mut() else {
            return;
        };
        let names = match &route.kind {
            Kind::Keyed => info
                .dns_names
                .iter()
                .filter_map(|n| RouteName::parse(n).ok())
                .collect(),
            _ => Vec::new(),
        };
        if matches!(route.kind, Kind::Keyed)
            && route.installed.as_ref().map(|(_, n)| n) != Some(&names)
        {
            self.table_dirty = true;
        }
        let certified = Arc::clone(validated.certified_key());
        match &route.slot {
            Some(slot) => slot.store(Some(certified)),
            None => {
                if let Some(resolver) = self.resolver.upgrade() {
                    resolver.store_default(certified);
                }
            }
        }
        route.installed = Some((validated.digest(), names));
        route.expiring = expiring_key;
        route.expired = expired_key;
        let status = &mut route.status;
        status.generation += 1;
        status.last_error = None;
        status.expiring = until_expiring.is_none();
        status.expired = expired;
        if matches!(route.kind, Kind::Keyed) {
            status.names.clone_from(&info.dns_names);
        }
        cert_event!(
            info,
            info,
            route.label,
            generation = status.generation,
            "certificate installed"
        );
        crate::metrics::installed(route.label.as_deref(), &info);
        if status.expiring {
            cert_event!(
                warn,
                info,
                route.label,
                "installed certificate expires soon"
            );
        }
        status.current = Some(info);
        let default = matches!(route.kind, Kind::Default);
        self.publish(id);
        if default {
            self.set_trust(id, validated.ca());
        }
    }

    /// With client authentication: the CAs of the default bundle just installed become the
    /// trust (the certificate and the trust it came with change in the same batch).
    fn set_trust(&mut self, id: RouteId, cas: &[CertificateDer<'static>]) {
        let now = self.validator.clock().now();
        let Some(trust) = self.trust.as_mut().filter(|t| t.is_the_bundles()) else {
            return;
        };
        let next = trust.set(cas, now);
        self.trust_changed(id, next);
    }

    /// What the trust source of its own yielded: the new trust once every certificate in it
    /// parses; otherwise nothing changes.
    fn trust_from_source(&mut self, item: TrustItem) {
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
                let now = self.validator.clock().now();
                if let Some(trust) = self.trust.as_mut() {
                    let next = trust.set(&cas, now);
                    // The timer's route id is unused for the trust: any place will do.
                    self.trust_changed(0, next);
                }
            }
            Err(reason) => {
                tracing::warn!(error = %reason, "client CA source: keeping the trusted CAs");
                self.trust_error = Some(Arc::new(Error::ClientCas { reason }));
                self.trust_dirty = true;
            }
        }
    }

    /// Publishes the trust and arms the timer of the next CA to leave.
    fn trust_changed(&mut self, id: RouteId, next: Result<Option<SystemTime>, rustls::Error>) {
        self.trust_dirty = true;
        if let Some(key) = self.trust_timer.take() {
            self.timers.try_remove(&key);
        }
        match next {
            Ok(Some(at)) => {
                let wait = self.until(at) + Duration::from_millis(1);
                self.trust_timer = Some(self.arm(id, Timer::TrustLeaves, wait));
            }
            Ok(None) => {}
            Err(err) => {
                tracing::error!(error = %err, "cannot build the client-authentication config; keeping the previous one");
            }
        }
    }

    /// A timer fired: armed short of its deadline ([`MAX_TIMER`]), it is armed again for the
    /// `rest` (unless it was cancelled meanwhile); due, it is handled.
    fn on_expired(&mut self, id: RouteId, timer: Timer, rest: Duration) {
        if rest.is_zero() {
            return self.on_timer(id, timer);
        }
        if self.key_of(id, timer).is_none() {
            return;
        }
        let key = self.arm(id, timer, rest);
        if let Some(slot) = self.key_of(id, timer) {
            *slot = key;
        }
    }

    /// Where the key of an armed timer is kept.
    fn key_of(&mut self, id: RouteId, timer: Timer) -> Option<&mut delay_queue::Key> {
        if let Timer::TrustLeaves = timer {
            return self.trust_timer.as_mut();
        }
        let route = self.routes[id].as_mut()?;
        match timer {
            Timer::Retry => route.retry.as_mut().map(|(key, _)| key),
            Timer::Expiring => route.expiring.as_mut(),
            Timer::Expired => route.expired.as_mut(),
            Timer::TrustLeaves => None,
        }
    }

    fn on_timer(&mut self, id: RouteId, timer: Timer) {
        if matches!(timer, Timer::TrustLeaves) {
            self.trust_timer = None;
            let now = self.validator.clock().now();
            if let Some(trust) = self.trust.as_mut() {
                let next = trust.expire(now);
                self.trust_changed(id, next);
            }
            return;
        }
        let Some(route) = self.routes[id].as_mut() else {
            return;
        };
        match timer {
            Timer::Retry => {
                if let Some((_, bundle)) = route.retry.take() {
                    self.consider(id, bundle);
                }
            }
            Timer::TrustLeaves => {}
            Timer::Expiring => {
                route.expiring = None;
                route.status.expiring = true;
                if let Some(info) = &route.status.current {
                    cert_event!(
                        warn,
                        info,
                        route.label,
                        "the served certificate expires soon and has not been replaced"
                    );
                }
                self.publish(id);
            }
            Timer::Expired => {
                route.expired = None;
                let Some(info) = route.status.current.clone() else {
                    return;
                };
                let now = self.validator.clock().now();
                if Validity::at(now, info.not_before, info.not_after) != Validity::Expired {
                    // The timer ran ahead of the wall clock: look again shortly.
                    let wait = self.until(info.not_after) + Duration::from_millis(1);
                    let key = self.arm(id, Timer::Expired, wait.max(Duration::from_millis(10)));
                    if let Some(route) = self.routes[id].as_mut() {
                        route.expired = Some(key);
                    }
                    return;
                }
                let err = Error::ServedExpired {
                    origin: info.origin.clone(),
                    not_after: info.not_after,
                };
                tracing::warn!(error = %err, route = route.label.as_deref(), "the served certificate has expired");
                route.status.expired = true;
                route.status.expiring = true;
                route.status.last_error = Some(Arc::new(err));
                self.publish(id);
            }
        }
    }

    /// How long until `at` on the validator's clock (zero if past).
    fn until(&self, at: SystemTime) -> Duration {
        at.duration_since(self.validator.clock().now())
            .unwrap_or_default()
    }

    /// Arms `timer` to fire in `wait`: at most [`MAX_TIMER`] ahead, the rest carried in the
    /// entry for [`on_expired`](Self::on_expired).
    fn arm(&mut self, id: RouteId, timer: Timer, wait: Duration) -> delay_queue::Key {
        let now = wait.min(MAX_TIMER);
        self.timers.insert((id, timer, wait - now), now)
    }

    fn cancel_timer(&mut self, id: RouteId, timer: Timer) {
        let Some(route) = self.routes[id].as_mut() else {
            return;
        };
        let key = match timer {
            Timer::Retry => route.retry.take().map(|(key, _)| key),
            Timer::Expiring => route.expiring.take(),
            Timer::Expired => route.expired.take(),
            Timer::TrustLeaves => self.trust_timer.take(),
        };
        if let Some(key) = key {
            self.timers.try_remove(&key);
        }
    }

    fn record(&mut self, id: RouteId, err: Arc<Error>) {
        if let Some(route) = self.routes[id].as_mut() {
            route.status.last_error = Some(err);
            self.publish(id);
        }
    }

    fn route_label(&self, id: RouteId) -> Option<&str> {
        self.routes[id].as_ref().and_then(|r| r.label.as_deref())
    }

    /// Marks a route's status for publishing at the end of the batch.
    fn publish(&mut self, id: RouteId) {
        self.changed.push(id);
    }

    /// After a batch: rebuilds the SNI table if its names changed, and updates readiness.
    fn finish_batch(&mut self) {
        if self.table_dirty {
            self.table_dirty = false;
            let mut table = Table::default();
            for route in self.routes[..self.statics].iter().flatten() {
                if let (Kind::Named(name), Some(slot)) = (&route.kind, &route.slot) {
                    table.insert(name, slot);
                }
            }
            for id in self.keyed.values() {
                let Some((route, slot)) = self.routes[*id]
                    .as_ref()
                    .and_then(|r| Some((r, r.slot.as_ref()?)))
                else {
                    continue;
                };
                for name in route.installed.iter().flat_map(|(_, names)| names) {
                    if !table.insert(name, slot) {
                        tracing::debug!(route = route.label.as_deref(), %name, "name already served by another route");
                    }
                }
            }
            if let Some(resolver) = self.resolver.upgrade() {
                resolver.store_table(table);
            }
        }
        let statics = &self.routes[..self.statics];
        let routes_ready = if statics.is_empty() {
            self.routes.iter().flatten().any(|r| r.installed.is_some())
        } else {
            statics.iter().flatten().all(|r| r.installed.is_some())
        };
        // With client authentication, a server that trusts no CA yet refuses everyone.
        let ready = routes_ready && self.trust.as_ref().is_none_or(Trust::trusts_any);
        crate::metrics::ready(ready);
        let (mut changed, removed) = (
            std::mem::take(&mut self.changed),
            std::mem::take(&mut self.removed),
        );
        changed.sort_unstable();
        changed.dedup();
        let routes = &self.routes;
        let trust = std::mem::take(&mut self.trust_dirty)
            .then(|| self.trust.as_ref().map(Trust::status))
            .flatten();
        let trust_error = &self.trust_error;
        self.status.send_if_modified(|s| {
            let mut modified = s.ready != ready || !removed.is_empty() || trust.is_some();
            if let Some(trust) = trust {
                s.client_cas = trust;
                s.client_ca_error.clone_from(trust_error);
            }
            s.ready = ready;
            for label in &removed {
                s.routes.remove(label);
            }
            for route in changed.iter().filter_map(|id| routes[*id].as_ref()) {
                modified = true;
                match &route.label {
                    None => s.set_default(&route.status),
                    Some(label) => match s.routes.get_mut(label) {
                        Some(published) => published.clone_from(&route.status),
                        None => {
                            s.routes.insert(label.clone(), route.status.clone());
                        }
                    },
                }
            }
            modified
        });
    }
}

/// A source's items as inputs, with a panic in its `poll_next` caught: the source is dropped
/// and [`Input::Panicked`] says so, instead of the panic ending the reload task.
fn guarded<S, F>(source: S, place: Place, tag: F) -> BoxStream<'static, Input>
where
    S: futures::Stream + Send + 'static,
    F: Fn(S::Item) -> Input + Send + 'static,
{
    AssertUnwindSafe(source)
        .catch_unwind()
        .map(move |item| match item {
            Ok(item) => tag(item),
            Err(panic) => Input::Panicked(place, panic_message(panic.as_ref())),
        })
        .boxed()
}
