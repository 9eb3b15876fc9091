//! The state directory of one replica: the account, each certificate in the kubelet's
//! `..data` layout (so a `FileSource` could serve it too), each order in flight (its URL and
//! its new key, written before a challenge is answered), and each name's schedule (when to
//! try again, and why). Every set of files is swapped in at once (`tls_source::layout`); key
//! files and the account are mode 0600.
//!
//! ```text
//! STATE/account/{account.json,directory}
//! STATE/certs/NAME/{tls.crt,tls.key}      (NAME: the certificate's first name, `*` as `_`)
//! STATE/orders/NAME/{order.json,key.pem}
//! STATE/names/NAME/schedule.json
//! STATE/budget/budget.json                (first orders per registered domain, last 7 days)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::AccountCredentials;
use serde::{Deserialize, Serialize};
use tls_source::layout;

use crate::Error;

/// A stored account: its credentials, and why it replaced one that was gone, if it did.
pub(crate) type StoredAccount = (AccountCredentials, Option<String>);

/// A stored certificate: the chain's PEM and the key's.
pub(crate) struct StoredCert {
    pub(crate) chain_pem: Vec<u8>,
    pub(crate) key_pem: Vec<u8>,
}

/// Where the state is kept: a directory (one replica), or a fleet's Secrets (feature `k8s`,
/// written only by the Lease holder, every write fenced by its round).
#[derive(Debug, Clone)]
pub(crate) enum Store {
    Dir(DirStore),
    #[cfg(feature = "k8s")]
    Kube(std::sync::Arc<crate::fleet::KubeStore>),
}

/// The state directory.
#[derive(Debug, Clone)]
pub(crate) struct DirStore {
    root: PathBuf,
}

/// An order in flight: enough for whoever comes next to resume it instead of ordering again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InFlight {
    pub(crate) url: String,
}

/// When a name may be tried again, and why not before.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Schedule {
    /// Seconds since the epoch.
    pub(crate) retry_at: Option<u64>,
    pub(crate) failures: u32,
    pub(crate) last_error: Option<String>,
    /// It will not be retried until the configuration changes.
    #[serde(default)]
    pub(crate) failed: bool,
    /// The configuration it failed with (names and challenge): another one tries again.
    #[serde(default)]
    pub(crate) failed_for: Option<String>,
}

impl Schedule {
    /// Nothing to wait for, nothing failed: what a name with a fresh certificate has.
    pub(crate) fn is_clear(&self) -> bool {
        self.retry_at.is_none() && self.failures == 0 && !self.failed && self.last_error.is_none()
    }
}

pub(crate) fn to_unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The time `secs` after the epoch, read from stored state (a file, a Secret another replica
/// wrote): a value past the year 9999 reads as the end of 9999, never an overflow.
pub(crate) fn from_unix(secs: u64) -> SystemTime {
    tls_source::clock::saturating_add(UNIX_EPOCH, Duration::from_secs(secs))
}

/// The directory name of a certificate named by its first name.
pub(crate) fn dir_name(name: &str) -> String {
    name.replace('*', "_")
}

/// Forwards each call to the store in use: the directory's (blocking file I/O, each write
/// synced to disk) on tokio's blocking threads, so a server on the same runtime never waits
/// behind it; its arguments are owned copies (`ToOwned`).
macro_rules! each {
    ($self:ident, $store:ident => $method:ident($($arg:ident),*)) => {
        match $self {
            Store::Dir($store) => {
                let $store = $store.clone();
                $(let $arg = $arg.to_owned();)*
                blocking(&$store.root.clone(), move || $store.$method($(&$arg),*)).await
            }
            #[cfg(feature = "k8s")]
            Store::Kube($store) => $store.$method($($arg),*).await,
        }
    };
}

/// Runs `f` on tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    root: &Path,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::State {
            path: root.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?
}

