//! etcd certificate sources for zero-downtime TLS rotation.
//!
//! A certificate put into etcd once is served by every replica milliseconds later, outside
//! Kubernetes as inside it (VMs, Nomad, bare metal: wherever shared configuration already lives
//! in etcd).
//!
//! - [`EtcdCertSource`]: the certificate at one key, as a `CertSource`.
//! - [`EtcdCertsSource`]: every certificate under a prefix, as a keyed source for SNI routes.
//! - [`Etcd`]: how to reach the cluster: its endpoints (a member that goes away is left for the
//!   next), TLS on the caller's rustls config (a rotating client certificate from
//!   `tls_reload::ClientTls`), a user and password.
//! - [`store`]: for a fleet's shared state, one writer elected on an etcd lease and writes
//!   fenced by its round; on it, `SharedSelfSigned` (feature `self-signed`): one self-signed
//!   certificate (and CA) for every replica, made once by the writer, its keys sealed with a
//!   seal key.
//!
//! # The value
//! A JSON object shaped like a `kubernetes.io/tls` Secret's data, with PEM text in each field,
//! so that chain and key always change together in one put:
//!
//! ```json
//! {"tls.crt": "-----BEGIN CERTIFICATE-----\n...", "tls.key": "-----BEGIN PRIVATE KEY-----\n...", "ca.crt": "..."}
//! ```
//!
//! `ca.crt` is optional. From files, with `etcdctl` and `jq`:
//!
//! ```sh
//! etcdctl put /tls-rotation/certs/web "$(jq -n --rawfile crt tls.crt --rawfile key tls.key \
//!     '{"tls.crt": $crt, "tls.key": $key}')"
//! ```
//!
//! # Guarantees
//! Those of the Kubernetes Secret sources: the last good certificate keeps serving through a bad
//! value, a key of another pair and (for [`EtcdCertSource`]) a deletion; a revision compacted
//! while the watch was down means listing again, never a gap; a lost connection, a member that
//! goes away and a leader election inside etcd are retried on the next endpoint, and the watch
//! resumes from the last revision seen.
//!
//! # Metrics
//! With the feature `metrics`, on the `metrics` facade (nothing is recorded until the
//! application installs a recorder):
//! - `tls_etcd_requests_total{request}`: requests to etcd by kind (`list`, a page each;
//!   `watch`, opened; `read`; `txn`; `lease_grant`; `keep_alive`; `lease_revoke`;
//!   `authenticate`). [`Etcd::requests`] counts the same without the feature.
//! - `tls_etcd_fenced_writes_total{outcome}`: a fleet's fenced writes, `accepted` or `refused`.
//! - `tls_etcd_writer_leading{key}`, `tls_etcd_writer_round{key}`: whether this replica holds
//!   the writer key, and its round.
//!
//! # Building
//! etcd-client compiles etcd's protobufs when it is built, with `protoc`: install Debian's or
//! Ubuntu's `protobuf-compiler` (or set `PROTOC` to a `protoc` binary).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tls_etcd::{Etcd, EtcdCertSource};
//! use tls_reload::Reloader;
//!
//! let etcd = Etcd::builder(["127.0.0.1:2379"]).build()?;
//! let reloader = Reloader::spawn(EtcdCertSource::new(etcd, "/tls-rotation/certs/web"))?;
//! reloader.ready().await?;
//! let config = reloader.server_config()?;
//! # Ok(()) }
//! ```

mod cert;
mod certs;
mod connect;
mod error;
mod metrics;
#[cfg(feature = "self-signed")]
mod shared;
pub mod store;
mod value;
mod watch;

pub use cert::{EtcdCertSource, EtcdCertSourceBuilder};
pub use certs::{EtcdCertsSource, EtcdCertsSourceBuilder};
pub use connect::{Etcd, EtcdBuilder};
pub use error::Error;
/// The etcd client this crate is built on ([`Etcd::connect`] returns its `Client`).
pub use etcd_client;
#[cfg(feature = "self-signed")]
pub use shared::{SharedSelfSigned, SharedSource, StateAccess, WriterStats};
pub use value::{CA_CRT, SEALED_SUFFIX, TLS_CRT, TLS_KEY, sealed_location, value};
