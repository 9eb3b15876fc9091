//! A fleet's shared self-signed certificate on a real etcd cluster: three replicas in this
//! process, each a reloader behind a real TLS server.

use std::sync::Arc;
use std::time::Duration;

use tls_etcd::store::Leadership;
use tls_etcd::{Etcd, SharedSelfSigned, SharedSource, StateAccess, WriterStats};
use tls_reload::{Reloader, Status};
use tls_seal::{KeyRing, SealKey};
use tls_selfsigned::SelfSigned;
use tls_test::{EtcdCluster, PATIENCE, TestServer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct Replica {
    reloader: Reloader,
    server: TestServer,
    leadership: watch::Receiver<Leadership>,
    stats: watch::Receiver<WriterStats>,
    access: watch::Receiver<StateAccess>,
    token: CancellationToken,
    stopped: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

fn generator() -> SelfSigned {
    SelfSigned::builder()
        .dns_name("localhost")
        .ca()
        .build()
        .unwrap()
}

fn ring(byte: u8) -> Arc<KeyRing> {
    Arc::new(KeyRing::from_keys([SealKey::from_bytes([byte; 32])]).unwrap())
}

async fn replica(
    cluster: &EtcdCluster,
    prefix: &str,
    identity: &str,
    seal: Option<Arc<KeyRing>>,
) -> Replica {
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let token = CancellationToken::new();
    let mut shared = SharedSelfSigned::new(etcd, prefix, "web", identity, generator())
        .lease_timing(Duration::from_secs(3), Duration::from_millis(500));
    if let Some(seal) = seal {
        shared = shared.seal(seal);
    }
    let shared: SharedSource = shared.start(&token);
    let (leadership, stats, access) = (shared.leadership(), shared.stats(), shared.access());
    let stopped = Box::pin(shared.stopped());
    let reloader = Reloader::builder()
        .crypto_provider(tls_test::provider())
        .spawn(shared)
        .unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    Replica {
        reloader,
        server,
        leadership,
        stats,
        access,
        token,
        stopped,
    }
}

impl Replica {
    async fn stop(self) {
        self.token.cancel();
        self.reloader.stop();
        let _ = self.reloader.stopped().await;
        drop(self.server);
        tokio::time::timeout(PATIENCE, self.stopped)
            .await
            .expect("the writer stops");
    }

    fn current(&self) -> Option<String> {
        current(&self.reloader.status().borrow())
    }
}

fn current(status: &Status) -> Option<String> {
    status
        .current
        .as_ref()
        .map(|c| c.fingerprint_sha256.clone())
}

/// Waits until every replica serves one same leaf; returns it.
async fn one_leaf(replicas: &[Replica]) -> String {
    let leaf = tls_test::wait_for(replicas[0].reloader.status(), "a leaf", |s| {
        s.current.is_some()
    })
    .await;
    let leaf = current(&leaf).unwrap();
    for replica in replicas {
        tls_test::wait_for(replica.reloader.status(), "the same leaf", |s| {
            current(s).as_deref() == Some(leaf.as_str())
        })
        .await;
        assert_eq!(tls_test::served(replica.server.addr()).await, leaf);
    }
    leaf
}

fn generated(replicas: &[Replica]) -> (u64, u64) {
    replicas.iter().fold((0, 0), |(l, c), r| {
        let s = r.stats.borrow();
        (l + s.generated_leaves, c + s.generated_cas)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn three_replicas_serve_one_leaf_made_once_and_a_restart_of_all_makes_none() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("shared");
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(replica(cluster, &prefix, id, None).await);
    }
    let leaf = one_leaf(&replicas).await;
    assert_eq!(
        generated(&replicas),
        (1, 1),
        "one leaf and one CA, by the writer alone"
    );
    let leaders = replicas
        .iter()
        .filter(|r| r.leadership.borrow().leading)
        .count();
    assert_eq!(leaders, 1);

    // The writer stops: another leads, and generates nothing (what is stored fits).
    let writer = replicas
        .iter()
        .position(|r| r.leadership.borrow().leading)
        .unwrap();
    let old = replicas.remove(writer);
    let old_round = old.leadership.borrow().round;
    old.stop().await;
    for replica in &replicas {
        tls_test::wait_for(replica.leadership.clone(), "a new round", |l| {
            l.round > old_round
        })
        .await;
    }
    tls_test::wait_for(
        replicas
            .iter()
            .find(|r| r.leadership.borrow().leading)
            .map(|r| r.stats.clone())
            .expect("a new leader"),
        "the new writer checked",
        |s| s.checks > 0,
    )
    .await;
    assert_eq!(generated(&replicas), (0, 0));
    assert_eq!(one_leaf(&replicas).await, leaf);

    // Every replica restarted at once: the same leaf, nothing generated.
    for replica in replicas.drain(..) {
        replica.stop().await;
    }
    for id in ["a", "b", "c"] {
        replicas.push(replica(cluster, &prefix, id, None).await);
    }
    assert_eq!(one_leaf(&replicas).await, leaf);
    let leader = tls_test::wait_for(replicas[0].leadership.clone(), "a leader", |l| {
        l.holder.is_some()
    })
    .await;
    let writer = replicas
        .iter()
        .find(|r| r.leadership.borrow().holder == leader.holder && r.leadership.borrow().leading);
    if let Some(writer) = writer {
        tls_test::wait_for(writer.stats.clone(), "checked", |s| s.checks > 0).await;
    }
    assert_eq!(generated(&replicas), (0, 0), "a restart generates nothing");
    for replica in replicas {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn with_a_seal_key_no_private_key_is_readable_in_etcd_and_a_wrong_key_never_leads() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("sealed");
    let a = replica(cluster, &prefix, "a", Some(ring(1))).await;
    let b = replica(cluster, &prefix, "b", Some(ring(1))).await;
    let fleet = [a, b];
    let leaf = one_leaf(&fleet).await;
    let stored = cluster.etcdctl(&["get", "--prefix", &prefix]);
    assert!(
        stored.contains("BEGIN CERTIFICATE"),
        "certificates stay readable"
    );
    assert!(
        !stored.contains("PRIVATE KEY"),
        "no private key in etcd:\n{stored}"
    );
    assert!(stored.contains("tls.key.sealed") && stored.contains("ca.key.sealed"));

    // A replica with another key: refused, never a candidate, serves nothing it cannot open.
    let wrong = replica(cluster, &prefix, "wrong", Some(ring(2))).await;
    let access = tls_test::wait_for(wrong.access.clone(), "refused", |a| {
        matches!(a, StateAccess::Refused { .. })
    })
    .await;
    let StateAccess::Refused { reason } = access else {
        unreachable!()
    };
    assert!(reason.contains(&prefix), "{reason}");
    assert!(!wrong.leadership.borrow().leading);
    assert_ne!(wrong.current().as_deref(), Some(leaf.as_str()));
    wrong.stop().await;
    for replica in fleet {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_value_edited_by_hand_is_refused_and_the_last_good_leaf_keeps_serving() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("edited");
    let seal = ring(5);
    let replicas = vec![
        replica(cluster, &prefix, "a", Some(seal.clone())).await,
        replica(cluster, &prefix, "b", Some(seal.clone())).await,
    ];
    let leaf = one_leaf(&replicas).await;
    let tls = format!("{prefix}fleets/web/tls");
    let stored = cluster.etcdctl(&["get", &tls, "--print-value-only"]);
    let mut value: serde_json::Value = serde_json::from_str(stored.trim()).unwrap();

    // An altered sealed key: nobody can open it, nobody writes over it, all serve the leaf.
    let sealed = value["tls.key.sealed"].as_str().unwrap().to_owned();
    let mut altered = sealed.clone().into_bytes();
    let i = altered.len() / 2;
    altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
    value["tls.key.sealed"] = String::from_utf8(altered).unwrap().into();
    let revision = cluster.put(&tls, value.to_string().as_bytes());
    for replica in &replicas {
        tls_test::wait_for(replica.reloader.status(), "the altered key refused", |s| {
            s.last_error.is_some()
        })
        .await;
        tls_test::wait_for(replica.access.clone(), "refused", |a| {
            matches!(a, StateAccess::Refused { .. })
        })
        .await;
        assert_eq!(tls_test::served(replica.server.addr()).await, leaf);
    }
    // Neither can open it, so neither leads (a writer that found it so steps down, its lease
    // revoked a moment after): nothing was, or will be, written over it.
    for replica in &replicas {
        tls_test::wait_for(replica.leadership.clone(), "not leading", |l| !l.leading).await;
    }
    let now = cluster.etcdctl(&["get", &tls, "-w", "json"]);
    let now: serde_json::Value = serde_json::from_str(&now).unwrap();
    assert_eq!(
        now["kvs"][0]["mod_revision"].as_i64(),
        Some(revision),
        "nobody wrote over what it cannot open"
    );

    // Put back as it was: every replica opens it again and one leads.
    value["tls.key.sealed"] = sealed.into();
    cluster.put(&tls, value.to_string().as_bytes());
    for replica in &replicas {
        tls_test::wait_for(replica.access.clone(), "open again", |a| {
            *a == StateAccess::Open
        })
        .await;
    }
    tls_test::wait_for(replicas[0].leadership.clone(), "a writer again", |l| {
        l.holder.is_some()
    })
    .await;
    assert_eq!(one_leaf(&replicas).await, leaf);
    for replica in replicas {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn garbage_or_a_foreign_pair_is_refused_by_every_reader_and_replaced_by_the_writer_alone() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("foreign");
    let replicas = vec![
        replica(cluster, &prefix, "a", None).await,
        replica(cluster, &prefix, "b", None).await,
        replica(cluster, &prefix, "c", None).await,
    ];
    let mut leaf = one_leaf(&replicas).await;
    let tls = format!("{prefix}fleets/web/tls");
    let other = tls_test::TestCa::new("foreign");
    let [one, two]: [tls_test::TestCert; 2] = other.leaves(&["localhost"]);
    let foreign = tls_etcd::value(&one.chain_pem, &two.key_pem, None);
    for bad in [b"garbage".to_vec(), foreign.into_bytes()] {
        let accepted: Vec<u64> = replicas.iter().map(|r| r.stats.borrow().accepted).collect();
        let made = generated(&replicas).0;
        cluster.put(&tls, &bad);
        // The writer puts a new leaf in its place; every replica serves it, and none ever
        // served what was put by hand.
        let replaced = tls_test::wait_for(replicas[0].reloader.status(), "a new leaf", |s| {
            current(s).is_some_and(|c| c != leaf)
        })
        .await;
        let replaced = current(&replaced).unwrap();
        assert_ne!(replaced, one.fingerprint);
        assert_eq!(one_leaf(&replicas).await, replaced);
        assert_eq!(generated(&replicas).0, made + 1, "one leaf, by the writer");
        let wrote: Vec<bool> = replicas
            .iter()
            .zip(&accepted)
            .map(|(r, before)| r.stats.borrow().accepted > *before)
            .collect();
        assert_eq!(
            wrote.iter().filter(|w| **w).count(),
            1,
            "only the writer wrote"
        );
        for (replica, wrote) in replicas.iter().zip(&wrote) {
            assert_eq!(*wrote, replica.leadership.borrow().leading);
        }
        leaf = replaced;
    }
    for replica in replicas {
        replica.stop().await;
    }
}
