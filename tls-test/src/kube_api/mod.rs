//! A Kubernetes API emulator on loopback: the wire protocol of the resources this workspace uses,
//! with fault injection.
//!
//! Speaks enough of the real API for `kube::Client` and `kube::runtime::watcher` to run
//! unchanged against it (an ordinary `kube::Config` with its URL):
//! - core/v1 `secrets` and coordination.k8s.io/v1 `leases`, namespaced and across namespaces;
//! - get; list (with `resourceVersion` in the list metadata); watch streams of JSON events
//!   (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`), resumable from a `resourceVersion`,
//!   filtered by `fieldSelector` (`metadata.name`, `metadata.namespace`) and `labelSelector`
//!   (`k=v`, `k==v`, `k!=v`, `k`, `!k`), ended after `timeoutSeconds`;
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

mod endpoint;

pub use endpoint::{Endpoint, Link};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

/// How often an idle watch sends a `BOOKMARK` when the client allows them.
const BOOKMARK_EVERY: Duration = Duration::from_millis(500);

/// The emulator. Stops when dropped.
#[derive(Debug)]
pub struct KubeApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<JoinSet<()>>,
}

#[derive(Debug)]
struct Shared {
    /// Like a third-party API mock (kmock in its resourceVersion mode): field and label
    /// selectors are accepted and ignored, so every object of the namespace is listed and
    /// watched. Clients must check what they receive.
    ignore_selectors: std::sync::atomic::AtomicBool,
    state: Mutex<Store>,
    events: broadcast::Sender<Stored>,
    /// Bumped to end every open watch stream.
    close: watch::Sender<u64>,
    faults: Mutex<Faults>,
    requests: AtomicU64,
    /// Every request as `METHOD path?query`, in order.
    log: Mutex<Vec<String>>,
    gone: AtomicU64,
    /// The endpoints' counters, by the address their proxied connections come from.
    clients: Mutex<HashMap<SocketAddr, Arc<endpoint::Counters>>>,
}

/// The peer address of a request's connection.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Stored>,
    /// Watches from a resourceVersion below this answer 410 Gone.
    oldest: u64,
    /// When each write (by its resourceVersion) was stored, on the wall clock.
    written: Vec<(u64, std::time::SystemTime)>,
}

#[derive(Debug, Default)]
struct Faults {
    next: VecDeque<u16>,
    all: Option<u16>,
    delay: Duration,
}

/// (resource, namespace, name)
type Key = (String, String, String);

#[derive(Debug, Clone)]
struct Stored {
    rv: u64,
    kind: &'static str,
    object: Value,
    /// The object before a `MODIFIED` write: a watch with a selector needs both to tell whether
    /// the object entered or left its selection.
    previous: Option<Value>,
    resource: String,
}

/// The resources served: path segment, kind, apiVersion, and the list path prefix.
const RESOURCES: [(&str, &str, &str, &str); 2] = [
    ("secrets", "Secret", "v1", "/api/v1"),
    (
        "leases",
        "Lease",
        "coordination.k8s.io/v1",
        "/apis/coordination.k8s.io/v1",
    ),
];

// ===== impl KubeApi =====

impl KubeApi {
    /// Starts an empty API server on an ephemeral loopback port.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
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
        Self {
            addr,
            shared,
            server: Mutex::new(server),
        }
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
        self.shared.write(&key, object, false).expect("put secret")
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
        self.shared.write(&key, object, false).expect("put secret")
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
            .write(&key, object, false)
            .expect("change labels")
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

