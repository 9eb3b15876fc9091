//! A fleet sharing one ACME state in Kubernetes Secrets (feature `k8s`): the holder of a Lease
//! orders and renews, every replica serves what is stored and answers the CA's challenges.
//!
//! For a fleet named `NAME` in one namespace:
//!
//! ```text
//! Lease  NAME-acme                 who orders (tls_k8s::store::LeaseLock; its round fences every write)
//! Secret NAME-acme-account         the account (account.json, directory); its URL and its key's public
//!                                  thumbprint as annotations, for every replica's HTTP-01 answers
//! Secret NAME-acme-state           orders in flight (URL and new key, written before a challenge is
//!                                  answered), each name's schedule, the weekly budget, the status
//! Secret NAME-acme-challenges      TLS-ALPN-01 key authorization digests, by identifier
//! Secret NAME-acme-<first name>    each certificate, kubernetes.io/tls, labelled tls-rotation.io/acme=NAME
//! ```
//!
//! The account, state and challenges Secrets carry the label `tls-rotation.io/acme-state=NAME`
//! and are watched by every replica (one watch); the certificates are served through one
//! [`SecretsSource`](tls_k8s::SecretsSource) of the label `tls-rotation.io/acme=NAME`. Only
//! the leader writes, each write a [`FencedSecret`] write carrying its round: a leader
//! deposed while it worked can no longer write, and its successor resumes the order it
//! stored instead of placing another.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use instant_acme::AccountCredentials;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tls_k8s::Leadership;
use tls_k8s::seal::{Location, Seal};
use tls_k8s::store::{Fence, FencedSecret, LeaseLock, Stored, Written};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::source::{Driver, Tx};
use crate::status::StoredNames;
use crate::store::{InFlight, Schedule, StoredAccount, StoredCert, dir_name};

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

/// How the fleet is reached and elected.
#[derive(Clone)]
pub(crate) struct FleetConfig {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) lease: String,
    pub(crate) timing: Option<(Duration, Duration, Duration)>,
    pub(crate) leadership: Arc<watch::Sender<Leadership>>,
    /// Cancelled once the replica has stopped and its Lease is released (or given up).
    pub(crate) released: CancellationToken,
}

