//! tls-etcd's metrics, emitted from here only. With the `metrics` feature they go to the
//! `metrics` facade; without it only [`Etcd::requests`](crate::Etcd::requests) counts. The names
//! are in the crate docs (`# Metrics`).

/// One request to etcd of the kind `request` (`list`, `watch`, `txn`, `lease_grant`,
/// `keep_alive`, `lease_revoke`, `read`, `authenticate`).
pub(crate) fn request(request: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tls_etcd_requests_total", "request" => request).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = request;
}

/// A fenced write was accepted or refused.
pub(crate) fn fenced_write(accepted: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tls_etcd_fenced_writes_total",
        "outcome" => if accepted { "accepted" } else { "refused" }
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = accepted;
}

/// This replica's view of the writer key changed: whether it leads, in which round.
pub(crate) fn leadership(key: &str, leading: bool, round: u64) {
    #[cfg(feature = "metrics")]
    {
        let key = key.to_owned();
        metrics::gauge!("tls_etcd_writer_leading", "key" => key.clone()).set(if leading {
            1.0
        } else {
            0.0
        });
        #[allow(clippy::cast_precision_loss)] // revisions stay far below 2^53
        metrics::gauge!("tls_etcd_writer_round", "key" => key).set(round as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (key, leading, round);
}
