//! A rotation installed on the thread that read it: a static route whose source is a
//! [`FileSource`](tls_source::FileSource) offers each item to the reload core on the file
//! watcher's own thread ([`tls_source::inline`]), and the engine takes a bundle there, under
//! the same lock as the reload task's batches. So a rotation waits neither for a runtime
//! worker to wake nor for a busy runtime: the new certificate is served as soon as it is read
//! and validated. The item still reaches the task down the stream, which skips what was
//! handled here.
//!
//! Which item is which: the source offers every item it will yield, in order, before yielding
//! it; the route counts offers, the task counts the items it receives from the source (before
//! its `dedup`). An item the task receives numbered at or below the last one handled here is
//! skipped: it was handled, or a later one was (so an older item that was on its way never
//! replaces a newer one). Timers the engine arms here are handed to the task, which owns them.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use tls_source::{CertBundle, panic_message};
use tokio::sync::Notify;

use super::{Applier, Apply, Contained, Timing, run_batch};
use crate::engine::{Engine, Input};

/// A static route's end of the hook: what its source offered and what was handled inline.
#[derive(Debug, Default)]
pub(crate) struct Route {
    /// How many items the source has offered.
    offered: AtomicU64,
    /// The number of the last offered item handled inline (0: none). Written and read under
    /// the core's lock.
    handled: AtomicU64,
    /// The core and the route's id, once the task runs.
    target: OnceLock<(Weak<dyn Offer>, usize)>,
}

impl Route {
    /// Whether the task should skip the item numbered `seq`: it, or a later one, was handled
    /// inline. Only meaningful under the core's lock.
    pub(crate) fn handled(&self, seq: u64) -> bool {
        seq <= self.handled.load(Ordering::Acquire)
    }

    pub(crate) fn connect(&self, core: Weak<dyn Offer>, id: usize) {
        let _ = self.target.set((core, id));
    }
}

impl tls_source::inline::Inline for Route {
    fn offer(&self, item: Result<&CertBundle, &tls_source::Error>) {
        let seq = self.offered.fetch_add(1, Ordering::AcqRel) + 1;
        // Errors take the stream's way: nothing to install, and no hurry.
        let Ok(bundle) = item else { return };
        let Some((core, id)) = self.target.get() else {
            return;
        };
        if let Some(core) = core.upgrade() {
            core.offer(*id, seq, bundle, &self.handled);
        }
    }
}

/// The core as the hook sees it (erased over the [`Apply`]).
pub(crate) trait Offer: Send + Sync + 'static {
    /// Handles `bundle`, item `seq` of static route `id`, now, and records it in `handled`.
    fn offer(&self, id: usize, seq: u64, bundle: &CertBundle, handled: &AtomicU64);
}

/// The engine and where its effects land, shared by the reload task and the inline hooks.
pub(crate) struct Shared<A> {
    core: Mutex<Core<A>>,
    clock: Contained,
    /// Woken when an inline batch panicked.
    pub(crate) wake: Notify,
    /// An inline batch left timers in [`Core::timers`]. Not a wake of its own: the item that
    /// batch handled reaches the task down its source's stream right after (the contract of
    /// [`tls_source::inline`]), and every poll of the task looks at this first. One wake per
    /// rotation, not two.
    pending: AtomicBool,
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
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Core<A>> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn clock(&self) -> &Contained {
        &self.clock
    }

    /// Ready when inline batches left timers for the task: polled on every poll of the task,
    /// it never waits (the source's item that follows each offer wakes the task).
    pub(crate) fn pending(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|_| {
            if self.pending.load(Ordering::Acquire) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }

    /// Takes the timers inline batches left (under the core's lock).
    pub(crate) fn take_timers(&self, core: &mut Core<A>) -> Vec<Timing> {
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut core.timers)
    }
}

impl<A: Apply + Send + 'static> Offer for Shared<A> {
    fn offer(&self, id: usize, seq: u64, bundle: &CertBundle, handled: &AtomicU64) {
        let mut core = self.lock();
        if !core.open || core.panicked.is_some() {
            return;
        }
        // A clock that cannot be read: the task judges the item when it arrives.
        let Ok(now) = self.clock.read() else { return };
        let core = &mut *core;
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_batch(
                core,
                vec![Input::Route(id, Ok(bundle.clone()))],
                now,
                Applier::Inline,
            )
        }));
        handled.store(seq, Ordering::Release);
        match run {
            Ok(timers) => {
                if !timers.is_empty() {
                    core.timers.extend(timers);
                    self.pending.store(true, Ordering::Release);
                }
            }
            Err(panic) => {
                core.panicked = Some(panic_message(panic.as_ref()));
                self.wake.notify_one();
            }
        }
    }
}

/// The hooks of the static routes, by route id.
pub(crate) type Routes = Vec<Arc<Route>>;
