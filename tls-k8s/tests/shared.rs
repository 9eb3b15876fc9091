//! The shared self-signed store on the API emulator, with real handshakes: three replicas, one
//! writer elected by a Lease, fenced writes, and the faults a fleet meets (a killed leader, a
//! paused one, a partitioned one, a restart of every replica, a corrupt CA key, a recreated
//! Lease, a CA renewal).
//!
//! Each replica talks to the API through its own emulator endpoint, so one can be partitioned
//! or paused while the others carry on.

#![cfg(feature = "self-signed")]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fleet::*;
use tls_k8s::SharedSelfSigned;
use tls_k8s::store::{Fence, FencedSecret, Written};
use tls_reload::Reloader;
use tls_selfsigned::SelfSigned;
use tls_test::{KubeApi, Link, PATIENCE, TestServer};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_start_together_one_generates_all_serve_it() {
    let api = KubeApi::start().await;
    let [a, b, c] = three(&api, true).await;
    let all = [&a, &b, &c];
    let leaf = converged(&api, &all).await;
    let leader = leader(&all).await;
    assert_eq!(total(&all, |s| s.generated_leaves), 1, "exactly one leaf");
    assert_eq!(total(&all, |s| s.generated_cas), 1, "exactly one CA");
    assert_eq!(leader.stats().generated_leaves, 1, "by the leader");
    // One CA for the fleet: every replica serves a leaf that verifies against the Secret's
    // ca.crt, and says so in its status.
    let ca = certificates(&secret_value(&api, "tls", "ca.crt").expect("ca.crt"));
    assert_eq!(ca.len(), 1);
    for replica in all {
        let served = tls_test::probe_trusting(replica.server.addr(), "localhost", &ca)
            .await
            .expect("verified by the shared CA");
        assert_eq!(served.fingerprint, leaf);
        let status = replica.status();
        assert_eq!(
            status.current.expect("serving").ca_fingerprints_sha256,
            [tls_test::fingerprint(&ca[0])]
        );
    }
    // The CA's key lives in its own Secret, not in the one every replica reads.
    assert!(secret_value(&api, "tls", "ca.key").is_none());
    assert!(secret_value(&api, "tls-ca", "ca.key").is_some());
    // The fence and the renewal time are on the Secret.
    assert_eq!(
        annotation(&api, "tls", tls_k8s::store::HOLDER_ANNOTATION).as_deref(),
        Some(leader.id.as_str())
    );
    let renew_after =
        annotation(&api, "tls", tls_k8s::RENEW_AFTER_ANNOTATION).expect("renew-after");
    let at: k8s_openapi::jiff::Timestamp = renew_after.parse().expect("RFC 3339");
    let in_secs = at.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (60 * 86400 - 120..=60 * 86400).contains(&in_secs),
        "two thirds of 90 days from now: {renew_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_within_the_lease_and_nothing_is_regenerated() {
    let api = KubeApi::start().await;
    let [a, b, c] = three(&api, true).await;
    let leaf = converged(&api, &[&a, &b, &c]).await;
    let first = leader(&[&a, &b, &c]).await.id.clone();
    let round = stored_round(&api).expect("round");
    let (mut rest, mut killed): (Vec<Replica>, Vec<Replica>) =
        [a, b, c].into_iter().partition(|r| r.id != first);
    killed.remove(0).kill().await;
    let killed = Instant::now();
    let (b, c) = (rest.remove(0), rest.remove(0));
    let next = leader(&[&b, &c]).await;
    let took = killed.elapsed();
    assert!(
        took < LEASE + RENEW_DEADLINE,
        "took over in {took:?}, with a {LEASE:?} lease"
    );
    until("the new leader's fencing write", || {
        annotation(&api, "tls", tls_k8s::store::HOLDER_ANNOTATION).as_deref()
            == Some(next.id.as_str())
    })
    .await;
    assert!(stored_round(&api).expect("round") > round, "a later round");
    assert_eq!(
        converged(&api, &[&b, &c]).await,
        leaf,
        "the same certificate"
    );
    assert_eq!(next.stats().generated_leaves, 0, "nothing regenerated");
    assert_eq!(next.stats().generated_cas, 0);
}

