//! The generator as a [`CertSource`](tls_source::CertSource): renewal before expiry, persistence.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use futures::stream::BoxStream;
use rustls_pki_types::CertificateDer;
use tls_source::clock::saturating_add;
use tls_source::{Backoff, CertBundle};

use crate::ca::Ca;
use crate::generator::Generated;
use crate::{Clock, Error, Part, SelfSigned, Unfit, fit, persist};

/// The longest the source sleeps before looking at the wall clock again, so that a suspend or a
/// clock step delays renewal by at most this.
pub const MAX_NAP: Duration = Duration::from_secs(30);

/// The shortest time between two generations: whatever the certificate says, the source never
/// renews in a tight loop (a leaf whose renewal time has already passed when it is made waits
/// this long, with a warning).
pub const MIN_RENEWAL_GAP: Duration = Duration::from_secs(1);

const MAX_BACKOFF: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

type Item = Result<CertBundle, tls_source::Error>;

/// The stream made by [`SelfSigned::into_source`].
#[must_use = "streams do nothing unless polled"]
pub struct SelfSignedSource {
    inner: BoxStream<'static, Item>,
}

impl Stream for SelfSignedSource {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for SelfSignedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelfSignedSource").finish_non_exhaustive()
    }
}

impl SelfSigned {
    /// The generator as a source: a bundle at once, then a new one before the current leaf enters
    /// its renewal window.
    ///
    /// - **Renewal** is checked against the wall clock ([`Clock`]) at least every [`MAX_NAP`], not
    ///   only by sleeping for the remaining time, so a suspend/resume or an NTP step does not make
    ///   it late.
    /// - **Persistence** (with [`Builder::persist`](crate::Builder::persist)): on start, the pair
    ///   (and CA) in the directory is reused while it still fits ([`check`](Self::check)); else a
    ///   new one is generated and replaces it. A corrupt file is reported (an `Err` item) and
    ///   replaced. Every renewal is written there too.
    ///
    /// # Recovery
    /// A failed generation is an `Err` item; the source tries again with backoff (1 s,
    /// doubling, at most 60 s). The reload core keeps the last good certificate meanwhile.
    ///
    /// A persistence directory that cannot be read or written (read-only, a directory where
    /// `tls.crt` should be) does not stop serving: what is stored and still fits is served when
    /// it can be read (the CA too, in CA mode), else a certificate generated in memory; the
    /// error follows it as an `Err` item (the route's last error), and persisting is tried
    /// again with the same backoff until it works. A stored CA that cannot be read is never
    /// overwritten: until it can be read, the certificate served is signed by a CA held in
    /// memory only.
    pub fn into_source(self) -> SelfSignedSource {
        let state = State {
            generator: self,
            queue: VecDeque::new(),
            renew_at: None,
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            unpersisted: None,
            persist_backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
        };
        SelfSignedSource {
            inner: Box::pin(futures::stream::unfold(state, State::step)),
        }
    }
}

struct State {
    generator: SelfSigned,
    queue: VecDeque<Item>,
    /// `None` before the first bundle.
    renew_at: Option<SystemTime>,
    backoff: Backoff,
    /// What is served but not stored yet, and when persisting is tried again.
    unpersisted: Option<(Unpersisted, SystemTime)>,
    persist_backoff: Backoff,
}

/// Why what is served is not in the persistence directory.
enum Unpersisted {
    /// Writing it failed: write it again.
    Write(Box<Generated>),
    /// What is stored could not be read: read it again, and use it if it fits, or store what
    /// is served if nothing is there; never overwrite what could not be read (a CA there may
    /// be pinned by clients).
    Read(Box<Generated>),
}

