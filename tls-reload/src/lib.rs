//! Zero-downtime TLS certificate rotation for rustls servers.
//!
//! A [`Reloader`] drives certificate sources (files, a Kubernetes Secret, a self-signed
//! generator: anything implementing [`tls_source::CertSource`]), validates each new bundle with a
//! [`Validator`], and swaps it atomically into a [`CertResolver`] that rustls asks on every
//! handshake. A bad update is reported in the [`Status`] and logged while the last good
//! certificate keeps serving; the next good one is picked up by itself.
//!
//! - [`Validator`] + [`Policy`], usable on their own: the key matches the leaf, validity,
//!   required names, purpose (EKU), chain order and size (clients refuse oversized chains), and
//!   optionally verification against [`Roots`].
//! - One certificate, or many by SNI: [`Builder::route`] (exact names and one-label wildcards)
//!   and [`Builder::routes`] (a [`tls_source::KeyedCertSource`], e.g. Secrets by label selector),
//!   a default for unknown names or [`Builder::sni_strict`]. One task serves every route.
//!   Certificates for IP addresses too: a client connecting to an address sends no server
//!   name, and is served the certificate for the local address it arrived on, else the one IP
//!   certificate if there is exactly one ([`CertResolver`], [`on_local_addr`]).
//! - Wait-free, allocation-free reads: with one certificate, `resolve` is one atomic load and a
//!   reference-count increment (a per-thread cache in front of arc-swap); with SNI routes, a hash
//!   lookup of the name and an arc-swap load.
//! - [`Reloader::ready`]: accept connections only once every route has a certificate.
//! - [`Reloader::status`]: a `watch` channel of [`Status`] (fingerprint, names, validity, origin,
//!   generation, last error, expiring/expired; the same per SNI route).
//! - An owned task: it stops with a `tokio_util` `CancellationToken` (the same one your accept
//!   loop watches) or when every handle and resolver is gone, and [`Reloader::stopped`] says how
//!   it [`Ended`], a panic included. [`Builder::build`] hands it to you to run.
//! - [`Incoming`] (feature `accept`, on by default): a stream of established TLS connections
//!   from a listener, hardened (handshake time-out, a cap on handshakes in progress, accept
//!   errors survived, nothing accepted before the first certificate), an `axum::serve::Listener`
//!   with feature `axum`, and a stream for tonic's `serve_with_incoming` with feature `tonic`.
//! - Session tickets a fleet shares (`Builder::session_tickets`, features `aws-lc-rs` or
//!   `ring`): a returning TLS 1.3 client resumes on any replica, on keys derived from a shared
//!   secret or published by a fleet's writer, rotated, TLS 1.3 only; with client
//!   authentication every resumed client is checked against the trust in force.
//! - Never installs a crypto provider (see below).
//!
//! # Example: axum on rotating files
//! ```no_run
//! use tls_reload::{CancellationToken, FileSource, Reloader};
//!
//! # #[cfg(feature = "axum")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let shutdown = CancellationToken::new();
//! let reloader = Reloader::builder()
//!     .cancellation_token(shutdown.clone())
//!     .spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
//! let listener = reloader.incoming(tokio::net::TcpListener::bind("0.0.0.0:8443").await?)?;
//! let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
//! axum::serve(listener, app)
//!     .with_graceful_shutdown(shutdown.cancelled_owned())
//!     .await?;
//! # Ok(()) }
//! ```
//! The `hyper` and `tonic` examples of the repository do the same for hyper-util (with graceful
//! shutdown) and a gRPC service.
//!
//! # Features
//! - `accept` (default): [`Incoming`] and [`TlsConnection`] (tokio-rustls).
//! - `axum`, `tonic`: [`Incoming`] as an `axum::serve::Listener`, [`TlsConnection`] as tonic's
//!   `Connected`.
//! - The file source is always there ([`FileSource`]), as are [`rustls`], [`tls_source`] and
//!   [`CancellationToken`]. This crate knows no particular source: Kubernetes Secrets
//!   (`tls-k8s`) and generated certificates (`tls-selfsigned`) come through the facade crate
//!   `tls-rotation` (features `k8s`, `self-signed`), the one dependency line a user writes.
//! - `ring`, `aws-lc-rs`: rustls's crypto providers, passed through.
//! - `metrics`: the metrics below, on the `metrics` facade.
//! - `serde`: `Serialize` for [`Status`] and its parts, in the JSON shape of the `serve`
//!   example's status page (documented on [`Status`]).
//!
//! # Metrics
//! With the `metrics` feature, the reload task records these on the
//! [`metrics`](https://docs.rs/metrics) facade, which costs nothing until the application
//! installs a recorder (e.g. `metrics-exporter-prometheus`; `serve --metrics ADDR` does):
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tls_certificate_expiration_timestamp_seconds` | gauge | `source`, `route` | the served leaf's `notAfter`, Unix seconds |
//! | `tls_certificate_not_before_timestamp_seconds` | gauge | `source`, `route` | the served leaf's `notBefore` |
//! | `tls_reload_installs_total` | counter | `route` | certificates installed |
//! | `tls_reload_rejections_total` | counter | `route`, `reason` | inputs refused, by [`Error::reason`]: `parse`, `key`, `key_mismatch`, `expired`, `not_yet_valid`, `chain`, `too_large`, `name`, `purpose`, `untrusted`, `no_client_ca`, `served_expired`, `source`, `internal` |
//! | `tls_source_errors_total` | counter | `route` | errors a source reported (undecodable input is also a rejection) |
//! | `tls_reload_last_success_timestamp_seconds` | gauge | `route` | the last install, or the last good read of unchanged material after an error |
//! | `tls_reload_ready` | gauge | | 1 once everything that must be served is, else 0 |
//! | `tls_reload_client_ca_changes_total` | counter | | changes of the trusted client CAs applied (mTLS, [`ClientAuth`]): a new set from the source, or a CA leaving after its overlap; the server's certificate and `generation` do not move |
//! | `tls_reload_clients_refused_total` | counter | | verified clients the authorization rules refused in the handshake ([`ClientAuth::authorize`]); each is logged with its identity |
//! | `tls_reload_authorization_changes_total` | counter | | changes of the authorization rules applied ([`Authorization::set`]) |
//!
//! The default's and the static routes' counters are recorded at 0, for every reason, when the
//! reloader starts, so a first scrape has them and an `increase()` alert sees the first event.
//!
//! `route` is empty for the default certificate, else the route's SNI name; the routes of keyed
//! sources (every TLS Secret of a label selector: thousands, coming and going) share the one
//! value `(keyed)`, whose expiry gauge is the earliest `notAfter` among them (`source="keyed"`;
//! `+Inf` while none serves) and whose counters count for all of them. The `metrics` facade
//! cannot remove a series, so per-key series would outlive their keys, grow with every key ever
//! seen and fire expiry alerts for deleted Secrets; which key expires first is in the status
//! (`routes`). `source` says where the certificate comes
//! from, with nothing that changes on every rotation: `files:<cert path>`,
//! `secret:<namespace>/<name>`, `self-signed`, or the source's own description. A route whose
//! source changes keeps its previous series (with the last values) until the process restarts.
//!
//! Alert rules for Prometheus, a certificate expiring within 7 days and no successful load for
//! an hour while errors occur:
//!
//! ```yaml
//! groups:
//!   - name: tls-rotation
//!     rules:
//!       - alert: CertificateExpiresSoon
//!         expr: tls_certificate_expiration_timestamp_seconds - time() < 7 * 86400
//!         for: 10m
//!         annotations:
//!           summary: "{{ $labels.source }} ({{ $labels.route }}) expires in {{ $value | humanizeDuration }}"
//!       - alert: CertificateReloadFailing
//!         expr: >
//!           time() - tls_reload_last_success_timestamp_seconds > 3600
//!           and on(route) (increase(tls_source_errors_total[1h]) > 0
//!             or on(route) sum by (route) (increase(tls_reload_rejections_total[1h])) > 0)
//!         annotations:
//!           summary: "no certificate loaded for an hour on route {{ $labels.route }}, with errors"
//! ```
//!
//! # Choosing ring or aws-lc-rs
//! The library never installs a provider. When the builder is given none
//! ([`Builder::crypto_provider`]), it takes, in this order ([`default_crypto_provider`]):
//! 1. aws-lc-rs when this crate's `aws-lc-rs` feature is on
//!    (`tls-reload = { version = "0.1", features = ["aws-lc-rs"] }`), whether or not `ring` is
//!    on too: features add up across a dependency graph, and a build that has both gets the
//!    post-quantum one rather than an error;
//! 2. *ring* when only `ring` is on (`ring_provider`);
//! 3. otherwise the process default (`CryptoProvider::install_default`), read when the reloader
//!    is built;
//! 4. otherwise [`Error::NoCryptoProvider`], whose message says what to write.
//!
//! So a feature makes the choice the same in every run, whatever else in the process installs.
//! Pick `aws-lc-rs`: rustls's own default, the hybrid post-quantum key exchange X25519MLKEM768
//! that current browsers and rustls clients offer first (a server on *ring* answers them with a
//! `HelloRetryRequest`, one more round trip per full handshake), and FIPS. `ring` stays for builds
//! where AWS-LC cannot be compiled; rustls deprecated its *ring* constructor, and
//! `ring_provider` (feature `ring`) is the one place that calls it.