/// The leader is paused past its lease (its API calls held). A new leader takes over and
/// writes; then the old one resumes: what it sent while paused arrives late and is refused,
/// as is every write it attempts with its fence, and the stored round never goes backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_resumes_and_every_write_it_attempts_is_refused() {
    let api = Arc::new(KubeApi::start().await);
    let [a, b, c] = three(&api, false).await;
    converged(&api, &[&a, &b, &c]).await;
    let all = [a, b, c];
    let old = leader(&all.iter().collect::<Vec<_>>()).await;
    let old_fence = Fence {
        round: old.stats().round.expect("it wrote"),
        holder: old.id.clone(),
    };
    // Watch the stored round for the rest of the test: it must never go backwards.
    let sampler = {
        let api = Arc::clone(&api);
        tokio::spawn(async move {
            let mut highest = 0;
            loop {
                if let Some(round) = stored_round(&api) {
                    assert!(round >= highest, "the round went from {highest} to {round}");
                    highest = round;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    old.endpoint.pause();
    // A write it makes while paused: held, delivered after the take-over.
    let late = {
        let secret = FencedSecret::new(client_of(&old.endpoint), "default", "tls");
        let fence = old_fence.clone();
        tokio::spawn(async move { secret.stamp(&fence).await })
    };
    let others: Vec<&Replica> = all.iter().filter(|r| r.id != old.id).collect();
    let new = leader(&others).await;
    until("the new leader's fencing write", || {
        annotation(&api, "tls", tls_k8s::store::HOLDER_ANNOTATION).as_deref()
            == Some(new.id.as_str())
    })
    .await;
    let new_round = stored_round(&api).expect("round");
    assert!(new_round > old_fence.round);
    old.endpoint.resume();
    let late = late.await.expect("task").expect("answered");
    assert!(
        matches!(&late, Written::Refused { stored } if stored.round == new_round),
        "{late:?}"
    );
    // Every later write with the old fence is refused too, data or not.
    let secret = FencedSecret::new(client_of(&old.endpoint), "default", "tls");
    for _ in 0..5 {
        let data = std::collections::BTreeMap::from([("tls.crt".to_owned(), b"x".to_vec())]);
        assert!(matches!(
            secret
                .write(&old_fence, Some(&data))
                .await
                .expect("answered"),
            Written::Refused { .. }
        ));
    }
    until("the old leader to follow", || {
        let view = old.leadership.borrow().clone();
        !view.leading && view.holder.as_deref() == Some(new.id.as_str())
    })
    .await;
    assert_eq!(stored_round(&api), Some(new_round));
    assert!(!sampler.is_finished(), "the round went backwards");
    sampler.abort();
    converged(&api, &all.iter().collect::<Vec<_>>()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_leader_steps_down_and_follows_on_heal() {
    for how in [Link::Hang, Link::Reset] {
        let api = KubeApi::start().await;
        let [a, b, c] = three(&api, false).await;
        let leaf = converged(&api, &[&a, &b, &c]).await;
        let all = [&a, &b, &c];
        let old = leader(&all).await;
        old.endpoint.partition(how);
        let cut = Instant::now();
        until("the partitioned leader to step down", || !old.leading()).await;
        let stepped_down = cut.elapsed();
        // Within the renew deadline of its last renewal (which was at most a retry before the
        // cut), with scheduling slack.
        assert!(
            stepped_down <= RENEW_DEADLINE + RETRY + Duration::from_millis(300),
            "{how:?}: stepped down after {stepped_down:?}, renew deadline {RENEW_DEADLINE:?}"
        );
        let others: Vec<&Replica> = all.iter().copied().filter(|r| r.id != old.id).collect();
        let new = leader(&others).await;
        // Cut off, it keeps serving what it had.
        assert_eq!(old.served().await, leaf, "{how:?}");
        old.endpoint.heal();
        until("the healed replica to follow", || {
            let view = old.leadership.borrow().clone();
            !view.leading && view.holder.as_deref() == Some(new.id.as_str())
        })
        .await;
        assert!(new.leading(), "{how:?}: the new leader keeps leading");
        assert_eq!(converged(&api, &all).await, leaf);
        assert_eq!(total(&all, |s| s.generated_leaves), 1, "{how:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wanted_names_grow_on_the_leader_one_regeneration_all_converge() {
    let api = KubeApi::start().await;
    let [a, b, c] = three(&api, true).await;
    converged(&api, &[&a, &b, &c]).await;
    let first = leader(&[&a, &b, &c]).await.id.clone();
    let mut replicas: Vec<Replica> = [a, b, c].into_iter().collect();
    let at = replicas.iter().position(|r| r.id == first).expect("leader");
    replicas.remove(at).kill().await;
    // The leader restarts with a new name (same pod name): it holds the Lease still.
    let wider = Replica::start(&api, &first, generator(&["localhost", "api.test"], true)).await;
    until("the wider leaf", || {
        secret_value(&api, "tls", "tls.crt").is_some_and(|pem| {
            let chain = certificates(&pem);
            tls_source::x509::LeafInfo::parse(&chain[0])
                .is_ok_and(|leaf| leaf.dns_names.iter().any(|n| n == "api.test"))
        })
    })
    .await;
    replicas.push(wider);
    let all: Vec<&Replica> = replicas.iter().collect();
    let leaf = converged(&api, &all).await;
    assert_eq!(total(&all, |s| s.generated_leaves), 1, "one regeneration");
    assert_eq!(total(&all, |s| s.generated_cas), 0, "the CA is kept");
    // It stays put: nobody regenerates for the narrower wanted names of the followers.
    tokio::time::sleep(LEASE).await;
    assert_eq!(secret_leaf(&api).as_deref(), Some(leaf.as_str()));
    assert_eq!(total(&all, |s| s.generated_leaves), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replica_restarted_the_ca_and_leaf_survive() {
    let api = KubeApi::start().await;
    let (leaf, ca) = {
        let [a, b, c] = three(&api, true).await;
        let leaf = converged(&api, &[&a, &b, &c]).await;
        for replica in [a, b, c] {
            replica.kill().await;
        }
        (leaf, secret_value(&api, "tls", "ca.crt").expect("ca.crt"))
    };
    let [a, b, c] = three(&api, true).await;
    let all = [&a, &b, &c];
    assert_eq!(converged(&api, &all).await, leaf);
    let leader = leader(&all).await;
    until("the new leader's check", || leader.stats().checks >= 1).await;
    assert_eq!(secret_value(&api, "tls", "ca.crt"), Some(ca), "the same CA");
    assert_eq!(total(&all, |s| s.generated_leaves + s.generated_cas), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupt_ca_key_is_reported_and_not_replaced() {
    let api = KubeApi::start().await;
    let leaf = {
        let a = Replica::start(&api, "a", generator(&["localhost"], true)).await;
        let leaf = converged(&api, &[&a]).await;
        a.kill().await;
        leaf
    };
    let ca_crt = secret_value(&api, "tls-ca", "ca.crt").expect("ca.crt");
    api.put_secret(
        "default",
        "tls-ca",
        &[("ca.crt", ca_crt.as_slice()), ("ca.key", b"not a key")],
    );
    let b = Replica::start(&api, "b", generator(&["localhost"], true)).await;
    let status = tls_test::wait_for(b.reloader.status(), "the corrupt CA reported", |s| {
        s.last_error.as_ref().is_some_and(|e| {
            e.to_string()
                .contains("the CA Secret default/tls-ca cannot be used")
        })
    })
    .await;
    let message = status.last_error.expect("reported").to_string();
    assert!(message.contains("not replaced"), "{message}");
    assert_eq!(b.served().await, leaf, "the certificate keeps serving");
    assert_eq!(
        secret_value(&api, "tls-ca", "ca.key").as_deref(),
        Some(b"not a key".as_slice()),
        "not replaced"
    );
    assert_eq!(b.stats().generated_cas, 0);
    b.kill().await;
    // Asked to, a writer replaces it.
    let replacing = SelfSigned::builder()
        .dns_name("localhost")
        .ca()
        .replace_corrupt_ca(true)
        .build()
        .unwrap();
    let c = Replica::start(&api, "c", replacing).await;
    until("a new CA", || {
        secret_value(&api, "tls-ca", "ca.key").is_some_and(|k| k != b"not a key")
    })
    .await;
    until("a leaf of the new CA", || {
        secret_leaf(&api).is_some_and(|l| l != leaf)
    })
    .await;
    converged(&api, &[&c]).await;
    assert_eq!(c.stats().generated_cas, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_lease_does_not_turn_the_round_back() {
    let api = KubeApi::start().await;
    // Two leaders in turn (rounds 0 and 1), each killed.
    let mut before = 0;
    for id in ["a", "b"] {
        let replica = Replica::start(&api, id, generator(&["localhost"], false)).await;
        until("it leads and writes", || replica.stats().round.is_some()).await;
        before = replica.stats().round.expect("wrote");
        replica.kill().await;
    }
    assert_eq!(before, 1);
    // The Lease is deleted; the next one starts again at round 0.
    assert!(api.delete("leases", "default", "tls-writer"));
    let c = Replica::start(&api, "c", generator(&["localhost"], false)).await;
    until("the new writer's round", || c.stats().round.is_some()).await;
    assert_eq!(
        c.leadership.borrow().round,
        0,
        "the Lease starts again at 0"
    );
    let round = c.stats().round.expect("wrote");
    assert_eq!(round, before + 1, "past the stored round");
    assert_eq!(stored_round(&api), Some(round));
    // A writer that still carries round 1 (the one before) is refused.
    let secret = FencedSecret::new(client_of(&c.endpoint), "default", "tls");
    let stale = Fence {
        round: before,
        holder: "b".into(),
    };
    assert!(matches!(
        secret.stamp(&stale).await.expect("answered"),
        Written::Refused { .. }
    ));
}

/// CA renewal with an overlap: a 9 s CA enters its renewal window with 3 s left; the next CA is
/// announced in ca.crt for 1.5 s before leaves are signed by it. A client that refreshes its
/// trust from ca.crt only now and then (here: trusting what was served a probe earlier) never
/// fails, through two CA generations and many leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewed_ca_is_announced_before_it_signs() {
    let api = KubeApi::start().await;
    let short = SelfSigned::builder()
        .dns_name("localhost")
        .validity(Duration::from_secs(3))
        .ca_validity(Duration::from_secs(9))
        .build()
        .unwrap();
    let a = Replica::start_with(&api, "a", short, |s| {
        s.ca_overlap(Duration::from_millis(1500))
    })
    .await;
    converged(&api, &[&a]).await;
    let mut trusted = certificates(&secret_value(&api, "tls", "ca.crt").expect("ca.crt"));
    let mut signing_cas = BTreeSet::new();
    let mut bundles = BTreeSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(11) {
        let served = tls_test::probe_trusting(a.server.addr(), "localhost", &trusted)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "at {:?}: not verified by the last ca.crt seen: {e}",
                    start.elapsed()
                )
            });
        // Which CA signed it: the one that verifies it alone.
        for ca in &trusted {
            let alone = std::slice::from_ref(ca);
            if tls_test::probe_trusting(a.server.addr(), "localhost", alone)
                .await
                .is_ok_and(|again| again.fingerprint == served.fingerprint)
            {
                signing_cas.insert(tls_test::fingerprint(ca));
            }
        }
        let now = secret_value(&api, "tls", "ca.crt").expect("ca.crt");
        bundles.insert(now.clone());
        trusted = certificates(&now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        signing_cas.len() >= 2,
        "leaves signed by {} CAs",
        signing_cas.len()
    );
    assert!(
        bundles.iter().any(|b| certificates(b).len() >= 2),
        "ca.crt carried two CAs during the overlap"
    );
    assert!(a.stats().generated_cas >= 2);
    assert!(
        a.status().last_error.is_none(),
        "{:?}",
        a.status().last_error
    );
}

/// The same on a real cluster (the ambient kubeconfig; namespace `$TLS_K8S_TEST_NAMESPACE`,
/// default `default`): three replicas, one generation, one certificate. Cleans up after itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs cluster"]
async fn on_a_real_cluster_three_replicas_share_one_certificate() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Secret;
    let client = kube::Client::try_default()
        .await
        .expect("a cluster from the kubeconfig");
    let namespace = std::env::var("TLS_K8S_TEST_NAMESPACE").unwrap_or_else(|_| "default".into());
    let name = format!("tls-rotation-shared-{}", std::process::id());
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        let shared = SharedSelfSigned::new(
            client.clone(),
            &namespace,
            name.clone(),
            id,
            generator(&["localhost"], true),
        )
        .start(&CancellationToken::new());
        let (leadership, stats) = (shared.leadership(), shared.stats());
        let reloader = Reloader::builder()
            .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .spawn(shared)
            .expect("spawn");
        let server = TestServer::start(reloader.resolver()).await;
        replicas.push((leadership, stats, reloader, server));
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut served = BTreeSet::new();
        for (_, _, _, server) in &replicas {
            served.insert(tls_test::served_as(server.addr(), "localhost").await.ok());
        }
        let leading = replicas.iter().filter(|r| r.0.borrow().leading).count();
        if served.len() == 1 && served.first().is_some_and(Option::is_some) && leading == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no agreement: {served:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let generated: u64 = replicas.iter().map(|r| r.1.borrow().generated_leaves).sum();
    assert_eq!(generated, 1);
    drop(replicas);
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), &namespace);
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, &namespace);
    let params = kube::api::DeleteParams::default();
    let _ = secrets.delete(&name, &params).await;
    let _ = secrets.delete(&format!("{name}-ca"), &params).await;
    let _ = leases.delete(&format!("{name}-writer"), &params).await;
}

/// At steady state a follower makes no requests at all (its watches of the Lease and the
/// Secret stay open), and the leader one per retry period: a replace of the Lease from its own
/// last write, without reading it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_steady_state_a_follower_only_watches_and_the_leader_renews_once_per_retry() {
    let api = KubeApi::start().await;
    let [a, b, c] = three(&api, false).await;
    let all = [&a, &b, &c];
    converged(&api, &all).await;
    let leader = leader(&all).await;
    until("the leader's first check", || leader.stats().checks >= 1).await;
    tokio::time::sleep(RETRY * 2).await;
    let before: Vec<Vec<String>> = all.iter().map(|r| r.endpoint.request_log()).collect();
    let since =
        |replica: &&Replica, before: usize| replica.endpoint.request_log()[before..].to_vec();
    let leader_before = all
        .iter()
        .zip(&before)
        .find(|(r, _)| r.id == leader.id)
        .map(|(_, b)| b.len())
        .expect("the leader is one of them");
    // The leader renews: wait for twelve renewals, a count that moves.
    let started = std::time::Instant::now();
    until("twelve renewals", || {
        since(&leader, leader_before)
            .iter()
            .filter(|r| r.starts_with("PUT "))
            .count()
            >= 12
    })
    .await;
    // And nothing more, however slowly the time passed: at most one request per retry period
    // of the leader's (an upper bound on a count: no storm), none from the followers.
    let periods = started.elapsed().as_millis() / RETRY.as_millis() + 2;
    for (replica, before) in all.iter().zip(before) {
        let during = since(replica, before.len());
        if replica.id == leader.id {
            let renewals = during.iter().filter(|r| r.starts_with("PUT ")).count();
            assert!(
                renewals as u128 <= periods,
                "{renewals} renewals in {periods} retry periods: {during:?}"
            );
            assert_eq!(during.len(), renewals, "nothing but renewals: {during:?}");
        } else {
            assert!(during.is_empty(), "a follower asked: {during:?}");
        }
    }
}
