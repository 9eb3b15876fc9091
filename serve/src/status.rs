//! `GET /`: the reloader's status as JSON (tls-reload's `Serialize` for `Status`, feature
//! `serde`), with what is per request (the client certificate of the connection) or comes from
//! the fleet (`leader` and `seal`, with `--k8s-shared` or `--etcd-shared`) or the ACME client (`acme`);
//! with `--connect`, the client's. And where the status and metrics are served: the Prometheus
//! recorder of `--metrics`, and `--status-listen`'s plain HTTP listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use tls_rotation::Status;
use tls_rotation::k8s::seal::Seal;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cli::Args;

/// Who writes a fleet's state (`--k8s-shared`: the Lease; `--etcd-shared`: the writer key), as
/// the status shows it under `leader`: `{"holder", "round", "leading"}` either way.
#[derive(Clone)]
pub(crate) enum Leader {
    K8s(watch::Receiver<tls_rotation::k8s::Leadership>),
    Etcd(watch::Receiver<tls_rotation::etcd::store::Leadership>),
}

impl Leader {
    fn json(&self) -> serde_json::Value {
        match self {
            Self::K8s(rx) => serde_json::to_value(&*rx.borrow()),
            Self::Etcd(rx) => serde_json::to_value(&*rx.borrow()),
        }
        .unwrap_or_default()
    }
}

/// What the status page reads: the reloader's status, and with `--k8s-shared` the leadership.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) status: watch::Receiver<Status>,
    pub(crate) leader: Option<Leader>,
    pub(crate) sealing: Option<Sealing>,
    /// With `--acme-directory`: each name's state.
    pub(crate) acme: Option<watch::Receiver<tls_rotation::acme::AcmeStatus>>,
    /// With `--session-tickets`: the reloader, which says which key is current.
    pub(crate) tickets: Option<tls_rotation::Reloader>,
}

/// With `--k8s-shared` or `--etcd-shared`: the `--seal-key` ring (none: state stored unsealed),
/// and whether this replica can open what is stored.
#[derive(Clone)]
pub(crate) struct Sealing {
    pub(crate) seal: Option<Arc<dyn Seal>>,
    pub(crate) access: watch::Receiver<tls_rotation::k8s::StateAccess>,
}

/// `GET /` with `--connect`: the client certificate presented (`current`, as a server's),
/// its `generation`, `last_error`, `expiring` and `expired`.
pub(crate) async fn client_status_json(
    State(client): State<tls_rotation::ClientTls>,
) -> Json<serde_json::Value> {
    let status = client.status().borrow().clone();
    Json(serde_json::json!({
        "client": {
            "current": status.current.as_deref().map(serde_json::to_value).transpose().unwrap_or_default(),
            "generation": status.generation,
            "last_error": status.last_error.as_ref().map(ToString::to_string),
            "root_fingerprints_sha256": status.root_fingerprints_sha256,
            "expiring": status.expiring,
            "expired": status.expired,
        }
    }))
}

pub(crate) async fn status_json(
    State(state): State<AppState>,
    tls: Option<axum::Extension<tls_rotation::TlsInfo>>,
) -> Json<serde_json::Value> {
    // The SHA-256 of the client certificate presented on this request's connection (mTLS;
    // none on --status-listen's plain HTTP).
    let client = tls
        .as_ref()
        .and_then(|tls| tls.peer_certificates.as_deref())
        .and_then(|chain| chain.first())
        .map(|leaf| tls_rotation::tls_source::Digest::of(leaf).to_string());
    let status = state.status.borrow().clone();
    let mut json = serde_json::to_value(&status).unwrap_or_default();
    if client.is_some() || !status.client_cas.is_empty() {
        json["client_fingerprint_sha256"] = client.into();
        // Present with mTLS even before a CA is trusted or refused.
        if json.get("client_ca_fingerprints_sha256").is_none() {
            json["client_ca_fingerprints_sha256"] = serde_json::json!([]);
            json["client_ca_error"] = serde_json::Value::Null;
        }
    }
    if let Some(leader) = &state.leader {
        json["leader"] = leader.json();
    }
    if let Some(sealing) = &state.sealing {
        let key_ids: Vec<String> = sealing
            .seal
            .iter()
            .flat_map(|s| s.key_ids())
            .map(|id| id.to_string())
            .collect();
        // `state` and `reason`, as tls-k8s serializes them.
        let mut seal = serde_json::to_value(&*sealing.access.borrow()).unwrap_or_default();
        seal["key_ids"] = key_ids.into();
        json["seal"] = seal;
    }
    if let Some(acme) = &state.acme {
        json["acme"] = serde_json::to_value(&*acme.borrow()).unwrap_or_default();
    }
    if let Some(tickets) = state
        .tickets
        .as_ref()
        .and_then(tls_rotation::Reloader::session_tickets)
    {
        // The current key's id and age, never a key.
        json["session_tickets"] = serde_json::json!({
            "source": tickets.source,
            "key_id": tickets.key_id,
            "key_age_seconds": tickets.age.as_secs(),
            "rotation_seconds": tickets.rotation.as_secs(),
            "note": tickets.note,
        });
    }
    Json(json)
}

/// The Prometheus recorder, installed when `--metrics` or `--status-listen` asks for it: with
/// `--metrics` alone, the exporter's own listener serves it; with `--status-listen`, the
/// handle its `/metrics` renders (and `--metrics`, if given too, serves the same).
pub(crate) async fn metrics(
    args: &Args,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<metrics_exporter_prometheus::PrometheusHandle>> {
    let builder = metrics_exporter_prometheus::PrometheusBuilder::new();
    match (args.metrics, args.status_listen) {
        (None, None) => Ok(None),
        (Some(addr), None) => {
            builder
                .with_http_listener(addr)
                .install()
                .with_context(|| format!("--metrics {addr}: cannot serve metrics"))?;
            tracing::info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
            Ok(None)
        }
        (metrics_addr, Some(_)) => {
            let handle = builder
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            // The exporter's upkeep (histograms' buckets), as its own listener would run it.
            let upkeep = handle.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tokio::select! {
                        _ = tick.tick() => upkeep.run_upkeep(),
                        () = stop.cancelled() => return,
                    }
                }
            });
            if let Some(addr) = metrics_addr {
                let app = Router::new().route("/metrics", metrics_route(handle.clone()));
                serve_plain(addr, "--metrics", app, shutdown.clone()).await?;
                tracing::info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
            }
            Ok(Some(handle))
        }
    }
}

fn metrics_route<S: Clone + Send + Sync + 'static>(
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> axum::routing::MethodRouter<S> {
    get(move || std::future::ready(handle.render()))
}

/// `--status-listen`: `app` (the status page) and `/metrics` over plain HTTP on `addr`; the
/// address bound.
pub(crate) async fn spawn_status(
    addr: SocketAddr,
    app: Router,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let app = match metrics {
        Some(handle) => app.route("/metrics", metrics_route(handle)),
        None => app,
    };
    serve_plain(addr, "--status-listen", app, shutdown).await
}

/// Serves `app` over plain HTTP on `addr` until `shutdown` (`--status-listen`, `--metrics`
/// beside it, `--acme-http-listen`'s HTTP-01 answers); the address bound. `flag` names it in
/// errors.
pub(crate) async fn serve_plain(
    addr: SocketAddr,
    flag: &str,
    app: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("{flag} {addr}: cannot listen"))?;
    let bound = listener.local_addr()?;
    let flag = flag.to_owned();
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "{flag}: the listener stopped");
        }
    });
    Ok(bound)
}
