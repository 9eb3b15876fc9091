//! The HTTP side: the request log, injected faults, the API paths, and create, get, update,
//! merge patch and delete as the API server answers them (Status bodies with reasons).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::respond::{not_found, ok, status};
use super::store::*;
use super::watches::*;

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
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
pub(super) struct Target {
    pub(super) resource: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
}

pub(super) fn parse_path(path: &str) -> Option<Target> {
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

pub(super) fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
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

pub(super) fn decode(s: &str) -> String {
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

pub(super) async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
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
            match shared.write(&key, object, Write::Create) {
                Ok((_, stored)) => ok(StatusCode::CREATED, &stored),
                Err(response) => *response,
            }
        }
        (Method::PUT, Some(name), Some(ns)) => {
            let key = key(&target.resource, &ns, &name);
            let Ok(object) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            match shared.write(&key, object, Write::Update) {
                Ok((_, stored)) => ok(StatusCode::OK, &stored),
                Err(response) => *response,
            }
        }
        (Method::PATCH, Some(name), Some(ns)) => {
            let key = key(&target.resource, &ns, &name);
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            // JSON merge patch of an existing object (server-side apply is not emulated:
            // nothing here uses it).
            let Some(mut object) = shared.lock().objects.get(&key).cloned() else {
                return not_found(&target.resource, &name);
            };
            let precondition = patch["metadata"]["resourceVersion"].clone();
            merge(&mut object, patch);
            if let Some(rv) = precondition.as_str() {
                object["metadata"]["resourceVersion"] = json!(rv);
            } else if let Some(map) = object["metadata"].as_object_mut() {
                map.remove("resourceVersion");
            }
            match shared.write(&key, object, Write::Update) {
                Ok((_, stored)) => ok(StatusCode::OK, &stored),
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

/// JSON merge patch (RFC 7386).
pub(super) fn merge(target: &mut Value, patch: Value) {
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
