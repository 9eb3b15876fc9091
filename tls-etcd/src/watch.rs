//! The list-then-watch loop both sources share: a key or a prefix listed at one revision (in
//! pages), then watched from the next; a broken watch resumed from the last revision seen; a
//! compacted revision listed again. Every failure is reported and retried with a backoff, on a
//! new connection that starts with the next endpoint.

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{Client, GetOptions, WatchOptions, WatchStream};
use futures::Stream;
use tls_source::Backoff;

use crate::Error;
use crate::connect::{Etcd, MAX_MESSAGE};

/// Keys per page of a list. Halved for a page larger than [`MAX_MESSAGE`]; a page of
/// certificates (a few KiB each) is well under it.
const PAGE: i64 = 1000;
/// The first wait after a failure, doubling up to [`MAX_WAIT`]. Short: a member killed is
/// replaced by the next endpoint at once, and a watch resumed from its revision misses nothing.
const FIRST_WAIT: Duration = Duration::from_millis(50);
const MAX_WAIT: Duration = Duration::from_secs(10);

/// What a watch of keys reports ([`store::watch_prefix`](crate::store::watch_prefix)).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A (re)list begins: the keys present follow as [`Put`](Self::Put), then
    /// [`Listed`](Self::Listed); a key not put again before it was deleted meanwhile.
    Listing,
    /// A key's value (from a list, or a put seen by the watch).
    Put {
        /// The key.
        key: String,
        /// Its value.
        value: Vec<u8>,
        /// The revision it was put at (its `mod_revision`).
        revision: i64,
    },
    /// A key deleted (seen by the watch).
    Delete {
        /// The key.
        key: String,
    },
    /// The (re)list is complete.
    Listed,
    /// A failure; the watch carries on (on the next endpoint, after a backoff).
    Failed(Error),
}

/// What is watched: one key, or every key under a prefix.
#[derive(Debug, Clone)]
pub(crate) enum Range {
    Key(String),
    Prefix(String),
}

impl Range {
    pub(crate) fn text(&self) -> &str {
        match self {
            Self::Key(key) | Self::Prefix(key) => key,
        }
    }

    /// The end of the range (exclusive), for a prefix: the prefix with its last byte raised
    /// (etcd's `WithPrefix`).
    fn end(&self) -> Option<Vec<u8>> {
        let Self::Prefix(prefix) = self else {
            return None;
        };
        let mut end = prefix.as_bytes().to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return Some(end);
            }
        }
        Some(vec![0]) // every key
    }
}

pub(crate) struct Watch {
    etcd: Etcd,
    range: Range,
    client: Option<Client>,
    stream: Option<WatchStream>,
    /// The revision listed or last seen by the watch; `None` until listed (and after a
    /// compaction, so the next step lists again).
    revision: Option<i64>,
    /// The list under way: its pages are passed on as they come, so that the consumer
    /// validates one while the next is fetched.
    cursor: Option<Cursor>,
    pending: VecDeque<Event>,
    backoff: Backoff,
    wait: Option<Duration>,
}

impl Watch {
    pub(crate) fn new(etcd: Etcd, range: Range) -> Self {
        Self {
            etcd,
            range,
            client: None,
            stream: None,
            revision: None,
            cursor: None,
            pending: VecDeque::new(),
            backoff: Backoff::new(FIRST_WAIT, MAX_WAIT),
            wait: None,
        }
    }

