//! A fleet's ACME state in etcd (feature `etcd`). For a fleet named `NAME` under `PREFIX`:
//!
//! ```text
//! PREFIX/fleets/NAME/writer                          the writer key (tls_etcd::store::WriterLease)
//! PREFIX/fleets/NAME/acme/certs/<first name>         each certificate: tls.crt, tls.key (sealed with a seal)
//! PREFIX/fleets/NAME/acme/state/accounts/<directory> an account per directory URL: account.json (sealed),
//!                                                    its URL and public thumbprint as annotations
//! PREFIX/fleets/NAME/acme/state/budget               the weekly budget of first orders
//! PREFIX/fleets/NAME/acme/state/records/<first name> each certificate's record
//! PREFIX/fleets/NAME/acme/state/orders/<first name>  its order in flight: order.key (sealed), its URL
//! PREFIX/fleets/NAME/acme/state/challenges/tls-alpn-01/<identifier>  a key authorization digest
//! PREFIX/fleets/NAME/acme/state/challenges/dns-01/<record name>/<tag> a TXT value published (tag: of the value)
//! ```
//!
//! One key per certificate (and one for its record, one for its order): no read-modify-write
//! of a shared value, each write a single put or delete in one transaction fenced by the
//! writer's round ([`FencedKeys`]). Objects are [`tls_etcd::store::object`]'s JSON, so a
//! certificate's value is one every replica's [`EtcdCertsSource`](tls_etcd::EtcdCertsSource)
//! serves; with a seal every private key (the account's, each order's, each certificate's) is
//! sealed, bound to its etcd key. Every replica watches `acme/state/` (the thumbprint, the
//! TLS-ALPN-01 challenges, the records for its status) and serves `acme/certs/`.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tls_etcd::etcd_client::TxnOp;
use tls_etcd::store::object::{self, Annotations, Data};
use tls_etcd::store::{Fence, FencedKeys};
use tls_etcd::{Etcd, TLS_CRT, TLS_KEY};
use tls_seal::Seal;

use super::{
    AcmeStore, InFlight, NewAccount, Published, StoreFuture, StoredAccount, StoredCert, Term,
};
use crate::Error;
use crate::budget::Budget;
use crate::challenge::ChallengeType;
use crate::record::Record;

/// The account's credentials in its object (sealed).
pub(crate) const ACCOUNT_JSON: &str = "account.json";
/// The annotations of an account: its URL, its key's thumbprint (public: HTTP-01's answers
/// are `token.thumbprint`), why it replaced one that was gone.
pub(crate) const ACCOUNT_URL: &str = "url";
pub(crate) const THUMBPRINT: &str = "thumbprint";
pub(crate) const REPLACED: &str = "replaced";
/// An order's new key in its object (sealed), and its URL as an annotation.
const ORDER_KEY: &str = "order.key";
const ORDER_URL: &str = "url";

/// The keys of a fleet's ACME state, under `PREFIX/fleets/NAME/acme/`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `PREFIX/fleets/NAME/acme/`.
    acme: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, fleet: &str) -> Self {
        Self {
            acme: format!("{}/fleets/{fleet}/acme/", prefix.trim_end_matches('/')),
        }
    }

    /// Where every certificate is: the prefix every replica serves.
    pub(crate) fn certs(&self) -> String {
        format!("{}certs/", self.acme)
    }

    fn cert(&self, name: &str) -> String {
        format!("{}certs/{name}", self.acme)
    }

    /// Where the rest is: the prefix every replica watches.
    pub(crate) fn state(&self) -> String {
        format!("{}state/", self.acme)
    }

    /// The prefix of the accounts, each at the directory URL after it.
    pub(crate) fn accounts(&self) -> String {
        format!("{}accounts/", self.state())
    }

    fn budget(&self) -> String {
        format!("{}budget", self.state())
    }

    /// The prefix of the records, each at its certificate's first name after it.
    pub(crate) fn records(&self) -> String {
        format!("{}records/", self.state())
    }

    fn order(&self, name: &str) -> String {
        format!("{}orders/{name}", self.state())
    }

    /// The prefix of the challenges of `kind`, each at its identifier (or record name).
    pub(crate) fn challenges(&self, kind: ChallengeType) -> String {
        format!("{}challenges/{kind}/", self.state())
    }
}

