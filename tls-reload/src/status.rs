//! What the reloader reports.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use tls_source::Origin;
use tls_source::x509::LeafInfo;

use crate::Error;

/// The reloader's state, published on a `tokio::sync::watch` channel
/// ([`Reloader::status`](crate::Reloader::status)).
///
/// The top-level certificate fields describe the *default route*: the certificate given to
/// [`Builder::spawn`](crate::Builder::spawn), served when no SNI route matches. SNI routes are in
/// [`routes`](Self::routes).
///
/// With the `serde` feature it serializes as the `serve` example's status page does: the
/// default certificate's fields at the top (`null` before the first), times as RFC 3339 in UTC,
/// origins and errors as their text:
/// ```text
/// { "fingerprint_sha256", "subject", "dns_names", "ip_addresses", "not_before", "not_after",
///   "origin", "ca_fingerprints_sha256", "loaded_at",
///   "generation", "expiring", "expired", "stopped", "running", "ready", "ended", "last_error",
///   "routes": { NAME: { "fingerprint_sha256", "names", "generation", "not_after", "origin",
///                       "expiring", "expired", "stopped", "last_error" } },
///   with client authentication, once a CA is trusted or refused:
///   "client_ca_fingerprints_sha256": [..],
///   "client_cas": [{ "fingerprint_sha256", "leaves_at" }], "client_ca_error" }
/// ```
/// [`CertInfo`] serializes every field of its own by its name.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Status {
    /// The default certificate being served; `None` until the first one is installed (or when
    /// there is no default route). Shared with the reload task, not copied.
    pub current: Option<Arc<CertInfo>>,
    /// How many default certificates have been installed (0 before the first).
    pub generation: u64,
    /// The default route's last rejected update or source error since its last successful load,
    /// or [`Error::ServedExpired`] once the served certificate has expired; `None` when the
    /// latest input was good.
    pub last_error: Option<Arc<Error>>,
    /// Whether the served default certificate is inside the expiry-warning window
    /// ([`Policy::expiry_warning`](crate::Policy::expiry_warning)) or past its end.
    pub expiring: bool,
    /// Whether the served default certificate has expired.
    pub expired: bool,
    /// Whether the default route's source panicked and was dropped: its certificate keeps
    /// being served, and it will not rotate until the process restarts
    /// ([`Error::SourcePanicked`] in [`last_error`](Self::last_error)).
    pub stopped: bool,
    /// The SNI routes, by name (`api.example.com`, `*.example.com`) or, for a keyed source, by
    /// key (e.g. a Secret's `namespace/name`): `status.routes.get("default/web")`.
    ///
    /// The map is shared by every snapshot until the reload task next changes a route (then it
    /// copies it once, if a snapshot still holds it), and each route's state is shared with
    /// the reload task: cloning a status of 50,000 routes copies one pointer. To read one
    /// route, borrow the channel's value and look it up:
    /// ```no_run
    /// # fn read(reloader: &tls_reload::Reloader) {
    /// // One route, read in place (the channel is borrowed for the lookup only).
    /// let generation = reloader.status().borrow().routes.get("default/web").map(|r| r.generation);
    /// // A snapshot to keep, e.g. to serialize while the reload task goes on.
    /// let snapshot = reloader.status().borrow().clone();
    /// # let _ = (generation, snapshot);
    /// # }
    /// ```
    pub routes: Arc<BTreeMap<Arc<str>, Arc<RouteStatus>>>,
    /// Whether every configured route has a certificate (with keyed routes only: whether any
    /// has), and, with [`ClientAuth`](crate::ClientAuth), a client CA is trusted; what
    /// [`Reloader::ready`](crate::Reloader::ready) waits for.
    pub ready: bool,
    /// Whether the reload task is still running (the last certificates keep being served after
    /// it ends).
    pub running: bool,
    /// How the reload task ended; `None` while it runs.
    pub ended: Option<Ended>,
    /// With [`ClientAuth`](crate::ClientAuth): the CAs client certificates may chain to now,
    /// each with the time it leaves (a CA no longer in the bundle, kept for the overlap).
    pub client_cas: Vec<TrustedCa>,
    /// With a client-CA source of its own ([`ClientAuth::from_source`](crate::ClientAuth::from_source)):
    /// why its last input was not taken (a missing file, no CA certificate in it); the
    /// trusted CAs stay as they were. Cleared when a good one is.
    pub client_ca_error: Option<Arc<Error>>,
}