impl State {
    async fn step(mut self) -> Option<(Item, Self)> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some((item, self));
            }
            let result = match (self.renew_at, &self.unpersisted) {
                (None, _) => self.start(),
                (Some(at), Some((_, retry))) if *retry < at => {
                    wait_for_wall_clock(&*self.generator.clock, *retry).await;
                    match self.persist_again() {
                        Some(result) => result,
                        None => continue,
                    }
                }
                (Some(at), _) => {
                    wait_for_wall_clock(&*self.generator.clock, at).await;
                    self.renew()
                }
            };
            match result {
                Ok(not_after) => {
                    self.backoff.reset();
                    let window = self.generator.renewal_window();
                    let due = not_after.checked_sub(window).unwrap_or(not_after);
                    let soonest = self.generator.clock.now() + MIN_RENEWAL_GAP;
                    if due < soonest {
                        tracing::warn!(
                            renewal_window = ?window,
                            "the new certificate is due for renewal already; renewing in {MIN_RENEWAL_GAP:?}, not at once"
                        );
                    }
                    self.renew_at = Some(due.max(soonest));
                }
                Err(err) => {
                    self.queue.push_back(Err(report(err)));
                    let wait = self.backoff.next().unwrap_or(MAX_BACKOFF);
                    self.renew_at = Some(saturating_add(self.generator.clock.now(), wait));
                }
            }
        }
    }

    /// The first bundle: reused from the persistence directory when it fits, else generated.
    /// What cannot be read is served from memory meanwhile (see [`SelfSigned::into_source`]).
    fn start(&mut self) -> Result<SystemTime, Error> {
        match self.load() {
            Err(err @ Error::PersistRead { .. }) => {
                // Serve a certificate of our own (signed by the stored CA if that was read), and
                // say why it is not the stored one.
                let generated = self.generator.generate_leaf()?;
                let not_after = generated.not_after;
                self.queue.push_back(Ok(generated.bundle.clone()));
                tracing::warn!(error = %err, "serving a self-signed certificate held in memory until the stored one can be read");
                self.queue.push_back(Err(report(err)));
                self.persist_later(Unpersisted::Read(Box::new(generated)));
                Ok(not_after)
            }
            other => other,
        }
    }

    /// Reuses what is stored when it fits, else generates and persists.
    fn load(&mut self) -> Result<SystemTime, Error> {
        let Some(dir) = self.generator.persist_dir().map(Path::to_path_buf) else {
            return self.renew();
        };
        if self.generator.is_ca_mode() && !self.load_ca(&dir)? {
            // A new CA: the persisted leaf was signed by another.
            return self.renew();
        }
        let cert = persist::read(&dir, "tls.crt")?;
        let key = persist::read(&dir, "tls.key")?;
        match self.generator.check(cert.as_deref(), key.as_deref()) {
            Ok(()) => {
                let reused = self.reuse(
                    cert.as_deref().unwrap_or_default(),
                    key.as_deref().unwrap_or_default(),
                )?;
                tracing::info!(dir = %dir.display(), "reusing the persisted self-signed certificate");
                let not_after = reused.not_after;
                self.queue.push_back(Ok(reused.bundle));
                Ok(not_after)
            }
            Err(unfit) => {
                let broken = match &unfit {
                    Unfit::Unparsable { what, .. } => Some(*what),
                    // A missing file beside a present one: the pair is broken.
                    Unfit::Missing { what } if cert.is_some() || key.is_some() => Some(*what),
                    Unfit::KeyMismatch => Some(Part::PrivateKey),
                    _ => None,
                };
                match broken {
                    Some(part) => self.queue.push_back(Err(report(Error::Corrupt {
                        path: dir.join(part.file_name()),
                        reason: unfit.to_string(),
                    }))),
                    None => {
                        tracing::info!(dir = %dir.display(), reason = %unfit, "regenerating the persisted self-signed certificate");
                    }
                }
                self.renew()
            }
        }
    }

    /// Loads the persisted CA: `true` when it fits and is used; `false` when there is none or
    /// it is due for renewal (a new one is generated, persisted with the next leaf). A CA that
    /// cannot be read back (a corrupt `ca.crt` or `ca.key`) is an error, not silently replaced:
    /// clients pin it. Unless `Builder::replace_corrupt_ca`.
    fn load_ca(&mut self, dir: &Path) -> Result<bool, Error> {
        let cert = persist::read(dir, "ca.crt")?;
        let key = persist::read(dir, "ca.key")?;
        let (cert, key) = match (cert, key) {
            (None, None) => return Ok(false),
            (Some(cert), Some(key)) => (cert, key),
            (cert, _) => {
                let missing = if cert.is_none() { "ca.crt" } else { "ca.key" };
                return self.corrupt_ca(dir.join(missing), "missing beside the other".into());
            }
        };
        let loaded = match (std::str::from_utf8(&cert), std::str::from_utf8(&key)) {
            (Ok(cert), Ok(key)) => Ca::from_pem(cert, key),
            _ => Err(Error::Ca {
                reason: "not UTF-8 PEM".into(),
            }),
        };
        match loaded {
            Ok(ca) => match self.generator.ca_fits(&ca) {
                Ok(()) => {
                    self.generator.set_ca(ca);
                    Ok(true)
                }
                Err(unfit) => {
                    tracing::info!(reason = %unfit, "renewing the persisted CA");
                    Ok(false)
                }
            },
            Err(err) => self.corrupt_ca(dir.join("ca.key"), err.to_string()),
        }
    }

    fn corrupt_ca(&mut self, path: std::path::PathBuf, reason: String) -> Result<bool, Error> {
        if self.generator.replaces_corrupt_ca() {
            let err = Error::Corrupt { path, reason };
            tracing::warn!(error = %err, "replacing the corrupt CA, as configured: clients that pinned it must trust the new one");
            self.queue.push_back(Err(report(err)));
            return Ok(false);
        }
        Err(Error::CorruptCa { path, reason })
    }

    fn reuse(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Generated, Error> {
        let corrupt = |reason: String| Error::Corrupt {
            path: self
                .generator
                .persist_dir()
                .unwrap_or(Path::new("."))
                .join("tls.crt"),
            reason,
        };
        let decoder = tls_source::Decoder::new();
        let leaf: CertificateDer<'static> = decoder
            .certificates("tls.crt", cert_pem)
            .map_err(|e| corrupt(e.to_string()))?
            .remove(0);
        let key_der = decoder
            .private_key("tls.key", key_pem)
            .map_err(|e| corrupt(e.to_string()))?;
        let key = rcgen::KeyPair::try_from(&key_der).map_err(|e| corrupt(e.to_string()))?;
        let parsed = fit::parse(&leaf).map_err(corrupt)?;
        let leaf_pem = pem_of_first(cert_pem);
        let ca = self.generator.current_ca()?;
        Ok(self
            .generator
            .assemble(leaf, leaf_pem, &key, ca, parsed.not_after))
    }

    /// Generates a new leaf, queues it, persists it (or queues why not, and tries again
    /// later); returns its expiry.
    fn renew(&mut self) -> Result<SystemTime, Error> {
        let generated = self.generator.generate_leaf()?;
        let not_after = generated.not_after;
        self.queue.push_back(Ok(generated.bundle.clone()));
        if let Some((Unpersisted::Read(served), _)) = &mut self.unpersisted {
            **served = generated;
            // What is stored could not be read: it is not overwritten (a CA there may be
            // pinned by clients) until it can be.
            return Ok(not_after);
        }
        self.store(Box::new(generated));
        Ok(not_after)
    }

    /// Persists what is served; if that fails, queues why and tries again later. (The reload
    /// core logs the error it is given.)
    fn store(&mut self, served: Box<Generated>) {
        match self.generator.write_leaf(&served) {
            Ok(()) => self.persisted(),
            Err(err) => {
                self.queue.push_back(Err(report(err)));
                self.persist_later(Unpersisted::Write(served));
            }
        }
    }

    fn persist_later(&mut self, why: Unpersisted) {
        let wait = self.persist_backoff.next().unwrap_or(MAX_BACKOFF);
        let at = saturating_add(self.generator.clock.now(), wait);
        self.unpersisted = Some((why, at));
    }

    fn persisted(&mut self) {
        if self.unpersisted.take().is_some() {
            tracing::info!("the self-signed certificate is persisted again");
        }
        self.persist_backoff.reset();
    }

    /// Tries again what could not be persisted. `Some` when that made a new bundle (what is
    /// stored, readable now): the result as for `start`.
    fn persist_again(&mut self) -> Option<Result<SystemTime, Error>> {
        let served = match self.unpersisted.take()? {
            (Unpersisted::Write(served), _) => {
                self.store(served);
                return None;
            }
            (Unpersisted::Read(served), _) => served,
        };
        let stored = self.stored_nothing().and_then(|nothing| {
            if nothing {
                Ok(None)
            } else {
                self.load().map(Some)
            }
        });
        match stored {
            // Nothing there after all: store what is served.
            Ok(None) => {
                self.store(served);
                None
            }
            // Something that reads now: used if it fits, else replaced, as on a start.
            Ok(Some(not_after)) => {
                if self.unpersisted.is_none() {
                    self.persisted();
                }
                Some(Ok(not_after))
            }
            Err(err @ Error::PersistRead { .. }) => {
                self.queue.push_back(Err(report(err)));
                self.persist_later(Unpersisted::Read(served));
                None
            }
            Err(err) => Some(Err(err)),
        }
    }

    /// Whether the persistence directory holds none of the files a generation writes.
    fn stored_nothing(&self) -> Result<bool, Error> {
        let Some(dir) = self.generator.persist_dir() else {
            return Ok(false);
        };
        let names: &[&str] = if self.generator.is_ca_mode() {
            &["tls.crt", "tls.key", "ca.crt", "ca.key"]
        } else {
            &["tls.crt", "tls.key"]
        };
        for name in names {
            if persist::read(dir, name)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The first PEM block of `pem` (the leaf of a persisted chain).
fn pem_of_first(pem: &[u8]) -> String {
    let text = String::from_utf8_lossy(pem);
    const END: &str = "-----END CERTIFICATE-----";
    match text.find(END) {
        Some(at) => format!("{}\n", &text[..at + END.len()]),
        None => text.into_owned(),
    }
}

fn report(err: Error) -> tls_source::Error {
    tls_source::Error::source("self-signed", err)
}

/// Returns once the wall clock reaches `at`, looking at it at least every [`MAX_NAP`].
async fn wait_for_wall_clock(clock: &dyn Clock, at: SystemTime) {
    tls_source::clock::sleep_until(clock, at, MAX_NAP).await;
}
