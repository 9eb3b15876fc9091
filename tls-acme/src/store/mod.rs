//! Everything ACME keeps, behind one trait ([`AcmeStore`]), so that a backend is one file:
//! the state directory of one replica (`dir.rs`), a fleet's Kubernetes Secrets (`kube.rs`,
//! feature `k8s`), each write fenced by the Lease round, and a fleet's keys in etcd
//! (`etcd.rs`, feature `etcd`), each write a transaction fenced by the writer key's round.
//!
//! What is kept:
//! - **accounts**, by directory URL (one per CA), with why one replaced another that was gone;
//! - **each certificate**: its PEM (chain and key, always together), its [`Record`] (one
//!   versioned record of everything else: failures and why, the renewal time and its reason and
//!   jitter, the ARI window; fields a later version adds are kept), and its order in flight (the
//!   URL and the new key, stored before a challenge is answered, so whoever comes next resumes
//!   it);
//! - **the weekly budget** of first orders ([`Budget`]);
//! - **the challenges published** (to withdraw them after a restart or a new leader).
//!
//! A fleet's term begins ([`AcmeStore::begin_term`]) with the fence its writes carry, and
//! nothing read in a term outlives it: the driver reads the budget again each term, so a new
//! leader continues from what the last one wrote.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::Error;
use crate::budget::Budget;
use crate::challenge::ChallengeType;
use crate::record::Record;

pub(crate) mod dir;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(feature = "k8s")]
pub(crate) mod kube;

/// What a store's methods return.
pub(crate) type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// A stored account: its credentials (the CA client's JSON, kept as it is), and why it
/// replaced one that was gone, if it did.
pub(crate) struct StoredAccount {
    pub(crate) credentials: serde_json::Value,
    pub(crate) replaced: Option<String>,
}

/// An account to store: its credentials, its URL and its key's (public) thumbprint, which
/// let every replica of a fleet answer HTTP-01, and why it replaced one that was gone.
#[cfg_attr(not(any(feature = "k8s", feature = "etcd")), allow(dead_code))] // the URL and thumbprint: a fleet's
pub(crate) struct NewAccount<'a> {
    pub(crate) credentials: &'a serde_json::Value,
    pub(crate) url: &'a str,
    pub(crate) thumbprint: &'a str,
    pub(crate) replaced: Option<&'a str>,
}

/// A stored certificate: the chain's PEM and the key's.
#[derive(Clone)]
pub(crate) struct StoredCert {
    pub(crate) chain_pem: Vec<u8>,
    pub(crate) key_pem: Vec<u8>,
}

impl fmt::Debug for StoredCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCert").finish_non_exhaustive()
    }
}

/// An order in flight: its URL and the new key (PEM) its CSR is made with.
#[derive(Clone)]
pub(crate) struct InFlight {
    pub(crate) url: String,
    pub(crate) key_pem: Vec<u8>,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The JSON of an order in flight, without its key.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct OrderJson {
    pub(crate) url: String,
}

/// A challenge answer published: a TLS-ALPN-01 digest for an identifier, or a DNS-01 TXT
/// value for a record name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Published {
    #[serde(with = "challenge_name")]
    pub(crate) kind: ChallengeType,
    /// The identifier (TLS-ALPN-01) or the record's name (DNS-01).
    pub(crate) name: String,
    /// The digest (TLS-ALPN-01) or the TXT value (DNS-01).
    pub(crate) value: Vec<u8>,
}

#[cfg(any(feature = "k8s", feature = "etcd"))]
impl Published {
    /// A short tag of the value (16 hex digits of its SHA-256), for the stores that keep one
    /// key per answer: an apex and its wildcard publish two DNS-01 values at one record name,
    /// each kept (and withdrawn) on its own.
    pub(crate) fn value_tag(&self) -> String {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(&self.value);
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

mod challenge_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::challenge::ChallengeType;

    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's `with` passes a reference
    pub(super) fn serialize<S: Serializer>(kind: &ChallengeType, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(kind)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ChallengeType, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A fleet's term: the round its writes are fenced by, and its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Term {
    pub(crate) round: u64,
    pub(crate) holder: String,
}

/// Everything ACME keeps. Each write is durable when it returns (synced to disk, or accepted
/// by the API server under the term's fence); a fleet's deposed writer gets
/// [`Error::Deposed`].
pub(crate) trait AcmeStore: Send + Sync + fmt::Debug + 'static {
    /// The account registered at `directory`, if one is stored. (The state directory and etcd
    /// keep one per directory; a fleet's Secrets keep the last one saved, whose thumbprint
    /// every replica answers HTTP-01 with: more than one CA in a fleet is for later.)
    fn account<'a>(&'a self, directory: &'a str) -> StoreFuture<'a, Option<StoredAccount>>;
    /// Stores the account registered at `directory`.
    fn save_account<'a>(
        &'a self,
        directory: &'a str,
        account: NewAccount<'a>,
    ) -> StoreFuture<'a, ()>;

    /// The certificate named by its first name `name`, if stored.
    fn cert<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<StoredCert>>;
    /// Stores the certificate `name` (chain and key at once).
    fn save_cert<'a>(&'a self, name: &'a str, cert: &'a StoredCert) -> StoreFuture<'a, ()>;

    /// The record of the certificate `name` (empty if none is stored; one an earlier version
    /// wrote is read as it is).
    fn record<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Record>;
    /// Stores the record of the certificate `name`.
    fn save_record<'a>(&'a self, name: &'a str, record: &'a Record) -> StoreFuture<'a, ()>;

    /// The order in flight for `name`, if one is stored.
    fn in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<InFlight>>;
    /// Stores the order in flight for `name` (before any challenge is answered).
    fn save_in_flight<'a>(&'a self, name: &'a str, order: &'a InFlight) -> StoreFuture<'a, ()>;
    /// Forgets the order in flight for `name` (done, or invalid).
    fn forget_in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()>;

    /// The weekly budget of first orders.
    fn budget(&self) -> StoreFuture<'_, Budget>;
    /// Stores the weekly budget.
    fn save_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, ()>;

    /// The challenge answers published and not yet withdrawn.
    fn published(&self) -> StoreFuture<'_, Vec<Published>>;
    /// Publishes a challenge answer (for a fleet's other replicas, and to withdraw it after a
    /// restart).
    fn publish<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()>;
    /// Withdraws a published challenge answer.
    fn withdraw<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()>;

    /// A term begins: its writes carry `term` (a single replica's store ignores it).
    fn begin_term(&self, term: Term) -> StoreFuture<'_, ()>;
    /// The term ended: nothing read in it is kept. (A single replica's term never ends.)
    #[cfg_attr(not(any(feature = "k8s", feature = "etcd")), allow(dead_code))]
    fn end_term(&self) -> StoreFuture<'_, ()>;

    /// How long a published challenge takes to reach every replica before the CA is told to
    /// validate.
    fn propagation(&self) -> Duration {
        Duration::ZERO
    }
}
