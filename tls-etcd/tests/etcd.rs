//! The etcd sources against a real etcd cluster (three members on loopback; Debian's
//! `etcd-server`), served through a reloader behind a real TLS server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use tls_etcd::{Etcd, EtcdCertSource, EtcdCertsSource};
use tls_reload::{ClientTls, FileSource, Reloader, Status};
use tls_source::KeyedUpdate;
use tls_test::{EtcdCluster, KubeDir, PATIENCE, TestCa, TestCert, TestServer};

use tls_test::TcpLink as Link;

fn etcd(cluster: &EtcdCluster) -> Etcd {
    Etcd::builder(cluster.endpoints())
        .build()
        .expect("endpoints")
}

fn value(cert: &TestCert) -> Vec<u8> {
    tls_etcd::value(&cert.chain_pem, &cert.key_pem, None).into_bytes()
}

fn reloader(source: EtcdCertSource) -> Reloader {
    Reloader::builder()
        .crypto_provider(tls_test::provider())
        .spawn(source)
        .expect("spawn")
}

fn routes_reloader(source: EtcdCertsSource) -> Reloader {
    Reloader::builder()
        .crypto_provider(tls_test::provider())
        .routes(source)
        .spawn_routes()
        .expect("spawn")
}

fn current(status: &Status) -> Option<&str> {
    status
        .current
        .as_ref()
        .map(|c| c.fingerprint_sha256.as_str())
}

fn route(status: &Status, key: &str) -> Option<String> {
    status
        .routes
        .get(key)
        .and_then(|r| r.current.as_ref())
        .map(|c| c.fingerprint_sha256.clone())
}