#[cfg(feature = "accept")]
mod accept;
mod authorize;
mod client;
mod client_auth;
mod engine;
mod error;
#[cfg(feature = "__test-hooks")]
#[doc(hidden)]
pub mod hooks;
#[cfg(feature = "hyper")]
pub mod http;
mod metrics;
mod policy;
mod reloader;
#[cfg(feature = "serde")]
mod serialize;
mod status;
mod task;
#[cfg(test)]
mod testing;
mod tickets;
mod tls;
mod validate;

#[cfg(feature = "accept")]
pub use accept::{
    DEFAULT_CLOSE_GRACE, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES, HTTP1_QUIET, Incoming,
    IncomingBuilder, TlsConnection, TlsInfo,
};
pub use authorize::{AllowList, Authorization, Authorize, ClientIdentity, Rule, RuleError};
pub use client::{BoxError, ClientStatus, ClientTls, ClientTlsBuilder, Rebuilt};
#[cfg(feature = "hyper")]
pub use client::{Connector, Fresh};
pub use client_auth::ClientAuth;
pub use engine::TrustItem;
pub use error::{Error, NotReady};
pub use policy::{
    DEFAULT_EXPIRY_WARNING, DEFAULT_MAX_CHAIN_BYTES, DEFAULT_MAX_CHAIN_LEN, Policy, Purpose, Roots,
};
pub use reloader::{Builder, ReloadTask, Reloader};
/// The rustls this crate builds on, for `ServerConfig`, providers and the rest.
pub use rustls;
pub use status::{CertInfo, Ended, RouteStatus, Status, TrustedCa};
#[cfg(any(feature = "aws-lc-rs", feature = "ring"))]
pub use tickets::SessionTickets;
pub use tickets::{
    DEFAULT_ROTATION as DEFAULT_TICKET_ROTATION, SharedTicketKeys, TicketKey, TicketsError,
    TicketsStatus, next_due as next_ticket_due, next_schedule as next_ticket_schedule,
};
#[cfg(feature = "ring")]
pub use tls::ring_provider;
pub use tls::{CertResolver, HandshakeHook, Takeover, default_crypto_provider, on_local_addr};
pub use tls_source::clock::Rfc3339;
pub use tls_source::{CertSource, CertSourceExt, FileSource, IntoCertSource};
pub use tokio_util::sync::CancellationToken;
pub use validate::{Validated, Validator};

/// The source contract (`CertBundle`, `CertSource`, combinators, PEM decoding, clocks).
pub use tls_source;
