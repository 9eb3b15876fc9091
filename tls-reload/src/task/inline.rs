//! A rotation installed on the thread that read it: a static route whose source is
//! [`Inline`](tls_source::inline::Inline) (a [`FileSource`](tls_source::FileSource) is) hands
//! each item to the reload core on the producer's own thread (the file watcher's), and the
//! engine takes it there, under the same lock as the reload task's batches. So a rotation waits
//! neither for a runtime worker to wake nor for a busy runtime: the new certificate is served as
//! soon as it is read and validated. An item taken here is not yielded by the stream: every
//! item is delivered once.
//!
//! Order: the hook hands an item back (to go down the stream) while the core cannot take it
//! (the task has not started, or has stopped; the clock cannot be read), and then also every
//! later item until the task has handled all that went down the stream (the handoff counts
//! them, the task counts what it handled, under the core's lock): an older item still on its
//! way never lands after a newer one. Timers the engine
//! arms here are handed to the task, which owns them, with a wake of their own.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use tls_source::inline::{Handoff, Hook, Item};
use tls_source::panic_message;
use tokio::sync::Notify;

use super::{Applier, Apply, Contained, Timing, run_batch};
use crate::engine::{Engine, Input};

/// A static route's end of the handoff: what went down the stream, what the task received.
#[derive(Debug, Default)]
pub(crate) struct Route {
    /// The source's handoff (which counts what went down the stream), once attached.
    handoff: OnceLock<Handoff>,
    /// How many items of this route's stream the task has handled. Written under the core's
    /// lock.
    received: AtomicU64,
    /// The core and the route's id, once the task runs.
    target: OnceLock<(Weak<dyn Offer>, usize)>,
}

impl Route {
    /// Attaches this hook to `handoff`; whether it was.
    pub(crate) fn attach(self: &Arc<Self>, handoff: &Handoff) -> bool {
        let attached = handoff.attach(self.clone());
        if attached {
            let _ = self.handoff.set(handoff.clone());
        }
        attached
    }

    pub(crate) fn connect(&self, core: Weak<dyn Offer>, id: usize) {
        let _ = self.target.set((core, id));
    }

    /// The task handled one item of this route's stream (under the core's lock).
    pub(crate) fn received(&self) {
        self.received.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether an item that went down the stream (handed back, or offered before the hook
    /// was attached) is still on its way to the task (under the core's lock).
    fn in_flight(&self) -> bool {
        self.handoff
            .get()
            .is_some_and(|h| h.returned() != self.received.load(Ordering::Acquire))
    }
}

impl Hook for Route {
    fn take(&self, item: Item) -> Option<Item> {
        let core = self
            .target
            .get()
            .and_then(|(core, id)| Some((core.upgrade()?, *id)));
        match core {
            Some((core, id)) => core.offer(id, item, self),
            None => Some(item),
        }
    }
}

/// The core as the hook sees it (erased over the [`Apply`]).
pub(crate) trait Offer: Send + Sync + 'static {
    /// Handles `item` of static route `id` now, or hands it back to go down the stream.
    fn offer(&self, id: usize, item: Item, route: &Route) -> Option<Item>;
}

/// The engine and where its effects land, shared by the reload task and the inline hooks.
pub(crate) struct Shared<A> {
    core: Mutex<Core<A>>,
    clock: Contained,
    /// Woken when an inline batch panicked.
    pub(crate) wake: Notify,
    /// An inline batch left timers in [`Core::timers`]; `timers_left` wakes the task for them.
    pending: AtomicBool,
    timers_left: Notify,
}

pub(crate) struct Core<A> {
    pub(crate) engine: Engine,
    pub(crate) apply: A,
    /// Timer effects of inline batches, for the task to apply.
    pub(crate) timers: Vec<Timing>,
    /// Inline batches are taken until the task stops its sources.
    pub(crate) open: bool,
    /// An inline batch panicked outside the engine's own containment: the task ends with it.
    pub(crate) panicked: Option<String>,
}

impl<A: Apply> Shared<A> {
    pub(crate) fn new(engine: Engine, apply: A, clock: Contained) -> Self {
        Self {
            core: Mutex::new(Core {
                engine,
                apply,
                timers: Vec::new(),
                open: true,
                panicked: None,
            }),
            clock,
            wake: Notify::new(),
            pending: AtomicBool::new(false),
            timers_left: Notify::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Core<A>> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn clock(&self) -> &Contained {
        &self.clock
    }

    /// Ready when inline batches left timers for the task.
    pub(crate) async fn pending(&self) {
        while !self.pending.load(Ordering::Acquire) {
            self.timers_left.notified().await;
        }
    }

    /// Takes the timers inline batches left (under the core's lock).
    pub(crate) fn take_timers(&self, core: &mut Core<A>) -> Vec<Timing> {
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut core.timers)
    }
}

impl<A: Apply + Send + 'static> Offer for Shared<A> {
    fn offer(&self, id: usize, item: Item, route: &Route) -> Option<Item> {
        let mut core = self.lock();
        if !core.open || core.panicked.is_some() || route.in_flight() {
            return Some(item);
        }
        // A clock that cannot be read: the task judges the item when it arrives.
        let Ok(now) = self.clock.read() else {
            return Some(item);
        };
        let core = &mut *core;
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_batch(core, vec![Input::Route(id, item)], now, Applier::Inline)
        }));
        match run {
            Ok(timers) => {
                if !timers.is_empty() {
                    core.timers.extend(timers);
                    self.pending.store(true, Ordering::Release);
                    self.timers_left.notify_one();
                }
            }
            Err(panic) => {
                core.panicked = Some(panic_message(panic.as_ref()));
                self.wake.notify_one();
            }
        }
        None
    }
}

/// The hooks of the static routes, by route id.
pub(crate) type Routes = Vec<Arc<Route>>;
