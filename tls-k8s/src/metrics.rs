//! tls-k8s's metrics, emitted from here only (beside the tracing events of the Lease lock and
//! the shared writer). With the `metrics` feature they go to the `metrics` facade; without it
//! these functions are empty. The names are in the crate docs (`# Metrics`).

/// This replica's view of the Lease `lease` changed: whether it leads, in which round.
pub(crate) fn leadership(lease: &str, leading: bool, round: u64) {
    #[cfg(feature = "metrics")]
    {
        let lease = lease.to_owned();
        metrics::gauge!("tls_lease_leading", "lease" => lease.clone()).set(if leading {
            1.0
        } else {
            0.0
        });
        #[allow(clippy::cast_precision_loss)] // rounds stay far below 2^53
        metrics::gauge!("tls_lease_round", "lease" => lease).set(round as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lease, leading, round);
}

/// A fenced write to the Secret `secret` (`namespace/name`) was accepted or refused.
#[cfg_attr(not(feature = "self-signed"), allow(dead_code))]
pub(crate) fn fenced_write(secret: &str, accepted: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tls_shared_writes_total",
        "secret" => secret.to_owned(),
        "outcome" => if accepted { "accepted" } else { "refused" }
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (secret, accepted);
}
