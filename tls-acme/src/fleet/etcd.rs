//! A fleet sharing one ACME state in etcd (feature `etcd`): the holder of the writer key
//! `PREFIX/fleets/NAME/writer` leads (`super::lead`; `store/etcd.rs` has the keys), every
//! replica serves `acme/certs/` through an `EtcdCertsSource` and watches `acme/state/`: the
//! account's thumbprint (HTTP-01), the TLS-ALPN-01 challenges, the records (its status). A
//! replica campaigns only once it has seen that it can open the stored account (with its
//! seal), as the self-signed fleet's replicas do: one without the seal key, or with an account
//! altered in etcd, serves what it has and never leads.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, PoisonError};

use futures::StreamExt as _;
use tls_etcd::store::{Event, Leadership, WriterLease, object};
use tls_etcd::{Etcd, EtcdCertsSource};
use tls_seal::Seal;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::challenge::ChallengeType;
use crate::driver::{Driver, Tx};
use crate::record::Record;
use crate::status::NameStatus;
use crate::store::etcd::{ACCOUNT_JSON, ACCOUNT_URL, Keys, REPLACED, THUMBPRINT};

/// How the fleet is reached and elected.
pub(crate) struct FleetConfig {
    pub(crate) etcd: Etcd,
    pub(crate) keys: Keys,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) lease: WriterLease,
    /// Opens the certificates' sealed keys.
    pub(crate) seal: Arc<dyn Seal>,
    pub(crate) leadership: Arc<watch::Sender<Leadership>>,
    /// Cancelled once the replica has stopped and its lease is revoked (or given up).
    pub(crate) released: CancellationToken,
}

impl fmt::Debug for FleetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetConfig")
            .field("keys", &self.keys)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Runs a replica of the fleet: the election, the watch of the fleet's state, the
