//! Fleet state in etcd: one writer elected on an etcd lease ([`WriterLease`]), and writes fenced
//! by its round ([`FencedKeys`]): the parts a fleet's shared state builds on outside
//! Kubernetes, as `tls_k8s::store`'s Lease and fenced Secrets do inside it.
//!
//! The round is the holder key's `create_revision`: etcd's own, raised by every take of the
//! key, so there is no counter to read and write. Every write of the fleet's state is one
//! transaction comparing it: a writer paused past its lease (a stopped process, a partition)
//! writes nothing once another took the key.
//!
//! Every replica follows the state with [`watch_prefix`] (a list, then a watch resumed from
//! the last revision seen); [`object`] is the JSON of a value with its private keys sealed.

mod fenced;
mod lease;
pub mod object;

pub use fenced::{Fence, FencedError, FencedKeys};
pub use lease::{DEFAULT_RETRY_PERIOD, DEFAULT_TTL, Leadership, LeaseHandle, WriterLease};

use futures::StreamExt as _;
use futures::stream::BoxStream;

pub use crate::watch::Event;
use crate::watch::{Range, Watch};

/// Every key under `prefix`: listed at one revision (in pages), then watched from the next; a
/// broken watch resumed from the last revision seen, on the next endpoint; a compacted
/// revision listed again ([`Event::Listing`] .. [`Event::Listed`]). Failures are reported as
/// [`Event::Failed`] and retried with a backoff. Nothing is requested until the stream is
/// first polled; dropping it closes the watch.
pub fn watch_prefix(etcd: crate::Etcd, prefix: impl Into<String>) -> BoxStream<'static, Event> {
    Watch::new(etcd, Range::Prefix(prefix.into()))
        .into_stream()
        .boxed()
}
