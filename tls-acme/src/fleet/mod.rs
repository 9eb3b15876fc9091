//! A fleet sharing one ACME state: the holder of an election orders and renews (a driver term
//! per leadership term, every write fenced by its round), every replica serves what is stored,
//! answers the CA's challenges and shows each certificate's status from the record its leader
//! stored. On Kubernetes (`kube.rs`: a Lease, Secrets) and on etcd (`etcd.rs`: a writer key,
//! keys under the fleet's prefix); the terms are this file's, the same on both.

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(feature = "k8s")]
pub(crate) mod kube;

use tokio::sync::watch;

use crate::driver::Driver;
use crate::store::Term;

/// Runs the driver for each term this replica leads: `round` says, of the election's latest
/// word, whether this replica leads and in which round. A term ends when the round changes or
/// this replica no longer leads; its orders are left, stored, for the next leader.
pub(crate) async fn lead<T: Send + Sync>(
    driver: &Driver,
    fleet: &str,
    identity: &str,
    mut leadership: watch::Receiver<T>,
    round: fn(&T) -> Option<u64>,
) {
    loop {
        let Ok(now) = leadership
            .wait_for(|l| round(l).is_some())
            .await
            .map(|l| round(&l).unwrap_or_default())
        else {
            return;
        };
        tracing::info!(%fleet, round = now, "leading the ACME fleet: ordering and renewing");
        if let Err(e) = driver
            .store
            .begin_term(Term {
                round: now,
                holder: identity.to_owned(),
            })
            .await
        {
            tracing::warn!(%fleet, error = %e, "cannot begin the ACME term");
        }
        // The leader serves through the watch too: what the driver sends goes nowhere.
        // The term's state (the budget, the records) is dropped with the driver's future.
        let (sink, _) = tokio::sync::mpsc::unbounded_channel();
        tokio::select! {
            () = driver.run_term(&sink) => {}
            _ = leadership.wait_for(|l| round(l) != Some(now)) => {
                tracing::info!(%fleet, round = now, "no longer leading the ACME fleet: its orders are left for the next leader");
            }
        }
        if let Err(e) = driver.store.end_term().await {
            tracing::warn!(%fleet, error = %e, "cannot end the ACME term");
        }
    }
}
