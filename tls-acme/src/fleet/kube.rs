//! A fleet sharing one ACME state in Kubernetes Secrets (feature `k8s`): the holder of a Lease
//! leads (`super::lead`; `store/kube.rs` has the Secrets), every replica serves the
//! certificates' Secrets and watches the account, the challenges and the records.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tls_k8s::Leadership;
use tls_k8s::store::{LeaseLock, Stored};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::driver::{Driver, Tx};
use crate::record::Record;
use crate::status::NameStatus;
use crate::store::kube::{
    ACCOUNT_ANNOTATION, CERTIFICATE_LABEL, RECORD, REPLACED_ANNOTATION, STATE_LABEL,
    THUMBPRINT_ANNOTATION, certificate_secret, state_secret,
};

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

/// Runs a replica of the fleet: the election, the watch of the fleet's state (the thumbprint,
/// the challenges, the leader's status), the certificates served (into `tx`) and, while this
/// replica leads, the driver. Everything stops when the returned future is dropped.
pub(crate) async fn run(driver: Driver, config: FleetConfig, tx: Tx) {
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
    let leadership = lease.leadership();
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
    let lead = super::lead(
        &driver,
        &config.name,
        &config.identity,
        leadership.clone(),
        |l: &Leadership| l.leading.then_some(l.round),
    );
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

/// The fleet's account, challenges and certificate-state Secrets, watched: the thumbprint for
/// HTTP-01, the TLS-ALPN-01 challenges for this replica's handshakes, each certificate's record
/// for the status (on a replica that does not lead).
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
    let challenges = format!("{}-acme-challenges", config.name);
    let records: HashMap<String, String> = driver
        .groups
        .iter()
        .map(|group| (state_secret(&config.name, &group[0]), group[0].clone()))
        .collect();
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
        } else if let Some(certificate) = records.get(&name)
            && !leadership.borrow().leading
            && let Some(record) = stored
                .data
                .get(RECORD)
                .and_then(|json| Record::from_json(json).ok())
        {
            let status = NameStatus::from_record(&record, driver.clock.now());
            driver.status.send_modify(|s| {
                if let Some(entry) = s.names.get_mut(certificate) {
                    *entry = status;
                }
            });
        }
    }
}
