//! The emulator's state: the objects by resource, namespace and name, their resourceVersions,
//! the watchers, the faults to inject, and the writes (create, update with a precondition:
//! 409 on a stale resourceVersion) and deletes every route goes through.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use super::respond::{not_found, status};

/// The resources served: path segment, kind, apiVersion, and the list path prefix.
pub(super) const RESOURCES: [(&str, &str, &str, &str); 2] = [
    ("secrets", "Secret", "v1", "/api/v1"),
    (
        "leases",
        "Lease",
        "coordination.k8s.io/v1",
        "/apis/coordination.k8s.io/v1",
    ),
];

/// How a write treats what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// POST: 409 `AlreadyExists` if the object exists.
    Create,
    /// PUT or PATCH: 404 if it does not; 409 Conflict if the object carries a resourceVersion
    /// other than the stored one.
    Update,
    /// The emulator's own puts (the tests' set-up): create or replace, no precondition.
    Put,
}

#[derive(Debug)]
pub(super) struct Shared {
    /// Like a third-party API mock (kmock in its resourceVersion mode): field and label
    /// selectors are accepted and ignored, so every object of the namespace is listed and
    /// watched. Clients must check what they receive.
    pub(super) ignore_selectors: std::sync::atomic::AtomicBool,
    pub(super) state: Mutex<Store>,
    pub(super) events: broadcast::Sender<Stored>,
    /// Bumped to end every open watch stream.
    pub(super) close: watch::Sender<u64>,
    pub(super) faults: Mutex<Faults>,
    pub(super) requests: AtomicU64,
    /// Every request as `METHOD path?query`, in order.
    pub(super) log: Mutex<Vec<String>>,
    pub(super) gone: AtomicU64,
    /// The endpoints' counters, by the address their proxied connections come from.
    pub(super) clients: Mutex<HashMap<SocketAddr, Arc<super::endpoint::Counters>>>,
}

/// The peer address of a request's connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct Peer(pub(super) SocketAddr);

#[derive(Debug, Default)]
pub(super) struct Store {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<Key, Value>,
    pub(super) history: VecDeque<Stored>,
    /// Watches from a resourceVersion below this answer 410 Gone.
    pub(super) oldest: u64,
    /// When each write (by its resourceVersion) was stored, on the wall clock.
    pub(super) written: Vec<(u64, std::time::SystemTime)>,
    /// The rest of each list served in pages (`limit`), by its `continue` token: the objects as
    /// they were at the list's resourceVersion, as etcd's snapshot is.
    pub(super) pages: BTreeMap<u64, Page>,
    /// The last `continue` token handed out.
    pub(super) last_page: u64,
}

/// What a `continue` token resumes: the list's resourceVersion and the objects not yet sent.
#[derive(Debug)]
pub(super) struct Page {
    pub(super) rv: u64,
    pub(super) rest: VecDeque<Value>,
}

/// How many unfinished paged lists are kept; a client that abandons more loses the oldest
/// (410 on its `continue`, as after a compaction).
pub(super) const MAX_PAGED_LISTS: usize = 64;

#[derive(Debug, Default)]
pub(super) struct Faults {
    pub(super) next: VecDeque<u16>,
    pub(super) all: Option<u16>,
    pub(super) delay: Duration,
}

/// (resource, namespace, name)
pub(super) type Key = (String, String, String);

#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) rv: u64,
    pub(super) kind: &'static str,
    pub(super) object: Value,
    /// The object before a `MODIFIED` write: a watch with a selector needs both to tell whether
    /// the object entered or left its selection.
    pub(super) previous: Option<Value>,
    pub(super) resource: String,
}

pub(super) fn key(resource: &str, namespace: &str, name: &str) -> Key {
    (resource.to_owned(), namespace.to_owned(), name.to_owned())
}

// ===== the store =====

impl Shared {
    pub(super) fn ignores_selectors(&self) -> bool {
        self.ignore_selectors
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn register(&self, from: SocketAddr, counters: Arc<super::endpoint::Counters>) {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(from, counters);
    }

    pub(super) fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `object` at `key` with a new resourceVersion, as `mode` says, under one lock (as
    /// the API server, whose create and update are atomic: two creates of one name get one
    /// 201 and one 409). Returns the resourceVersion and the object as stored.
    pub(super) fn write(
        &self,
        key: &Key,
        mut object: Value,
        mode: Write,
    ) -> Result<(u64, Value), Box<Response>> {
        let mut state = self.lock();
        let existing = state.objects.get(key).cloned();
        let existing = existing.as_ref();
        match (mode, existing) {
            (Write::Create, Some(_)) => {
                return Err(Box::new(status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("{} \"{}\" already exists", key.0, key.2),
                )));
            }
            (Write::Update, None) => return Err(Box::new(not_found(&key.0, &key.2))),
            (Write::Update, Some(stored))
                if object["metadata"]["resourceVersion"]
                    .as_str()
                    .is_some_and(|want| {
                        stored["metadata"]["resourceVersion"].as_str() != Some(want)
                    }) =>
            {
                return Err(Box::new(status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                        key.0, key.2
                    ),
                )));
            }
            _ => {}
        }
        let (kind, api_version) = kind_of(&key.0);
        let created = existing.is_none();
        state.rv += 1;
        let rv = state.rv;
        state.written.push((rv, std::time::SystemTime::now()));
        object["kind"] = json!(kind);
        object["apiVersion"] = json!(api_version);
        object["metadata"]["name"] = json!(key.2);
        object["metadata"]["namespace"] = json!(key.1);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if created {
            object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{rv:012}"));
            object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        } else if let Some(old) = existing {
            object["metadata"]["uid"] = old["metadata"]["uid"].clone();
            object["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
        }
        state.objects.insert(key.clone(), object.clone());
        let written = object.clone();
        let stored = Stored {
            rv,
            kind: if created { "ADDED" } else { "MODIFIED" },
            object,
            previous: existing.cloned(),
            resource: key.0.clone(),
        };
        state.history.push_back(stored.clone());
        let _ = self.events.send(stored);
        Ok((rv, written))
    }

    pub(super) fn delete(&self, key: &Key) -> Option<Value> {
        let mut state = self.lock();
        let mut object = state.objects.remove(key)?;
        state.rv += 1;
        let rv = state.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Stored {
            rv,
            kind: "DELETED",
            object: object.clone(),
            previous: None,
            resource: key.0.clone(),
        };
        state.history.push_back(stored.clone());
        let _ = self.events.send(stored);
        Some(object)
    }
}

pub(super) fn kind_of(resource: &str) -> (&'static str, &'static str) {
    RESOURCES
        .iter()
        .find(|r| r.0 == resource)
        .map_or(("Unknown", "v1"), |r| (r.1, r.2))
}

// ===== HTTP =====
