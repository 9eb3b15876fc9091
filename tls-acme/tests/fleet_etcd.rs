//! A fleet of three replicas sharing one ACME state in a real three-member etcd, against
//! Pebble: replicas on 127.0.0.1, .2 and .3 (the same port, Pebble's TLS-ALPN-01 port), each
//! reaching etcd through TCP links of its own, so that killing one is cutting its links (it
//! can revoke nothing) and dropping it. challtestsrv points names at the followers, so the
//! CA's validation reaches a replica that did not order. Orders are counted on the CA's side
//! (Pebble's log). The leader killed at an exact point: [`tls_test::AcmeLayer::hold_next`]
//! holds one request to Pebble unanswered.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tls_acme::{Acme, AcmeBuilder};
use tls_etcd::Etcd;
use tls_seal::{KeyRing, Seal, SealKey};
use tls_test::{EtcdCluster, PATIENCE, Pebble, TcpLink};

/// Test timings: etcd's shortest lease (2 s), kept alive every 200 ms.
const TTL: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(200);

struct Replica {
    id: String,
    links: Vec<TcpLink>,
    server: Server,
}

impl Replica {
    /// Replica `n` (1 to 3) of the fleet under `prefix`, serving on 127.0.0.`n`:`port`, its
    /// builder changed by `configure`.
    async fn start(
        cluster: &EtcdCluster,
        prefix: &str,
        (pebble, directory): (&Pebble, &str),
        n: u8,
        port: u16,
        names: &[&str],
        configure: impl FnOnce(AcmeBuilder) -> AcmeBuilder,
    ) -> Self {
        let id = format!("replica-{n}");
        let mut links = Vec::new();
        for addr in cluster.addrs() {
            links.push(TcpLink::to(addr).await);
        }
        let etcd = Etcd::builder(links.iter().map(|l| l.addr.to_string()))
            .build()
            .expect("an etcd client");
        let mut builder = Acme::builder(directory)
            .contact("ops@example.com")
            .directory_roots(vec![pebble.https_ca_der()])
            .crypto_provider(provider())
            .stagger(Duration::from_millis(10))
            .etcd(etcd, prefix, "web", id.clone())
            .etcd_lease_timing(TTL, RETRY);
        for name in names {
            builder = builder.name(*name);
        }
        builder = configure(builder);
        let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, n), port));
        let listener = rebind(addr).await;
        Self {
            id,
            links,
            server: Server::start(builder, listener),
        }
    }

    fn leading(&self) -> bool {
        self.server
            .acme
            .etcd_leadership()
            .expect("a fleet on etcd")
            .borrow()
            .leading
    }

    async fn until_leading(&self) {
        let mut leadership = self.server.acme.etcd_leadership().expect("a fleet on etcd");
        tokio::time::timeout(PATIENCE, leadership.wait_for(|l| l.leading))
            .await
            .unwrap_or_else(|_| panic!("{} never led", self.id))
            .expect("the election runs");
    }

    /// Killed as on SIGKILL: its links to etcd are cut first (it cannot revoke its lease),
    /// then everything it runs is dropped.
    fn kill(self) {
        for link in &self.links {
            link.cut();
        }
        drop(self.server);
    }
}

/// The fleet: replica 1 leads (started first); names point at the others.
async fn fleet(
    cluster: &EtcdCluster,
    prefix: &str,
    ca: (&Pebble, &str),
    port: u16,
    names: &[&str],
    seal: Option<&Arc<dyn Seal>>,
) -> [Replica; 3] {
    let configure = |builder: AcmeBuilder| match seal {
        Some(seal) => builder.seal(Arc::clone(seal)),
        None => builder,
    };
    let a = Replica::start(cluster, prefix, ca, 1, port, names, configure).await;
    a.until_leading().await;
    let b = Replica::start(cluster, prefix, ca, 2, port, names, configure).await;
    let c = Replica::start(cluster, prefix, ca, 3, port, names, configure).await;
    [a, b, c]
}