    /// The loop as a stream; nothing is requested until it is first polled, and dropping it
    /// closes the watch.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Event> + Send + 'static {
        futures::stream::unfold(self, |mut watch| async move {
            let event = watch.next().await;
            Some((event, watch))
        })
    }

    async fn next(&mut self) -> Event {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            if let Some(wait) = self.wait.take() {
                tokio::time::sleep(wait).await;
            }
            if let Err(err) = self.step().await {
                // A new connection for the next attempt, starting with the next endpoint: the
                // member may be gone, cut off from its leader, or stopping.
                self.client = None;
                self.stream = None;
                self.cursor = None; // a list cut short starts again, announced again
                self.etcd.avoid_current();
                self.wait = self.backoff.next();
                tracing::debug!(range = %self.range.text(), error = %err, wait = ?self.wait, "etcd watch failed; retrying");
                return Event::Failed(err);
            }
        }
    }

    /// One request: a connection, a list, a watch opened, or one watch message.
    async fn step(&mut self) -> Result<(), Error> {
        let client = match &mut self.client {
            Some(client) => client,
            None => self.client.insert(self.etcd.connect().await?),
        };
        let Some(revision) = self.revision else {
            let cursor = self.cursor.get_or_insert_with(|| {
                self.pending.push_back(Event::Listing);
                Cursor::new(&self.range)
            });
            self.etcd.count("list");
            let done = cursor.page(client, &self.range, &mut self.pending).await?;
            if let Some(revision) = done {
                self.cursor = None;
                self.revision = Some(revision);
                self.pending.push_back(Event::Listed);
            }
            self.backoff.reset();
            return Ok(());
        };
        let stream = match &mut self.stream {
            Some(stream) => stream,
            None => {
                let mut options = WatchOptions::new()
                    .with_start_revision(revision.saturating_add(1))
                    .with_progress_notify();
                if let Some(end) = self.range.end() {
                    options = options.with_range(end);
                }
                self.etcd.count("watch");
                let stream = client
                    .watch_client()
                    .max_decoding_message_size(MAX_MESSAGE)
                    .watch(self.range.text(), Some(options))
                    .await
                    .map_err(|source| self.request("watch", source))?;
                self.stream.insert(stream)
            }
        };
        let message = stream.message().await.map_err(|source| Error::Request {
            what: format!("watch of {}", self.range.text()),
            source,
        })?;
        let Some(message) = message else {
            return Err(Error::WatchCancelled {
                key: self.range.text().to_owned(),
                reason: "the watch stream ended".to_owned(),
            });
        };
        if message.canceled() {
            self.stream = None;
            if message.compact_revision() > 0 {
                // The revision to resume from is gone: list again (the consumers tell what
                // changed meanwhile, removals included), then watch from the new revision.
                tracing::info!(range = %self.range.text(), from = revision + 1, compacted = message.compact_revision(), "etcd compacted the revision to resume the watch from; listing again");
                self.revision = None;
                return Ok(());
            }
            return Err(Error::WatchCancelled {
                key: self.range.text().to_owned(),
                reason: if message.cancel_reason().is_empty() {
                    "no reason given".to_owned()
                } else {
                    message.cancel_reason().to_owned()
                },
            });
        }
        let mut seen = revision;
        for event in message.events() {
            let Some(kv) = event.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            seen = seen.max(kv.mod_revision());
            self.pending.push_back(match event.event_type() {
                etcd_client::EventType::Put => Event::Put {
                    key,
                    value: kv.value().to_vec(),
                    revision: kv.mod_revision(),
                },
                etcd_client::EventType::Delete => Event::Delete { key },
            });
        }
        // A progress notification (or the created response) moves the revision on too, so
        // that a resumed watch does not ask for history that may be compacted by then.
        if let Some(header) = message.header() {
            seen = seen.max(header.revision());
        }
        self.revision = Some(seen);
        self.backoff.reset();
        Ok(())
    }

    fn request(&self, what: &str, source: etcd_client::Error) -> Error {
        Error::Request {
            what: format!(
                "{what} of {} through {}",
                self.range.text(),
                self.etcd.current()
            ),
            source,
        }
    }
}

/// A list in pages, all at the revision of the first.
struct Cursor {
    /// The revision of the first page; 0 before it.
    revision: i64,
    /// The first key of the next page.
    from: Vec<u8>,
    /// Keys per page.
    page: i64,
}

impl Cursor {
    fn new(range: &Range) -> Self {
        Self {
            revision: 0,
            from: range.text().as_bytes().to_vec(),
            page: PAGE,
        }
    }

    /// Fetches the next page into `out` as [`Event::Put`]s; the list's revision once it was the
    /// last. A revision compacted between pages starts the list again (announced again).
    async fn page(
        &mut self,
        client: &mut Client,
        range: &Range,
        out: &mut VecDeque<Event>,
    ) -> Result<Option<i64>, Error> {
        let end = range.end();
        let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        let mut response = loop {
            let mut options = GetOptions::new().with_limit(self.page);
            if let Some(end) = &end {
                options = options.with_range(end.clone());
            }
            if self.revision > 0 {
                options = options.with_revision(self.revision);
            }
            match kv.get(self.from.clone(), Some(options)).await {
                Ok(response) => break response,
                Err(err) if too_large(&err) && self.page > 1 => {
                    self.page = (self.page / 2).max(1);
                    tracing::debug!(range = %range.text(), page = self.page, "a page of the list was too large; asking for fewer keys");
                }
                Err(err) if self.revision > 0 && compacted(&err) => {
                    tracing::info!(range = %range.text(), revision = self.revision, "etcd compacted the revision of the list under way; listing again");
                    *self = Self::new(range);
                    out.push_back(Event::Listing);
                }
                Err(source) => {
                    return Err(Error::Request {
                        what: format!("list of {}", range.text()),
                        source,
                    });
                }
            }
        };
        if self.revision == 0 {
            self.revision = response
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
        }
        let more = response.more();
        let mut last = None;
        // Taken, not copied: a page of certificates is a megabyte or more.
        for kv in response.take_kvs() {
            let revision = kv.mod_revision();
            let (key, value) = kv.into_key_value();
            out.push_back(Event::Put {
                key: String::from_utf8_lossy(&key).into_owned(),
                value,
                revision,
            });
            last = Some(key);
        }
        match (more, last) {
            (true, Some(last)) if end.is_some() => {
                self.from = last;
                self.from.push(0); // the next key after it (the key's own bytes)
                Ok(None)
            }
            _ => Ok(Some(self.revision)),
        }
    }
}

fn status(err: &etcd_client::Error) -> Option<&tonic::Status> {
    match err {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        _ => None,
    }
}

/// A response larger than [`MAX_MESSAGE`].
fn too_large(err: &etcd_client::Error) -> bool {
    status(err).is_some_and(|s| s.message().contains("message length too large"))
}

/// etcd's `ErrCompacted`: the revision asked for is compacted.
fn compacted(err: &etcd_client::Error) -> bool {
    status(err).is_some_and(|s| s.message().contains("required revision has been compacted"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_last_byte_raised() {
        assert_eq!(Range::Prefix("/a/".into()).end(), Some(b"/a0".to_vec()));
        assert_eq!(Range::Key("/a".into()).end(), None);
        assert_eq!(Range::Prefix(String::new()).end(), Some(vec![0]));
    }
}