impl Store {
    pub(crate) async fn account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        each!(self, s => account(directory))
    }

    /// Stores the account; `(url, thumbprint)` (its key's, public) lets every replica answer
    /// HTTP-01; `replaced` says why it replaced one that was gone.
    pub(crate) async fn save_account(
        &self,
        directory: &str,
        credentials: &AccountCredentials,
        (account_url, thumbprint): (&str, &str),
        replaced: Option<&str>,
    ) -> Result<(), Error> {
        match self {
            Store::Dir(s) => {
                let _ = (account_url, thumbprint);
                let (s, directory) = (s.clone(), directory.to_owned());
                let json =
                    serde_json::to_vec(credentials).map_err(|e| Error::Config(e.to_string()))?;
                let replaced = replaced.map(str::to_owned);
                blocking(&s.root.clone(), move || {
                    s.save_account(&directory, &json, replaced.as_deref())
                })
                .await
            }
            #[cfg(feature = "k8s")]
            Store::Kube(s) => {
                s.save_account(directory, credentials, (account_url, thumbprint), replaced)
                    .await
            }
        }
    }

    pub(crate) async fn cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        each!(self, s => cert(name))
    }

    pub(crate) async fn save_cert(
        &self,
        name: &str,
        chain_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<(), Error> {
        each!(self, s => save_cert(name, chain_pem, key_pem))
    }

    pub(crate) async fn order(&self, name: &str) -> Result<Option<(InFlight, Vec<u8>)>, Error> {
        each!(self, s => order(name))
    }

    pub(crate) async fn save_order(
        &self,
        name: &str,
        order: &InFlight,
        key_pem: &[u8],
    ) -> Result<(), Error> {
        each!(self, s => save_order(name, order, key_pem))
    }

    pub(crate) async fn forget_order(&self, name: &str) -> Result<(), Error> {
        each!(self, s => forget_order(name))
    }

    pub(crate) async fn schedule(&self, name: &str) -> Result<Schedule, Error> {
        each!(self, s => schedule(name))
    }

    pub(crate) async fn save_schedule(&self, name: &str, schedule: &Schedule) -> Result<(), Error> {
        each!(self, s => save_schedule(name, schedule))
    }

    pub(crate) async fn budget(&self) -> Result<BTreeMap<String, Vec<u64>>, Error> {
        each!(self, s => budget())
    }

    pub(crate) async fn save_budget(
        &self,
        budget: &BTreeMap<String, Vec<u64>>,
    ) -> Result<(), Error> {
        each!(self, s => save_budget(budget))
    }

    /// Publishes a TLS-ALPN-01 challenge for the other replicas (a fleet's); the directory
    /// store has no one to tell.
    pub(crate) async fn publish_challenge(
        &self,
        identifier: &str,
        digest: Option<&[u8]>,
    ) -> Result<(), Error> {
        match self {
            Store::Dir(_) => {
                let _ = (identifier, digest);
                Ok(())
            }
            #[cfg(feature = "k8s")]
            Store::Kube(s) => s.publish_challenge(identifier, digest).await,
        }
    }

    /// How long a challenge takes to reach every replica before the CA is told to validate.
    pub(crate) fn propagation(&self) -> std::time::Duration {
        match self {
            Store::Dir(_) => std::time::Duration::ZERO,
            #[cfg(feature = "k8s")]
            Store::Kube(s) => s.propagation(),
        }
    }
}

