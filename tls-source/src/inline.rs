//! Items handed to the consumer on the thread that produced them, instead of down the stream:
//! how the reload core installs a rotation on the file watcher's own thread, without waiting for
//! a runtime worker to wake up and poll it.
//!
//! The capability is a value, not a method of [`CertSource`] (which every stream is, by a
//! blanket impl): a source that can hand items over returns an [`Inline`] (the stream and its
//! [`Handoff`]), as [`FileSourceBuilder::build`](crate::FileSourceBuilder::build) does.
//! [`Inline::boxed_source`] (or [`IntoCertSource`]) keeps the handoff in the [`BoxCertSource`],
//! where the consumer finds it. Any source can opt in:
//!
//! ```
//! use tls_source::inline::{Handoff, Inline};
//! use tls_source::{BoxCertSource, CertBundle, Error};
//!
//! /// A source fed by a thread of its own (a client library's callback, say).
//! fn pushed() -> Inline<futures::channel::mpsc::UnboundedReceiver<Result<CertBundle, Error>>> {
//!     let (tx, rx) = futures::channel::mpsc::unbounded();
//!     let handoff = Handoff::new();
//!     let offers = handoff.clone();
//!     std::thread::spawn(move || {
//!         # let items: Vec<Result<CertBundle, Error>> = Vec::new();
//!         for item in items {
//!             // The consumer's hook first; what it hands back goes down the stream, in order.
//!             if let Some(item) = offers.offer(item) {
//!                 let _ = tx.unbounded_send(item);
//!             }
//!         }
//!     });
//!     Inline::new(rx, handoff)
//! }
//!
//! let boxed: BoxCertSource = pushed().boxed_source();
//! assert!(boxed.handoff().is_some());
//! ```
//!
//! The contract, for a source and a consumer that attached a [`Hook`]:
//! - Every item goes once to the consumer: taken by the hook, or handed back by it and then
//!   yielded by the stream. Items are offered in the order they are produced, one at a time; an
//!   item handed back is yielded before any later item is offered.
//! - The hook runs on whatever thread produced the item (for [`FileSource`], the watcher's or a
//!   blocking thread), never on a runtime worker it does not own.
//! - The hook must not call back into the source: it may run on the source's own thread.
//! - Without a hook attached, every item goes down the stream, as from any source.
//!
//! [`FileSource`]: crate::FileSource

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;

use crate::{CertBundle, CertSource, Debounce, Dedup, Error, Fallback};

/// What a source yields: a bundle, or a report.
pub type Item = Result<CertBundle, Error>;

/// A consumer's end of a [`Handoff`]: takes an item on the thread that produced it, or hands it
/// back to travel down the stream.
pub trait Hook: Send + Sync + fmt::Debug + 'static {
    /// Takes `item` (`None`: the consumer has it, and the stream will not yield it), or hands
    /// it back (`Some`): the source yields it down its stream.
    fn take(&self, item: Item) -> Option<Item>;
}

/// Where a source meets its consumer's [`Hook`]. The source keeps a clone and offers each
/// item here before it would send it down its stream; the consumer attaches the hook, once.
#[derive(Clone, Default)]
pub struct Handoff {
    hook: Arc<OnceLock<Arc<dyn Hook>>>,
    /// How many items `offer` returned to go down the stream.
    returned: Arc<AtomicU64>,
}

impl Handoff {
    /// A handoff with no hook yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The source's side: gives `item` to the hook, if one is attached, on this thread. Returns
    /// what the source must yield down its stream: the item, when no hook is attached or the
    /// hook handed it back; nothing when the hook took it. A hook that panics took the item
    /// (the panic is logged; a consumer's hook contains its own, as the reload core's does).
    pub fn offer(&self, item: Item) -> Option<Item> {
        let back = match self.hook.get() {
            None => Some(item),
            Some(hook) => std::panic::catch_unwind(AssertUnwindSafe(|| hook.take(item)))
                .unwrap_or_else(|panic| {
                    let message = crate::panic_message(panic.as_ref());
                    tracing::error!(panic = %message, "the consumer's inline hook panicked");
                    None
                }),
        };
        if back.is_some() {
            self.returned.fetch_add(1, Ordering::AcqRel);
        }
        back
    }

    /// How many items [`offer`](Self::offer) has returned to go down the stream, hook or not:
    /// what the stream has yielded or will. A consumer that counts what it received knows
    /// whether an item handed back is still on its way (and takes nothing before it lands).
    pub fn returned(&self) -> u64 {
        self.returned.load(Ordering::Acquire)
    }

    /// The consumer's side: attaches `hook`. Returns whether it was attached (a handoff takes
    /// one hook, once).
    pub fn attach(&self, hook: Arc<dyn Hook>) -> bool {
        self.hook.set(hook).is_ok()
    }

    /// Whether a hook is attached.
    pub fn is_attached(&self) -> bool {
        self.hook.get().is_some()
    }
}

impl fmt::Debug for Handoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoff")
            .field("attached", &self.is_attached())
            .finish()
    }
}

/// A source that can hand its items over on the thread that produced them: the stream and its
/// [`Handoff`]. Not a stream itself, so that it cannot be polled (or wrapped) by mistake with
/// its handoff left behind: box it ([`boxed_source`](Self::boxed_source), or any API taking
/// [`IntoCertSource`]) to keep the handoff, or take the stream alone
/// ([`into_inner`](Self::into_inner), or the combinators below, which change or drop items and
/// so end the handoff there). Derefs to the source, for its own methods
/// ([`FileSource::trigger`](crate::FileSource::trigger)).
#[must_use = "a source does nothing until it is polled"]
pub struct Inline<S> {
    source: S,
    handoff: Handoff,
}