    /// Ends every open watch stream, as a dropped connection or a load balancer time-out would.
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

fn key(resource: &str, namespace: &str, name: &str) -> Key {
    (resource.to_owned(), namespace.to_owned(), name.to_owned())
}

// ===== the store =====

impl Shared {
    fn ignores_selectors(&self) -> bool {
        self.ignore_selectors
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, from: SocketAddr, counters: Arc<endpoint::Counters>) {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(from, counters);
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `object` at `key` with a new resourceVersion. With `precondition`, a
    /// `metadata.resourceVersion` in the object must equal the stored one.
    fn write(
        &self,
        key: &Key,
        mut object: Value,
        precondition: bool,
    ) -> Result<u64, Box<Response>> {
        let mut state = self.lock();
        let existing = state.objects.get(key).cloned();
        let existing = existing.as_ref();
        if precondition
            && let Some(want) = object["metadata"]["resourceVersion"].as_str()
            && existing.and_then(|o| o["metadata"]["resourceVersion"].as_str()) != Some(want)
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
        let stored = Stored {
            rv,
            kind: if created { "ADDED" } else { "MODIFIED" },
            object,
            previous: existing.cloned(),
            resource: key.0.clone(),
        };
        state.history.push_back(stored.clone());
        let _ = self.events.send(stored);
        Ok(rv)
    }

    fn delete(&self, key: &Key) -> Option<Value> {
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

fn kind_of(resource: &str) -> (&'static str, &'static str) {
    RESOURCES
        .iter()
        .find(|r| r.0 == resource)
        .map_or(("Unknown", "v1"), |r| (r.1, r.2))
}

// ===== HTTP =====

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let app = axum::Router::new().fallback(handle).with_state(shared);
    let mut connections = JoinSet::new();
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone().layer(axum::Extension(Peer(peer))),
        );
        // Dropped with this task (an abort is a crash): every connection goes with it.
        connections.spawn(async move {
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

/// A path, parsed: the resource, the namespace (none for all namespaces) and the name.
struct Target {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    for (resource, _, _, prefix) in RESOURCES {
        let Some(rest) = path.strip_prefix(prefix) else {
            continue;
        };
        let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
        return match parts.as_slice() {
            [r] if *r == resource => Some(Target {
                resource: resource.to_owned(),
                namespace: None,
                name: None,
            }),
            ["namespaces", ns, r] if *r == resource => Some(Target {
                resource: resource.to_owned(),
                namespace: Some((*ns).to_owned()),
                name: None,
            }),
            ["namespaces", ns, r, name] if *r == resource => Some(Target {
                resource: resource.to_owned(),
                namespace: Some((*ns).to_owned()),
                name: Some((*name).to_owned()),
            }),
            _ => None,
        };
    }
    None
}

fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(k), decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let line = format!(
        "{} {}",
        request.method(),
        request.uri().path_and_query().map_or("", |p| p.as_str())
    );
    let endpoint = request.extensions().get::<Peer>().and_then(|peer| {
        shared
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer.0)
            .cloned()
    });
    if let Some(counters) = endpoint {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        counters
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.clone());
    }
    shared
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line);
    let (injected, delay) = {
        let mut faults = shared.faults();
        let injected = faults.next.pop_front().or(faults.all);
        (injected, faults.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (parts, body) = request.into_parts();
    let Some(target) = parse_path(parts.uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    if let Some(code) = injected {
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let verb = match (&parts.method, &target.name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None)
                if query(&parts.uri)
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1") =>
            {
                "watch"
            }
            (&Method::GET, None) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, _) => "delete",
            _ => "access",
        };
        let message = if code == StatusCode::FORBIDDEN {
            format!(
                "{} is forbidden: User \"system:serviceaccount:default:default\" cannot {verb} resource \"{}\" in API group \"{}\" in the namespace \"{}\"",
                target.resource,
                target.resource,
                if target.resource == "leases" {
                    "coordination.k8s.io"
                } else {
                    ""
                },
                target.namespace.as_deref().unwrap_or_default()
            )
        } else {
            "injected failure".to_owned()
        };
        let reason = match code.as_u16() {
            403 => "Forbidden",
            410 => "Expired",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "InternalError",
        };
        return status(code, reason, &message);
    }
    let body = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    let params = query(&parts.uri);
    match (parts.method, target.name.clone(), target.namespace.clone()) {
        (Method::GET, None, namespace)
            if params.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            watch_stream(&shared, &target.resource, namespace, &params)
        }
        (Method::GET, None, namespace) => {
            list(&shared, &target.resource, namespace.as_deref(), &params)
        }
        (Method::GET, Some(name), Some(ns)) => {
            match shared
                .lock()
                .objects
                .get(&key(&target.resource, &ns, &name))
            {
                Some(object) => ok(StatusCode::OK, object),
                None => not_found(&target.resource, &name),
            }
        }
        (Method::POST, None, Some(ns)) => {
            let Ok(object) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name is required",
                );
            };
            let key = key(&target.resource, &ns, &name);
            if shared.lock().objects.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("{} \"{name}\" already exists", target.resource),
                );
            }
            match shared.write(&key, object, false) {
                Ok(_) => ok(StatusCode::CREATED, &shared.lock().objects[&key]),
                Err(response) => *response,
            }
        }
        (Method::PUT, Some(name), Some(ns)) => {
            let key = key(&target.resource, &ns, &name);
            let Ok(object) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            if !shared.lock().objects.contains_key(&key) {
                return not_found(&target.resource, &name);
            }
            match shared.write(&key, object, true) {
                Ok(_) => ok(StatusCode::OK, &shared.lock().objects[&key]),
                Err(response) => *response,
            }
        }
        (Method::PATCH, Some(name), Some(ns)) => {
            let key = key(&target.resource, &ns, &name);
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            let apply = parts
                .headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|c| c.as_bytes().starts_with(b"application/apply-patch"));
            let existing = shared.lock().objects.get(&key).cloned();
            let mut object = match existing {
                Some(object) => object,
                None if apply => json!({"metadata": {"name": name, "namespace": ns}}),
                None => return not_found(&target.resource, &name),
            };
            let precondition = patch["metadata"]["resourceVersion"].clone();
            merge(&mut object, patch);
            if let Some(rv) = precondition.as_str() {
                object["metadata"]["resourceVersion"] = json!(rv);
            } else if let Some(map) = object["metadata"].as_object_mut() {
                map.remove("resourceVersion");
            }
            match shared.write(&key, object, true) {
                Ok(_) => ok(StatusCode::OK, &shared.lock().objects[&key]),
                Err(response) => *response,
            }
        }
        (Method::DELETE, Some(name), Some(ns)) => {
            match shared.delete(&key(&target.resource, &ns, &name)) {
                Some(object) => ok(StatusCode::OK, &object),
                None => not_found(&target.resource, &name),
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "not supported by the emulator",
        ),
    }
}