/// A CA the server trusts for client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrustedCa {
    /// SHA-256 of the CA certificate's DER, lower-case hex.
    pub fingerprint_sha256: String,
    /// When it stops being trusted: `Some` once it left the bundle (the end of the overlap).
    pub leaves_at: Option<SystemTime>,
}

/// The state of one SNI route.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RouteStatus {
    /// The certificate being served for the route; `None` until one is installed.
    pub current: Option<Arc<CertInfo>>,
    /// The names the route is served for: its name, or the DNS names (then the IP
    /// addresses) of a keyed route's certificate.
    pub names: Vec<String>,
    /// How many certificates have been installed for the route.
    pub generation: u64,
    /// The route's last rejected update or source error since its last successful load.
    pub last_error: Option<Arc<Error>>,
    /// Whether the route's certificate is inside the expiry-warning window or past its end.
    pub expiring: bool,
    /// Whether the route's certificate has expired.
    pub expired: bool,
    /// Whether the route's source panicked and was dropped: the route keeps serving its
    /// certificate and will not rotate ([`Error::SourcePanicked`] in
    /// [`last_error`](Self::last_error)).
    pub stopped: bool,
}

/// How the reload task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// Its cancellation token was cancelled, or [`Reloader::stop`](crate::Reloader::stop) called.
    Cancelled,
    /// Every source ended.
    SourcesEnded,
    /// Every [`Reloader`](crate::Reloader) handle and resolver was dropped: nothing could be
    /// served any more.
    HandlesDropped,
    /// The task panicked (in a source, say); the message is the panic's.
    Panicked {
        /// The panic message.
        message: String,
    },
    /// The task was dropped before it ended: its runtime shut down, or the
    /// [`ReloadTask`](crate::ReloadTask) was never run.
    Dropped,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::SourcesEnded => f.write_str("every source ended"),
            Self::HandlesDropped => f.write_str("every handle and resolver was dropped"),
            Self::Panicked { message } => write!(f, "panicked: {message}"),
            Self::Dropped => f.write_str("the task was dropped before it ended"),
        }
    }
}

impl Status {
    pub(crate) fn set_default(&mut self, route: &RouteStatus) {
        self.current.clone_from(&route.current);
        self.generation = route.generation;
        self.last_error.clone_from(&route.last_error);
        self.expiring = route.expiring;
        self.expired = route.expired;
        self.stopped = route.stopped;
    }
}

/// What is known about an installed certificate. Holds no key material.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CertInfo {
    /// SHA-256 of the leaf's DER, lower-case hex (as `openssl x509 -fingerprint -sha256` shows,
    /// without colons).
    pub fingerprint_sha256: String,
    /// The leaf's subject, e.g. `CN=example.com`.
    pub subject: String,
    /// The leaf's issuer.
    pub issuer: String,
    /// The DNS names among the leaf's subject alternative names.
    pub dns_names: Vec<String>,
    /// The IP addresses among the leaf's subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Where the bundle came from.
    pub origin: Origin,
    /// When it was validated (and, for an installed certificate, installed).
    pub loaded_at: SystemTime,
    /// How many certificates the chain holds (leaf included).
    pub chain_len: usize,
    /// SHA-256 of each certificate of the bundle's CA bundle (`ca.crt`), lower-case hex; empty
    /// when there is none.
    pub ca_fingerprints_sha256: Vec<String>,
}

impl CertInfo {
    pub(crate) fn new(
        bundle: &tls_source::CertBundle,
        leaf: &[u8],
        parsed: LeafInfo,
        loaded_at: SystemTime,
    ) -> Self {
        Self {
            fingerprint_sha256: tls_source::Digest::of(leaf).to_string(),
            subject: parsed.subject,
            issuer: parsed.issuer,
            dns_names: parsed.dns_names,
            ip_addresses: parsed.ip_addresses,
            not_before: parsed.not_before,
            not_after: parsed.not_after,
            origin: bundle.origin().clone(),
            loaded_at,
            chain_len: bundle.chain().len(),
            ca_fingerprints_sha256: bundle
                .ca()
                .iter()
                .map(|ca| tls_source::Digest::of(ca).to_string())
                .collect(),
        }
    }

    /// The DNS names and IP addresses, as text.
    pub(crate) fn names(&self) -> Vec<String> {
        self.dns_names
            .iter()
            .cloned()
            .chain(self.ip_addresses.iter().map(ToString::to_string))
            .collect()
    }
}
