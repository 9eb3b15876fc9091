//! The reload task: the thin loop around the [`Engine`]. It owns the sources (one
//! `SelectAll`, each source's panics caught) and the [`Timers`], hands the engine each batch
//! of inputs and each due timer with the clock's `now`, and applies the effects it returns
//! through an [`Apply`]: the server's resolver and status ([`Server`]), or the client side's
//! identity ([`ClientTls`](crate::ClientTls)).
//!
//! # How it works
//!
//! Shared by the server and `ClientTls`. It owns the
//! sources (one `SelectAll`, each single source without a hook behind `dedup`, each polled through
//! `catch_unwind`: one that panics is dropped and becomes `Input::Panicked`, its routes marked
//! `stopped`). Each keyed source runs on a task of its own once the reload task runs (a
//! `Pump`: a bounded channel of 2,048 items, four of kube's list pages, into the `SelectAll`, so decoding a Secret overlaps
//! validating the ones before; stopped and awaited before the task reports how it ended, so
//! "ended" still means "dropped its sources"; aborted if the task is dropped); static routes
//! are polled in place. `inline.rs`: the engine and the `Apply` sit behind one mutex, shared with each static route's
//! hook on an `Inline` source's `Handoff` (`tls_source::inline`): a bundle a `FileSource` reads
//! runs through the engine on the thread that read it (the watcher's), so a rotation waits
//! neither for a runtime worker to wake nor for a busy runtime, and that thread yields its core
//! right after the install (`Applier::Inline`), so a handshake sharing the core is served the new
//! certificate before the events, status and layout that follow. What the hook takes is not
//! yielded down the stream (each item is delivered once); while anything that went down the
//! stream has not been handled by the task (the handoff counts what went, the task what it
//! handled, under the lock), the hook hands later items back too, so an older item never lands
//! after a newer one. The timers it arms go to the task, which owns them, with a wake of their
//! own; a panic there ends the task as `Ended::Panicked`. It takes batches of up to 64 items, reads the validator's clock (a clock that panics
//! is contained: the batch's bundles are rejected, reason `internal`) and applies the effects
//! through `Apply` (`Server`: the resolver, the trust config, the status channel). `timers.rs`:
//! one timer per `Due` on tokio time, fired only once the clock reaches its time (a clock behind
//! tokio's is looked at again after 10 ms, not spun on); a `DelayQueue` panics past about 795
//! days and a certificate can be valid until 9999, so a timer is armed at most `MAX_TIMER` (a
//! year) ahead and armed again until it is due. Containment needs `panic = "unwind"`.

mod inline;
mod timers;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt as _, StreamExt as _};
use rustls::pki_types::CertificateDer;
use tls_source::clock::Clock;
use tls_source::{BoxCertSource, BoxKeyedCertSource, CertSourceExt as _, panic_message};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client_auth::TrustConfig;
use crate::engine::{Due, Effect, Engine, Input, Kind, Place, Publish, TrustItem, TrustSet};
use crate::status::Ended;
use crate::tls::{CertResolver, RouteName, Slot, Table, TableEdit};
use crate::{Status, Validated, Validator};
pub(crate) use timers::Timers;
#[cfg(feature = "accept")]
pub(crate) use timers::sleep_until;

/// The most items taken from the sources in one go before the latest wins.
const MAX_BATCH: usize = 64;