fn not_found(resource: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{resource} \"{name}\" not found"),
    )
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = json!({});
            }
            let map = target.as_object_mut().expect("object");
            for (k, v) in patch {
                if v.is_null() {
                    map.remove(&k);
                } else {
                    merge(map.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other,
    }
}

/// Field and label selectors of a list or watch.
struct Filter {
    namespace: Option<String>,
    fields: Vec<(String, String, bool)>,
    labels: Vec<LabelReq>,
}

enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl Filter {
    fn new(namespace: Option<String>, params: &BTreeMap<String, String>, ignore: bool) -> Self {
        let pairs = |s: Option<&String>| -> Vec<String> {
            s.filter(|_| !ignore)
                .map(|s| {
                    s.split(',')
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let fields = pairs(params.get("fieldSelector"))
            .into_iter()
            .filter_map(|p| {
                if let Some((k, v)) = p.split_once("!=") {
                    Some((k.to_owned(), v.to_owned(), false))
                } else {
                    let (k, v) = p.split_once("==").or_else(|| p.split_once('='))?;
                    Some((k.to_owned(), v.to_owned(), true))
                }
            })
            .collect();
        // Set-based requirements hold commas inside their parentheses.
        let label_parts = params
            .get("labelSelector")
            .filter(|_| !ignore)
            .map(|s| {
                let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
                for c in s.chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        ',' if depth == 0 => {
                            parts.push(std::mem::take(&mut current));
                            continue;
                        }
                        _ => {}
                    }
                    current.push(c);
                }
                parts.push(current);
                parts.retain(|p| !p.trim().is_empty());
                parts
            })
            .unwrap_or_default();
        let labels = label_parts
            .into_iter()
            .map(|p| {
                let set = |p: &str, op: &str| {
                    let (k, rest) = p.split_once(op)?;
                    let values = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
                    Some((
                        k.trim().to_owned(),
                        values.split(',').map(|v| v.trim().to_owned()).collect(),
                    ))
                };
                if let Some((k, values)) = set(&p, " notin ") {
                    LabelReq::NotIn(k, values)
                } else if let Some((k, values)) = set(&p, " in ") {
                    LabelReq::In(k, values)
                } else if let Some((k, v)) = p.split_once("!=") {
                    LabelReq::Ne(k.to_owned(), v.to_owned())
                } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                    LabelReq::Eq(k.to_owned(), v.to_owned())
                } else if let Some(k) = p.strip_prefix('!') {
                    LabelReq::Absent(k.to_owned())
                } else {
                    LabelReq::Exists(p)
                }
            })
            .collect();
        Self {
            namespace,
            fields,
            labels,
        }
    }

    /// What a watch with this filter sees of `event`, as the API server's watch cache does: an
    /// object modified into the selection is `ADDED`, one modified out of it `DELETED`.
    fn event_kind(&self, event: &Stored) -> Option<&'static str> {
        let now = self.matches(&event.object);
        let before = event.previous.as_ref().is_some_and(|p| self.matches(p));
        match (event.kind, before, now) {
            ("MODIFIED", true, true) => Some("MODIFIED"),
            ("MODIFIED", false, true) => Some("ADDED"),
            ("MODIFIED", true, false) => Some("DELETED"),
            ("MODIFIED", false, false) => None,
            (kind, _, true) => Some(kind),
            _ => None,
        }
    }

    fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        if let Some(ns) = &self.namespace
            && meta["namespace"].as_str() != Some(ns)
        {
            return false;
        }
        for (field, want, equal) in &self.fields {
            let have = match field.as_str() {
                "metadata.name" => meta["name"].as_str(),
                "metadata.namespace" => meta["namespace"].as_str(),
                "type" => object["type"].as_str(),
                _ => None,
            };
            if (have == Some(want.as_str())) != *equal {
                return false;
            }
        }
        let label = |k: &str| meta["labels"][k].as_str().map(str::to_owned);
        self.labels.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k).as_deref() == Some(v),
            LabelReq::Ne(k, v) => label(k).as_deref() != Some(v),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::Absent(k) => label(k).is_none(),
            LabelReq::In(k, values) => label(k).is_some_and(|v| values.contains(&v)),
            LabelReq::NotIn(k, values) => label(k).is_none_or(|v| !values.contains(&v)),
        })
    }
}

