//! A Kubernetes API emulator on loopback: the wire protocol of the resources this workspace uses,
//! with fault injection.
//!
//! Speaks enough of the real API for `kube::Client` and `kube::runtime::watcher` to run
//! unchanged against it (an ordinary `kube::Config` with its URL):
//! - core/v1 `secrets` and coordination.k8s.io/v1 `leases`, namespaced and across namespaces;
//! - get; list (with `resourceVersion` in the list metadata), in pages with `limit` and
//!   `continue` as the API server pages it (each page from the snapshot of the first; a token
//!   older than a compaction answers 410 Expired); watch streams of JSON events
//!   (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`), resumable from a `resourceVersion`,
//!   filtered by `fieldSelector` (`metadata.name`, `metadata.namespace`) and `labelSelector`
//!   (`k=v`, `k==v`, `k!=v`, `k`, `!k`), ended after `timeoutSeconds` (any value: one past
//!   what the clock can add never ends it);
//! - create, update and patch (JSON merge patch) with `resourceVersion` preconditions (409
//!   Conflict), delete; resourceVersions that only grow, across restarts too.
//!
//! Faults: [`close_watches`](KubeApi::close_watches), [`compact`](KubeApi::compact) (older
//! resourceVersions answer 410 Gone), [`fail_next`](KubeApi::fail_next) /
//! [`fail_all`](KubeApi::fail_all) (500s, 403s...), [`set_delay`](KubeApi::set_delay), and
//! [`restart`](KubeApi::restart), keeping or losing state; and per client, through its own
//! [`Endpoint`] ([`KubeApi::endpoint`]): a partition that hangs or resets only that client's
//! connections, or a pause that holds its requests and delivers them late, while the other
//! clients carry on. Each endpoint counts its own requests.
//!
//! # The files
//!
//! `mod.rs` its
//! public face: objects put and labelled, faults, restarts, logs; `store.rs` the objects, their
//! resourceVersions (that only grow), and writes that are atomic as the API server's (of racing
//! creates one gets 201, the others 409 `AlreadyExists`; an update with a stale resourceVersion
//! 409 `Conflict`, of a missing object 404); `http.rs` the paths,
//! the request log, injected faults, create, get, update, merge patch, delete with the API's
//! Status bodies; `selectors.rs` field and label selectors (set-based too) with the watch cache's
//! ADDED/DELETED on selection changes, `ignore_selectors` (as kmock: every object of the namespace
//! is sent); `watches.rs` list and watch with resume, bookmarks, 410 before the compacted
//! resourceVersion, time-outs, `close_watches` (nothing written after it reaches a stream open
//! before it), lists in pages (`limit`/`continue` from one snapshot, as kube's
//! watcher asks for; a continue token older than a compaction is 410 `Expired`); `endpoint.rs`: an `Endpoint` per client, a TCP
//! proxy on its own port whose `Link` partitions (hang, reset) or pauses (bytes held, delivered
//! late) that client alone, with its own request log

mod endpoint;
mod http;
mod respond;
mod selectors;
mod store;
mod watches;

pub use endpoint::{Endpoint, Link};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;

use http::*;
use store::*;

/// The emulator. Stops when dropped.
#[derive(Debug)]
pub struct KubeApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<JoinSet<()>>,
}

/// A kubeconfig for the API server at `url` (no authentication, namespace `default`).
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\n\
         contexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: emulator\n    namespace: default\n\
         current-context: emulator\nusers:\n- name: emulator\n  user: {{}}\n"
    )
}

// ===== impl KubeApi =====

