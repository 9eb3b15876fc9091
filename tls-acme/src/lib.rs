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
//!   HTTP-01 as a tower service ([`Http01`], stateless: `token.thumbprint`; an order at a
//!   fallback CA whose account has another key is answered by token while it runs); DNS-01
//!   through a [`Dns01Solver`] (the only one for wildcards): yours, or RFC 2136 dynamic updates
//!   signed with TSIG on any standard DNS server (`rfc2136::Rfc2136`, feature `rfc2136`).
//! - **More than one CA** ([`AcmeBuilder::fallback`], [`FallbackCa`]): an order that fails
//!   for a reason of the CA's (unreachable, a 5xx, `serverInternal`, `rateLimited`) is placed
//!   with the next one at once; each certificate records its issuer, which ARI and
//!   `replaces` go to, and every renewal starts with the preferred CA again.
//! - **IP addresses too** (RFC 8738): a name that is an address (`192.0.2.7`, `2001:db8::7`)
//!   is ordered as an `ip` identifier, proven by TLS-ALPN-01 (answered under the address's
//!   reverse-mapping name, `7.2.0.192.in-addr.arpa`) or HTTP-01 (`Host: [2001:db8::7]`), never
//!   DNS-01; with no [`AcmeBuilder::profile`], `shortlived` is asked for when the directory
//!   advertises it (Let's Encrypt issues for addresses only under it). The reload core serves
//!   an address's certificate to handshakes without a server name (see `tls_reload`'s SNI
//!   routes).
//! - **State kept** in a directory ([`AcmeBuilder::state_dir`]): the account, each
//!   certificate in the kubelet's `..data` layout (key files 0600), each order in flight
//!   (its URL and new key, written before a challenge is answered, so a restart resumes it
//!   instead of ordering again), each name's retry time. A restart serves what is stored at
//!   once (the source's initial list: the reload core is ready once it is in) and orders
//!   nothing that still fits.
//! - **Renewal** inside the CA's ARI window (RFC 9773) when the directory has
//!   `renewalInfo` (asked again at its `Retry-After`, one minute to a day; a window that has
//!   started means now; the new order names the certificate it `replaces`, and is placed once
//!   more without if the CA answers `alreadyReplaced`), else once a third of the lifetime
//!   remains (half under ten days), earlier by up to a thirtieth of it by a number drawn once
//!   per certificate and stored: a restart keeps the time ([`NameStatus::renew_after`],
//!   [`NameStatus::renew_reason`]). An ARI outage never leaves renewal later than the lifetime
//!   rule.
//! - **Failures wait**, each kept with the configuration it was made with (the names, the
//!   challenge type, [`AcmeBuilder::answered_at`], the directory): after a change of it the
//!   name is tried at once. An order the CA refused (a failed validation) waits an hour
//!   ([`REFUSED_BACKOFF`]); `rateLimited` until the CA's `Retry-After` (an hour without one);
//!   other errors back off from a minute to a day, with jitter; an identifier the CA will not
//!   issue for is not retried. None of our waits outlasts a quarter of what is left of the
//!   certificate held (a minute at least), so a short-lived certificate is tried again before
//!   it ends. [`Acme::retry_now`] tries every waiting name again as far as
//!   the CA's limits allow. A `badNonce` is retried, an order in flight resumed. Each wait is
//!   stored; [`AcmeStatus`] says what each name is doing and why.
//! - **A budget of first orders** per registered domain (by the public suffix list; an IPv4
//!   address alone, an IPv6 address by its /64), 50 in
//!   any seven days by default, Let's Encrypt's limit
//!   ([`AcmeBuilder::new_certificates_per_week`]); stored, and read again by each new term of
//!   a fleet's leader, so neither restarts nor failovers reset it; and a staggered start
//!   ([`AcmeBuilder::stagger`]).
//!
//! Inside, renewal is a pure plan (what is stored, the configuration and `now` in, what to do
//! next out), driven on a [`Clock`](tls_source::clock::Clock) ([`AcmeBuilder::clock`]) over a
//! store of everything kept (a directory, or a fleet's Secrets, one per certificate).
//!
//! The directory's HTTPS is checked against the web PKI's roots and any given
//! ([`AcmeBuilder::directory_ca_file`]), on the crypto provider you give: this crate installs
//! none.
//!
//! # Metrics
//! With the `metrics` feature, on the `metrics` facade (nothing is recorded until the
//! application installs a recorder):
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tls_acme_orders_total` | counter | `name`, `outcome` | orders ended: `issued`, `refused` (a failed validation), `rejected` (the identifier), `rate_limited` (by the CA or the budget), `bad_certificate`, `error` |
//! | `tls_acme_renewal_timestamp_seconds` | gauge | `name` | when the certificate will be renewed (Unix time) |
//! | `tls_acme_names_failing` | gauge | | certificates in `backoff` or `failed` |
//!
//! The served certificate's expiry is `tls-reload`'s, per route.
//!
//! # A fleet
//! With the `k8s` feature, `AcmeBuilder::kubernetes` keeps the state in Kubernetes Secrets
//! instead of a directory: one replica, the holder of a Lease, orders and renews (every write
//! fenced by its round, `tls_k8s::store`); every replica serves each certificate from its
//! Secret (labelled `CERTIFICATE_LABEL`) and answers the CA's challenges (TLS-ALPN-01
//! published in a Secret, HTTP-01 from the account's thumbprint, `THUMBPRINT_ANNOTATION`).
//! An order in flight is stored before its challenge is answered, so a new leader resumes it;
//! each leadership term reads the stored state afresh (the weekly budget included), so a
//! replica that leads again continues from what the leaders between wrote.
//!
//! With the `etcd` feature, `AcmeBuilder::etcd` does the same outside Kubernetes: the holder
//! of an etcd writer key leads (its round the key's `create_revision`), every write one
//! transaction fenced by it, the state one key per certificate under
//! `PREFIX/fleets/NAME/acme/`; with `AcmeBuilder::seal`, every private key there is sealed,
//! the certificates' included.

mod budget;
mod builder;
mod challenge;
mod driver;
mod error;
mod fallback;
#[cfg(any(feature = "k8s", feature = "etcd"))]
mod fleet;
mod ip;
mod metrics;
mod order;
mod plan;
mod record;
#[cfg(feature = "rfc2136")]
pub mod rfc2136;
mod status;
mod store;
#[cfg(feature = "test-util")]
pub mod test_util;

#[cfg(any(feature = "k8s", feature = "etcd"))]
pub use builder::DEFAULT_CHALLENGE_PROPAGATION;
pub use builder::{Acme, AcmeBuilder, AcmeSource, DEFAULT_NEW_CERTIFICATES_PER_WEEK};
pub use challenge::{ACME_TLS_ALPN, ChallengeType, Challenges, Dns01Solver, Http01, SolverFuture};
pub use error::{BoxError, Error};
pub use fallback::FallbackCa;
pub use plan::REFUSED_BACKOFF;
pub use status::{AcmeStatus, NameState, NameStatus, RenewReason};
#[cfg(feature = "k8s")]
pub use store::kube::{
    ACCOUNT_ANNOTATION, CERTIFICATE_LABEL, REPLACED_ANNOTATION, STATE_LABEL, THUMBPRINT_ANNOTATION,
};
