//! [`EtcdCertsSource`]: every certificate under an etcd prefix, through one watch.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use tls_seal::Seal;
use tls_source::{Keyed, KeyedState, KeyedUpdate};

use crate::connect::Etcd;
use crate::value::{self, Reader};
use crate::watch::{Event, Range, Watch};

/// A [`KeyedCertSource`](tls_source::KeyedCertSource) of every certificate under an etcd
/// prefix, through **one** watch, for SNI: give it to `tls_reload::Builder::routes` and each
/// certificate is served for the DNS names (and IP addresses) it holds.
///
/// - The key of each update is the etcd key with the prefix removed (`web` for
///   `/tls-rotation/certs/web` under `/tls-rotation/certs/`).
/// - The prefix is listed at one revision, in pages (10,000 certificates are more than one gRPC
///   message holds), announced by [`Listing`](KeyedUpdate::Listing) and
///   [`Listed`](KeyedUpdate::Listed): the reload core is ready once the whole list is in.
/// - A put whose bytes changed is a [`Put`](KeyedUpdate::Put) (or, for a bad value,
///   [`Invalid`](KeyedUpdate::Invalid): the key's last good certificate keeps serving); a
///   deleted key is a [`Remove`](KeyedUpdate::Remove): its routes go.
/// - A broken watch resumes from the last revision seen, on the next endpoint; a revision
///   compacted meanwhile means listing again, and keys that went away meanwhile are removed.
///   Watch failures are `Err` items naming the prefix.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_etcd::{Etcd, EtcdCertsSource};
/// use tls_reload::Reloader;
///
/// let etcd = Etcd::builder(["127.0.0.1:2379"]).build()?;
/// let reloader = Reloader::builder()
///     .routes(EtcdCertsSource::new(etcd, "/tls-rotation/certs/"))
///     .spawn_routes()?;
/// reloader.ready().await?; // the whole prefix listed
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct EtcdCertsSource {
    prefix: String,
    inner: BoxStream<'static, Result<Keyed, tls_source::Error>>,
}

/// Configures an [`EtcdCertsSource`]; made by [`EtcdCertsSource::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct EtcdCertsSourceBuilder {
    etcd: Etcd,
    prefix: String,
    reader: Reader,
}

impl fmt::Debug for EtcdCertsSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCertsSourceBuilder")
            .field("prefix", &self.prefix)
            .field("seal", &self.reader.seal)
            .finish_non_exhaustive()
    }
}

impl EtcdCertsSourceBuilder {
    /// The largest value accepted, in bytes (default 1 MiB): each whole JSON value.
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.reader.decoder = self.reader.decoder.max_size(bytes);
        self
    }

    /// Opens sealed private keys (`"tls.key.sealed"`) with `seal`; a key that does not open is
    /// reported for its route, which keeps its last good certificate.
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.reader.seal = Some(seal);
        self
    }

    /// Builds the source. Nothing is requested until the stream is first polled.
    pub fn build(self) -> EtcdCertsSource {
        let mut state = State {
            prefix: self.prefix.clone(),
            reader: self.reader,
            keys: KeyedState::new(),
        };
        let inner = Watch::new(self.etcd, Range::Prefix(self.prefix.clone()))
            .into_stream()
            .flat_map(move |event| futures::stream::iter(state.event(event)))
            .boxed();
        EtcdCertsSource {
            prefix: self.prefix,
            inner,
        }
    }
}

impl EtcdCertsSource {
    /// Every certificate under `prefix` (e.g. `/tls-rotation/certs/`), with values up to 1 MiB.
    pub fn new(etcd: Etcd, prefix: impl Into<String>) -> Self {
        Self::builder(etcd, prefix).build()
    }

    /// Starts configuring a source for every certificate under `prefix`.
    pub fn builder(etcd: Etcd, prefix: impl Into<String>) -> EtcdCertsSourceBuilder {
        EtcdCertsSourceBuilder {
            etcd,
            prefix: prefix.into(),
            reader: Reader::default(),
        }
    }

    /// The prefix watched.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Stream for EtcdCertsSource {
    type Item = Result<Keyed, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for EtcdCertsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCertsSource")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

type Item = Result<Keyed, tls_source::Error>;

struct State {
    prefix: String,
    reader: Reader,
    /// What has been passed on, by name.
    keys: KeyedState,
}

impl State {
    fn event(&mut self, event: Event) -> Vec<Item> {
        match event {
            Event::Listing => vec![Ok(self.keys.listing())],
            Event::Put {
                key,
                value,
                revision,
            } => {
                let Some(name) = self.name(&key) else {
                    return Vec::new();
                };
                if !self.keys.changed(&name, value::digest(&value)) {
                    return Vec::new(); // the same bytes put (or listed) again: not read again
                }
                let update = match value::bundle(&key, &value, revision, &self.reader) {
                    Ok(bundle) => KeyedUpdate::Put(bundle),
                    Err(err) => KeyedUpdate::Invalid(err),
                };
                vec![Ok(Keyed { key: name, update })]
            }
            Event::Delete { key } => self
                .name(&key)
                .and_then(|name| self.keys.remove(&name))
                .map(Ok)
                .into_iter()
                .collect(),
            // Whatever the relist no longer holds was deleted while the watch was down.
            Event::Listed => self.keys.listed().into_iter().map(Ok).collect(),
            Event::Failed(err) => vec![Err(tls_source::Error::source(
                format!("etcd certificates under {}", self.prefix),
                err,
            ))],
        }
    }

    /// The name of an etcd key under the prefix; `None` for the prefix itself.
    fn name(&self, key: &str) -> Option<String> {
        key.strip_prefix(&self.prefix)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
    }
}