fn last_error(status: &Status) -> String {
    // Each layer's message names what it wraps: the source's, then etcd's or the value's.
    status
        .last_error
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// Handshakes with `addr` as `localhost`, one after another until `stop`, counting failures.
fn handshakes(addr: SocketAddr, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        while !stop.load(Ordering::Relaxed) {
            match tls_test::served_as(addr, "localhost").await {
                Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                Err(_) => failed.fetch_add(1, Ordering::Relaxed),
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (ok.into_inner(), failed.into_inner())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_put_is_served_and_bad_values_a_foreign_key_and_a_deletion_keep_the_last_good_one() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let key = format!("{}certs/web", cluster.prefix("put"));
    let ca = TestCa::new("etcd put");
    let [first, second, third]: [TestCert; 3] = ca.leaves(&["localhost"]);

    // Started before the key exists: not ready, and says why.
    let reloader = reloader(EtcdCertSource::new(etcd(cluster), key.clone()));
    let status = tls_test::wait_for(reloader.status(), "not found reported", |s| {
        s.last_error.is_some()
    })
    .await;
    assert!(!status.ready);
    assert!(
        last_error(&status).contains("holds no value"),
        "{}",
        last_error(&status)
    );
    assert!(
        last_error(&status).contains(&key),
        "{}",
        last_error(&status)
    );

    cluster.put(&key, &value(&first));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    tls_test::expect_served(server.addr(), reloader.status(), current, &first).await;
    let origin = reloader
        .status()
        .borrow()
        .current
        .as_ref()
        .unwrap()
        .origin
        .clone();
    assert!(
        origin
            .to_string()
            .starts_with(&format!("etcd {key} at revision ")),
        "{origin}"
    );

    // Garbage: reported by key, never echoing the value; the first keeps serving.
    let generation = reloader.status().borrow().generation;
    cluster.put(&key, format!("garbage {}", first.key_pem).as_bytes());
    let status = tls_test::wait_for(reloader.status(), "garbage reported", |s| {
        last_error(s).contains("not a JSON object")
    })
    .await;
    tls_test::assert_no_key_material(&last_error(&status), &first);
    assert_eq!(tls_test::served(server.addr()).await, first.fingerprint);

    // A chain with the key of another pair: refused by the core.
    let foreign = tls_etcd::value(&second.chain_pem, &third.key_pem, None);
    cluster.put(&key, foreign.as_bytes());
    tls_test::wait_for(reloader.status(), "mismatch reported", |s| {
        last_error(s).contains("key") && !last_error(s).contains("JSON")
    })
    .await;
    assert_eq!(tls_test::served(server.addr()).await, first.fingerprint);
    assert_eq!(reloader.status().borrow().generation, generation);

    // Good again: served.
    cluster.put(&key, &value(&second));
    tls_test::expect_served(server.addr(), reloader.status(), current, &second).await;

    // Deleted: reported, the last good one serves; a new put is picked up.
    cluster.delete(&key);
    let status = tls_test::wait_for(reloader.status(), "deletion reported", |s| {
        last_error(s).contains("was deleted")
    })
    .await;
    assert_eq!(current(&status), Some(second.fingerprint.as_str()));
    assert_eq!(tls_test::served(server.addr()).await, second.fingerprint);
    cluster.put(&key, &value(&third));
    tls_test::expect_served(server.addr(), reloader.status(), current, &third).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn every_certificate_under_the_prefix_is_served_by_its_names_and_a_deleted_one_goes() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = format!("{}certs/", cluster.prefix("routes"));
    let ca = TestCa::new("etcd routes");
    let certs: Vec<TestCert> = (0..5)
        .map(|i| ca.leaf(&[&format!("host{i}.example.com")]))
        .collect();
    for (i, cert) in certs.iter().enumerate() {
        cluster.put(&format!("{prefix}web-{i}"), &value(cert));
    }
    // Outside the prefix: not served.
    let other = ca.leaf(&["other.example.com"]);
    cluster.put(
        &format!("{}other", cluster.prefix("routes-other")),
        &value(&other),
    );

    let reloader = routes_reloader(EtcdCertsSource::new(etcd(cluster), prefix.clone()));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let status = reloader.status().borrow().clone();
    assert_eq!(status.routes.len(), 5, "ready once the whole list is in");
    assert_eq!(status.routes["web-3"].names, ["host3.example.com"]);
    let server = TestServer::start(reloader.resolver()).await;
    for (i, cert) in certs.iter().enumerate() {
        let served = tls_test::served_as(server.addr(), &format!("host{i}.example.com")).await;
        assert_eq!(served.unwrap(), cert.fingerprint, "host{i}");
    }
    assert!(
        tls_test::served_as(server.addr(), "other.example.com")
            .await
            .is_err()
    );

    // A rotation reaches its route; a bad value keeps the route's last good one; a deletion
    // removes the route; a new key adds one.
    let rotated = ca.leaf(&["host1.example.com"]);
    cluster.put(&format!("{prefix}web-1"), &value(&rotated));
    cluster.put(&format!("{prefix}web-2"), b"{}");
    cluster.delete(&format!("{prefix}web-3"));
    let added = ca.leaf(&["host9.example.com"]);
    cluster.put(&format!("{prefix}web-9"), &value(&added));
    tls_test::wait_for(reloader.status(), "all four changes", |s| {
        route(s, "web-1").as_deref() == Some(rotated.fingerprint.as_str())
            && s.routes
                .get("web-2")
                .is_some_and(|r| r.last_error.is_some())
            && !s.routes.contains_key("web-3")
            && route(s, "web-9").as_deref() == Some(added.fingerprint.as_str())
    })
    .await;
    let served = |name: &'static str| tls_test::served_as(server.addr(), name);
    assert_eq!(
        served("host1.example.com").await.unwrap(),
        rotated.fingerprint
    );
    assert_eq!(
        served("host2.example.com").await.unwrap(),
        certs[2].fingerprint
    );
    assert!(served("host3.example.com").await.is_err());
    assert_eq!(
        served("host9.example.com").await.unwrap(),
        added.fingerprint
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_list_larger_than_a_page_is_listed_whole_at_one_revision() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = format!("{}certs/", cluster.prefix("pages"));
    let cert = TestCa::new("etcd pages").leaf(&["pages.example.com"]);
    let etcd = etcd(cluster);
    let mut client = etcd.connect().await.unwrap();
    // 1,203 keys: more than one page (1,000 keys).
    let count = 1203;
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<_> = chunk
            .iter()
            .map(|i| {
                tls_etcd::etcd_client::TxnOp::put(format!("{prefix}k{i:05}"), value(&cert), None)
            })
            .collect();
        client
            .txn(tls_etcd::etcd_client::Txn::new().and_then(ops))
            .await
            .unwrap();
    }
    let mut source = EtcdCertsSource::new(etcd.clone(), prefix.clone());
    let mut keys = std::collections::BTreeSet::new();
    let listed = tokio::time::timeout(PATIENCE, async {
        while let Some(item) = source.next().await {
            let item = item.expect("no failure");
            match item.update {
                KeyedUpdate::Listing => assert!(keys.is_empty(), "one Listing first"),
                KeyedUpdate::Put(_) => assert!(keys.insert(item.key), "each key once"),
                KeyedUpdate::Listed => return,
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    assert!(
        listed.is_ok(),
        "listed within {PATIENCE:?}: {} keys",
        keys.len()
    );
    assert_eq!(keys.len(), count);
    assert_eq!(
        etcd.requests(),
        2,
        "two pages of 1,000 keys at most, and nothing else yet"
    );
    assert!(keys.contains("k00000") && keys.contains(&format!("k{:05}", count - 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn compaction_while_disconnected_lists_again_with_no_gap() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = format!("{}certs/", cluster.prefix("compaction"));
    let ca = TestCa::new("etcd compaction");
    let [a, b, a2]: [TestCert; 3] = [
        ca.leaf(&["a.example.com"]),
        ca.leaf(&["b.example.com"]),
        ca.leaf(&["a.example.com"]),
    ];
    cluster.put(&format!("{prefix}a"), &value(&a));
    cluster.put(&format!("{prefix}b"), &value(&b));
    // The source reaches etcd through one member, behind a link the test cuts.
    let link = Link::to(cluster.addrs()[0]).await;
    let through = Etcd::builder([link.addr.to_string()]).build().unwrap();
    let reloader = routes_reloader(EtcdCertsSource::new(through, prefix.clone()));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    assert_eq!(reloader.status().borrow().routes.len(), 2);
    let server = TestServer::start(reloader.resolver()).await;

    link.cut();
    tls_test::wait_for(reloader.status(), "the lost connection reported", |s| {
        s.routes.values().any(|r| r.last_error.is_some()) || s.last_error.is_some()
    })
    .await;
    // Meanwhile: a rotated, b deleted, then the history compacted past all of it.
    cluster.put(&format!("{prefix}a"), &value(&a2));
    cluster.delete(&format!("{prefix}b"));
    for i in 0..3 {
        cluster.put(&format!("{prefix}noise"), format!("{i}").as_bytes());
    }
    cluster.compact();
    // Still serving what it had.
    assert_eq!(
        tls_test::served_as(server.addr(), "a.example.com")
            .await
            .unwrap(),
        a.fingerprint
    );
    assert_eq!(
        tls_test::served_as(server.addr(), "b.example.com")
            .await
            .unwrap(),
        b.fingerprint
    );

    link.restore();
    tls_test::wait_for(reloader.status(), "the relist applied", |s| {
        route(s, "a").as_deref() == Some(a2.fingerprint.as_str()) && !s.routes.contains_key("b")
    })
    .await;
    assert_eq!(
        tls_test::served_as(server.addr(), "a.example.com")
            .await
            .unwrap(),
        a2.fingerprint
    );
    assert!(
        tls_test::served_as(server.addr(), "b.example.com")
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcds_leader_member_killed_fails_no_handshake_and_the_next_put_is_served() {
    let Some(cluster) = EtcdCluster::builder().start() else {
        return;
    };
    let key = "/tls-rotation/certs/web";
    let ca = TestCa::new("etcd leader");
    let [first, second, third]: [TestCert; 3] = ca.leaves(&["localhost"]);
    cluster.put(key, &value(&first));
    // The leader's endpoint first: the source is connected to the member about to be killed.
    let leader = cluster.leader();
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(leader);
    let etcd = Etcd::builder(endpoints).build().unwrap();
    let reloader = reloader(EtcdCertSource::new(etcd, key));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = handshakes(server.addr(), stop.clone());

    cluster.kill(leader);
    // The remaining two elect a leader; a put through them reaches the source, which moved
    // to another member if it was on the one killed.
    cluster.wait_healthy();
    cluster.put(key, &value(&second));
    tls_test::expect_served(server.addr(), reloader.status(), current, &second).await;

    // The member back, another leader killed: the same.
    cluster.restart(leader);
    let leader = cluster.leader();
    cluster.kill(leader);
    cluster.wait_healthy();
    cluster.put(key, &value(&third));
    tls_test::expect_served(server.addr(), reloader.status(), current, &third).await;

    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(ok > 10, "{ok} handshakes");
    assert_eq!(failed, 0, "no handshake failed ({ok} succeeded)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_rotated_etcd_client_certificate_keeps_the_source_connected() {
    let Some(cluster) = EtcdCluster::builder().tls().start() else {
        return;
    };
    let key = "/tls-rotation/certs/web";
    let served_ca = TestCa::new("etcd tls served");
    let [first, second]: [TestCert; 2] = served_ca.leaves(&["localhost"]);
    cluster.put(key, &value(&first));

    // The source's client certificate: valid for a few seconds only, then rotated (the
    // kubelet's way) to one valid for a day. etcd checks it at each new connection.
    let now = std::time::SystemTime::now();
    let short = cluster.ca().client_leaf_valid(
        "etcd-reader",
        now - Duration::from_secs(60),
        now + Duration::from_secs(4),
    );
    let long = cluster.ca().client_leaf("etcd-reader");
    let tmp = tempfile::tempdir().unwrap();
    let dir = KubeDir::new(tmp.path()).unwrap();
    dir.write(&[
        ("tls.crt", short.chain_pem.as_bytes()),
        ("tls.key", short.key_pem.as_bytes()),
        ("ca.crt", cluster.ca().cert_pem().as_bytes()),
    ])
    .unwrap();
    let client_tls = ClientTls::builder()
        .crypto_provider(tls_test::provider())
        .spawn(FileSource::kubernetes_dir(dir.path()).build())
        .unwrap();
    client_tls.ready_timeout(PATIENCE).await.unwrap();
    let etcd = Etcd::builder(cluster.endpoints())
        .tls(Arc::new(client_tls.client_config().unwrap()))
        .build()
        .unwrap();
    let reloader = reloader(EtcdCertSource::new(etcd, key));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    tls_test::expect_served(server.addr(), reloader.status(), current, &first).await;

    dir.write(&[
        ("tls.crt", long.chain_pem.as_bytes()),
        ("tls.key", long.key_pem.as_bytes()),
        ("ca.crt", cluster.ca().cert_pem().as_bytes()),
    ])
    .unwrap();
    tls_test::wait_for(client_tls.status(), "the new client certificate", |s| {
        s.current
            .as_ref()
            .is_some_and(|c| c.fingerprint_sha256 == long.fingerprint)
    })
    .await;
    // Past the first certificate's end, every member restarted: every connection the source
    // makes from now on presents the new certificate, or etcd refuses it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for member in 0..3 {
        cluster.kill(member);
        cluster.restart(member);
    }
    cluster.put(key, &value(&second));
    tls_test::expect_served(server.addr(), reloader.status(), current, &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_user_with_a_password_file_is_authenticated_again_when_its_token_expires() {
    let Some(cluster) = EtcdCluster::builder().members(1).auth_token_ttl(1).start() else {
        return;
    };
    cluster.enable_auth("root-password", "reader", "reader-password");
    let key = "/tls-rotation/certs/web";
    let ca = TestCa::new("etcd auth");
    let [first, second]: [TestCert; 2] = ca.leaves(&["localhost"]);
    cluster.put(key, &value(&first));
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "reader-password\n").unwrap();

    // A wrong password: refused by etcd, said plainly, and no password in the message.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-it\n").unwrap();
    let err = Etcd::builder(cluster.endpoints())
        .user_with_password_file("reader", &wrong)
        .build()
        .unwrap()
        .connect()
        .await
        .err()
        .expect("a wrong password is refused");
    let message = err.to_string();
    assert!(message.contains("authentication"), "{message}");
    assert!(
        !message.contains("not-it") && !message.contains("reader-password"),
        "{message}"
    );

    let etcd = Etcd::builder(cluster.endpoints())
        .user_with_password_file("reader", &password)
        .build()
        .unwrap();
    let reloader = reloader(EtcdCertSource::new(etcd.clone(), key));
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    tls_test::expect_served(server.addr(), reloader.status(), current, &first).await;

    // One client, its token left to expire (1 s unused), then used again: authenticated anew.
    let mut client = etcd.connect().await.unwrap();
    client.get(key, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let again = client.get(key, None).await;
    assert!(again.is_ok(), "after the token expired: {again:?}");
    // The source's watch goes on.
    cluster.put(key, &value(&second));
    tls_test::expect_served(server.addr(), reloader.status(), current, &second).await;
}
