//! The state directory of one replica: the account, each certificate in the kubelet's
//! `..data` layout (so a `FileSource` could serve it too), each order in flight (its URL and
//! its new key, written before a challenge is answered), each certificate's record. Every set
//! of files is swapped in at once (`tls_source::layout`) and synced; key files and accounts are
//! mode 0600. The calls run on tokio's blocking threads, so a server on the same runtime never
//! waits behind a disk.
//!
//! ```text
//! STATE/account/{account.json,directory}  the account of the first directory used
//! STATE/accounts/HASH/{account.json,directory}   any other directory's (HASH: of its URL)
//! STATE/certs/NAME/{tls.crt,tls.key}      (NAME: the certificate's first name, `*` as `_`)
//! STATE/orders/NAME/{order.json,key.pem}
//! STATE/names/NAME/schedule.json          the certificate's record (a superset of the
//!                                         schedule earlier versions wrote)
//! STATE/budget/budget.json                first orders per registered domain, last 7 days
//! STATE/challenges/published.json         challenge answers published, not yet withdrawn
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tls_source::layout;

use super::{
    AcmeStore, InFlight, NewAccount, OrderJson, Published, StoreFuture, StoredAccount, StoredCert,
    Term,
};
use crate::Error;
use crate::budget::Budget;
use crate::challenge::ChallengeType;
use crate::record::Record;

/// The state directory.
#[derive(Debug, Clone)]
pub(crate) struct DirStore {
    root: PathBuf,
    /// Held across each read-change-write of `challenges/published.json`, which every order's
    /// challenges share (orders run at once).
    published: Arc<Mutex<()>>,
}

/// The directory name of a certificate named by its first name.
fn dir_name(name: &str) -> String {
    name.replace('*', "_")
}

