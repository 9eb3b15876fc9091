//! [`EtcdCertSource`]: one certificate, kept at one etcd key.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use tls_seal::Seal;
use tls_source::{CertBundle, Digest};

use crate::connect::Etcd;
use crate::value::Reader;
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

/// Configures an [`EtcdCertSource`]; made by [`EtcdCertSource::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct EtcdCertSourceBuilder {
    etcd: Etcd,
    key: String,
    reader: Reader,
}

impl fmt::Debug for EtcdCertSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCertSourceBuilder")
            .field("key", &self.key)
            .field("seal", &self.reader.seal)
            .finish_non_exhaustive()
    }
}

impl EtcdCertSourceBuilder {
    /// The largest value accepted, in bytes (default 1 MiB): the whole JSON value.
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.reader.decoder = self.reader.decoder.max_size(bytes);
        self
    }

    /// Opens a sealed private key (`"tls.key.sealed"`, as a fleet on etcd writes it with a
    /// seal key) with `seal`. A key that does not open (sealed with a key not in the ring,
    /// altered, or copied from another etcd key) is reported and the last good certificate
    /// keeps serving. The seal's key files are re-read at each change of the value.
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.reader.seal = Some(seal);
        self
    }

    /// Builds the source. Nothing is requested until the stream is first polled.
    pub fn build(self) -> EtcdCertSource {
        let mut state = State {
            key: self.key.clone(),
            reader: self.reader,
            last: None,
            present: None,
            listed: false,
        };
        let inner = Watch::new(self.etcd, Range::Key(self.key.clone()))
            .into_stream()
            .filter_map(move |event| futures::future::ready(state.event(event)))
            .boxed();
        EtcdCertSource {
            key: self.key,
            inner,
        }
    }
}

impl EtcdCertSource {
    /// The certificate at `key` (the whole etcd key, e.g. `/tls-rotation/certs/web`), with
    /// values up to 1 MiB.
    pub fn new(etcd: Etcd, key: impl Into<String>) -> Self {
        Self::builder(etcd, key).build()
    }

    /// Starts configuring a source for the certificate at `key`.
    pub fn builder(etcd: Etcd, key: impl Into<String>) -> EtcdCertSourceBuilder {
        EtcdCertSourceBuilder {
            etcd,
            key: key.into(),
            reader: Reader::default(),
        }
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
    reader: value::Reader,
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
                let digest = value::digest(&value);
                if self.last == Some(digest) {
                    return None; // the same bytes put (or listed) again: not read again
                }
                self.last = Some(digest);
                Some(value::bundle(&self.key, &value, revision, &self.reader))
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tls_seal::{KeyRing, Location, Opened, SealKey};

    use super::*;

    /// A key ring that counts the values it opens.
    #[derive(Debug)]
    struct Counting(KeyRing, AtomicUsize);

    impl Seal for Counting {
        fn seal(&self, at: Location<'_>, plaintext: &[u8]) -> Result<Vec<u8>, tls_seal::Error> {
            self.0.seal(at, plaintext)
        }

        fn open(&self, at: Location<'_>, stored: &[u8]) -> Result<Opened, tls_seal::Error> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.open(at, stored)
        }
    }

    #[test]
    fn the_same_bytes_put_again_are_passed_on_once_and_read_once() {
        use base64::Engine as _;

        let key = "/f/web/tls";
        let leaf = tls_test::TestCa::new("cert state").leaf(&["localhost"]);
        let seal = Arc::new(Counting(
            KeyRing::from_keys([SealKey::from_bytes([9; 32])]).unwrap(),
            AtomicUsize::new(0),
        ));
        let at = value::sealed_location(key, crate::TLS_KEY);
        let sealed = seal
            .seal(Location::etcd(&at), leaf.key_pem.as_bytes())
            .unwrap();
        let bytes = serde_json::json!({
            "tls.crt": leaf.chain_pem,
            "tls.key.sealed": base64::engine::general_purpose::STANDARD.encode(sealed),
        })
        .to_string()
        .into_bytes();
        let mut state = State {
            key: key.to_owned(),
            reader: Reader {
                decoder: tls_source::Decoder::new(),
                seal: Some(seal.clone()),
            },
            last: None,
            present: None,
            listed: false,
        };
        let put = |revision| Event::Put {
            key: key.to_owned(),
            value: bytes.clone(),
            revision,
        };
        assert!(matches!(state.event(put(2)), Some(Ok(_))));
        // Listed again after a compaction, or put again unchanged: nothing, and not opened.
        assert!(state.event(Event::Listing).is_none());
        assert!(state.event(put(2)).is_none());
        assert!(state.event(Event::Listed).is_none());
        assert!(state.event(put(7)).is_none());
        assert_eq!(seal.1.load(Ordering::Relaxed), 1, "opened once");
    }
}
