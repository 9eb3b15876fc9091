//! Certificates from an ACME CA (RFC 8555: Let's Encrypt, `ZeroSSL`, a private CA) for many
//! names, served by the `tls-reload` core as SNI routes.
//!
//! - **One certificate per name** by default ([`AcmeBuilder::name`]), or names grouped into
//!   one ([`AcmeBuilder::group`]); each is a keyed route, so one name's rotation or failure
//!   never touches another.
//! - **Challenges answered by the server itself**: TLS-ALPN-01 in the handshake
//!   ([`Challenges`], a [`HandshakeHook`](tls_reload::HandshakeHook) that takes the CA's
//!   `acme-tls/1` handshake over, also before the server is ready: on a first start
//!   nothing is stored and every other handshake is refused until a certificate exists);
//!   HTTP-01 as a tower service ([`Http01`], stateless: `token.thumbprint`); DNS-01 through
//!   your [`Dns01Solver`] (the only one for wildcards).
//! - **State kept** in a directory ([`AcmeBuilder::state_dir`]): the account, each
//!   certificate in the kubelet's `..data` layout (key files 0600), each order in flight
//!   (its URL and new key, written before a challenge is answered, so a restart resumes it
//!   instead of ordering again), each name's retry time. A restart serves what is stored at
//!   once (the source's initial list: the reload core is ready once it is in) and orders
//!   nothing that still fits.
//! - **Renewal** inside the CA's ARI window (RFC 9773) when the directory has
//!   `renewalInfo`, else at two thirds of the lifetime, a little earlier by chance.
//! - **Failures wait**: an order the CA refused (a failed validation) is tried again no
//!   sooner than an hour later ([`REFUSED_BACKOFF`]); `rateLimited` an hour; other errors
//!   back off from a minute to a day; an identifier the CA will not issue for is not retried
//!   until the configuration changes. Each waits across restarts (the retry time is stored);
//!   [`AcmeStatus`] says what each name is doing and why.
//!
//! The directory's HTTPS is checked against the web PKI's roots and any given
//! ([`AcmeBuilder::directory_ca_file`]), on the crypto provider you give: this crate installs
//! none.
//!
//! Not built yet: a fleet sharing one ACME state in Kubernetes Secrets (one Lease holder
//! ordering, every replica answering), a per-registered-domain order budget, `Retry-After`
//! read from the CA's rate-limit answers (an hour is assumed).

mod challenge;
mod client;
mod error;
mod source;
mod status;
mod store;

pub use challenge::{ACME_TLS_ALPN, ChallengeType, Challenges, Dns01Solver, Http01, SolverFuture};
pub use error::Error;
pub use source::{Acme, AcmeBuilder, AcmeSource, REFUSED_BACKOFF};
pub use status::{AcmeStatus, NameState, NameStatus};
