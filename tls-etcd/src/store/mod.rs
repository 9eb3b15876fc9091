//! Fleet state in etcd: one writer elected on an etcd lease ([`WriterLease`]), and writes fenced
//! by its round ([`FencedKeys`]): the parts a fleet's shared state builds on outside
//! Kubernetes, as `tls_k8s::store`'s Lease and fenced Secrets do inside it.
//!
//! The round is the holder key's `create_revision`: etcd's own, raised by every take of the
//! key, so there is no counter to read and write. Every write of the fleet's state is one
//! transaction comparing it: a writer paused past its lease (a stopped process, a partition)
//! writes nothing once another took the key.

mod fenced;
mod lease;

pub use fenced::{Fence, FencedError, FencedKeys};
pub use lease::{DEFAULT_RETRY_PERIOD, DEFAULT_TTL, Leadership, LeaseHandle, WriterLease};
