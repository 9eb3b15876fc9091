//! List and watch: a list with its resourceVersion, and watch streams of JSON events resumable
//! from a resourceVersion (410 Gone before the compacted one), with bookmarks and time-outs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::respond::{ok, status};
use super::selectors::*;
use super::store::*;

/// How often an idle watch sends a `BOOKMARK` when the client allows them.
pub(super) const BOOKMARK_EVERY: Duration = Duration::from_millis(500);

pub(super) fn list(
    shared: &Shared,
    resource: &str,
    namespace: Option<&str>,
    params: &BTreeMap<String, String>,
) -> Response {
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut state = shared.lock();
    let (rv, mut rest) = match params.get("continue").filter(|c| !c.is_empty()) {
        // The rest of a paged list, from the snapshot taken at its first page. Like the API
        // server, a token older than the compacted history is refused: 410, list again.
        Some(token) => {
            let page = token.parse().ok().and_then(|t| state.pages.remove(&t));
            match page {
                Some(page) if page.rv + 1 >= state.oldest => (page.rv, page.rest),
                _ => {
                    shared.gone.fetch_add(1, Ordering::Relaxed);
                    return status(
                        StatusCode::GONE,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent \
                         list result. You can start a new list without the continue parameter.",
                    );
                }
            }
        }
        None => {
            let filter = Filter::new(
                namespace.map(str::to_owned),
                params,
                shared.ignores_selectors(),
            );
            let items: std::collections::VecDeque<Value> = state
                .objects
                .iter()
                .filter(|(k, _)| k.0 == resource)
                .map(|(_, v)| v)
                .filter(|o| filter.matches(o))
                .cloned()
                .collect();
            (state.rv, items)
        }
    };
    let take = limit.unwrap_or(rest.len()).min(rest.len());
    let items: Vec<Value> = rest.drain(..take).collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if !rest.is_empty() {
        state.last_page += 1;
        let token = state.last_page;
        metadata["continue"] = Value::String(token.to_string());
        metadata["remainingItemCount"] = rest.len().into();
        state.pages.insert(token, Page { rv, rest });
        while state.pages.len() > MAX_PAGED_LISTS {
            state.pages.pop_first();
        }
    }
    drop(state);
    let (kind, api_version) = kind_of(resource);
    ok(
        StatusCode::OK,
        &json!({
            "kind": format!("{kind}List"),
            "apiVersion": api_version,
            "metadata": metadata,
            "items": items,
        }),
    )
}

pub(super) fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

pub(super) fn watch_stream(
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
        // `sleep` saturates a timeout past what the clock can add (any `timeoutSeconds` a
        // client sends), where `now() + timeout` would panic.
        let ended = tokio::time::sleep(timeout);
        tokio::pin!(ended);
        loop {
            tokio::select! {
                // A close comes first: nothing written after `close_watches` returned is sent
                // on a stream open before it, as on a dropped connection.
                biased;
                _ = close.changed() => return,
                () = &mut ended => return,
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