impl KubeApi {
    /// Starts an empty API server on an ephemeral loopback port.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("an address"))
            .await
            .expect("bind loopback")
    }

    /// Starts an empty API server on `addr` (the `kube-emulator` binary's `--listen`).
    ///
    /// # Errors
    /// If `addr` cannot be bound.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            ignore_selectors: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(Store::default()),
            events,
            close: watch::channel(0).0,
            faults: Mutex::new(Faults::default()),
            requests: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
            gone: AtomicU64::new(0),
            clients: Mutex::new(HashMap::new()),
        });
        let mut server = JoinSet::new();
        server.spawn(serve(listener, shared.clone()));
        Ok(Self {
            addr,
            shared,
            server: Mutex::new(server),
        })
    }

    /// A kubeconfig for this emulator (no authentication, namespace `default`): what `serve`
    /// and any kube client read through `KUBECONFIG`.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url())
    }

    /// Stops (or resumes) applying `fieldSelector` and `labelSelector` to lists and watches,
    /// as API mocks that do not implement them behave: every object of the namespace is sent.
    /// For tests that a client checks the name, namespace and labels of what it receives.
    pub fn ignore_selectors(&self, ignore: bool) {
        self.shared
            .ignore_selectors
            .store(ignore, std::sync::atomic::Ordering::SeqCst);
    }

    /// The base URL, for `kube::Config::new(url.parse()?)`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A port of its own for one client (one replica, say), through the same store: faults on it
    /// ([`Endpoint::partition`], [`Endpoint::pause`]) touch only that client's traffic.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn endpoint(&self) -> Endpoint {
        Endpoint::start(self.addr, self.shared.clone()).await
    }

    /// How many requests the server has answered (faults included).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Every request answered so far, as `METHOD path?query` (e.g.
    /// `GET /api/v1/namespaces/web/secrets?labelSelector=app%3Dweb&watch=true&...`).
    pub fn request_log(&self) -> Vec<String> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many watches were answered 410 Gone (their resourceVersion was too old).
    pub fn answered_gone(&self) -> u64 {
        self.shared.gone.load(Ordering::Relaxed)
    }

    /// Creates or replaces a Secret of type `kubernetes.io/tls` with `data` (raw bytes; encoded
    /// as the API does), as a writer through the API would. Returns its new resourceVersion.
    pub fn put_secret(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) -> u64 {
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        let key = key("secrets", namespace, name);
        let mut object = self.shared.lock().objects.get(&key).cloned().unwrap_or_else(|| {
            json!({"metadata": {"name": name, "namespace": namespace}, "type": "kubernetes.io/tls"})
        });
        object["data"] = Value::Object(encoded);
        self.shared
            .write(&key, object, Write::Put)
            .expect("put secret")
            .0
    }

    /// Creates or replaces a `kubernetes.io/tls` Secret whose `data` values are stored as given,
    /// not encoded: invalid base64 as a proxy or a buggy writer might leave it.
    pub fn put_secret_raw(&self, namespace: &str, name: &str, data: &[(&str, &str)]) -> u64 {
        let raw: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect();
        let key = key("secrets", namespace, name);
        let object = json!({
            "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/tls",
            "data": raw,
        });
        self.shared
            .write(&key, object, Write::Put)
            .expect("put secret")
            .0
    }

    /// Sets a label on an object (a metadata-only change). Returns the new resourceVersion.
    ///
    /// # Panics
    /// If the object does not exist.
    pub fn set_label(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        label: &str,
        value: &str,
    ) -> u64 {
        self.relabel(resource, namespace, name, |labels| {
            labels[label] = Value::String(value.to_owned());
        })
    }

    /// Removes a label from an object. Returns the new resourceVersion.
    ///
    /// # Panics
    /// If the object does not exist.
    pub fn remove_label(&self, resource: &str, namespace: &str, name: &str, label: &str) -> u64 {
        self.relabel(resource, namespace, name, |labels| {
            if let Some(labels) = labels.as_object_mut() {
                labels.remove(label);
            }
        })
    }

    /// Changes an object's labels (a metadata-only write). Returns the new resourceVersion.
    fn relabel(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> u64 {
        let key = key(resource, namespace, name);
        let mut object = self
            .shared
            .lock()
            .objects
            .get(&key)
            .cloned()
            .expect("object exists");
        change(&mut object["metadata"]["labels"]);
        self.shared
            .write(&key, object, Write::Put)
            .expect("change labels")
            .0
    }

    /// Deletes an object. Returns whether it existed.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        self.shared
            .delete(&key(resource, namespace, name))
            .is_some()
    }

    /// The stored object, as the API would return it.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&key(resource, namespace, name))
            .cloned()
    }

    /// When the write that made resourceVersion `rv` was stored (wall clock): for measuring
    /// the time from a write to its effect, against `Status`'s `loaded_at`.
    pub fn written_at(&self, rv: u64) -> Option<std::time::SystemTime> {
        let state = self.shared.lock();
        state
            .written
            .iter()
            .rev()
            .find(|(at, _)| *at == rv)
            .map(|(_, when)| *when)
    }

    /// Ends every open watch stream, as a dropped connection or a load balancer time-out would:
    /// nothing written after this returns is sent on a stream that was open before it.
    pub fn close_watches(&self) {
        self.shared.close.send_modify(|n| *n += 1);
    }

    /// Forgets the event history: a watch resumed from an older resourceVersion gets 410 Gone
    /// and the client must list again.
    pub fn compact(&self) {
        let mut state = self.shared.lock();
        state.history.clear();
        state.oldest = state.rv + 1;
    }

    /// Answers the next `count` requests with `code` (e.g. 500, 403, 429).
    pub fn fail_next(&self, code: u16, count: usize) {
        self.shared
            .faults()
            .next
            .extend(std::iter::repeat_n(code, count));
    }

    /// Answers every request with `code` until called with `None`; open watches end.
    pub fn fail_all(&self, code: Option<u16>) {
        self.shared.faults().all = code;
        if code.is_some() {
            self.close_watches();
        }
    }

    /// Delays every answer by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.faults().delay = delay;
    }

    /// Stops the server abruptly (every connection dropped) and starts it again on the same
    /// address, with its objects (`keep_state`) or empty, as after losing etcd. resourceVersions
    /// keep growing either way, and the history is gone: old watches get 410.
    ///
    /// # Panics
    /// If the address cannot be bound again.
    pub async fn restart(&self, keep_state: bool) {
        {
            let mut server = self.server.lock().unwrap_or_else(PoisonError::into_inner);
            server.abort_all();
        }
        self.close_watches();
        {
            let mut state = self.shared.lock();
            if !keep_state {
                // Every resourceVersion a client holds is now meaningless: resuming answers 410.
                state.objects.clear();
                state.rv += 1;
            }
            state.history.clear();
            state.oldest = state.rv + 1;
        }
        // The port is free once the aborted accept loop is gone.
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let mut server = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        server.spawn(serve(listener, self.shared.clone()));
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.close_watches();
        self.server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
    }
}