/// The fleet's keys, as the leader reads and writes them. Every write carries the fence of
/// the term it was made in.
pub(crate) struct EtcdStore {
    keys: Keys,
    fenced: FencedKeys,
    fence: RwLock<Option<Fence>>,
    propagation: Duration,
    seal: Arc<dyn Seal>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// An error about the etcd key `key`.
fn error(key: &str, source: impl Into<crate::BoxError>) -> Error {
    Error::Etcd {
        key: key.to_owned(),
        source: source.into(),
    }
}

impl EtcdStore {
    pub(crate) fn new(
        etcd: Etcd,
        keys: Keys,
        writer_key: String,
        propagation: Duration,
        seal: Arc<dyn Seal>,
    ) -> Self {
        Self {
            keys,
            fenced: FencedKeys::new(etcd, writer_key),
            fence: RwLock::new(None),
            propagation,
            seal,
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.fenced.get(key).await.map_err(|e| error(key, e))
    }

    /// The object at `key`, its values named in `sealed` opened.
    async fn object(&self, key: &str, sealed: &[&str]) -> Result<Option<object::Opened>, Error> {
        let Some(bytes) = self.get(key).await? else {
            return Ok(None);
        };
        object::decode(key, &bytes, &*self.seal, sealed)
            .map(Some)
            .map_err(|e| error(key, e))
    }

    fn encode(
        &self,
        key: &str,
        data: &Data,
        annotations: &Annotations,
        sealed: &[&str],
    ) -> Result<Vec<u8>, Error> {
        object::encode(key, data, annotations, &*self.seal, sealed).map_err(|e| error(key, e))
    }

    /// Runs `op` on `key` in one transaction fenced by this term's round.
    async fn write(&self, key: &str, op: TxnOp) -> Result<(), Error> {
        let fence = *self.fence.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fence) = fence else {
            return Err(error(key, "no term: this replica does not lead"));
        };
        self.fenced
            .txn(fence, vec![op])
            .await
            .map(drop)
            .map_err(|e| error(key, e))
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<(), Error> {
        self.write(key, TxnOp::put(key, value, None)).await
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        self.write(key, TxnOp::delete(key, None)).await
    }

    async fn read_account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        let key = format!("{}{directory}", self.keys.accounts());
        let Some(opened) = self.object(&key, &[ACCOUNT_JSON]).await? else {
            return Ok(None);
        };
        let Some(json) = opened.data.get(ACCOUNT_JSON) else {
            return Ok(None);
        };
        let credentials = serde_json::from_slice(json)
            .map_err(|e| error(&key, format!("{ACCOUNT_JSON} is not JSON: {e}")))?;
        if opened.reseal {
            // Only the leader reads the account: store it as the seal stores it now.
            let value = self.encode(&key, &opened.data, &opened.annotations, &[ACCOUNT_JSON])?;
            self.put(&key, value).await?;
            tracing::info!(%key, "sealed the stored ACME account again");
        }
        Ok(Some(StoredAccount {
            credentials,
            replaced: opened.annotations.get(REPLACED).cloned(),
        }))
    }

    async fn write_account(&self, directory: &str, account: NewAccount<'_>) -> Result<(), Error> {
        let key = format!("{}{directory}", self.keys.accounts());
        let json = serde_json::to_vec(account.credentials).map_err(|e| error(&key, e))?;
        let data = Data::from([(ACCOUNT_JSON.to_owned(), json)]);
        let mut annotations = Annotations::from([
            (ACCOUNT_URL.to_owned(), account.url.to_owned()),
            (THUMBPRINT.to_owned(), account.thumbprint.to_owned()),
        ]);
        if let Some(why) = account.replaced {
            annotations.insert(REPLACED.to_owned(), why.to_owned());
        }
        let value = self.encode(&key, &data, &annotations, &[ACCOUNT_JSON])?;
        self.put(&key, value).await
    }

    async fn read_cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        let key = self.keys.cert(name);
        let Some(mut opened) = self.object(&key, &[TLS_KEY]).await? else {
            return Ok(None);
        };
        match (opened.data.remove(TLS_CRT), opened.data.remove(TLS_KEY)) {
            (Some(chain_pem), Some(key_pem)) if !chain_pem.is_empty() && !key_pem.is_empty() => {
                Ok(Some(StoredCert { chain_pem, key_pem }))
            }
            _ => Ok(None),
        }
    }

    async fn write_cert(&self, name: &str, cert: &StoredCert) -> Result<(), Error> {
        let key = self.keys.cert(name);
        let data = Data::from([
            (TLS_CRT.to_owned(), cert.chain_pem.clone()),
            (TLS_KEY.to_owned(), cert.key_pem.clone()),
        ]);
        let value = self.encode(&key, &data, &Annotations::new(), &[TLS_KEY])?;
        self.put(&key, value).await
    }

