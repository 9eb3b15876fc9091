//! tls-acme's metrics, emitted from here only. With the `metrics` feature they go to the
//! `metrics` facade; without it these functions are empty. The names are in the crate docs
//! (`# Metrics`).

use crate::Error;
use crate::status::AcmeStatus;
#[cfg(feature = "metrics")]
use crate::status::NameState;

/// How an order ended, as the `outcome` label says it.
pub(crate) fn outcome(result: Result<(), &Error>) -> &'static str {
    match result {
        Ok(()) => "issued",
        Err(Error::Refused { .. }) => "refused",
        Err(Error::Rejected { .. }) => "rejected",
        Err(Error::RateLimited { .. } | Error::Budget { .. }) => "rate_limited",
        Err(Error::BadCertificate { .. }) => "bad_certificate",
        Err(_) => "error",
    }
}

/// An order for the certificate `name` ended with `outcome`.
pub(crate) fn order(name: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tls_acme_orders_total", "name" => name.to_owned(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// The status changed: each name's next renewal, and how many are failing.
pub(crate) fn status(status: &AcmeStatus) {
    #[cfg(feature = "metrics")]
    {
        let seconds = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        let mut failing = 0u32;
        for (name, state) in &status.names {
            if let Some(renew) = state.renew_after {
                metrics::gauge!("tls_acme_renewal_timestamp_seconds", "name" => name.clone())
                    .set(seconds(renew));
            }
            if matches!(state.state, NameState::Backoff | NameState::Failed) {
                failing += 1;
            }
        }
        metrics::gauge!("tls_acme_names_failing").set(f64::from(failing));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = status;
}