impl<S: CertSource> Inline<S> {
    /// `source`, which offers each item to `handoff` before it would yield it.
    pub fn new(source: S, handoff: Handoff) -> Self {
        Self { source, handoff }
    }

    /// The stream alone. Nothing is handed over then (no one can attach a hook).
    pub fn into_inner(self) -> S {
        self.source
    }

    /// The stream and its handoff.
    pub fn into_parts(self) -> (S, Handoff) {
        (self.source, self.handoff)
    }

    /// The handoff, for a consumer that polls the stream itself.
    pub fn handoff(&self) -> &Handoff {
        &self.handoff
    }

    /// Boxes the source with its handoff.
    pub fn boxed_source(self) -> BoxCertSource
    where
        S: 'static,
    {
        BoxCertSource {
            stream: Box::pin(self.source),
            handoff: Some(self.handoff),
        }
    }

    /// The stream, deduplicated ([`CertSourceExt::dedup`](crate::CertSourceExt::dedup)).
    pub fn dedup(self) -> Dedup<S> {
        Dedup::new(self.source)
    }

    /// The stream, debounced ([`CertSourceExt::debounce`](crate::CertSourceExt::debounce)).
    pub fn debounce(self, quiet: Duration) -> Debounce<S> {
        Debounce::new(self.source, quiet)
    }

    /// The stream with a fallback
    /// ([`CertSourceExt::fallback`](crate::CertSourceExt::fallback)).
    pub fn fallback<T: CertSource>(self, secondary: T) -> Fallback<S, T> {
        Fallback::new(self.source, secondary)
    }
}

impl<S> Deref for Inline<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.source
    }
}

impl<S> DerefMut for Inline<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.source
    }
}

impl<S: fmt::Debug> fmt::Debug for Inline<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inline")
            .field("source", &self.source)
            .field("handoff", &self.handoff)
            .finish()
    }
}

/// A type-erased [`CertSource`], for sources chosen at run time, with the [`Handoff`] of an
/// [`Inline`] source when it was boxed from one.
#[must_use = "streams do nothing unless polled"]
pub struct BoxCertSource {
    stream: Pin<Box<dyn CertSource>>,
    handoff: Option<Handoff>,
}

impl BoxCertSource {
    /// Boxes `source` (no handoff: see [`Inline::boxed_source`]). A `BoxCertSource` is returned
    /// as it is, its handoff kept.
    pub fn new<S: CertSource + 'static>(source: S) -> Self {
        // Not boxed twice: the one type this looks for is this one.
        let mut slot = Some(source);
        if let Some(boxed) = (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<Self>>() {
            return boxed.take().expect("just put");
        }
        Self {
            stream: Box::pin(slot.expect("not taken")),
            handoff: None,
        }
    }

    /// The handoff of the [`Inline`] source this was boxed from.
    pub fn handoff(&self) -> Option<&Handoff> {
        self.handoff.as_ref()
    }
}

impl Stream for BoxCertSource {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.stream.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.stream.size_hint()
    }
}

impl fmt::Debug for BoxCertSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxCertSource")
            .field("handoff", &self.handoff)
            .finish_non_exhaustive()
    }
}

/// What the builders of this workspace take as a source: any [`CertSource`], or an [`Inline`]
/// one (whose handoff is kept).
pub trait IntoCertSource {
    /// Boxes the source, keeping an [`Inline`] source's handoff.
    fn into_cert_source(self) -> BoxCertSource;
}

impl<S: CertSource + 'static> IntoCertSource for S {
    fn into_cert_source(self) -> BoxCertSource {
        BoxCertSource::new(self)
    }
}

impl<S: CertSource + 'static> IntoCertSource for Inline<S> {
    fn into_cert_source(self) -> BoxCertSource {
        self.boxed_source()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;
    use crate::CertSourceExt as _;

    #[derive(Debug)]
    struct TakeAll;

    impl Hook for TakeAll {
        fn take(&self, _: Item) -> Option<Item> {
            None
        }
    }

    #[derive(Debug)]
    struct Panics;

    impl Hook for Panics {
        fn take(&self, _: Item) -> Option<Item> {
            panic!("a hook's bug")
        }
    }

    fn error() -> Item {
        Err(Error::source("test", "a report"))
    }

    #[test]
    fn an_item_goes_down_the_stream_until_a_hook_takes_it() {
        let handoff = Handoff::new();
        assert!(
            handoff.offer(error()).is_some(),
            "no hook: the stream yields it"
        );
        assert!(handoff.attach(Arc::new(TakeAll)));
        assert!(!handoff.attach(Arc::new(TakeAll)), "one hook, once");
        assert!(handoff.offer(error()).is_none(), "taken: never yielded");
        assert_eq!(handoff.returned(), 1, "what went down the stream");
    }

    #[test]
    fn a_hook_that_panics_took_the_item() {
        let handoff = Handoff::new();
        handoff.attach(Arc::new(Panics));
        assert!(handoff.offer(error()).is_none());
    }

    #[tokio::test]
    async fn boxing_keeps_the_handoff_once_and_a_combinator_ends_it() {
        let inline = Inline::new(futures::stream::iter([error()]), Handoff::new());
        let boxed = inline.into_cert_source();
        assert!(boxed.handoff().is_some());
        // Boxed again (as a builder taking any source does): the same box, handoff kept.
        let again = boxed.boxed_source();
        assert!(again.handoff().is_some());
        let mut plain = futures::stream::iter([error()]).boxed_source();
        assert!(plain.handoff().is_none());
        assert!(plain.next().await.is_some_and(|item| item.is_err()));

        let deduplicated = Inline::new(futures::stream::iter([error()]), Handoff::new()).dedup();
        assert!(deduplicated.into_cert_source().handoff().is_none());
    }
}
