//! Items handed to the consumer on the thread that produced them, before they travel down the
//! stream: how the reload core installs a rotation on the file watcher's own thread, without
//! waiting for a runtime worker to wake up and poll it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::{BoxCertSource, CertBundle, Error, FileSource};

/// A consumer that a source hands each item to, on the thread that produced it, right before
/// the source sends the same item down its stream.
///
/// The contract, for a source that accepts one ([`attach`]):
/// - `offer` is called once for every item the stream will yield, errors included, in the
///   order the stream yields them, and before the stream can yield that item: a consumer that
///   counts offers and counts items knows which item is which.
/// - It is called on whatever thread produced the item (for [`FileSource`], notify's thread
///   or a blocking thread), never on a runtime worker, and one call at a time.
/// - The item still travels down the stream afterwards; what `offer` does is the consumer's
///   business (the reload core installs a bundle it accepts, and skips it when it arrives).
///
/// `offer` must not call back into the source (for [`FileSource`], into the file watcher):
/// it may run on the watcher's own thread.
pub trait Inline: Send + Sync + fmt::Debug + 'static {
    /// The next item of the stream, before it is sent.
    fn offer(&self, item: Result<&CertBundle, &Error>);
}

/// A [`CertSource`](crate::CertSource) that can be type-erased and still be recognised by
/// [`attach`]: every `'static` source is one. [`BoxCertSource`] holds one.
pub trait AnySource: crate::CertSource + Any {}

impl<S> AnySource for S where S: crate::CertSource + Any {}

/// Offers `hook` to `source`, which takes it if it knows how to hand items over on their
/// producer's thread: a [`FileSource`], as built or boxed once ([`BoxCertSource`]). A source
/// wrapped in a combinator (or in anything else) does not take it: the combinator may change,
/// delay or drop items, and the hook would then see items the stream never yields.
///
/// Returns whether the source took it; a source takes one hook, once.
///
/// ```
/// use std::sync::Arc;
/// use tls_source::inline::{Inline, attach};
/// use tls_source::{CertBundle, CertSourceExt as _, Error, FileSource};
///
/// #[derive(Debug)]
/// struct Log;
///
/// impl Inline for Log {
///     fn offer(&self, item: Result<&CertBundle, &Error>) {
///         if let Ok(bundle) = item {
///             println!("about to yield {}", bundle.origin());
///         }
///     }
/// }
///
/// let files = FileSource::kubernetes_dir("/etc/tls").build();
/// assert!(attach(&files, Arc::new(Log)));
/// let deduplicated = FileSource::kubernetes_dir("/etc/tls").build().dedup();
/// assert!(!attach(&deduplicated, Arc::new(Log)));
/// ```
pub fn attach(source: &dyn Any, hook: Arc<dyn Inline>) -> bool {
    if let Some(files) = source.downcast_ref::<FileSource>() {
        return files.attach(hook);
    }
    if let Some(boxed) = source.downcast_ref::<BoxCertSource>() {
        let inner: &dyn AnySource = boxed.as_ref().get_ref();
        return attach(inner as &dyn Any, hook);
    }
    false
}