impl fmt::Debug for FleetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetConfig")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The name of the Secret holding the certificate whose first name is `name`: `NAME-acme-`
/// and the name (`*` as `wildcard`), or a digest of it when that would be too long.
pub(crate) fn certificate_secret(fleet: &str, name: &str) -> String {
    let readable = format!("{fleet}-acme-{}", name.replace('*', "wildcard"));
    if readable.len() <= 253 {
        return readable;
    }
    let digest = <sha2::Sha256 as sha2::Digest>::digest(name.as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{fleet}-acme-{hex}")
}

/// The fleet's Secrets, as the leader reads and writes them. Every write carries the fence of
/// the term it was made in.
pub(crate) struct KubeStore {
    client: Client,
    namespace: String,
    fleet: String,
    account: FencedSecret,
    state: FencedSecret,
    challenges: FencedSecret,
    fence: RwLock<Fence>,
    /// The state Secret's data, as last read or written in this term (only the leader writes).
    state_data: Mutex<Option<BTreeMap<String, Vec<u8>>>>,
    challenge_data: Mutex<Option<BTreeMap<String, Vec<u8>>>>,
    propagation: Duration,
    /// Seals the account's credentials and the orders' keys.
    seal: Arc<dyn Seal>,
}

impl fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cached data holds order keys: not shown.
        f.debug_struct("KubeStore")
            .field("namespace", &self.namespace)
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

const ACCOUNT_JSON: &str = "account.json";
const DIRECTORY: &str = "directory";
const BUDGET: &str = "budget.json";
const STATUS: &str = "status.json";

impl KubeStore {
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        fleet: &str,
        propagation: Duration,
        seal: Arc<dyn Seal>,
    ) -> Self {
        let labels = BTreeMap::from([(STATE_LABEL.to_owned(), fleet.to_owned())]);
        let opaque = |suffix: &str| {
            FencedSecret::new(client.clone(), namespace, format!("{fleet}-acme-{suffix}"))
                .secret_type("Opaque")
                .labels(labels.clone())
        };
        Self {
            account: opaque("account"),
            state: opaque("state"),
            challenges: opaque("challenges"),
            client,
            namespace: namespace.to_owned(),
            fleet: fleet.to_owned(),
            fence: RwLock::new(Fence {
                round: 0,
                holder: String::new(),
            }),
            state_data: Mutex::new(None),
            challenge_data: Mutex::new(None),
            propagation,
            seal,
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
            .map_err(|e| Error::Kube {
                secret: secret.id(),
                reason: format!("cannot seal {key}: {e}"),
            })
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
                reason: e.to_string(),
            })?;
        let reseal = opened.needs_reseal();
        Ok((opened.into_plaintext(), reseal))
    }

    /// A new term: its writes carry `fence`, and what the last term cached is read again.
    pub(crate) async fn begin_term(&self, fence: Fence) {
        *self.fence.write().unwrap_or_else(PoisonError::into_inner) = fence;
        // A key ring's files may have changed (a new sealing key rolled out).
        self.seal.reload();
        *self.state_data.lock().await = None;
        *self.challenge_data.lock().await = None;
    }

    fn fence(&self) -> Fence {
        self.fence
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn propagation(&self) -> Duration {
        self.propagation
    }

    fn api_error(secret: &FencedSecret, e: &kube::Error) -> Error {
        Error::Kube {
            secret: secret.id(),
            reason: e.to_string(),
        }
    }

    async fn read(secret: &FencedSecret) -> Result<Option<Stored>, Error> {
        secret.read().await.map_err(|e| Self::api_error(secret, &e))
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
            .map_err(|e| Self::api_error(secret, &e))?
        {
            Written::Accepted { .. } => Ok(()),
            Written::Refused { stored } => Err(Error::Deposed {
                secret: secret.id(),
                round: stored.round,
                holder: stored.holder,
            }),
        }
    }

    pub(crate) async fn account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        let Some(stored) = Self::read(&self.account).await? else {
            return Ok(None);
        };
        if stored.data.get(DIRECTORY).map(Vec::as_slice) != Some(directory.as_bytes()) {
            return Ok(None);
        }
        let Some(sealed) = stored.data.get(ACCOUNT_JSON) else {
            return Ok(None);
        };
        let (json, reseal) = self.open_value(&self.account, ACCOUNT_JSON, sealed)?;
        let credentials: AccountCredentials =
            serde_json::from_slice(&json).map_err(|e| Error::Kube {
                secret: self.account.id(),
                reason: format!("{ACCOUNT_JSON} is not an ACME account: {e}"),
            })?;
        if reseal {
            // Only the leader reads the account: store it as the seal stores it now, with
            // everything else on the Secret as it was (its annotations are kept).
            let mut data = stored.data.clone();
            data.insert(
                ACCOUNT_JSON.to_owned(),
                self.seal_value(&self.account, ACCOUNT_JSON, &json)?,
            );
            self.write(&self.account, &data, &BTreeMap::new()).await?;
            tracing::info!(secret = %self.account.id(), "sealed the stored ACME account again");
        }
        let replaced = stored.annotations.get(REPLACED_ANNOTATION).cloned();
        Ok(Some((credentials, replaced)))
    }

    pub(crate) async fn save_account(
        &self,
        directory: &str,
        credentials: &AccountCredentials,
        (account_url, thumbprint): (&str, &str),
        replaced: Option<&str>,
    ) -> Result<(), Error> {
        let json = serde_json::to_vec(credentials).map_err(|e| Error::Config(e.to_string()))?;
        let data = BTreeMap::from([
            (
                ACCOUNT_JSON.to_owned(),
                self.seal_value(&self.account, ACCOUNT_JSON, &json)?,
            ),
            (DIRECTORY.to_owned(), directory.as_bytes().to_vec()),
        ]);
        let mut annotations = BTreeMap::from([
            (THUMBPRINT_ANNOTATION.to_owned(), thumbprint.to_owned()),
            (ACCOUNT_ANNOTATION.to_owned(), account_url.to_owned()),
        ]);
        if let Some(why) = replaced {
            annotations.insert(REPLACED_ANNOTATION.to_owned(), why.to_owned());
        }
        self.write(&self.account, &data, &annotations).await
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

    pub(crate) async fn cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        let secret = self.certificate(name);
        let Some(mut stored) = Self::read(&secret).await? else {
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

    pub(crate) async fn save_cert(
        &self,
        name: &str,
        chain_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<(), Error> {
        let data = BTreeMap::from([
            (tls_k8s::TLS_CRT.to_owned(), chain_pem.to_vec()),
            (tls_k8s::TLS_KEY.to_owned(), key_pem.to_vec()),
        ]);
        self.write(&self.certificate(name), &data, &BTreeMap::new())
            .await
    }

    /// The state Secret's value under `key`.
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let mut cached = self.state_data.lock().await;
        if cached.is_none() {
            *cached = Some(
                Self::read(&self.state)
                    .await?
                    .map(|s| s.data)
                    .unwrap_or_default(),
            );
        }
        Ok(cached.as_ref().and_then(|data| data.get(key).cloned()))
    }

    /// Sets (or, with `None`, removes) values of the state Secret, in one fenced write.
    async fn set(&self, changes: &[(String, Option<Vec<u8>>)]) -> Result<(), Error> {
        self.change(&self.state, &self.state_data, changes).await
    }

    /// Changes values of `secret` (one fenced write), through its cache.
    async fn change(
        &self,
        secret: &FencedSecret,
        cache: &Mutex<Option<BTreeMap<String, Vec<u8>>>>,
        changes: &[(String, Option<Vec<u8>>)],
    ) -> Result<(), Error> {
        let mut cached = cache.lock().await;
        let mut data = match cached.take() {
            Some(data) => data,
            None => Self::read(secret)
                .await?
                .map(|s| s.data)
                .unwrap_or_default(),
        };
        let before = data.clone();
        for (key, value) in changes {
            match value {
                Some(value) => data.insert(key.clone(), value.clone()),
                None => data.remove(key),
            };
        }
        // On an error the cache stays empty: read again next time (the write may or may not
        // have landed).
        if data != before {
            self.write(secret, &data, &BTreeMap::new()).await?;
        }
        *cached = Some(data);
        Ok(())
    }

    pub(crate) async fn order(&self, name: &str) -> Result<Option<(InFlight, Vec<u8>)>, Error> {
        let d = dir_name(name);
        let (Some(json), Some(key)) = (
            self.get(&format!("order.{d}.json")).await?,
            self.get(&format!("order.{d}.key")).await?,
        ) else {
            return Ok(None);
        };
        let order = serde_json::from_slice(&json).map_err(|e| Error::Kube {
            secret: self.state.id(),
            reason: format!("order.{d}.json: {e}"),
        })?;
        // An order in flight is resumed once: it is not sealed again.
        let (key, _) = self.open_value(&self.state, &format!("order.{d}.key"), &key)?;
        Ok(Some((order, key)))
    }

    pub(crate) async fn save_order(
        &self,
        name: &str,
        order: &InFlight,
        key_pem: &[u8],
    ) -> Result<(), Error> {
        let d = dir_name(name);
        let json = serde_json::to_vec(order).map_err(|e| Error::Config(e.to_string()))?;
        let key = format!("order.{d}.key");
        let sealed = self.seal_value(&self.state, &key, key_pem)?;
        self.set(&[(format!("order.{d}.json"), Some(json)), (key, Some(sealed))])
            .await
    }

    pub(crate) async fn forget_order(&self, name: &str) -> Result<(), Error> {
        let d = dir_name(name);
        self.set(&[
            (format!("order.{d}.json"), None),
            (format!("order.{d}.key"), None),
        ])
        .await
    }

    pub(crate) async fn schedule(&self, name: &str) -> Result<Schedule, Error> {
        let key = format!("schedule.{}.json", dir_name(name));
        Ok(self
            .get(&key)
            .await?
            .and_then(|json| serde_json::from_slice(&json).ok())
            .unwrap_or_default())
    }

    pub(crate) async fn save_schedule(&self, name: &str, schedule: &Schedule) -> Result<(), Error> {
        let key = format!("schedule.{}.json", dir_name(name));
        let value = if schedule.is_clear() {
            None
        } else {
            Some(serde_json::to_vec(schedule).map_err(|e| Error::Config(e.to_string()))?)
        };
        self.set(&[(key, value)]).await
    }

    pub(crate) async fn budget(&self) -> Result<BTreeMap<String, Vec<u64>>, Error> {
        Ok(self
            .get(BUDGET)
            .await?
            .and_then(|json| serde_json::from_slice(&json).ok())
            .unwrap_or_default())
    }

    pub(crate) async fn save_budget(
        &self,
        budget: &BTreeMap<String, Vec<u64>>,
    ) -> Result<(), Error> {
        let json = serde_json::to_vec(budget).map_err(|e| Error::Config(e.to_string()))?;
        self.set(&[(BUDGET.to_owned(), Some(json))]).await
    }

    async fn save_status(&self, names: &StoredNames) -> Result<(), Error> {
        let json = serde_json::to_vec(names).map_err(|e| Error::Config(e.to_string()))?;
        self.set(&[(STATUS.to_owned(), Some(json))]).await
    }

    pub(crate) async fn publish_challenge(
        &self,
        identifier: &str,
        digest: Option<&[u8]>,
    ) -> Result<(), Error> {
        let changes = [(identifier.to_owned(), digest.map(<[u8]>::to_vec))];
        self.change(&self.challenges, &self.challenge_data, &changes)
            .await
    }
}

/// Runs a replica of the fleet: the election, the watch of the fleet's state (the thumbprint,
/// the challenges, the leader's status), the certificates served (into `tx`) and, while this
/// replica leads, the driver. Everything stops when the returned future is dropped.
pub(crate) async fn run(driver: Driver, config: FleetConfig, store: Arc<KubeStore>, tx: Tx) {
    let token = CancellationToken::new();
    let _stop = token.clone().drop_guard();
    let mut lock = LeaseLock::new(
        config.client.clone(),
        &config.namespace,
        config.lease.clone(),
        config.identity.clone(),
    );
    if let Some((lease, renew, retry)) = config.timing {
        lock = lock.timing(lease, renew, retry);
    }
    let lease = lock.spawn(token.child_token());
    let mut leadership = lease.leadership();
    let forwarded = lease.leadership();
    // When this future is dropped (the source was), a leader releases its Lease so that
    // another replica leads within a retry period.
    tokio::spawn({
        let (token, released) = (token.clone(), config.released.clone());
        async move {
            token.cancelled().await;
            lease.stop().await;
            released.cancel();
        }
    });
    let served = serve(&config, &driver.groups, &tx);
    let watched = watch_state(&driver, &config, leadership.clone());
    let lead = async {
        loop {
            let Ok(now) = leadership.wait_for(|l| l.leading).await.map(|l| l.clone()) else {
                return;
            };
            tracing::info!(fleet = %config.name, round = now.round, "leading the ACME fleet: ordering and renewing");
            store
                .begin_term(Fence {
                    round: now.round,
                    holder: config.identity.clone(),
                })
                .await;
            // The leader serves through the watch too: what the driver sends goes nowhere.
            let (sink, _) = tokio::sync::mpsc::unbounded_channel();
            tokio::select! {
                () = driver.run(&sink) => {}
                () = publish_status(&driver, &store) => {}
                _ = leadership.wait_for(|l| !l.leading || l.round != now.round) => {
                    tracing::info!(fleet = %config.name, round = now.round, "no longer leading the ACME fleet: its orders are left for the next leader");
                }
            }
        }
    };
    let forward = async {
        let mut leadership = forwarded;
        loop {
            config
                .leadership
                .send_replace(leadership.borrow_and_update().clone());
            if leadership.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::join!(served, watched, lead, forward);
}

/// Every certificate of the fleet, from its Secrets, into `tx`: keyed by its first name, as
/// one replica's are (a Secret of a name this replica is not configured with keeps its
/// `namespace/name`).
async fn serve(config: &FleetConfig, groups: &[Vec<String>], tx: &Tx) {
    let keys: std::collections::HashMap<String, String> = groups
        .iter()
        .map(|group| {
            let secret = certificate_secret(&config.name, &group[0]);
            (format!("{}/{secret}", config.namespace), group[0].clone())
        })
        .collect();
    let mut secrets = tls_k8s::SecretsSource::builder(config.client.clone(), &config.namespace)
        .selector(format!("{CERTIFICATE_LABEL}={}", config.name))
        .build();
    while let Some(mut item) = secrets.next().await {
        if let Ok(keyed) = &mut item
            && let Some(name) = keys.get(&keyed.key)
        {
            keyed.key.clone_from(name);
        }
        if tx.send(item).is_err() {
            return;
        }
    }
}

/// The leader's status, for the other replicas (coalesced: at most one write in 250 ms).
async fn publish_status(driver: &Driver, store: &KubeStore) {
    let mut status = driver.status.subscribe();
    loop {
        let names = StoredNames::of(&status.borrow_and_update().names);
        if let Err(e) = store.save_status(&names).await {
            tracing::debug!(error = %e, "could not publish the ACME status");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        if status.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// The fleet's account, state and challenges Secrets, watched: the thumbprint for HTTP-01,
/// the TLS-ALPN-01 challenges for this replica's handshakes, the leader's status.
async fn watch_state(
    driver: &Driver,
    config: &FleetConfig,
    leadership: watch::Receiver<Leadership>,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        config.client.clone(),
        &config.namespace,
        &ApiResource::erase::<Secret>(&()),
    );
    let selector = format!("{STATE_LABEL}={}", config.name);
    let mut events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let account = format!("{}-acme-account", config.name);
    let state = format!("{}-acme-state", config.name);
    let challenges = format!("{}-acme-challenges", config.name);
    let mut published: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Some(event) = events.next().await {
        let (object, deleted) = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
            Ok(watcher::Event::Delete(o)) => (o, true),
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(fleet = %config.name, error = %e, "watching the ACME fleet's state failed; retrying");
                continue;
            }
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        let stored = if deleted {
            Stored::of(&DynamicObject::new(
                &name,
                &ApiResource::erase::<Secret>(&()),
            ))
        } else {
            Stored::of(&object)
        };
        if name == account {
            let thumbprint = stored.annotations.get(THUMBPRINT_ANNOTATION).cloned();
            *driver
                .thumbprint
                .write()
                .unwrap_or_else(PoisonError::into_inner) = thumbprint;
            let url = stored.annotations.get(ACCOUNT_ANNOTATION).cloned();
            let replaced = stored.annotations.get(REPLACED_ANNOTATION).cloned();
            if !leadership.borrow().leading {
                driver.status.send_modify(|s| {
                    s.account = url;
                    s.account_replaced = replaced;
                });
            }
        } else if name == challenges {
            for (identifier, digest) in &stored.data {
                if published.get(identifier) != Some(digest)
                    && let Err(e) = driver
                        .challenges
                        .present(&driver.provider, identifier, digest)
                {
                    tracing::warn!(name = %identifier, error = %e, "cannot answer the published challenge");
                }
            }
            for identifier in published.keys() {
                if !stored.data.contains_key(identifier) {
                    driver.challenges.clean_up(identifier);
                }
            }
            published = stored.data;
        } else if name == state
            && !leadership.borrow().leading
            && let Some(names) = stored
                .data
                .get(STATUS)
                .and_then(|json| serde_json::from_slice::<StoredNames>(json).ok())
        {
            driver.status.send_modify(|s| names.apply(&mut s.names));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let long = format!(
            "{}.example.com",
            ["a".repeat(63), "b".repeat(63), "c".repeat(63)].join(".")
        );
        let named = certificate_secret("web", &long);
        assert!(named.len() <= 253, "{named}");
        assert_ne!(named, certificate_secret("web", &long.replace('a', "d")));
    }
}
