//! A fleet's ACME state in Kubernetes Secrets (feature `k8s`). For a fleet named `NAME` in one
//! namespace:
//!
//! ```text
//! Secret NAME-acme-account         the account (account.json, directory); its URL and its key's public
//!                                  thumbprint as annotations, for every replica's HTTP-01 answers
//! Secret NAME-acme-state           the weekly budget (budget.json), DNS-01 records published
//! Secret NAME-acme--<first name>   each certificate's record (acme.json) and order in flight
//!                                  (order.json, order.key: written before a challenge is answered)
//! Secret NAME-acme-challenges      TLS-ALPN-01 key authorization digests, by identifier
//! Secret NAME-acme-<first name>    each certificate, kubernetes.io/tls, labelled tls-rotation.io/acme=NAME
//! ```
//!
//! One Secret per certificate for its state (a Secret stops at 1 MiB: one for every name's
//! would not hold a large fleet). Earlier versions kept each name's schedule and order in
//! `NAME-acme-state` (`schedule.<name>.json`, `order.<name>.json`, `order.<name>.key`): they
//! are read when the certificate's own Secret has none, and removed with the order.
//!
//! The account, state and certificate-state Secrets carry the label
//! `tls-rotation.io/acme-state=NAME` and are watched by every replica (one watch: the
//! thumbprint, the challenges, each certificate's record for the status); the certificates are
//! served through one [`SecretsSource`](tls_k8s::SecretsSource) of the label
//! `tls-rotation.io/acme=NAME`. Only the leader writes, each write a [`FencedSecret`] write
//! carrying its round: a leader deposed while it worked can no longer write, and its successor
//! resumes the order it stored instead of placing another.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kube::Client;
use tls_k8s::seal::{Location, Seal};
use tls_k8s::store::{Fence, FencedSecret, Stored, Written};

use super::{
    AcmeStore, InFlight, NewAccount, OrderJson, Published, StoreFuture, StoredAccount, StoredCert,
    Term,
};
use crate::Error;
use crate::budget::Budget;
use crate::challenge::ChallengeType;
use crate::record::Record;

/// The label on each certificate Secret of the fleet (its value: the fleet's name): what every
/// replica serves.
pub const CERTIFICATE_LABEL: &str = "tls-rotation.io/acme";
/// The label on the fleet's account, state and challenges Secrets (its value: the fleet's
/// name): what every replica watches.
pub const STATE_LABEL: &str = "tls-rotation.io/acme-state";
/// The annotation on the account Secret with the account key's thumbprint (public: HTTP-01's
/// answers are `token.thumbprint`).
pub const THUMBPRINT_ANNOTATION: &str = "tls-rotation.io/acme-thumbprint";
/// The annotation on the account Secret with the account's URL.
pub const ACCOUNT_ANNOTATION: &str = "tls-rotation.io/acme-account";
/// The annotation on the account Secret saying when and why it replaced an account that was
/// gone while certificates were stored ([`AcmeStatus::account_replaced`](crate::AcmeStatus)).
pub const REPLACED_ANNOTATION: &str = "tls-rotation.io/acme-account-replaced";
/// The key of a certificate's record in its state Secret.
pub(crate) const RECORD: &str = "acme.json";

const ACCOUNT_JSON: &str = "account.json";
const DIRECTORY: &str = "directory";
const BUDGET: &str = "budget.json";
const ORDER_JSON: &str = "order.json";
const ORDER_KEY: &str = "order.key";