impl DirStore {
    pub(crate) fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, file: &str) -> Result<Option<T>, Error> {
        let Some(bytes) = layout::read(dir, file)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::State {
                path: dir.join(file),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
            })
    }

    /// The stored account, if it was made at `directory`.
    pub(crate) fn account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        let dir = self.root.join("account");
        let stored_for = layout::read(&dir, "directory")?;
        if stored_for.as_deref() != Some(directory.as_bytes()) {
            return Ok(None);
        }
        let Some(credentials) = Self::read_json(&dir, "account.json")? else {
            return Ok(None);
        };
        let replaced =
            layout::read(&dir, "replaced")?.map(|why| String::from_utf8_lossy(&why).into_owned());
        Ok(Some((credentials, replaced)))
    }

    pub(crate) fn save_account(
        &self,
        directory: &str,
        json: &[u8],
        replaced: Option<&str>,
    ) -> Result<(), Error> {
        let mut files = vec![
            ("account.json", json, 0o600),
            ("directory", directory.as_bytes(), 0o644),
        ];
        if let Some(why) = replaced {
            files.push(("replaced", why.as_bytes(), 0o644));
        }
        layout::write_set(&self.root.join("account"), &files)?;
        Ok(())
    }

    pub(crate) fn cert_dir(&self, name: &str) -> PathBuf {
        self.root.join("certs").join(dir_name(name))
    }

    /// The stored certificate and key PEM of the certificate named `name`.
    pub(crate) fn cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        let dir = self.cert_dir(name);
        let (Some(cert), Some(key)) = (
            layout::read(&dir, "tls.crt")?,
            layout::read(&dir, "tls.key")?,
        ) else {
            return Ok(None);
        };
        Ok(Some(StoredCert {
            chain_pem: cert,
            key_pem: key,
        }))
    }

    pub(crate) fn save_cert(
        &self,
        name: &str,
        chain_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<(), Error> {
        layout::write_set(
            &self.cert_dir(name),
            &[("tls.crt", chain_pem, 0o644), ("tls.key", key_pem, 0o600)],
        )?;
        Ok(())
    }

    /// The order in flight for `name` and its key (PEM).
    pub(crate) fn order(&self, name: &str) -> Result<Option<(InFlight, Vec<u8>)>, Error> {
        let dir = self.root.join("orders").join(dir_name(name));
        let (Some(order), Some(key)) = (
            Self::read_json::<InFlight>(&dir, "order.json")?,
            layout::read(&dir, "key.pem")?,
        ) else {
            return Ok(None);
        };
        Ok(Some((order, key)))
    }

    pub(crate) fn save_order(
        &self,
        name: &str,
        order: &InFlight,
        key_pem: &[u8],
    ) -> Result<(), Error> {
        let json = serde_json::to_vec(order).map_err(|e| Error::Config(e.to_string()))?;
        layout::write_set(
            &self.root.join("orders").join(dir_name(name)),
            &[("order.json", &json, 0o644), ("key.pem", key_pem, 0o600)],
        )?;
        Ok(())
    }

    pub(crate) fn forget_order(&self, name: &str) -> Result<(), Error> {
        let dir = self.root.join("orders").join(dir_name(name));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::State { path: dir, source }),
        }
    }

    pub(crate) fn schedule(&self, name: &str) -> Result<Schedule, Error> {
        Ok(Self::read_json(
            &self.root.join("names").join(dir_name(name)),
            "schedule.json",
        )?
        .unwrap_or_default())
    }

    /// When new certificates were first ordered, per registered domain (seconds since the
    /// epoch).
    pub(crate) fn budget(&self) -> Result<BTreeMap<String, Vec<u64>>, Error> {
        Ok(Self::read_json(&self.root.join("budget"), "budget.json")?.unwrap_or_default())
    }

    pub(crate) fn save_budget(&self, budget: &BTreeMap<String, Vec<u64>>) -> Result<(), Error> {
        let json = serde_json::to_vec(budget).map_err(|e| Error::Config(e.to_string()))?;
        layout::write_set(&self.root.join("budget"), &[("budget.json", &json, 0o644)])?;
        Ok(())
    }

    pub(crate) fn save_schedule(&self, name: &str, schedule: &Schedule) -> Result<(), Error> {
        let json = serde_json::to_vec(schedule).map_err(|e| Error::Config(e.to_string()))?;
        layout::write_set(
            &self.root.join("names").join(dir_name(name)),
            &[("schedule.json", &json, 0o644)],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_times_far_past_or_beyond_9999_read_without_overflow() {
        assert_eq!(from_unix(0), UNIX_EPOCH);
        let end = from_unix(u64::MAX);
        assert_eq!(to_unix(end), 253_402_300_799, "clamped to the end of 9999");
        // A time before the epoch (a certificate from 1950) is stored as 0, not a panic.
        let y1950 = UNIX_EPOCH - Duration::from_secs(20 * 365 * 86_400);
        assert_eq!(to_unix(y1950), 0);
    }
}