    async fn read_record(&self, name: &str) -> Result<Record, Error> {
        let key = format!("{}{name}", self.keys.records());
        match self.get(&key).await? {
            Some(json) => Record::from_json(&json).map_err(|e| error(&key, e)),
            None => Ok(Record::default()),
        }
    }

    async fn read_in_flight(&self, name: &str) -> Result<Option<InFlight>, Error> {
        let key = self.keys.order(name);
        let Some(mut opened) = self.object(&key, &[ORDER_KEY]).await? else {
            return Ok(None);
        };
        // An order in flight is resumed once: it is not sealed again.
        match (
            opened.annotations.remove(ORDER_URL),
            opened.data.remove(ORDER_KEY),
        ) {
            (Some(url), Some(key_pem)) => Ok(Some(InFlight { url, key_pem })),
            _ => Err(error(&key, "not an order: no url or no order.key")),
        }
    }

    async fn write_in_flight(&self, name: &str, order: &InFlight) -> Result<(), Error> {
        let key = self.keys.order(name);
        let data = Data::from([(ORDER_KEY.to_owned(), order.key_pem.clone())]);
        let annotations = Annotations::from([(ORDER_URL.to_owned(), order.url.clone())]);
        let value = self.encode(&key, &data, &annotations, &[ORDER_KEY])?;
        self.put(&key, value).await
    }

    async fn read_budget(&self) -> Result<Budget, Error> {
        let key = self.keys.budget();
        match self.get(&key).await? {
            Some(json) => serde_json::from_slice(&json).map_err(|e| error(&key, e)),
            None => Ok(Budget::default()),
        }
    }

    /// A TLS-ALPN-01 answer by its identifier (every replica answers it); a DNS-01 value by its
    /// record name and the value's tag (two values may share a record).
    fn published_at(&self, challenge: &Published) -> String {
        let prefix = self.keys.challenges(challenge.kind);
        match challenge.kind {
            ChallengeType::Dns01 => format!("{prefix}{}/{}", challenge.name, challenge.value_tag()),
            _ => format!("{prefix}{}", challenge.name),
        }
    }

    async fn read_published(&self) -> Result<Vec<Published>, Error> {
        let mut published = Vec::new();
        for kind in [ChallengeType::TlsAlpn01, ChallengeType::Dns01] {
            let prefix = self.keys.challenges(kind);
            let found = self
                .fenced
                .get_prefix(&prefix)
                .await
                .map_err(|e| error(&prefix, e))?;
            published.extend(found.into_iter().filter_map(|(key, value)| {
                let name = key.strip_prefix(&prefix)?;
                // A DNS-01 value's tag after its record name (none in what older versions wrote).
                let name = name.split_once('/').map_or(name, |(name, _tag)| name);
                Some(Published {
                    kind,
                    name: name.to_owned(),
                    value,
                })
            }));
        }
        Ok(published)
    }
}

impl AcmeStore for EtcdStore {
    fn account<'a>(&'a self, directory: &'a str) -> StoreFuture<'a, Option<StoredAccount>> {
        Box::pin(self.read_account(directory))
    }