impl DirStore {
    pub(crate) fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            published: Arc::default(),
        }
    }

    /// Runs `f` on a copy of this store on tokio's blocking threads.
    fn blocking<'a, T: Send + 'static>(
        &self,
        f: impl FnOnce(&Self) -> Result<T, Error> + Send + 'static,
    ) -> StoreFuture<'a, T> {
        let this = self.clone();
        Box::pin(async move {
            let root = this.root.clone();
            tokio::task::spawn_blocking(move || f(&this))
                .await
                .map_err(|e| Error::State {
                    path: root,
                    source: std::io::Error::other(e),
                })?
        })
    }

    fn read_json<T: for<'de> serde::Deserialize<'de>>(
        dir: &Path,
        file: &str,
    ) -> Result<Option<T>, Error> {
        let Some(bytes) = layout::read(dir, file)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::State {
                path: dir.join(file),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })
    }

    fn json<T: serde::Serialize>(&self, value: &T, file: &Path) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(value).map_err(|e| Error::State {
            path: file.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    /// Where the account of `directory` is kept: `account/` (every version's) when it holds
    /// that directory's or none, else `accounts/HASH/`.
    fn account_dir(&self, directory: &str) -> Result<PathBuf, Error> {
        let first = self.root.join("account");
        match layout::read(&first, "directory")? {
            Some(stored) if stored != directory.as_bytes() => {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(directory.as_bytes());
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                Ok(self.root.join("accounts").join(hex))
            }
            _ => Ok(first),
        }
    }

    fn read_account(&self, directory: &str) -> Result<Option<StoredAccount>, Error> {
        let dir = self.account_dir(directory)?;
        if layout::read(&dir, "directory")?.as_deref() != Some(directory.as_bytes()) {
            return Ok(None);
        }
        let Some(credentials) = Self::read_json(&dir, "account.json")? else {
            return Ok(None);
        };
        let replaced =
            layout::read(&dir, "replaced")?.map(|why| String::from_utf8_lossy(&why).into_owned());
        Ok(Some(StoredAccount {
            credentials,
            replaced,
        }))
    }

    fn cert_dir(&self, name: &str) -> PathBuf {
        self.root.join("certs").join(dir_name(name))
    }

    fn order_dir(&self, name: &str) -> PathBuf {
        self.root.join("orders").join(dir_name(name))
    }

    fn record_dir(&self, name: &str) -> PathBuf {
        self.root.join("names").join(dir_name(name))
    }

    fn read_cert(&self, name: &str) -> Result<Option<StoredCert>, Error> {
        let dir = self.cert_dir(name);
        let (Some(chain_pem), Some(key_pem)) = (
            layout::read(&dir, "tls.crt")?,
            layout::read(&dir, "tls.key")?,
        ) else {
            return Ok(None);
        };
        Ok(Some(StoredCert { chain_pem, key_pem }))
    }

    fn read_record(&self, name: &str) -> Result<Record, Error> {
        let dir = self.record_dir(name);
        let Some(bytes) = layout::read(&dir, "schedule.json")? else {
            return Ok(Record::default());
        };
        Record::from_json(&bytes).map_err(|e| Error::State {
            path: dir.join("schedule.json"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    fn read_in_flight(&self, name: &str) -> Result<Option<InFlight>, Error> {
        let dir = self.order_dir(name);
        let (Some(order), Some(key_pem)) = (
            Self::read_json::<OrderJson>(&dir, "order.json")?,
            layout::read(&dir, "key.pem")?,
        ) else {
            return Ok(None);
        };
        Ok(Some(InFlight {
            url: order.url,
            key_pem,
        }))
    }

    fn remove(dir: PathBuf) -> Result<(), Error> {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::State { path: dir, source }),
        }
    }

    fn read_published(&self) -> Result<Vec<Published>, Error> {
        Ok(Self::read_json(&self.root.join("challenges"), "published.json")?.unwrap_or_default())
    }

    fn write_published(&self, published: &[Published]) -> Result<(), Error> {
        let dir = self.root.join("challenges");
        let json = self.json(&published, &dir.join("published.json"))?;
        layout::write_set(&dir, &[("published.json", &json, 0o600)])?;
        Ok(())
    }
}

impl AcmeStore for DirStore {
    fn account<'a>(&'a self, directory: &'a str) -> StoreFuture<'a, Option<StoredAccount>> {
        let directory = directory.to_owned();
        self.blocking(move |s| s.read_account(&directory))
    }

    fn save_account<'a>(
        &'a self,
        directory: &'a str,
        account: NewAccount<'a>,
    ) -> StoreFuture<'a, ()> {
        let directory = directory.to_owned();
        let json = serde_json::to_vec(account.credentials);
        let replaced = account.replaced.map(str::to_owned);
        self.blocking(move |s| {
            let dir = s.account_dir(&directory)?;
            let json = json.map_err(|e| Error::State {
                path: dir.join("account.json"),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?;
            let mut files = vec![
                ("account.json", json.as_slice(), 0o600),
                ("directory", directory.as_bytes(), 0o644),
            ];
            if let Some(why) = &replaced {
                files.push(("replaced", why.as_bytes(), 0o644));
            }
            layout::write_set(&dir, &files)?;
            Ok(())
        })
    }

    fn cert<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<StoredCert>> {
        let name = name.to_owned();
        self.blocking(move |s| s.read_cert(&name))
    }

    fn save_cert<'a>(&'a self, name: &'a str, cert: &'a StoredCert) -> StoreFuture<'a, ()> {
        let (name, cert) = (name.to_owned(), cert.clone());
        self.blocking(move |s| {
            layout::write_set(
                &s.cert_dir(&name),
                &[
                    ("tls.crt", &cert.chain_pem, 0o644),
                    ("tls.key", &cert.key_pem, 0o600),
                ],
            )?;
            Ok(())
        })
    }

    fn record<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Record> {
        let name = name.to_owned();
        self.blocking(move |s| s.read_record(&name))
    }

    fn save_record<'a>(&'a self, name: &'a str, record: &'a Record) -> StoreFuture<'a, ()> {
        let (name, json) = (name.to_owned(), record.to_json());
        self.blocking(move |s| {
            layout::write_set(&s.record_dir(&name), &[("schedule.json", &json, 0o644)])?;
            Ok(())
        })
    }

    fn in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Option<InFlight>> {
        let name = name.to_owned();
        self.blocking(move |s| s.read_in_flight(&name))
    }

    fn save_in_flight<'a>(&'a self, name: &'a str, order: &'a InFlight) -> StoreFuture<'a, ()> {
        let (name, order) = (name.to_owned(), order.clone());
        self.blocking(move |s| {
            let dir = s.order_dir(&name);
            let json = s.json(
                &OrderJson {
                    url: order.url.clone(),
                },
                &dir.join("order.json"),
            )?;
            layout::write_set(
                &dir,
                &[
                    ("order.json", &json, 0o644),
                    ("key.pem", &order.key_pem, 0o600),
                ],
            )?;
            Ok(())
        })
    }

    fn forget_in_flight<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        let name = name.to_owned();
        self.blocking(move |s| Self::remove(s.order_dir(&name)))
    }

    fn budget(&self) -> StoreFuture<'_, Budget> {
        self.blocking(|s| {
            Ok(Self::read_json(&s.root.join("budget"), "budget.json")?.unwrap_or_default())
        })
    }

    fn save_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, ()> {
        let budget = budget.clone();
        self.blocking(move |s| {
            let dir = s.root.join("budget");
            let json = s.json(&budget, &dir.join("budget.json"))?;
            layout::write_set(&dir, &[("budget.json", &json, 0o644)])?;
            Ok(())
        })
    }

    fn published(&self) -> StoreFuture<'_, Vec<Published>> {
        self.blocking(|s| {
            let _one_at_a_time = s.published.lock().unwrap_or_else(PoisonError::into_inner);
            s.read_published()
        })
    }

    /// Only DNS-01 records are kept: a TLS-ALPN-01 answer lives in this process's memory and
    /// is gone after a restart, with no one else to tell.
    fn publish<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        if challenge.kind != ChallengeType::Dns01 {
            return Box::pin(async { Ok(()) });
        }
        let challenge = challenge.clone();
        self.blocking(move |s| {
            let _one_at_a_time = s.published.lock().unwrap_or_else(PoisonError::into_inner);
            let mut published = s.read_published()?;
            if !published.contains(&challenge) {
                published.push(challenge);
                s.write_published(&published)?;
            }
            Ok(())
        })
    }

    fn withdraw<'a>(&'a self, challenge: &'a Published) -> StoreFuture<'a, ()> {
        if challenge.kind != ChallengeType::Dns01 {
            return Box::pin(async { Ok(()) });
        }
        let challenge = challenge.clone();
        self.blocking(move |s| {
            let _one_at_a_time = s.published.lock().unwrap_or_else(PoisonError::into_inner);
            let mut published = s.read_published()?;
            let before = published.len();
            published.retain(|p| *p != challenge);
            if published.len() != before {
                s.write_published(&published)?;
            }
            Ok(())
        })
    }

    fn begin_term(&self, _term: Term) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn end_term(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state directory as the previous version wrote it loads: the schedule as the record,
    /// the budget, the order in flight; what this version writes the previous one reads.
    /// Orders run at once, and each publishes its DNS-01 records: none is lost, and the file
    /// they share is never caught half-swapped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn answers_published_at_once_are_all_kept_and_withdrawn() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::new(dir.path());
        let answer = |n: usize| Published {
            kind: ChallengeType::Dns01,
            name: format!("_acme-challenge.w{n}.example.com"),
            value: format!("value-{n}").into_bytes(),
        };
        let all: Vec<Published> = (0..20).map(answer).collect();
        let published = futures::future::join_all(all.iter().map(|p| store.publish(p))).await;
        assert!(published.iter().all(Result::is_ok), "{published:?}");
        let mut stored = store.published().await.unwrap();
        stored.sort_by(|a, b| a.name.cmp(&b.name));
        let mut expected = all.clone();
        expected.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(stored, expected);
        let withdrawn = futures::future::join_all(all.iter().map(|p| store.withdraw(p))).await;
        assert!(withdrawn.iter().all(Result::is_ok), "{withdrawn:?}");
        assert!(store.published().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_state_directory_an_earlier_version_wrote_loads() {
        let root = tempfile::tempdir().unwrap();
        let names = root.path().join("names/a.example.com");
        layout::write_set(
            &names,
            &[(
                "schedule.json",
                br#"{"retry_at":1800000000,"failures":1,"last_error":"refused"}"#,
                0o644,
            )],
        )
        .unwrap();
        layout::write_set(
            &root.path().join("budget"),
            &[("budget.json", br#"{"example.com":[1799990000]}"#, 0o644)],
        )
        .unwrap();
        layout::write_set(
            &root.path().join("orders/a.example.com"),
            &[
                (
                    "order.json",
                    br#"{"url":"https://ca.example/order/1"}"#,
                    0o644,
                ),
                ("key.pem", b"-----BEGIN PRIVATE KEY-----", 0o600),
            ],
        )
        .unwrap();
        let store = DirStore::new(root.path());
        let mut record = store.record("a.example.com").await.unwrap();
        assert_eq!(record.retry_at, Some(1_800_000_000));
        assert_eq!(record.last_error.as_deref(), Some("refused"));
        let order = store.in_flight("a.example.com").await.unwrap().unwrap();
        assert_eq!(order.url, "https://ca.example/order/1");
        let mut budget = store.budget().await.unwrap();
        budget
            .spend("b.example.com", 1, crate::record::from_unix(1_800_000_000))
            .expect_err("one a week, spent by the earlier version");

        record.jitter = Some(0.5);
        store.save_record("a.example.com", &record).await.unwrap();
        let json = std::fs::read(names.join("schedule.json")).unwrap();
        let old: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            old["retry_at"], 1_800_000_000,
            "the earlier fields, where they were"
        );
        assert_eq!(old["failures"], 1);
    }

    #[tokio::test]
    async fn accounts_are_kept_per_directory_the_first_where_every_version_looks() {
        let root = tempfile::tempdir().unwrap();
        let store = DirStore::new(root.path());
        let credentials = serde_json::json!({"id": "https://ca.example/acct/1"});
        for directory in ["https://one.example/dir", "https://two.example/dir"] {
            store
                .save_account(
                    directory,
                    NewAccount {
                        credentials: &credentials,
                        url: "https://ca.example/acct/1",
                        thumbprint: "t",
                        replaced: None,
                    },
                )
                .await
                .unwrap();
        }
        assert_eq!(
            std::fs::read(root.path().join("account/directory")).unwrap(),
            b"https://one.example/dir"
        );
        for directory in ["https://one.example/dir", "https://two.example/dir"] {
            assert!(
                store.account(directory).await.unwrap().is_some(),
                "{directory}"
            );
        }
        assert!(
            store
                .account("https://three.example/dir")
                .await
                .unwrap()
                .is_none()
        );
    }
}
