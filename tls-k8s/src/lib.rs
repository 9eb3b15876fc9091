//! Kubernetes certificate sources for zero-downtime TLS rotation.
//!
//! [`SecretSource`] watches one `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, optional
//! `ca.crt`) through the API and yields a [`CertBundle`](tls_source::CertBundle) milliseconds
//! after it changes, for `tls-reload` to validate and serve. API trouble never takes the
//! certificate away: a dropped watch, a 410 Gone, an API server restart or a deleted Secret is
//! reported while the last good certificate keeps serving. [`SecretsSource`] serves every TLS
//! Secret matching a label selector. For many replicas, `SharedSelfSigned` (feature
//! `self-signed`) gives them one self-signed certificate and CA, written by one replica
//! elected by a Lease: [`LeaseLock`](store::LeaseLock), with its round (`leaseTransitions`) as a fencing token,
//! and [`FencedSecret`](store::FencedSecret), which writes a Secret only for the latest round.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tls_k8s::SecretSource;
//! use tls_reload::Reloader;
//!
//! let client = kube::Client::try_default().await?; // in-cluster config or ~/.kube/config
//! let reloader = Reloader::spawn(SecretSource::builder(client, "web", "web-tls").build())?;
//! reloader.ready().await?;
//! let config = reloader.server_config()?;
//! # Ok(()) }
//! ```
//!
//! # Permissions
//! The source needs `get`, `list` and `watch` on that one Secret, nothing more. A Role bound to
//! the pod's service account (see also `deploy/example.yaml` in the repository):
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata:
//!   name: web-tls-reader
//!   namespace: web
//! rules:
//!   - apiGroups: [""]
//!     resources: ["secrets"]
//!     resourceNames: ["web-tls"]
//!     verbs: ["get", "list", "watch"]
//! ---
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: RoleBinding
//! metadata:
//!   name: web-tls-reader
//!   namespace: web
//! subjects:
//!   - kind: ServiceAccount
//!     name: web
//!     namespace: web
//! roleRef:
//!   apiGroup: rbac.authorization.k8s.io
//!   kind: Role
//!   name: web-tls-reader
//! ```
//!
//! `resourceNames` restricts `list` and `watch` to requests that select that name
//! (`fieldSelector=metadata.name=web-tls`), which is what the source sends.
//!
//! # Many hostnames
//! [`SecretsSource`] watches every `kubernetes.io/tls` Secret in a namespace that matches a label
//! selector, through one watch, and feeds them to a reloader as SNI routes: each Secret is served
//! for the DNS names in its certificate.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tls_k8s::SecretsSource;
//! use tls_reload::Reloader;
//! # let default = futures::stream::pending::<Result<tls_source::CertBundle, tls_source::Error>>();
//!
//! let client = kube::Client::try_default().await?;
//! let reloader = Reloader::builder()
//!     .routes(SecretsSource::builder(client, "web").selector("app=web").build())
//!     .spawn(default)?; // the default certificate, for every other name
//! # Ok(()) }
//! ```
//!
//! It needs `list` and `watch` on Secrets in the namespace (a Role with
//! `verbs: ["list", "watch"]` and no `resourceNames`, which cannot restrict a selector).
//!
//! # Many replicas, one certificate
//! Behind a load balancer, replicas that each generate their own self-signed certificate break
//! clients pinned to one replica's CA. With the `self-signed` feature, `SharedSelfSigned`
//! keeps one certificate (and CA) for the fleet in a Secret: every replica serves it, and the
//! holder of a Lease alone creates and renews it, with writes that a deposed leader cannot make
//! (see `SharedSelfSigned` for the rules and an example). `serve --k8s-shared NAMESPACE/NAME`
//! runs it.
//!
//! Every replica that may be elected needs the writer's Role: read and update the TLS Secret,
//! the CA Secret (`NAME-ca`, holding the CA's private key: only the writer's Role can read it)
//! and the Lease (`NAME-writer`); `create` has a rule of its own, since `resourceNames` cannot
//! limit it. A server that only serves the certificate needs the reader's Role above.
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata:
//!   name: web-tls-writer
//!   namespace: web
//! rules:
//!   - apiGroups: [""]
//!     resources: ["secrets"]
//!     resourceNames: ["web-tls", "web-tls-ca"]
//!     verbs: ["get", "list", "watch", "update"]
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     resourceNames: ["web-tls-writer"]
//!     verbs: ["get", "list", "watch", "update"]
//!   - apiGroups: [""]
//!     resources: ["secrets"]
//!     verbs: ["create"]
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["create"]
//! ```
//!
//! A Deployment of three replicas, each named in the Lease by its pod name:
//!
//! ```yaml
//! apiVersion: apps/v1
//! kind: Deployment
//! metadata:
//!   name: web
//!   namespace: web
//! spec:
//!   replicas: 3
//!   selector:
//!     matchLabels: {app: web}
//!   template:
//!     metadata:
//!       labels: {app: web}
//!     spec:
//!       serviceAccountName: web
//!       containers:
//!         - name: web
//!           image: registry.example/web:latest
//!           args: ["--listen", "0.0.0.0:8443", "--k8s-shared", "web/web-tls",
//!                  "--self-signed-ca", "--name", "web.web.svc"]
//!           env:
//!             - name: POD_NAME
//!               valueFrom:
//!                 fieldRef: {fieldPath: metadata.name}
//! ```
//!
//! The whole manifest (namespace, service account, both Roles, the binding) is
//! `deploy/shared.yaml` in the repository.
//!
//! # Sealed at rest
//! A Secret is base64, not encryption: whoever may `get` the CA Secret (a broad Role, a
//! backup, an etcd snapshot) could mint certificates every client of the fleet trusts. With
//! `SharedSelfSigned::seal` (`serve --seal-key PATH`), the store seals what it keeps for
//! itself with [`seal`] (the `tls-seal` crate: AES-256-GCM, an envelope documented for other
//! implementations, bound to namespace, Secret and key, so a value copied elsewhere does not
//! open).
//!
//! | what | sealed |
//! |---|---|
//! | the CA Secret `NAME-ca`: every value (`ca.key`, `next.key`, and the certificates, so none can be planted) | yes, with a seal |
//! | the served TLS Secret `NAME` (`tls.crt`, `tls.key`, `ca.crt`) | no: other consumers read it; `tls.key` with `SharedSelfSigned::seal_served_key` (`--seal-served-key`), and then every reader needs the key ([`SecretSourceBuilder::seal`]) |
//! | annotations (fence, `renew-after`, `switch-after`), the Lease | no: they hold no secret |
//!
//! **Nothing is lost, nothing is adopted silently.** A replica that cannot open what is stored
//! (no key, the wrong key, a tampered value, a value copied from another Secret) serves the TLS
//! Secret, writes nothing, says why (`SharedSource::access`, the status, the log) and does
//! not campaign for the Lease; a leader that finds it so steps down and releases it. State
//! found unsealed while a seal is configured is refused the same way, since whoever may
//! `update` Secrets but not `get` them could have planted a CA key of their choosing; the
//! one-time migration is [`KeyRing::adopt_unsealed`](seal::KeyRing::adopt_unsealed)
//! (`--seal-adopt-unsealed`): the leader seals what it finds, and the flag is removed after.
//!
//! **Rolling the key** takes three rollouts, each a normal one, and every replica keeps serving
//! through each (replicas on different key lists at once are fine; one writes):
//! 1. add the new key second (`--seal-key old --seal-key new`): every replica can open both;
//! 2. put it first (`--seal-key new --seal-key old`): the leader seals everything again with it
//!    on its next check;
//! 3. remove the old one (`--seal-key new`) once the leader has (its log says "sealing the
//!    stored state again"; the envelope's key id is bytes 6..14 of each value).
//!
//! Key files are re-read every 10 s, so a key rotated in place by a secrets-store driver is
//! taken up without a restart.
//!
//! **Where the key must come from.** A seal protects against those who can read the Secrets and
//! not the key: a key in a Secret of the same namespace protects nothing against
//! `get secrets`. Mount it from a KMS-backed store or the secrets-store CSI driver, or from a
//! namespace the workload's readers cannot read.
//!
//! # Metrics
//! With the `metrics` feature, on the `metrics` facade (nothing is recorded until the
//! application installs a recorder; `tls-reload`'s feature of the same name documents the
//! certificate metrics):
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tls_lease_leading` | gauge | `lease` | 1 while this replica leads, else 0 |
//! | `tls_lease_round` | gauge | `lease` | the round (`leaseTransitions`) this replica last saw |
//! | `tls_shared_writes_total` | counter | `secret`, `outcome` | fenced writes of the shared store, `accepted` or `refused` |

mod error;
mod fenced;
mod lease;
mod metrics;
mod secret;
mod secrets;
mod selector;
#[cfg(feature = "self-signed")]
mod shared;
#[cfg(feature = "tickets")]
mod tickets;

pub use lease::Leadership;

pub mod store {
    //! The fleet store's parts, for crates that keep state in Secrets for a fleet of replicas (the
    //! shared self-signed store here, ACME next): one writer elected by a Lease, and writes fenced by
    //! its round.
    //!
    //! - [`LeaseLock`] ([`LeaseHandle`], [`Leadership`]): client-go's leader election on a
    //!   `coordination.k8s.io/v1` Lease; the Lease's `leaseTransitions` is the round, a fencing
    //!   token that only grows. Timing defaults: [`DEFAULT_LEASE_DURATION`],
    //!   [`DEFAULT_RENEW_DEADLINE`], [`DEFAULT_RETRY_PERIOD`].
    //! - [`FencedSecret`]: writes of one Secret as a compare-and-swap on its resourceVersion,
    //!   carrying the writer's [`Fence`] (round and holder, in [`ROUND_ANNOTATION`] and
    //!   [`HOLDER_ANNOTATION`]); a write whose round is behind the stored one is refused
    //!   ([`Written::Refused`]), so a leader paused past its lease cannot overwrite its successor.

    pub use crate::fenced::{
        Fence, FencedSecret, HOLDER_ANNOTATION, ROUND_ANNOTATION, Stored, Written,
    };
    pub use crate::lease::{
        DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD, Leadership,
        LeaseHandle, LeaseLock,
    };
}
/// The Kubernetes client these sources take (`kube::Client::try_default()`), at the version they
/// were built with, so that one dependency line (`tls-rotation` with `k8s`) is enough. Its TLS
/// uses the process's crypto provider, or the one rustls's features name.
pub use kube;
pub use secret::{CA_CRT, SecretSource, SecretSourceBuilder, TLS_CRT, TLS_KEY};
pub use secrets::{SecretsSource, SecretsSourceBuilder};
#[cfg(feature = "self-signed")]
pub use shared::{
    RENEW_AFTER_ANNOTATION, SWITCH_AFTER_ANNOTATION, SharedSelfSigned, SharedSource, StateAccess,
    WriterStats,
};
#[cfg(feature = "tickets")]
pub use tickets::{FleetTickets, TICKETS_KEY, TicketWrites};
/// Sealed at rest (the `tls-seal` crate): the seal the shared store and [`SecretSource`] use.
pub use tls_seal as seal;

pub use error::Error;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
