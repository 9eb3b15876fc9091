//! [`SharedSelfSigned`] on etcd: one self-signed certificate (and CA) for every replica of a
//! fleet outside Kubernetes, made once by one elected writer whose writes are fenced.
//!
//! (Feature `self-signed`.) Under `PREFIX/fleets/NAME/`: `writer` (the holder key of
//! [`WriterLease`]), `tls` (the leaf's object, which every replica serves through an
//! [`EtcdCertSource`]) and, in CA mode, `ca`. The decisions are `tls_selfsigned::fleet`'s, the
//! same as on Kubernetes; each object is the JSON of [`crate::store::object`], its private keys
//! sealed with a seal key; `writer.rs` the I/O: the CA and the leaf written in one transaction fenced by the
//! writer's round.

mod writer;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tls_seal::{Plain, Seal};
use tls_selfsigned::SelfSigned;
use tls_selfsigned::fleet::Candidacy;
pub use tls_selfsigned::fleet::{StateAccess, WriterStats};
use tokio::sync::{Mutex, mpsc, watch};
use tokio_util::sync::CancellationToken;
use writer::Writer;

use crate::store::{DEFAULT_RETRY_PERIOD, DEFAULT_TTL, FencedKeys, Leadership, WriterLease};
use crate::{Etcd, EtcdCertSource};

/// One self-signed certificate shared by every replica, kept in etcd under
/// `PREFIX/fleets/NAME/`: what `tls_k8s::SharedSelfSigned` does with Secrets, on etcd.
///
/// Every replica runs it and serves the leaf at `PREFIX/fleets/NAME/tls` (milliseconds after
/// the writer puts it). The writer is the holder of the key `PREFIX/fleets/NAME/writer`
/// ([`WriterLease`]); it alone checks and, only when needed, generates:
///
/// - The leaf is **reused** while it fits the generator (names, key, validity, renewal
///   window), so a restart of every replica, or a new writer, generates nothing.
/// - **Writes are fenced**: the CA and the leaf are written together in one transaction that
///   holds only while the writer key is the one created in the writer's round. A writer paused
///   past its lease writes nothing.
/// - **CA mode** (a generator built with `ca()`): one CA for the fleet at `PREFIX/fleets/NAME/ca`,
///   renewed with an overlap (announced in `ca.crt` before it signs), as on Kubernetes.
/// - **Sealed** ([`seal`](Self::seal)): every private key (the leaf's, the CA's) is stored
///   sealed, bound to its etcd key; no private key is readable in etcd. A replica that cannot
///   open what is stored serves what it has, writes nothing and does not campaign.
///
/// A replica that cannot reach etcd keeps serving what it last read and never generates unless
/// it holds the writer key; without a quorum nobody writes.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_etcd::{Etcd, SharedSelfSigned};
/// use tls_reload::Reloader;
/// use tls_selfsigned::SelfSigned;
/// use tokio_util::sync::CancellationToken;
///
/// let etcd = Etcd::builder(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]).build()?;
/// let generator = SelfSigned::builder().dns_name("web.internal").ca().build()?;
/// let shared = SharedSelfSigned::new(etcd, "/tls-rotation/", "web", "web-0", generator)
///     .start(&CancellationToken::new());
/// let reloader = Reloader::spawn(shared)?;
/// reloader.ready().await?;
/// # Ok(()) }
/// ```
#[must_use = "nothing is shared until `start`"]
pub struct SharedSelfSigned {
    etcd: Etcd,
    prefix: String,
    name: String,
    identity: String,
    generator: SelfSigned,
    ttl: Duration,
    retry: Duration,
    ca_overlap: Option<Duration>,
    seal: Arc<dyn Seal>,
}

impl fmt::Debug for SharedSelfSigned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSelfSigned")
            .field("prefix", &self.prefix)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("ttl", &self.ttl)
            .field("seal", &self.seal)
            .finish_non_exhaustive()
    }
}

/// The running shared source: a [`CertSource`](tls_source::CertSource) of the leaf (with the
/// writer's reports as `Err` items), and this replica's leadership. The writer and the
/// election stop when it is dropped or the token is cancelled.
#[must_use = "streams do nothing unless polled"]
pub struct SharedSource {
    source: EtcdCertSource,
    reports: mpsc::UnboundedReceiver<tls_source::Error>,
    leadership: watch::Receiver<Leadership>,
    stats: watch::Receiver<WriterStats>,
    access: watch::Receiver<StateAccess>,
    token: CancellationToken,
    done: CancellationToken,
}

impl fmt::Debug for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSource")
            .field("source", &self.source)
            .field("leadership", &*self.leadership.borrow())
            .finish_non_exhaustive()
    }
}

