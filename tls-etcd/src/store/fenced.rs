//! [`FencedKeys`]: writes of a fleet's state, each one transaction that holds only while the
//! writer key was created in the writer's round.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::sync::Mutex;

use crate::{Error, Etcd};

/// What a write carries: the round of the writer that makes it ([`Leadership::fence`]).
///
/// [`Leadership::fence`]: super::Leadership::fence
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The writer key's `create_revision` when this writer took it.
    pub round: u64,
}

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedError {
    /// The writer key is no longer the one created in this round: another writer (or none)
    /// holds it now. Nothing was written.
    #[error(
        "refused: the writer key {key} is no longer the one of round {round}; another writer leads"
    )]
    Fenced {
        /// The writer key.
        key: String,
        /// The round the write carried.
        round: u64,
    },
    /// etcd failed the request (nothing is known to be written).
    #[error(transparent)]
    Etcd(#[from] Error),
}

/// Writes of a fleet's state fenced by the writer's round: each write is one transaction that
/// compares the writer key's `create_revision` with the round it carries, so a writer deposed
/// while paused (a stopped process, a partition) writes nothing, as a stale `resourceVersion`
/// is refused on Kubernetes. A refused write is logged and counted ([`refused`](Self::refused)).
pub struct FencedKeys {
    etcd: Etcd,
    writer_key: String,
    client: Mutex<Option<Client>>,
    refused: AtomicU64,
    written: AtomicU64,
}

impl fmt::Debug for FencedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedKeys")
            .field("writer_key", &self.writer_key)
            .field("refused", &self.refused())
            .field("written", &self.written())
            .finish_non_exhaustive()
    }
}

impl FencedKeys {
    /// Writes fenced by the holder key `writer_key` (a [`WriterLease`](super::WriterLease)'s
    /// [`key`](super::WriterLease::key)).
    pub fn new(etcd: Etcd, writer_key: impl Into<String>) -> Self {
        Self {
            etcd,
            writer_key: writer_key.into(),
            client: Mutex::new(None),
            refused: AtomicU64::new(0),
            written: AtomicU64::new(0),
        }
    }

    /// Puts every `(key, value)` in one transaction, if the writer key is still the one of
    /// `fence`'s round; returns the revision written at.
    ///
    /// # Errors
    /// [`FencedError::Fenced`] when another round holds the writer key (nothing written), or
    /// etcd's failure.
    pub async fn put(
        &self,
        fence: Fence,
        values: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<i64, FencedError> {
        let ops: Vec<TxnOp> = values
            .into_iter()
            .map(|(key, value)| TxnOp::put(key, value, None))
            .collect();
        self.txn(fence, ops).await
    }

    /// Runs `ops` in one transaction, if the writer key is still the one of `fence`'s round;
    /// returns the revision of the transaction.
    ///
    /// # Errors
    /// As [`put`](Self::put).
    pub async fn txn(&self, fence: Fence, ops: Vec<TxnOp>) -> Result<i64, FencedError> {
        let round = i64::try_from(fence.round).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.writer_key.as_str(),
                CompareOp::Equal,
                round,
            )])
            .and_then(ops);
        let mut guard = self.client.lock().await;
        let client = match &mut *guard {
            Some(client) => client,
            None => guard.insert(self.etcd.connect().await?),
        };
        self.etcd.count("txn");
        let response = match client.txn(txn).await {
            Ok(response) => response,
            Err(source) => {
                *guard = None; // a new connection next time
                return Err(FencedError::Etcd(Error::Request {
                    what: format!("fenced write (round {})", fence.round),
                    source,
                }));
            }
        };
        crate::metrics::fenced_write(response.succeeded());
        if !response.succeeded() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(key = %self.writer_key, round = fence.round, "a fenced write was refused: another writer leads now; nothing written");
            return Err(FencedError::Fenced {
                key: self.writer_key.clone(),
                round: fence.round,
            });
        }
        self.written.fetch_add(1, Ordering::Relaxed);
        Ok(response
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision))
    }

    /// Reads the value at `key` (a linearizable read), if there is one: the fleet's state as
    /// stored, for the writer to decide on. Not fenced: anyone may read.
    ///
    /// # Errors
    /// etcd's failure.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let mut kvs = self.read(key, None).await?;
        Ok(kvs.pop().map(|(_, value)| value))
    }

    /// Reads every key under `prefix` with its value, in key order (in one request: for a
    /// few keys, such as the challenges published).
    ///
    /// # Errors
    /// etcd's failure.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        self.read(prefix, Some(GetOptions::new().with_prefix()))
            .await
    }

    async fn read(
        &self,
        key: &str,
        options: Option<GetOptions>,
    ) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut client = {
            let mut guard = self.client.lock().await;
            match &*guard {
                Some(client) => client.clone(),
                None => guard.insert(self.etcd.connect().await?).clone(),
            }
        };
        self.etcd.count("read");
        match client.get(key, options).await {
            Ok(response) => Ok(response
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.value().to_vec(),
                    )
                })
                .collect()),
            Err(source) => {
                *self.client.lock().await = None; // a new connection next time
                Err(Error::Request {
                    what: format!("read of {key}"),
                    source,
                })
            }
        }
    }

    /// How many writes were refused for a stale round.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// How many writes were made.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}