/// certificates served (into `tx`) and, while this replica leads, the driver. Everything stops
/// when the returned future is dropped; a leader then revokes its lease, so that another leads
/// at once.
pub(crate) async fn run(driver: Driver, config: FleetConfig, tx: Tx) {
    let FleetConfig {
        etcd,
        keys,
        name,
        identity,
        lease,
        seal,
        leadership: forward_to,
        released,
    } = config;
    let token = CancellationToken::new();
    let _stop = token.clone().drop_guard();
    // Not a candidate until the state is listed and the account opens.
    let (candidate, candidacy) = watch::channel(false);
    let lease = lease.candidate(candidacy).spawn(&token);
    let leadership = lease.leadership();
    tokio::spawn({
        let token = token.clone();
        async move {
            token.cancelled().await;
            lease.stop();
            lease.stopped().await;
            released.cancel();
        }
    });
    let served = async {
        let mut certs = EtcdCertsSource::builder(etcd.clone(), keys.certs())
            .seal(Arc::clone(&seal))
            .build();
        while let Some(item) = certs.next().await {
            if tx.send(item).is_err() {
                return;
            }
        }
    };
    let watched = watch_state(
        &driver,
        (&etcd, &keys, &name),
        &*seal,
        leadership.clone(),
        &candidate,
    );
    let lead = super::lead(
        &driver,
        &name,
        &identity,
        leadership.clone(),
        |l: &Leadership| l.fence().map(|f| f.round),
    );
    let forward = async {
        let mut leadership = leadership.clone();
        loop {
            forward_to.send_replace(leadership.borrow_and_update().clone());
            if leadership.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::join!(served, watched, lead, forward);
}

/// The fleet's state under `acme/state/`, watched: the account's thumbprint for HTTP-01 and
/// its URL, the TLS-ALPN-01 challenges for this replica's handshakes, each certificate's
/// record for the status (on a replica that does not lead); and whether this replica may
/// lead (`candidate`): whether it opens the account stored, if any, with `seal`.
async fn watch_state(
    driver: &Driver,
    (etcd, keys, fleet): (&Etcd, &Keys, &str),
    seal: &dyn Seal,
    leadership: watch::Receiver<Leadership>,
    candidate: &watch::Sender<bool>,
) {
    let account = format!("{}{}", keys.accounts(), driver.directory);
    let challenges = keys.challenges(ChallengeType::TlsAlpn01);
    let records = keys.records();
    let configured: BTreeSet<&str> = driver.groups.iter().map(|g| g[0].as_str()).collect();
    let mut published: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // The challenges seen since a (re)list began (whatever else was published is gone), and
    // whether the account was.
    let mut listed: Option<(BTreeSet<String>, bool)> = None;
    // The refusal this replica put in its status, if any.
    let mut said: Option<String> = None;
    let mut events = tls_etcd::store::watch_prefix(etcd.clone(), keys.state());
    while let Some(event) = events.next().await {
        match event {
            Event::Listing => listed = Some((BTreeSet::new(), false)),
            Event::Listed => {
                let (seen, account_seen) = listed.take().unwrap_or_default();
                if !account_seen {
                    // Deleted while the watch was down (or never stored).
                    *driver
                        .thumbprint
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                    opens(driver, candidate, &mut said, None);
                }
                published.retain(|identifier, _| {
                    let keep = seen.contains(identifier);
                    if !keep {
                        driver.challenges.clean_up(identifier);
                    }
                    keep
                });
            }
            Event::Put { key, value, .. } => {
                if key == account {
                    if let Some((_, seen)) = &mut listed {
                        *seen = true;
                    }
                    account_stored(driver, &value, !leadership.borrow().leading);
                    // Only a seal's refusal keeps this replica from leading: a value that
                    // is no account's JSON is the leader's to report.
                    seal.reload(); // a key ring's files may have changed
                    let refused = match object::decode(&key, &value, seal, &[ACCOUNT_JSON]) {
                        Err(object::Unreadable::Sealed(e)) => Some(e),
                        _ => None,
                    };
                    opens(driver, candidate, &mut said, refused);
                } else if let Some(identifier) = key.strip_prefix(&challenges) {
                    if let Some((seen, _)) = &mut listed {
                        seen.insert(identifier.to_owned());
                    }
                    if published.get(identifier) != Some(&value) {
                        if let Err(e) =
                            driver
                                .challenges
                                .present(&driver.provider, identifier, &value)
                        {
                            tracing::warn!(name = %identifier, error = %e, "cannot answer the published challenge");
                        }
                        published.insert(identifier.to_owned(), value);
                    }
                } else if let Some(certificate) = key.strip_prefix(&records)
                    && configured.contains(certificate)
                    && !leadership.borrow().leading
                    && let Ok(record) = Record::from_json(&value)
                {
                    let status = NameStatus::from_record(&record, driver.clock.now());
                    driver.status.send_modify(|s| {
                        if let Some(entry) = s.names.get_mut(certificate) {
                            *entry = status;
                        }
                    });
                }
            }
            Event::Delete { key } => {
                if key == account {
                    *driver
                        .thumbprint
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                    opens(driver, candidate, &mut said, None);
                } else if let Some(identifier) = key.strip_prefix(&challenges)
                    && published.remove(identifier).is_some()
                {
                    driver.challenges.clean_up(identifier);
                }
            }
            Event::Failed(e) => {
                tracing::warn!(%fleet, error = %e, "watching the ACME fleet's state failed; retrying");
            }
            _ => {}
        }
    }
}

/// Whether this replica opens the stored account: a candidate for the writer key if it does;
/// if not (`refused`), it steps down (the election revokes its lease) and its status says why.
fn opens(
    driver: &Driver,
    candidate: &watch::Sender<bool>,
    said: &mut Option<String>,
    refused: Option<tls_seal::Error>,
) {
    let may_lead = refused.is_none();
    if let Some(e) = refused {
        let why = format!("{e}; this replica does not lead the ACME fleet");
        tracing::warn!(error = %why, "the stored ACME account does not open with this replica's seal");
        driver
            .status
            .send_modify(|s| s.account_error = Some(why.clone()));
        *said = Some(why);
    } else if let Some(why) = said.take() {
        // What this replica said is no longer so (unless the account's own error replaced it).
        driver.status.send_if_modified(|s| {
            let ours = s.account_error.as_ref() == Some(&why);
            if ours {
                s.account_error = None;
            }
            ours
        });
    }
    candidate.send_if_modified(|now| std::mem::replace(now, may_lead) != may_lead);
}

/// The account's object as stored: its thumbprint answers HTTP-01 on every replica; its URL
/// (and why it replaced another) is the status of a replica that does not lead. Only the
/// annotations are read: the credentials stay sealed.
fn account_stored(driver: &Driver, value: &[u8], follower: bool) {
    let annotations = serde_json::from_slice::<serde_json::Value>(value)
        .ok()
        .and_then(|mut v| v.get_mut(object::ANNOTATIONS).map(serde_json::Value::take));
    let text = |name: &str| {
        annotations
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    *driver
        .thumbprint
        .write()
        .unwrap_or_else(PoisonError::into_inner) = text(THUMBPRINT);
    if follower {
        let (url, replaced) = (text(ACCOUNT_URL), text(REPLACED));
        driver.status.send_modify(|s| {
            s.account = url;
            s.account_replaced = replaced;
        });
    }
}
