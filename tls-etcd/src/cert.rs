//! [`EtcdCertSource`]: one certificate, kept at one etcd key.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use tls_source::{CertBundle, Decoder, Digest};

use crate::connect::Etcd;
use crate::watch::{Event, Range, Watch};
use crate::{Error, value};

/// A [`CertSource`](tls_source::CertSource) of the certificate at one etcd key (a JSON value
/// with `tls.crt`, `tls.key` and an optional `ca.crt`, each PEM text: see [`value`](crate::value)),
/// yielding a bundle milliseconds after each put.
///
/// - Lists the key, then watches it from the revision listed; a watch that breaks (a member
///   killed, a lost connection, an election inside etcd) resumes from the last revision seen,
///   on the next endpoint; a revision compacted meanwhile means reading the key again, never a
///   gap.
/// - Yields only when the value's bytes change. The bundle's origin names the key and its
///   `mod_revision`.
/// - Every problem is an `Err` naming the key, and the source carries on; the reload core keeps
///   the last good certificate: a value that is not the JSON above, a bad PEM, a key that does
///   not match the chain (refused by the core), the key deleted (and a new put is picked up),
///   etcd unreachable.
/// - Until the key holds a certificate the reload core is not ready.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_etcd::{Etcd, EtcdCertSource};
/// use tls_reload::Reloader;
///
/// let etcd = Etcd::builder(["127.0.0.1:2379"]).build()?;
/// let reloader = Reloader::spawn(EtcdCertSource::new(etcd, "/tls-rotation/certs/web"))?;
/// reloader.ready().await?;
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct EtcdCertSource {
    key: String,
    inner: BoxStream<'static, Result<CertBundle, tls_source::Error>>,
}

impl EtcdCertSource {
    /// The certificate at `key` (the whole etcd key, e.g. `/tls-rotation/certs/web`), with
    /// values up to 1 MiB.
    pub fn new(etcd: Etcd, key: impl Into<String>) -> Self {
        Self::with_decoder(etcd, key, Decoder::new())
    }

    /// [`new`](Self::new) with a decoder of the caller's (its size limit applies to the whole
    /// value).
    pub fn with_decoder(etcd: Etcd, key: impl Into<String>, decoder: Decoder) -> Self {
        let key = key.into();
        let mut state = State {
            key: key.clone(),
            decoder,
            last: None,
            present: None,
            listed: false,
        };
        let inner = Watch::new(etcd, Range::Key(key.clone()))
            .into_stream()
            .filter_map(move |event| futures::future::ready(state.event(event)))
            .boxed();
        Self { key, inner }
    }

    /// The etcd key watched.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Stream for EtcdCertSource {
    type Item = Result<CertBundle, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for EtcdCertSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCertSource")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

type Item = Result<CertBundle, tls_source::Error>;

struct State {
    key: String,
    decoder: Decoder,
    /// The digest of the value last passed on; `None` after any error, so that the same value
    /// afterwards is passed on again.
    last: Option<Digest>,
    /// Whether the key held a value when last heard of (`None` before the first list).
    present: Option<bool>,
    /// Whether the (re)list under way held the key.
    listed: bool,
}

impl State {
    fn event(&mut self, event: Event) -> Option<Item> {
        match event {
            Event::Listing => {
                self.listed = false;
                None
            }
            Event::Put {
                key,
                value,
                revision,
            } if key == self.key => {
                self.listed = true;
                self.present = Some(true);
                let (digest, item) = value::read(&self.key, &value, revision, &self.decoder);
                if self.last == Some(digest) {
                    return None; // the same bytes put again
                }
                self.last = Some(digest);
                Some(item)
            }
            Event::Listed if self.listed => None,
            Event::Delete { key } if key == self.key => self.absent(),
            // The (re)list did not hold it: never put, or deleted while the watch was down.
            Event::Listed => self.absent(),
            Event::Put { .. } | Event::Delete { .. } => None,
            Event::Failed(err) => self.report(err),
        }
    }

    fn absent(&mut self) -> Option<Item> {
        match self.present.replace(false) {
            Some(false) => None,
            Some(true) => self.report(Error::Deleted {
                key: self.key.clone(),
            }),
            None => self.report(Error::NotFound {
                key: self.key.clone(),
            }),
        }
    }

    fn report(&mut self, err: Error) -> Option<Item> {
        self.last = None;
        Some(Err(tls_source::Error::source(
            format!("etcd {}", self.key),
            err,
        )))
    }
}