impl SharedSelfSigned {
    /// The certificate of `generator` (its names, validity, renewal, CA mode), shared under
    /// `PREFIX/fleets/NAME/`, for the replica `identity` (e.g. the host name).
    pub fn new(
        etcd: Etcd,
        prefix: &str,
        name: &str,
        identity: impl Into<String>,
        generator: SelfSigned,
    ) -> Self {
        Self {
            etcd,
            prefix: prefix.to_owned(),
            name: name.to_owned(),
            identity: identity.into(),
            generator,
            ttl: DEFAULT_TTL,
            retry: DEFAULT_RETRY_PERIOD,
            ca_overlap: None,
            seal: Arc::new(Plain),
        }
    }

    /// Seals every private key the fleet stores (the leaf's `tls.key`, the CA's `ca.key` and
    /// `next.key`) with `seal`, each bound to its etcd key; every replica's source opens the
    /// leaf's with it. Default: [`Plain`] (keys stored as PEM, readable by whoever may read
    /// the prefix).
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.seal = seal;
        self
    }

    /// The writer lease's TTL and retry period (defaults 15 s and 2 s; see [`WriterLease`]).
    pub fn lease_timing(mut self, ttl: Duration, retry: Duration) -> Self {
        self.ttl = ttl;
        self.retry = retry;
        self
    }

    /// In CA mode, how long `ca.crt` announces a renewed CA before leaves are signed by it
    /// (default: half the CA's renewal window).
    pub fn ca_overlap(mut self, overlap: Duration) -> Self {
        self.ca_overlap = Some(overlap);
        self
    }

    fn fleet(&self) -> String {
        format!(
            "{}/fleets/{}/",
            self.prefix.trim_end_matches('/'),
            self.name
        )
    }

    /// The etcd key of the leaf every replica serves: `PREFIX/fleets/NAME/tls`.
    pub fn tls_key(&self) -> String {
        format!("{}tls", self.fleet())
    }

    /// The etcd key of the CA (CA mode): `PREFIX/fleets/NAME/ca`.
    pub fn ca_key(&self) -> String {
        format!("{}ca", self.fleet())
    }

    /// Joins the election and starts serving the leaf; runs until `token` is cancelled or the
    /// source is dropped.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn start(self, token: &CancellationToken) -> SharedSource {
        let token = token.child_token();
        let candidacy = Candidacy::default();
        let access = candidacy.access();
        let lock = WriterLease::new(self.etcd.clone(), &self.prefix, &self.name, &*self.identity)
            .ttl(self.ttl)
            .retry_period(self.retry)
            .candidate(candidacy.candidate());
        let writer_key = lock.key().to_owned();
        let lease = lock.spawn(&token);
        let leadership = lease.leadership();
        let (tls_key, ca_key, fleet) = (self.tls_key(), self.ca_key(), self.fleet());
        let source = EtcdCertSource::builder(self.etcd.clone(), tls_key.clone())
            .seal(self.seal.clone())
            .build();
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let (stats_tx, stats) = watch::channel(WriterStats::default());
        let rotation = self.generator.ca_rotation();
        let writer = Writer {
            fenced: FencedKeys::new(self.etcd.clone(), writer_key),
            ca_overlap: self
                .ca_overlap
                .unwrap_or_else(|| rotation.as_ref().map_or(Duration::ZERO, |r| r.window() / 2)),
            rotation,
            etcd: self.etcd,
            fleet,
            tls_key,
            ca_key,
            generator: self.generator,
            // A seal with no key (`Plain`) seals nothing: there is nothing to fail to open.
            sealing: !self.seal.key_ids().is_empty(),
            seal: self.seal,
            client: Mutex::new(None),
            reports: reports_tx,
            stats: stats_tx,
            candidacy,
        };
        let done = CancellationToken::new();
        let ended = done.clone().drop_guard();
        tokio::spawn({
            let token = token.clone();
            async move {
                let _ended = ended;
                Arc::new(writer).run(lease, token).await;
            }
        });
        SharedSource {
            source,
            reports,
            leadership,
            stats,
            access,
            token,
            done,
        }
    }
}

impl SharedSource {
    /// Who leads, as this replica sees it (the `leader` of `serve`'s status).
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// What this replica's writer has done.
    pub fn stats(&self) -> watch::Receiver<WriterStats> {
        self.stats.clone()
    }

    /// Whether this replica can open the stored state, and why not.
    pub fn access(&self) -> watch::Receiver<StateAccess> {
        self.access.clone()
    }

    /// Completes once the writer and the election have ended, after the source is dropped or
    /// its token cancelled: a leader has then revoked its lease, so another leads at once.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.done.clone().cancelled_owned()
    }
}

impl Stream for SharedSource {
    type Item = Result<tls_source::CertBundle, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Poll::Ready(Some(report)) = self.reports.poll_recv(cx) {
            return Poll::Ready(Some(Err(report)));
        }
        Pin::new(&mut self.source).poll_next(cx)
    }
}

impl Drop for SharedSource {
    /// Stops the writer and the election; they end by themselves (a leader revokes its lease
    /// first), which [`stopped`](SharedSource::stopped) tells.
    fn drop(&mut self) {
        self.token.cancel();
    }
}