fn list(
    shared: &Shared,
    resource: &str,
    namespace: Option<&str>,
    params: &BTreeMap<String, String>,
) -> Response {
    let filter = Filter::new(
        namespace.map(str::to_owned),
        params,
        shared.ignores_selectors(),
    );
    let state = shared.lock();
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|(k, _)| k.0 == resource)
        .map(|(_, v)| v.clone())
        .filter(|o| filter.matches(o))
        .collect();
    let (kind, api_version) = kind_of(resource);
    ok(
        StatusCode::OK,
        &json!({
            "kind": format!("{kind}List"),
            "apiVersion": api_version,
            "metadata": {"resourceVersion": state.rv.to_string()},
            "items": items,
        }),
    )
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch_stream(
    shared: &Arc<Shared>,
    resource: &str,
    namespace: Option<String>,
    params: &BTreeMap<String, String>,
) -> Response {
    let filter = Filter::new(namespace, params, shared.ignores_selectors());
    let from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let (kind, api_version) = kind_of(resource);
    let resource = resource.to_owned();
    let (tx, rx) = mpsc::channel::<Bytes>(64);

    // Subscribe before reading the history, so nothing falls between the two.
    let mut live = shared.events.subscribe();
    let mut close = shared.close.subscribe();
    let (replay, current, gone) = {
        let state = shared.lock();
        if from > 0 && from + 1 < state.oldest {
            (Vec::new(), state.rv, true)
        } else if from == 0 {
            // No resourceVersion: the current objects as ADDED, then what follows.
            let added = state
                .objects
                .iter()
                .filter(|(k, _)| k.0 == resource)
                .map(|(_, o)| Stored {
                    rv: 0,
                    kind: "ADDED",
                    object: o.clone(),
                    previous: None,
                    resource: resource.clone(),
                })
                .collect();
            (added, state.rv, false)
        } else {
            let events = state
                .history
                .iter()
                .filter(|e| e.rv > from && e.resource == resource)
                .cloned()
                .collect();
            (events, state.rv, false)
        }
    };
    if gone {
        shared.gone.fetch_add(1, Ordering::Relaxed);
    }
    tokio::spawn(async move {
        if gone {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410,
            });
            let _ = tx.send(event_line("ERROR", &status)).await;
            return;
        }
        let mut last = from.max(if from == 0 { current } else { 0 });
        for event in replay {
            if let Some(kind) = filter.event_kind(&event)
                && tx.send(event_line(kind, &event.object)).await.is_err()
            {
                return;
            }
            if let Some(rv) = event.object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
            {
                last = last.max(rv);
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                _ = close.changed() => return,
                () = tokio::time::sleep(BOOKMARK_EVERY), if bookmarks => {
                    let bookmark = json!({
                        "kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": last.to_string()},
                    });
                    if tx.send(event_line("BOOKMARK", &bookmark)).await.is_err() {
                        return;
                    }
                }
                event = live.recv() => match event {
                    Ok(event) if event.rv > last && event.resource == resource => {
                        last = event.rv;
                        if let Some(kind) = filter.event_kind(&event)
                            && tx.send(event_line(kind, &event.object)).await.is_err()
                        {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind, or the emulator is gone: end the stream; the client resumes.
                    Err(_) => return,
                },
            }
        }
    });
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(bytes), rx))
    }));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
