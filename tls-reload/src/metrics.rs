//! The reload core's metrics, emitted from here only (the engine's events call these beside their
//! tracing events). With the `metrics` feature they go to the [`metrics`] facade, which costs
//! nothing until the application installs a recorder (a Prometheus exporter, say); without
//! it these functions are empty.
//!
//! The names, labels and meanings are in the crate docs (`# Metrics`).

#[cfg(feature = "metrics")]
use std::time::{SystemTime, UNIX_EPOCH};

use crate::status::CertInfo;

#[cfg(feature = "metrics")]
fn seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Describes the metrics to the recorder (its `# HELP` lines), once per process.
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            use metrics::{Unit, describe_counter, describe_gauge};
            describe_gauge!(
                "tls_certificate_expiration_timestamp_seconds",
                Unit::Seconds,
                "When the served certificate expires (notAfter), in Unix seconds"
            );
            describe_gauge!(
                "tls_certificate_not_before_timestamp_seconds",
                Unit::Seconds,
                "When the served certificate became valid (notBefore), in Unix seconds"
            );
            describe_counter!("tls_reload_installs_total", "Certificates installed");
            describe_counter!(
                "tls_reload_rejections_total",
                "Inputs refused (the last good certificate kept serving), by reason"
            );
            describe_counter!(
                "tls_source_errors_total",
                "Errors the certificate source reported"
            );
            describe_gauge!(
                "tls_reload_last_success_timestamp_seconds",
                Unit::Seconds,
                "When a good certificate was last installed or confirmed, in Unix seconds"
            );
            describe_gauge!(
                "tls_reload_ready",
                "1 once every certificate that must be served is installed"
            );
            describe_counter!(
                "tls_reload_client_ca_changes_total",
                "Changes of the trusted client CAs (mTLS) applied"
            );
            describe_counter!(
                "tls_reload_clients_refused_total",
                "Verified clients refused by the authorization rules (mTLS)"
            );
            describe_counter!(
                "tls_reload_authorization_changes_total",
                "Changes of the client authorization rules applied"
            );
        });
    }
}

/// The `route` label of the keyed routes' series, all of them together: keyed routes come and
/// go (Secrets by the thousand), and the `metrics` facade cannot remove a series, so per-route
/// series would stay after their routes and grow with every route ever seen. Not a DNS name,
/// so no route can have it.
pub(crate) const KEYED: &str = "(keyed)";

/// A certificate was installed for `route` (`None`: the default; [`KEYED`]: a keyed route,
/// whose expiry gauges are the keyed routes' earliest, [`keyed_earliest`]).
pub(crate) fn installed(route: Option<&str>, info: &CertInfo, keyed: bool) {
    #[cfg(feature = "metrics")]
    {
        let route = route.unwrap_or_default().to_owned();
        if !keyed {
            let source = info.origin.label();
            let labels = [("source", source), ("route", route.clone())];
            metrics::gauge!("tls_certificate_expiration_timestamp_seconds", &labels)
                .set(seconds(info.not_after));
            metrics::gauge!("tls_certificate_not_before_timestamp_seconds", &labels)
                .set(seconds(info.not_before));
        }
        metrics::counter!("tls_reload_installs_total", "route" => route.clone()).increment(1);
        metrics::gauge!("tls_reload_last_success_timestamp_seconds", "route" => route)
            .set(seconds(info.loaded_at));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (route, info, keyed);
}

/// The keyed routes' earliest `notAfter` (`None`: no keyed route serves: +Inf, which no
/// expiry alert fires on).
pub(crate) fn keyed_earliest(not_after: Option<std::time::SystemTime>) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(
        "tls_certificate_expiration_timestamp_seconds",
        "source" => "keyed",
        "route" => KEYED
    )
    .set(not_after.map_or(f64::INFINITY, seconds));
    #[cfg(not(feature = "metrics"))]
    let _ = not_after;
}

/// Every reason a rejection is counted under ([`Error::reason`](crate::Error::reason)).
#[cfg(feature = "metrics")]
const REASONS: [&str; 14] = [
    "parse",
    "key",
    "key_mismatch",
    "expired",
    "not_yet_valid",
    "chain",
    "too_large",
    "name",
    "purpose",
    "untrusted",
    "no_client_ca",
    "served_expired",
    "source",
    "internal",
];

/// A static route (`None`: the default): its counters are recorded at 0, for every reason.
pub(crate) fn declared(route: Option<&str>) {
    #[cfg(feature = "metrics")]
    {
        let route = route.unwrap_or_default().to_owned();
        metrics::counter!("tls_reload_installs_total", "route" => route.clone()).increment(0);
        metrics::counter!("tls_source_errors_total", "route" => route.clone()).increment(0);
        for reason in REASONS {
            metrics::counter!(
                "tls_reload_rejections_total",
                "route" => route.clone(),
                "reason" => reason
            )
            .increment(0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = route;
}

/// The source gave unchanged material again after an error: a success, nothing installed.
pub(crate) fn recovered(route: Option<&str>) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(
        "tls_reload_last_success_timestamp_seconds",
        "route" => route.unwrap_or_default().to_owned()
    )
    .set(seconds(SystemTime::now()));
    #[cfg(not(feature = "metrics"))]
    let _ = route;
}

/// An input for `route` was refused, for `reason` (one of [`Error::reason`](crate::Error::reason)).
pub(crate) fn rejected(route: Option<&str>, reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tls_reload_rejections_total",
        "route" => route.unwrap_or_default().to_owned(),
        "reason" => reason
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (route, reason);
}

/// The source of `route` reported an error.
pub(crate) fn source_error(route: Option<&str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tls_source_errors_total",
        "route" => route.unwrap_or_default().to_owned()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = route;
}

/// The trusted client CAs changed (a source's new set, or a CA leaving after its overlap).
pub(crate) fn client_cas_changed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tls_reload_client_ca_changes_total").increment(1);
}

/// A verified client was refused by the authorization rules.
pub(crate) fn client_refused() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tls_reload_clients_refused_total").increment(1);
}

/// The client authorization rules changed.
pub(crate) fn authorization_changed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tls_reload_authorization_changes_total").increment(1);
}

/// Readiness, after each batch.
pub(crate) fn ready(ready: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tls_reload_ready").set(if ready { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = ready;
}