/// The name of a Secret for the certificate whose first name is `name`: `NAME-acme-` (and `-`
/// more for its state: no DNS label starts with one) and the name (`*` as `wildcard`; an IPv6
/// address as its groups in full joined by `-`, `ip::object_name`), or a digest of it when
/// that would be too long.
fn secret_for(fleet: &str, infix: &str, name: &str) -> String {
    let name = crate::ip::address(name)
        .map_or_else(|| name.replace('*', "wildcard"), crate::ip::object_name);
    let readable = format!("{fleet}-acme-{infix}{name}");
    if readable.len() <= 253 {
        return readable;
    }
    let digest = <sha2::Sha256 as sha2::Digest>::digest(name.as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{fleet}-acme-{infix}{hex}")
}

/// The Secret holding the certificate whose first name is `name`.
pub(crate) fn certificate_secret(fleet: &str, name: &str) -> String {
    secret_for(fleet, "", name)
}

/// The Secret holding the state (record, order in flight) of the certificate `name`.
pub(crate) fn state_secret(fleet: &str, name: &str) -> String {
    secret_for(fleet, "-", name)
}

/// The name of a certificate as the earlier versions' keys of `NAME-acme-state` spell it.
fn legacy(name: &str) -> String {
    name.replace('*', "_")
}

/// The fleet's Secrets, as the leader reads and writes them. Every write carries the fence of
/// the term it was made in.
pub(crate) struct KubeStore {
    client: Client,
    namespace: String,
    fleet: String,
    /// The preferred CA's account (the one the fleet's replicas take HTTP-01's thumbprint
    /// from); another CA's is in a Secret of its own (`account_secret`).
    account: FencedSecret,
    /// The preferred CA's directory.
    preferred: String,
    state: FencedSecret,
    challenges: FencedSecret,
    fence: RwLock<Fence>,
    propagation: Duration,
    /// Seals the account's credentials and the orders' keys.
    seal: Arc<dyn Seal>,
}

impl fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeStore")
            .field("namespace", &self.namespace)
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

impl KubeStore {
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        fleet: &str,
        preferred: &str,
        propagation: Duration,
        seal: Arc<dyn Seal>,
    ) -> Self {
        Self {
            account: Self::opaque(&client, namespace, fleet, format!("{fleet}-acme-account")),
            preferred: preferred.to_owned(),
            state: Self::opaque(&client, namespace, fleet, format!("{fleet}-acme-state")),
            challenges: Self::opaque(
                &client,
                namespace,
                fleet,
                format!("{fleet}-acme-challenges"),
            ),
            client,
            namespace: namespace.to_owned(),
            fleet: fleet.to_owned(),
            fence: RwLock::new(Fence {
                round: 0,
                holder: String::new(),
            }),
            propagation,
            seal,
        }
    }

    fn opaque(client: &Client, namespace: &str, fleet: &str, name: String) -> FencedSecret {
        FencedSecret::new(client.clone(), namespace, name)
            .secret_type("Opaque")
            .labels(BTreeMap::from([(STATE_LABEL.to_owned(), fleet.to_owned())]))
    }

    /// The Secret of the account at `directory` when it is not the preferred CA's
    /// (`NAME-acme-account`): `NAME-acme-account-<digest of the directory>` (a Secret name with no dot
    /// is no certificate's: a name ordered has one).
    fn other_account(&self, directory: &str) -> Option<FencedSecret> {
        if directory == self.preferred {
            return None;
        }
        let digest = <sha2::Sha256 as sha2::Digest>::digest(directory.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Some(Self::opaque(
            &self.client,
            &self.namespace,
            &self.fleet,
            format!("{}-acme-account-{hex}", self.fleet),
        ))
    }

    fn certificate(&self, name: &str) -> FencedSecret {
        FencedSecret::new(
            self.client.clone(),
            &self.namespace,
            certificate_secret(&self.fleet, name),
        )
        .labels(BTreeMap::from([(
            CERTIFICATE_LABEL.to_owned(),
            self.fleet.clone(),
        )]))
    }

    fn cert_state(&self, name: &str) -> FencedSecret {
        Self::opaque(
            &self.client,
            &self.namespace,
            &self.fleet,
            state_secret(&self.fleet, name),
        )
    }

    fn fence(&self) -> Fence {
        self.fence
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn api_error(secret: &FencedSecret, e: kube::Error) -> Error {
        Error::Kube {
            secret: secret.id(),
            source: Box::new(e),
        }
    }

    fn data_error(
        secret: &FencedSecret,
        what: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Kube {
            secret: secret.id(),
            source: format!("{what}: {e}").into(),
        }
    }

    async fn read(secret: &FencedSecret) -> Result<Option<Stored>, Error> {
        secret.read().await.map_err(|e| Self::api_error(secret, e))
    }

    async fn write(
        &self,
        secret: &FencedSecret,
        data: &BTreeMap<String, Vec<u8>>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        match secret
            .write_with(&self.fence(), Some(data), annotations)
            .await
            .map_err(|e| Self::api_error(secret, e))?
        {
            Written::Accepted { .. } => Ok(()),
            Written::Refused { stored } => Err(Error::Deposed {
                secret: secret.id(),
                round: stored.round,
                holder: stored.holder,
            }),
        }
    }

    /// Changes values of `secret` (with `None`, removes them) in one fenced write, if any
    /// change; made again on what is stored after a conflict, so concurrent changes of one
    /// Secret (orders publishing their challenges at once) all land.
    async fn change(
        &self,
        secret: &FencedSecret,
        changes: &[(String, Option<Vec<u8>>)],
    ) -> Result<(), Error> {
        let written = secret
            .modify(&self.fence(), |data| {
                for (key, value) in changes {
                    match value {
                        Some(value) => data.insert(key.clone(), value.clone()),
                        None => data.remove(key),
                    };
                }
            })
            .await
            .map_err(|e| Self::api_error(secret, e))?;
        match written {
            None | Some(Written::Accepted { .. }) => Ok(()),
            Some(Written::Refused { stored }) => Err(Error::Deposed {
                secret: secret.id(),
                round: stored.round,
                holder: stored.holder,
            }),
        }
    }

    /// `plaintext` as stored under `key` of `secret`.
    fn seal_value(
        &self,
        secret: &FencedSecret,
        key: &str,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, Error> {
        self.seal
            .seal(
                Location::new(&self.namespace, secret.name(), key),
                plaintext,
            )
            .map_err(|e| Self::data_error(secret, &format!("cannot seal {key}"), e))
    }

    /// The value stored under `key` of `secret`, opened; and whether it wants sealing again
    /// (adopted unsealed, or sealed with a key that no longer seals).
    fn open_value(
        &self,
        secret: &FencedSecret,
        key: &str,
        stored: &[u8],
    ) -> Result<(Vec<u8>, bool), Error> {
        let opened = self
            .seal
            .open(Location::new(&self.namespace, secret.name(), key), stored)
            .map_err(|e| Error::Kube {
                secret: secret.id(),
                source: Box::new(e),
            })?;
        let reseal = opened.needs_reseal();
        Ok((opened.into_plaintext(), reseal))
    }

    async fn read_account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        let other = self.other_account(directory);
        let secret = other.as_ref().unwrap_or(&self.account);
        let Some(stored) = Self::read(secret).await? else {
            return Ok(None);
        };
        if stored.data.get(DIRECTORY).map(Vec::as_slice) != Some(directory.as_bytes()) {
            return Ok(None);
        }
        let Some(sealed) = stored.data.get(ACCOUNT_JSON) else {
            return Ok(None);
        };
        let (json, reseal) = self.open_value(secret, ACCOUNT_JSON, sealed)?;
        let credentials = serde_json::from_slice(&json)
            .map_err(|e| Self::data_error(secret, &format!("{ACCOUNT_JSON} is not JSON"), e))?;
        if reseal {
            // Only the leader reads the account: store it as the seal stores it now, with
            // everything else on the Secret as it was (its annotations are kept).
            let mut data = stored.data.clone();
            data.insert(
                ACCOUNT_JSON.to_owned(),
                self.seal_value(secret, ACCOUNT_JSON, &json)?,
            );
            self.write(secret, &data, &BTreeMap::new()).await?;
            tracing::info!(secret = %secret.id(), "sealed the stored ACME account again");
        }
        let replaced = stored.annotations.get(REPLACED_ANNOTATION).cloned();
        Ok(Some(StoredAccount {
            credentials,
            replaced,
        }))
    }

    async fn write_account(&self, directory: &str, account: NewAccount<'_>) -> Result<(), Error> {
        let other = self.other_account(directory);
        let secret = other.as_ref().unwrap_or(&self.account);
        let json = serde_json::to_vec(account.credentials)
            .map_err(|e| Self::data_error(secret, ACCOUNT_JSON, e))?;
        let data = BTreeMap::from([
            (
                ACCOUNT_JSON.to_owned(),
                self.seal_value(secret, ACCOUNT_JSON, &json)?,
            ),
            (DIRECTORY.to_owned(), directory.as_bytes().to_vec()),
        ]);
        let mut annotations = BTreeMap::from([
            (
                THUMBPRINT_ANNOTATION.to_owned(),
                account.thumbprint.to_owned(),
            ),
            (ACCOUNT_ANNOTATION.to_owned(), account.url.to_owned()),
        ]);
        if let Some(why) = account.replaced {
            annotations.insert(REPLACED_ANNOTATION.to_owned(), why.to_owned());
        }
        self.write(secret, &data, &annotations).await
    }

    async fn read_cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        let Some(mut stored) = Self::read(&self.certificate(name)).await? else {
            return Ok(None);
        };
        match (
            stored.data.remove(tls_k8s::TLS_CRT),
            stored.data.remove(tls_k8s::TLS_KEY),
        ) {
            (Some(chain_pem), Some(key_pem)) if !chain_pem.is_empty() && !key_pem.is_empty() => {
                Ok(Some(StoredCert { chain_pem, key_pem }))
            }
            _ => Ok(None),
        }
    }

    async fn read_record(&self, name: &str) -> Result<Record, Error> {
        let secret = self.cert_state(name);
        let own = Self::read(&secret)
            .await?
            .and_then(|mut s| s.data.remove(RECORD));
        let (json, from) = match own {
            Some(json) => (json, &secret),
            None => {
                let key = format!("schedule.{}.json", legacy(name));
                match Self::read(&self.state)
                    .await?
                    .and_then(|mut s| s.data.remove(&key))
                {
                    Some(json) => (json, &self.state),
                    None => return Ok(Record::default()),
                }
            }
        };
        Record::from_json(&json)
            .map_err(|e| Self::data_error(from, &format!("the record of {name}"), e))
    }

    async fn read_in_flight(&self, name: &str) -> Result<Option<InFlight>, Error> {
        let secret = self.cert_state(name);
        let mut found = Self::read(&secret)
            .await?
            .and_then(|mut s| Some((s.data.remove(ORDER_JSON)?, s.data.remove(ORDER_KEY)?)));
        let (mut from, mut key_name) = (&secret, ORDER_KEY.to_owned());
        if found.is_none() {
            let d = legacy(name);
            let json_key = format!("order.{d}.json");
            key_name = format!("order.{d}.key");
            found = Self::read(&self.state)
                .await?
                .and_then(|mut s| Some((s.data.remove(&json_key)?, s.data.remove(&key_name)?)));
            from = &self.state;
        }
        let Some((json, key)) = found else {
            return Ok(None);
        };
        let order: OrderJson = serde_json::from_slice(&json)
            .map_err(|e| Self::data_error(from, &format!("the order of {name}"), e))?;
        // An order in flight is resumed once: it is not sealed again.
        let (key_pem, _) = self.open_value(from, &key_name, &key)?;
        Ok(Some(InFlight {
            url: order.url,
            key_pem,
        }))
    }

    async fn write_in_flight(&self, name: &str, order: &InFlight) -> Result<(), Error> {
        let secret = self.cert_state(name);
        let json = serde_json::to_vec(&OrderJson {
            url: order.url.clone(),
        })
        .map_err(|e| Self::data_error(&secret, ORDER_JSON, e))?;
        let sealed = self.seal_value(&secret, ORDER_KEY, &order.key_pem)?;
        self.change(
            &secret,
            &[
                (ORDER_JSON.to_owned(), Some(json)),
                (ORDER_KEY.to_owned(), Some(sealed)),
            ],
        )
        .await
    }

    async fn remove_in_flight(&self, name: &str) -> Result<(), Error> {
        self.change(
            &self.cert_state(name),
            &[(ORDER_JSON.to_owned(), None), (ORDER_KEY.to_owned(), None)],
        )
        .await?;
        let d = legacy(name);
        self.change(
            &self.state,
            &[
                (format!("order.{d}.json"), None),
                (format!("order.{d}.key"), None),
            ],
        )
        .await
    }

    async fn read_budget(&self) -> Result<Budget, Error> {
        match Self::read(&self.state)
            .await?
            .and_then(|mut s| s.data.remove(BUDGET))
        {
            Some(json) => {
                serde_json::from_slice(&json).map_err(|e| Self::data_error(&self.state, BUDGET, e))
            }
            None => Ok(Budget::default()),
        }
    }

    /// Where a published answer is kept: TLS-ALPN-01 digests in the challenges Secret (every
    /// replica answers them, by identifier), DNS-01 records in the state Secret.
    fn published_at(&self, challenge: &Published) -> (&FencedSecret, String) {
        match challenge.kind {
            // The value's tag first: an apex and its wildcard publish two values at one record.
            ChallengeType::Dns01 => (
                &self.state,
                format!("dns01.{}.{}", challenge.value_tag(), challenge.name),
            ),
            _ => (&self.challenges, challenge.name.clone()),
        }
    }

    async fn read_published(&self) -> Result<Vec<Published>, Error> {
        let mut published = Vec::new();
        if let Some(stored) = Self::read(&self.challenges).await? {
            published.extend(stored.data.into_iter().map(|(name, value)| Published {
                kind: ChallengeType::TlsAlpn01,
                name,
                value,
            }));
        }
        if let Some(stored) = Self::read(&self.state).await? {
            published.extend(stored.data.into_iter().filter_map(|(key, value)| {
                let key = key.strip_prefix("dns01.")?;
                // Older versions wrote no tag: a record name starts with `_acme-challenge.`.
                let name = match key.split_once('.') {
                    Some((_tag, name)) if !key.starts_with("_acme-challenge.") => name,
                    _ => key,
                };
                Some(Published {
                    kind: ChallengeType::Dns01,
                    name: name.to_owned(),
                    value,
                })
            }));
        }
        Ok(published)
    }
}

impl AcmeStore for KubeStore {
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
        Box::pin(async move {
            let data = BTreeMap::from([
                (tls_k8s::TLS_CRT.to_owned(), cert.chain_pem.clone()),
                (tls_k8s::TLS_KEY.to_owned(), cert.key_pem.clone()),
            ]);
            self.write(&self.certificate(name), &data, &BTreeMap::new())
                .await
        })
    }

    fn record<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Record> {
        Box::pin(self.read_record(name))
    }

    fn save_record<'a>(&'a self, name: &'a str, record: &'a Record) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.change(
                &self.cert_state(name),
                &[(RECORD.to_owned(), Some(record.to_json()))],
            )
            .await
        })
    }

    fn in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<InFlight>> {
        Box::pin(self.read_in_flight(name))
    }

    fn save_in_flight<'a>(&'a self, name: &'a str, order: &'a InFlight) -> StoreFuture<'a, ()> {
        Box::pin(self.write_in_flight(name, order))
    }

    fn forget_in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(self.remove_in_flight(name))
    }

    fn budget(&self) -> StoreFuture<'_, Budget> {
        Box::pin(self.read_budget())
    }

    fn save_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let json =
                serde_json::to_vec(budget).map_err(|e| Self::data_error(&self.state, BUDGET, e))?;
            self.change(&self.state, &[(BUDGET.to_owned(), Some(json))])
                .await
        })
    }

    fn published(&self) -> StoreFuture<'_, Vec<Published>> {
        Box::pin(self.read_published())
    }

    fn publish<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (secret, key) = self.published_at(challenge);
            self.change(secret, &[(key, Some(challenge.value.clone()))])
                .await
        })
    }

    fn withdraw<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (secret, key) = self.published_at(challenge);
            let mut keys = vec![(key, None)];
            // What an earlier version kept, untagged, if it is this value.
            if challenge.kind == ChallengeType::Dns01 {
                let untagged = format!("dns01.{}", challenge.name);
                if Self::read(secret)
                    .await?
                    .is_some_and(|s| s.data.get(&untagged) == Some(&challenge.value))
                {
                    keys.push((untagged, None));
                }
            }
            self.change(secret, &keys).await
        })
    }

    fn begin_term(&self, term: Term) -> StoreFuture<'_, ()> {
        *self.fence.write().unwrap_or_else(PoisonError::into_inner) = Fence {
            round: term.round,
            holder: term.holder,
        };
        // A key ring's files may have changed (a new sealing key rolled out).
        self.seal.reload();
        Box::pin(async { Ok(()) })
    }

    fn end_term(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn propagation(&self) -> Duration {
        self.propagation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(api: &tls_test::KubeApi) -> KubeStore {
        let mut config = kube::Config::new(api.url().parse().expect("the emulator's URL"));
        config.default_namespace = "default".into();
        let client = Client::try_from(config).expect("a client");
        KubeStore::new(
            client,
            "default",
            "web",
            "https://ca.example/dir",
            Duration::ZERO,
            Arc::new(tls_k8s::seal::Plain),
        )
    }

    /// The store of a replica leading in `round`.
    async fn leading(api: &tls_test::KubeApi, round: u64) -> KubeStore {
        let store = store(api);
        store
            .begin_term(Term {
                round,
                holder: "replica-1".into(),
            })
            .await
            .unwrap();
        store
    }

    /// A fleet's state as the previous version wrote it: every name's schedule and order in
    /// `web-acme-state`. A new leader reads them, moves on from them, and a replica of the
    /// previous version still reads the budget the new one writes.
    #[tokio::test]
    async fn state_an_earlier_version_stored_loads_and_the_budget_stays_readable_to_it() {
        let api = tls_test::KubeApi::start().await;
        let schedule = br#"{"retry_at":1800000000,"failures":3,"last_error":"refused","failed":false,"failed_for":null}"#;
        let budget = br#"{"example.com":[1799990000,1799990100]}"#;
        api.put_secret(
            "default",
            "web-acme-state",
            &[
                ("schedule.a.example.com.json", schedule),
                (
                    "order.a.example.com.json",
                    br#"{"url":"https://ca.example/order/1"}"#,
                ),
                ("order.a.example.com.key", b"-----BEGIN PRIVATE KEY-----"),
                ("budget.json", budget),
                ("status.json", b"{}"),
            ],
        );
        let store = leading(&api, 7).await;
        let record = store.record("a.example.com").await.expect("readable");
        assert_eq!(record.retry_at, Some(1_800_000_000));
        assert_eq!(record.failures, 3);
        let order = store
            .in_flight("a.example.com")
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(order.url, "https://ca.example/order/1");
        let mut spent = store.budget().await.unwrap();
        let now = crate::record::from_unix(1_800_000_000);
        spent.spend("b.example.com", 50, now).unwrap();
        store.save_budget(&spent).await.unwrap();

        // The order done: gone from where the earlier version kept it, too.
        store.forget_in_flight("a.example.com").await.unwrap();
        assert!(store.in_flight("a.example.com").await.unwrap().is_none());
        // The record is now the certificate's own; the earlier reader reads the budget.
        store
            .save_record("a.example.com", &Record::default())
            .await
            .unwrap();
        assert!(
            api.get("secrets", "default", "web-acme--a.example.com")
                .is_some()
        );
        let state = api.get("secrets", "default", "web-acme-state").unwrap();
        let json = state["data"]["budget.json"].as_str().unwrap();
        let json =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, json).unwrap();
        let old: BTreeMap<String, Vec<u64>> =
            serde_json::from_slice(&json).expect("the earlier format");
        assert_eq!(old["example.com"].len(), 3);
    }

    /// The preferred CA's account stays in `web-acme-account` (whose thumbprint every replica
    /// answers HTTP-01 with); a fallback CA's is kept beside it, not over it.
    #[tokio::test]
    async fn each_cas_account_is_kept_and_the_preferred_one_where_replicas_look() {
        let api = tls_test::KubeApi::start().await;
        let store = leading(&api, 1).await;
        let save = |directory: &'static str, thumbprint: &'static str| {
            let store = &store;
            async move {
                let credentials = serde_json::json!({ "of": directory });
                store
                    .save_account(
                        directory,
                        NewAccount {
                            credentials: &credentials,
                            url: "https://ca.example/acct/1",
                            thumbprint,
                            replaced: None,
                        },
                    )
                    .await
                    .unwrap();
            }
        };
        save("https://fallback.example/dir", "FALLBACK").await;
        save("https://ca.example/dir", "PREFERRED").await;
        for directory in ["https://ca.example/dir", "https://fallback.example/dir"] {
            let stored = store.account(directory).await.unwrap().expect("stored");
            assert_eq!(stored.credentials["of"], directory);
        }
        assert!(
            store
                .account("https://third.example/dir")
                .await
                .unwrap()
                .is_none()
        );
        let main = api.get("secrets", "default", "web-acme-account").unwrap();
        assert_eq!(
            main["metadata"]["annotations"][THUMBPRINT_ANNOTATION],
            "PREFERRED"
        );
    }

    /// An apex and its wildcard publish two DNS-01 values at one record: each is kept and
    /// withdrawn on its own, and what an earlier version kept (untagged) is read too.
    #[tokio::test]
    async fn two_dns_01_values_at_one_record_are_kept_apart() {
        let api = tls_test::KubeApi::start().await;
        api.put_secret(
            "default",
            "web-acme-state",
            &[("dns01._acme-challenge.old.example.com", b"old-value")],
        );
        let store = leading(&api, 1).await;
        let value = |v: &str| Published {
            kind: ChallengeType::Dns01,
            name: "_acme-challenge.example.com".into(),
            value: v.as_bytes().to_vec(),
        };
        store.publish(&value("apex")).await.unwrap();
        store.publish(&value("wildcard")).await.unwrap();
        let mut published = store.published().await.unwrap();
        published.sort_by(|a, b| a.value.cmp(&b.value));
        let old = Published {
            kind: ChallengeType::Dns01,
            name: "_acme-challenge.old.example.com".into(),
            value: b"old-value".to_vec(),
        };
        assert_eq!(published, [value("apex"), old.clone(), value("wildcard")]);
        store.withdraw(&value("apex")).await.unwrap();
        store.withdraw(&old).await.unwrap();
        assert_eq!(store.published().await.unwrap(), [value("wildcard")]);
    }

    #[test]
    fn certificate_secrets_are_named_by_the_first_name_and_fit_the_api() {
        assert_eq!(
            certificate_secret("web", "a.example.com"),
            "web-acme-a.example.com"
        );
        assert_eq!(
            certificate_secret("web", "*.example.com"),
            "web-acme-wildcard.example.com"
        );
        assert_eq!(
            state_secret("web", "a.example.com"),
            "web-acme--a.example.com"
        );
        let long = format!(
            "{}.example.com",
            ["a".repeat(63), "b".repeat(63), "c".repeat(63)].join(".")
        );
        let named = certificate_secret("web", &long);
        assert!(named.len() <= 253, "{named}");
        assert_ne!(named, certificate_secret("web", &long.replace('a', "d")));
        assert_ne!(named, state_secret("web", &long));
        // An address: a valid object name (DNS-1123 subdomain), one per address.
        let subdomain = |name: &str| {
            name.len() <= 253
                && name.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !part.starts_with('-')
                        && !part.ends_with('-')
                })
        };
        for (address, secret) in [
            ("192.0.2.7", "web-acme-192.0.2.7"),
            (
                "2001:db8::7",
                "web-acme-2001-0db8-0000-0000-0000-0000-0000-0007",
            ),
            ("::", "web-acme-0000-0000-0000-0000-0000-0000-0000-0000"),
        ] {
            assert_eq!(certificate_secret("web", address), secret);
            let state = state_secret("web", address);
            assert!(subdomain(secret) && subdomain(&state), "{secret} {state}");
        }
    }

    #[test]
    fn no_certificate_secret_is_another_certificates_state_secret() {
        // A DNS label never starts with `-`, so `NAME-acme--x` is no certificate's Secret.
        for name in ["state.example.com", "-a.example.com", "a.example.com"] {
            let state = state_secret("web", name);
            assert!(state.starts_with("web-acme--"), "{state}");
        }
        assert_ne!(
            certificate_secret("web", "state-a.example.com"),
            state_secret("web", "a.example.com")
        );
    }
}