/// The keys under `prefix`, as `etcdctl` lists them.
fn keys(cluster: &EtcdCluster, prefix: &str) -> Vec<String> {
    cluster
        .etcdctl(&["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The shared etcd cluster, or the test's end: without etcd (and not under `CI`) these tests
/// are reported as ignored (`cfg(etcd)`).
fn cluster() -> &'static EtcdCluster {
    EtcdCluster::shared().expect("etcd (apt install etcd-server etcd-client)")
}

#[cfg_attr(
    not(all(pebble, etcd)),
    ignore = "needs Pebble and etcd (apt install pebble etcd-server etcd-client)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_fleet_orders_each_name_once_followers_answer_and_a_restart_orders_nothing() {
    let cluster = cluster();
    let prefix = cluster.prefix("acme-fleet");
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let names = ["a.example.com", "b.example.com", "c.example.com"];
    // The CA validates a at replica 2, b at replica 3, c at the leader.
    pebble.add_a(names[0], Ipv4Addr::new(127, 0, 0, 2)).await;
    pebble.add_a(names[1], Ipv4Addr::new(127, 0, 0, 3)).await;
    let root = pebble.issuing_root().await;
    let directory = pebble.directory_url();
    let ca = (&pebble, directory.as_str());
    let replicas = fleet(cluster, &prefix, ca, port, &names, None).await;
    for replica in &replicas {
        // Every replica's status says what the leader did (the others read its records).
        let status = replica.server.until("every name valid", all_valid).await;
        assert_eq!(status.names.len(), 3);
        until_served(replica.server.addr, &names, &root).await;
    }
    for replica in &replicas {
        // The account's URL reaches the followers a moment after the certificates can.
        replica
            .server
            .until("the account known", |s| s.account.is_some())
            .await;
    }
    assert!(replicas[0].leading() && !replicas[1].leading() && !replicas[2].leading());
    assert_eq!(pebble.orders(), 3, "one order per name across the fleet");

    // What the fleet keeps: a key per certificate and per record, one account for the
    // directory, the writer key; no order in flight, no challenge left published.
    let web = format!("{prefix}fleets/web/");
    let mut expected: Vec<String> = names
        .iter()
        .flat_map(|n| {
            [
                format!("{web}acme/certs/{n}"),
                format!("{web}acme/state/records/{n}"),
            ]
        })
        .collect();
    expected.extend([
        format!("{web}acme/state/accounts/{directory}"),
        format!("{web}acme/state/budget"),
        format!("{web}writer"),
    ]);
    expected.sort();
    assert_eq!(keys(cluster, &prefix), expected);
    let account = cluster.etcdctl(&[
        "get",
        "--print-value-only",
        &format!("{web}acme/state/accounts/{directory}"),
    ]);
    let account: serde_json::Value = serde_json::from_str(account.trim()).expect("JSON");
    assert!(
        account["annotations"]["thumbprint"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{account}"
    );

    // Every replica restarted: each serves what is stored as soon as it is ready, and nothing
    // is ordered again.
    drop(replicas);
    let replicas = fleet(cluster, &prefix, ca, port, &names, None).await;
    for replica in &replicas {
        tokio::time::timeout(PATIENCE, replica.server.reloader.ready())
            .await
            .expect("ready in time")
            .expect("ready");
        assert_served(replica.server.addr, &names, &root).await;
    }
    let decided = replicas[0]
        .server
        .until("the leader's decision on every name", |s| {
            s.names.len() == names.len() && s.names.values().all(|n| n.decided_at.is_some())
        })
        .await;
    assert!(replicas[0].leading(), "{decided:?}");
    assert!(all_valid(&decided), "{decided:?}");
    assert_eq!(
        pebble.orders(),
        3,
        "nothing ordered again after the restart"
    );
}

/// The leader of a fleet serving one name is killed while its request to Pebble's `path` is
/// held; the survivors finish the certificate. Returns how many orders Pebble saw.
async fn leader_killed_at(path: &str) -> usize {
    let cluster = cluster();
    let prefix = cluster.prefix("acme-killed");
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let name = "d.example.com";
    pebble.add_a(name, Ipv4Addr::new(127, 0, 0, 2)).await;
    let layer = pebble.layer().await;
    layer.hold_next(path, false);
    let root = pebble.issuing_root().await;
    let directory = layer.directory_url();
    let [leader, b, c] = fleet(
        cluster,
        &prefix,
        (&pebble, directory.as_str()),
        port,
        &[name],
        None,
    )
    .await;
    layer.until_held().await;
    leader.kill();
    // A follower takes over when the lease expires and resumes what is stored.
    for replica in [&b, &c] {
        replica
            .server
            .until("the name valid after the failover", all_valid)
            .await;
        until_served(replica.server.addr, &[name], &root).await;
    }
    assert!(b.leading() || c.leading(), "{path}: a survivor leads");
    pebble.orders()
}

#[cfg_attr(
    not(all(pebble, etcd)),
    ignore = "needs Pebble and etcd (apt install pebble etcd-server etcd-client)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_fleet_leader_killed_after_its_challenge_was_answered_is_succeeded_by_one_that_finalizes()
 {
    let orders = leader_killed_at("/finalize-order/").await;
    assert_eq!(
        orders, 1,
        "the stored order was finalized, not placed again"
    );
}

#[cfg_attr(
    not(all(pebble, etcd)),
    ignore = "needs Pebble and etcd (apt install pebble etcd-server etcd-client)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_seal_no_private_key_is_readable_in_etcd_and_a_new_leader_resumes_the_sealed_order()
{
    let cluster = cluster();
    let prefix = cluster.prefix("acme-sealed");
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let names = ["s.example.com", "t.example.com"];
    pebble.add_a(names[0], Ipv4Addr::new(127, 0, 0, 2)).await;
    pebble.add_a(names[1], Ipv4Addr::new(127, 0, 0, 3)).await;
    let layer = pebble.layer().await;
    // The leader is stopped once an order is stored, the CA not yet told to validate.
    layer.hold_next("/chalZ/", false);
    let root = pebble.issuing_root().await;
    let directory = layer.directory_url();
    let ring: Arc<dyn Seal> = Arc::new(KeyRing::from_keys([SealKey::generate().unwrap()]).unwrap());
    let ca = (&pebble, directory.as_str());
    let [leader, b, c] = fleet(cluster, &prefix, ca, port, &names, Some(&ring)).await;
    layer.until_held().await;

    // What an operator with `etcdctl get --prefix` sees: no private key, PEM or DER.
    let readable = async |cluster: &EtcdCluster| {
        let everything = cluster.etcdctl(&["get", "--prefix", &prefix]);
        assert!(!everything.contains("PRIVATE KEY"), "{everything}");
        no_key_in_the_clear(cluster, &prefix).await;
        everything
    };
    let held = readable(cluster).await;
    assert!(held.contains("\"order.key.sealed\""), "{held}");
    assert!(held.contains("\"account.json.sealed\""), "{held}");

    // The next leader opens the sealed account and order: it resumes the stored order.
    leader.kill();
    for replica in [&b, &c] {
        replica
            .server
            .until("issued after the failover", all_valid)
            .await;
        // Every replica opens the certificates' sealed keys with the seal.
        until_served(replica.server.addr, &names, &root).await;
    }
    assert_eq!(
        pebble.orders(),
        names.len(),
        "one order per name: the sealed one was resumed"
    );
    let done = readable(cluster).await;
    assert!(done.contains("\"tls.key.sealed\""), "{done}");
    assert!(done.contains("BEGIN CERTIFICATE"), "{done}");

    // A replica without the seal key cannot open the account: it says so and does not
    // campaign, so nobody leads (the others stopped) and nothing is registered or written.
    drop((b, c));
    let writer = format!("{prefix}fleets/web/writer");
    tokio::time::timeout(PATIENCE, async {
        while keys(cluster, &prefix).contains(&writer) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the stopped leader released the writer key");
    let before = keys(cluster, &prefix);
    let plain = Replica::start(cluster, &prefix, ca, 1, port, &names, |b| b).await;
    let status = plain
        .server
        .until("the account refused", |s| s.account_error.is_some())
        .await;
    let error = status.account_error.unwrap();
    assert!(
        error.contains("account.json")
            && error.contains("no seal key")
            && error.contains("does not lead"),
        "{error}"
    );
    // Refused at the list, before it could ever campaign.
    assert!(!plain.leading());
    assert_eq!(
        keys(cluster, &prefix),
        before,
        "no writer key, nothing written"
    );
    assert_eq!(pebble.log_matching("POST /sign-me-up"), 1, "one account");
}

/// Every value under `prefix`, read raw: the objects hold their private keys only sealed
/// (`NAME.sealed`, an envelope in base64), never as a field of their own, and what else is
/// there is JSON text or a challenge's digest (32 bytes).
async fn no_key_in_the_clear(cluster: &EtcdCluster, prefix: &str) {
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let mut client = etcd.connect().await.expect("etcd");
    let options = tls_etcd::etcd_client::GetOptions::new().with_prefix();
    let listed = client.get(prefix, Some(options)).await.expect("a list");
    assert!(!listed.kvs().is_empty());
    for kv in listed.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if key.contains("/challenges/tls-alpn-01/") {
            assert_eq!(kv.value().len(), 32, "{key}: a digest");
            continue;
        }
        if key.ends_with("/writer") {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_slice(kv.value()).unwrap_or_else(|e| panic!("{key}: not JSON ({e})"));
        for field in ["tls.key", "order.key", "account.json"] {
            assert!(value.get(field).is_none(), "{key}: {field} in the clear");
        }
        let sealed = ["/certs/", "/orders/", "/accounts/"]
            .iter()
            .any(|kind| key.contains(kind));
        if sealed {
            let fields: Vec<&String> = value.as_object().unwrap().keys().collect();
            assert!(
                fields.iter().any(|f| f.ends_with(".sealed")),
                "{key}: {fields:?}"
            );
        }
    }
}