    fn save_account<'a>(
        &'a self,
        directory: &'a str,
        account: NewAccount<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.write_account(directory, account))
    }

    fn cert<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<StoredCert>> {
        Box::pin(self.read_cert(name))
    }

    fn save_cert<'a>(&'a self, name: &'a str, cert: &'a StoredCert) -> StoreFuture<'a, ()> {
        Box::pin(self.write_cert(name, cert))
    }

    fn record<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Record> {
        Box::pin(self.read_record(name))
    }

    fn save_record<'a>(&'a self, name: &'a str, record: &'a Record) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = format!("{}{name}", self.keys.records());
            self.put(&key, record.to_json()).await
        })
    }

    fn in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<InFlight>> {
        Box::pin(self.read_in_flight(name))
    }

    fn save_in_flight<'a>(&'a self, name: &'a str, order: &'a InFlight) -> StoreFuture<'a, ()> {
        Box::pin(self.write_in_flight(name, order))
    }

    fn forget_in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.delete(&self.keys.order(name)).await })
    }

    fn budget(&self) -> StoreFuture<'_, Budget> {
        Box::pin(self.read_budget())
    }

    fn save_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.keys.budget();
            let json = serde_json::to_vec(budget).map_err(|e| error(&key, e))?;
            self.put(&key, json).await
        })
    }

    fn published(&self) -> StoreFuture<'_, Vec<Published>> {
        Box::pin(self.read_published())
    }

    fn publish<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.put(&self.published_at(challenge), challenge.value.clone())
                .await
        })
    }

    fn withdraw<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            // What an earlier version kept, untagged, if it is this value.
            if challenge.kind == ChallengeType::Dns01 {
                let untagged =
                    format!("{}{}", self.keys.challenges(challenge.kind), challenge.name);
                let stored = self
                    .fenced
                    .get(&untagged)
                    .await
                    .map_err(|e| error(&untagged, e))?;
                if stored.as_ref() == Some(&challenge.value) {
                    self.delete(&untagged).await?;
                }
            }
            self.delete(&self.published_at(challenge)).await
        })
    }

    fn begin_term(&self, term: Term) -> StoreFuture<'_, ()> {
        *self.fence.write().unwrap_or_else(PoisonError::into_inner) =
            Some(Fence { round: term.round });
        // A key ring's files may have changed (a new sealing key rolled out).
        self.seal.reload();
        Box::pin(async { Ok(()) })
    }

    fn end_term(&self) -> StoreFuture<'_, ()> {
        *self.fence.write().unwrap_or_else(PoisonError::into_inner) = None;
        Box::pin(async { Ok(()) })
    }

    fn propagation(&self) -> Duration {
        self.propagation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An apex and its wildcard publish two DNS-01 values at one record: each is kept and
    /// withdrawn on its own, and what an earlier version kept (untagged) is read and withdrawn
    /// with its value.
    #[cfg_attr(not(etcd), ignore = "needs etcd (apt install etcd-server etcd-client)")]
    #[tokio::test]
    async fn two_dns_01_values_at_one_record_are_kept_apart() {
        let cluster = tls_test::EtcdCluster::shared().expect("etcd (apt install etcd-server)");
        let prefix = cluster.prefix("acme-dns-values");
        let keys = Keys::new(&prefix, "web");
        let writer = format!("{prefix}fleets/web/writer");
        let round = cluster.put(&writer, b"replica-1");
        let untagged = format!(
            "{}_acme-challenge.old.example.com",
            keys.challenges(ChallengeType::Dns01)
        );
        cluster.put(&untagged, b"old-value");
        let etcd = tls_etcd::Etcd::builder(cluster.endpoints())
            .build()
            .expect("a client");
        let store = EtcdStore::new(
            etcd,
            keys,
            writer,
            Duration::ZERO,
            Arc::new(tls_seal::Plain),
        );
        store
            .begin_term(Term {
                round: u64::try_from(round).expect("a revision"),
                holder: "replica-1".into(),
            })
            .await
            .unwrap();
        let value = |name: &str, v: &str| Published {
            kind: ChallengeType::Dns01,
            name: name.into(),
            value: v.as_bytes().to_vec(),
        };
        let record = "_acme-challenge.example.com";
        store.publish(&value(record, "apex")).await.unwrap();
        store.publish(&value(record, "wildcard")).await.unwrap();
        let mut published = store.published().await.unwrap();
        published.sort_by(|a, b| a.value.cmp(&b.value));
        let old = value("_acme-challenge.old.example.com", "old-value");
        assert_eq!(
            published,
            [
                value(record, "apex"),
                old.clone(),
                value(record, "wildcard")
            ]
        );
        store.withdraw(&value(record, "apex")).await.unwrap();
        store.withdraw(&old).await.unwrap();
        assert_eq!(
            store.published().await.unwrap(),
            [value(record, "wildcard")]
        );
    }

    #[test]
    fn the_keys_of_a_fleet_are_under_its_prefix_one_per_certificate() {
        let keys = Keys::new("/tls-rotation/", "web");
        assert_eq!(keys.certs(), "/tls-rotation/fleets/web/acme/certs/");
        assert_eq!(
            keys.cert("*.example.com"),
            "/tls-rotation/fleets/web/acme/certs/*.example.com"
        );
        assert_eq!(
            format!("{}{}", keys.records(), "a.example.com"),
            "/tls-rotation/fleets/web/acme/state/records/a.example.com"
        );
        assert_eq!(
            keys.challenges(ChallengeType::TlsAlpn01),
            "/tls-rotation/fleets/web/acme/state/challenges/tls-alpn-01/"
        );
        // Nothing the replicas serve is under what they watch for the state, nor the reverse.
        assert!(!keys.certs().starts_with(&keys.state()));
        assert!(!keys.state().starts_with(&keys.certs()));
        assert_eq!(
            Keys::new("/p", "web").certs(),
            keys.certs().replace("/tls-rotation", "/p")
        );
    }
}