/// Where the effects land.
pub(crate) trait Apply {
    /// Whether the events are counted in the metrics (the server's; the client side's are not).
    const METRICS: bool;
    /// Serve a validated certificate in `slot` (`None`: the default, or the client identity);
    /// `default`: it is the default route's (in its own slot under strict SNI).
    fn install(&mut self, slot: Option<&Arc<Slot>>, validated: &Validated, default: bool);
    /// Serve from this SNI table.
    fn table(&mut self, table: Table);
    /// Edit the SNI table served: each name to its slot now (`None`: removed).
    fn table_edit(&mut self, edits: &[TableEdit]);
    /// Trust these client CAs.
    fn trust(&mut self, roots: &[CertificateDer<'static>], invalidate: bool);
    /// Show the batch's status changes.
    fn publish(&mut self, publish: Publish);
}

/// How many items a keyed source's pump may have ready before it waits for the reload task:
/// four of kube's list pages (500 objects each), so the watcher fetches and decodes the next
/// pages while the ones before are validated (a start of 50,000 measured 20 to 30% faster
/// than with half a page).
const PUMP_AHEAD: usize = 2048;

/// The sources, each item tagged with where it goes.
#[derive(Default)]
pub(crate) struct Inputs {
    streams: SelectAll<BoxStream<'static, Input>>,
    /// Keyed sources not pumped yet: they start with the task (a built task may be run later,
    /// on the runtime that runs it).
    keyed: Vec<BoxStream<'static, Input>>,
    pumps: Vec<Pump>,
    /// Each static route's inline hook, by route id ([`inline`]).
    inline: inline::Routes,
}

impl Inputs {
    /// The source of static route `id` (routes are added in the order of their ids). An
    /// [`Inline`](tls_source::inline::Inline) source (its handoff kept in the box) is given the
    /// route's hook, and what it takes never comes down the stream. Unchanged material is
    /// skipped here for the others; the engine skips it in any case (by digest), which an
    /// inline route relies on, since a `dedup` here would not see what the hook took.
    pub(crate) fn route(&mut self, id: usize, source: BoxCertSource) {
        debug_assert_eq!(id, self.inline.len(), "static routes are added in order");
        let hook = Arc::new(inline::Route::default());
        let inline = source.handoff().is_some_and(|handoff| hook.attach(handoff));
        self.inline.push(hook);
        let source = if inline {
            source.left_stream()
        } else {
            source.dedup().right_stream()
        };
        let tagged = guarded(source, Place::Route(id), move |item| Input::Route(id, item));
        self.streams.push(tagged.boxed());
    }

    /// Keyed source number `index`.
    pub(crate) fn keyed(&mut self, index: usize, source: BoxKeyedCertSource) {
        self.keyed
            .push(guarded(source, Place::Keyed(index), move |item| {
                Input::Keyed(index, item)
            }));
    }

    /// The client-CA source of its own.
    pub(crate) fn trust(&mut self, source: BoxStream<'static, TrustItem>) {
        self.streams
            .push(guarded(source, Place::Trust, Input::Trust).boxed());
    }

    /// Starts each keyed source on a task of its own, feeding the reload task through a
    /// bounded channel: what a keyed source does per item (a Secret's JSON decoded, its PEM
    /// read, its digest taken) runs beside the validation and installation of the items
    /// before, instead of before them. Static routes are polled by the reload task itself:
    /// a rotation's path stays one hop short.
    fn start(&mut self) {
        for mut source in self.keyed.drain(..) {
            let (tx, mut rx) = tokio::sync::mpsc::channel(PUMP_AHEAD);
            let task = tokio::spawn(async move {
                while let Some(item) = source.next().await {
                    if tx.send(item).await.is_err() {
                        break;
                    }
                }
            });
            self.pumps.push(Pump(task));
            self.streams
                .push(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed());
        }
    }

    /// Drops every source, the pumped ones included, and waits until they are gone.
    async fn stop(self) {
        let Self { streams, pumps, .. } = self;
        drop(streams);
        for pump in pumps {
            pump.stop().await;
        }
    }
}

/// A keyed source's pump task, aborted when dropped (the reload task dropped unfinished).
struct Pump(tokio::task::JoinHandle<()>);

impl Pump {
    /// Aborts the task and waits until it is gone (and with it, its source).
    async fn stop(mut self) {
        self.0.abort();
        // Its outcome says nothing new: it ended, was aborted, or its source's panic was
        // caught and reported as an input already.
        let _ = (&mut self.0).await;
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the builder hands the server's task.
pub(crate) struct Plan {
    pub(crate) default: Option<BoxCertSource>,
    pub(crate) named: Vec<(RouteName, BoxCertSource)>,
    pub(crate) keyed: Vec<BoxKeyedCertSource>,
    /// With client authentication: the set, the config side, and the source of its own.
    pub(crate) trust: Option<(TrustSet, TrustConfig, Option<BoxStream<'static, TrustItem>>)>,
    /// Strict SNI: the default certificate is served by its names only, like a route.
    pub(crate) strict: bool,
    /// Ready once the static routes serve, without waiting for the keyed sources' lists.
    pub(crate) ready_before_lists: bool,
}

/// The server's effects: the resolver and the status.
pub(crate) struct Server {
    /// Weak: the task must not keep the resolver alive (it ends when the resolver is gone).
    pub(crate) resolver: Weak<CertResolver>,
    pub(crate) trust: Option<TrustConfig>,
    pub(crate) status: watch::Sender<Status>,
}

impl Plan {
    /// The engine and its inputs: static routes are numbered in the order their sources are
    /// tagged (the default first).
    pub(crate) fn start(self, validator: Validator) -> (Engine, Inputs, Option<TrustConfig>) {
        let mut inputs = Inputs::default();
        let mut statics = Vec::new();
        if let Some(source) = self.default {
            inputs.route(statics.len(), source);
            statics.push(Kind::Default);
        }
        for (name, source) in self.named {
            inputs.route(statics.len(), source);
            statics.push(Kind::Named(name));
        }
        let keyed = self.keyed.len();
        for (index, source) in self.keyed.into_iter().enumerate() {
            inputs.keyed(index, source);
        }
        let (set, config) = match self.trust {
            Some((set, config, source)) => {
                if let Some(source) = source {
                    inputs.trust(source);
                }
                (Some(set), Some(config))
            }
            None => (None, None),
        };
        let mut engine = Engine::new(validator, statics, set);
        engine.keyed_sources(keyed, !self.ready_before_lists);
        if self.strict {
            engine.serve_default_by_name();
        }
        (engine, inputs, config)
    }
}

impl Apply for Server {
    const METRICS: bool = true;

    fn install(&mut self, slot: Option<&Arc<Slot>>, validated: &Validated, default: bool) {
        let certified = Arc::clone(validated.certified_key());
        if default && let Some(resolver) = self.resolver.upgrade() {
            resolver.store_default_addrs(&validated.info().ip_addresses, &certified);
        }
        match slot {
            Some(slot) => slot.store(Some(certified)),
            None => {
                if let Some(resolver) = self.resolver.upgrade() {
                    resolver.store_default(certified);
                }
            }
        }
    }

    fn table(&mut self, table: Table) {
        if let Some(resolver) = self.resolver.upgrade() {
            resolver.store_table(table);
        }
    }

    fn table_edit(&mut self, edits: &[TableEdit]) {
        if let Some(resolver) = self.resolver.upgrade() {
            resolver.edit_table(edits);
        }
    }

    fn trust(&mut self, roots: &[CertificateDer<'static>], invalidate: bool) {
        if let Some(config) = self.trust.as_mut()
            && let Err(err) = config.apply(roots, invalidate)
        {
            tracing::error!(error = %err, "cannot build the client-authentication config; keeping the previous one");
        }
    }

    fn publish(&mut self, publish: Publish) {
        let Publish {
            ready,
            routes,
            removed,
            trust,
        } = publish;
        self.status.send_if_modified(|s| {
            let modified =
                s.ready != ready || !removed.is_empty() || trust.is_some() || !routes.is_empty();
            if let Some((cas, error)) = trust {
                s.client_cas = cas;
                s.client_ca_error = error;
            }
            s.ready = ready;
            let mut named = Vec::with_capacity(routes.len());
            for (label, status) in routes {
                match label {
                    None => s.set_default(&status),
                    Some(label) => named.push((label, status)),
                }
            }
            if !removed.is_empty() || !named.is_empty() {
                // Copied only if a reader still holds a snapshot of it (once per snapshot).
                let map = Arc::make_mut(&mut s.routes);
                for label in &removed {
                    map.remove(label);
                }
                map.extend(named);
            }
            modified
        });
    }
}

/// Runs `engine` until cancelled, `gone` (every handle is gone), or every source has ended.
/// The engine's first effects (the static routes in the status) are applied before this
/// returns, so a status read right after the build already lists every route.
///
/// The engine and `apply` are shared with the static routes' inline hooks ([`inline`]): a
/// batch runs under their lock, here or on the thread that read a file.
pub(crate) fn run<A: Apply + Send + 'static>(
    mut engine: Engine,
    mut inputs: Inputs,
    mut apply: A,
    clock: Arc<dyn Clock>,
    cancel: CancellationToken,
    gone: CancellationToken,
) -> impl Future<Output = Ended> + Send + 'static {
    crate::metrics::describe();
    let clock = Contained(clock);
    let mut timers = Timers::default();
    let effects = engine.start();
    let due = apply_effects(effects, &mut apply, Applier::Task);
    set_timers(due, &mut timers, &clock);
    let shared = Arc::new(inline::Shared::new(engine, apply, clock));
    async move {
        // Connected when the task runs: a built task that is never run installs nothing.
        let offer: Arc<dyn inline::Offer> = shared.clone();
        for (id, route) in inputs.inline.iter().enumerate() {
            route.connect(Arc::downgrade(&offer), id);
        }
        drop(offer);
        inputs.start();
        let clock = shared.clock();
        let ended = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break Ended::Cancelled,
                () = gone.cancelled() => break Ended::HandlesDropped,
                () = shared.wake.notified() => {
                    let mut core = shared.lock();
                    if let Some(message) = core.panicked.take() {
                        break Ended::Panicked { message };
                    }
                }
                () = shared.pending() => {
                    let mut core = shared.lock();
                    let due = shared.take_timers(&mut core);
                    drop(core);
                    set_timers(due, &mut timers, clock);
                }
                Some(due) = timers.next(clock), if !timers.is_empty() => {
                    let mut core = shared.lock();
                    // Inline batches' timers first: they happened before this one.
                    let mut pending = shared.take_timers(&mut core);
                    let effects = core.engine.due(due, clock.now());
                    pending.extend(apply_effects(effects, &mut core.apply, Applier::Task));
                    drop(core);
                    set_timers(pending, &mut timers, clock);
                }
                item = inputs.streams.next() => {
                    let Some(first) = item else { break Ended::SourcesEnded };
                    let mut batch = vec![first];
                    let mut ended = false;
                    while batch.len() < MAX_BATCH {
                        match inputs.streams.next().now_or_never() {
                            Some(Some(item)) => batch.push(item),
                            Some(None) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    let mut core = shared.lock();
                    // Counted under the lock, as handled: a route's hook takes items again
                    // once nothing it handed back is on its way (`inline`).
                    for input in &batch {
                        if let Input::Route(id, _) = input {
                            inputs.inline[*id].received();
                        }
                    }
                    // Inline batches' timers first: they happened before this one.
                    let mut pending = shared.take_timers(&mut core);
                    let timings = match clock.read() {
                        Ok(now) => run_batch(&mut core, batch, now, Applier::Task),
                        Err(message) => {
                            let effects = core.engine.unjudged(batch, &message, SystemTime::now());
                            apply_effects(effects, &mut core.apply, Applier::Task)
                        }
                    };
                    pending.extend(timings);
                    drop(core);
                    set_timers(pending, &mut timers, clock);
                    if ended {
                        break Ended::SourcesEnded;
                    }
                }
            }
        };
        // No more inline batches: what the task ended with stays what is served.
        shared.lock().open = false;
        // The sources go first, so that "ended" means "dropped its sources".
        inputs.stop().await;
        ended
    }
}

/// A timer to arm or cancel, left by [`apply_effects`] for the task's [`Timers`].
pub(crate) enum Timing {
    Arm(Due, SystemTime),
    Cancel(Due),
}

/// Who applies a batch's effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applier {
    /// The reload task, on a runtime worker.
    Task,
    /// A source's own thread (a file watcher's), handing a rotation over inline: after each
    /// install it yields, so that a handshake sharing its core gets the new certificate before
    /// the bookkeeping that follows (the events, the status, the source's new layout).
    Inline,
}

/// Applies `effects` through `apply`, in order, but for the timers': those are returned, for
/// the task's [`Timers`] ([`set_timers`]).
fn apply_effects<A: Apply>(effects: Vec<Effect>, apply: &mut A, by: Applier) -> Vec<Timing> {
    let mut due = Vec::new();
    for effect in effects {
        match effect {
            Effect::Install {
                slot,
                validated,
                default,
            } => {
                apply.install(slot.as_ref(), &validated, default);
                if by == Applier::Inline {
                    std::thread::yield_now();
                }
            }
            Effect::Table(table) => apply.table(table),
            Effect::TableEdit(edits) => apply.table_edit(&edits),
            Effect::Trust { roots, invalidate } => apply.trust(&roots, invalidate),
            Effect::Publish(publish) => apply.publish(publish),
            Effect::Event(event) => event.emit(A::METRICS),
            Effect::Arm(timer, at) => due.push(Timing::Arm(timer, at)),
            Effect::Cancel(timer) => due.push(Timing::Cancel(timer)),
        }
    }
    due
}

/// Handles `batch` at `now` and applies its effects in two steps: the installs as soon as the
/// inputs are handled, then the table and the status ([`Engine::handle`]). Returns the timers.
fn run_batch<A: Apply>(
    core: &mut inline::Core<A>,
    batch: Vec<Input>,
    now: SystemTime,
    by: Applier,
) -> Vec<Timing> {
    let mut due = apply_effects(core.engine.handle(batch, now), &mut core.apply, by);
    due.extend(apply_effects(core.engine.finish(), &mut core.apply, by));
    due
}

/// Arms and cancels the timers [`apply_effects`] returned.
fn set_timers(timings: Vec<Timing>, timers: &mut Timers, clock: &dyn Clock) {
    for timing in timings {
        match timing {
            Timing::Arm(due, at) => timers.arm(due, at, clock),
            Timing::Cancel(due) => timers.cancel(due),
        }
    }
}

/// The validator's clock, with a panic in it contained: a clock is code of the user's, read
/// outside the engine's own containment.
#[derive(Debug)]
pub(crate) struct Contained(Arc<dyn Clock>);

impl Contained {
    fn read(&self) -> Result<SystemTime, String> {
        std::panic::catch_unwind(AssertUnwindSafe(|| self.0.now())).map_err(|panic| {
            let message = panic_message(panic.as_ref());
            tracing::error!(panic = %message, "the clock panicked; what needs it is refused");
            message
        })
    }
}

impl Clock for Contained {
    /// The clock's time, or the system's when it panics.
    fn now(&self) -> SystemTime {
        self.read().unwrap_or_else(|_| SystemTime::now())
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
