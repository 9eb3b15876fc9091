//! A fleet of three replicas sharing one ACME state in Secrets of the API emulator, against
//! Pebble: replicas on 127.0.0.1, .2 and .3 (the same port, Pebble's TLS-ALPN-01 port), each
//! with its own emulator endpoint so one can be cut off. challtestsrv points the names at the
//! followers, so the CA's validation reaches a replica that did not order. Orders are counted
//! on the CA's side (Pebble's log), not by our metrics.
//!
//! Faults injected: the leader killed (its API connection reset, its tasks dropped) at defined
//! points, each made exact by [`tls_test::AcmeLayer::hold_next`] holding one request to Pebble
//! unanswered: before its new order reaches the CA, after it stored the order (telling the CA
//! to validate), after its challenge was answered (finalizing), after finalizing (downloading
//! the certificate), and after the CA created the order but before its URL could be stored
//! (the one point where a second order is placed); every replica restarted.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;

use common::*;
use tls_acme::{Acme, AcmeBuilder, NameState};
use tls_k8s::seal::{KeyRing, Seal, SealKey};
use tls_test::{Endpoint, KubeApi, Link, PATIENCE, Pebble};

/// Test timings: a 1.5 s lease, renewed every 200 ms, given up after 1 s.
const LEASE: Duration = Duration::from_millis(1500);
const RENEW_DEADLINE: Duration = Duration::from_millis(1000);
const RETRY: Duration = Duration::from_millis(200);

struct Replica {
    id: String,
    endpoint: Endpoint,
    server: Server,
}

fn client_of(endpoint: &Endpoint) -> kube::Client {
    let mut config = kube::Config::new(endpoint.url().parse().expect("emulator URL"));
    config.default_namespace = "default".into();
    kube::Client::try_from(config).expect("client")
}

impl Replica {
    /// Replica `n` (1 to 3), serving on 127.0.0.`n`:`port`.
    async fn start(
        api: &KubeApi,
        (pebble, directory): (&Pebble, &str),
        n: u8,
        port: u16,
        names: &[&str],
    ) -> Self {
        Self::start_with(api, (pebble, directory), n, port, names, None).await
    }

    /// Replica `n`, with `seal` sealing the account and the orders' keys.
    async fn start_with(
        api: &KubeApi,
        ca: (&Pebble, &str),
        n: u8,
        port: u16,
        names: &[&str],
        seal: Option<Arc<dyn Seal>>,
    ) -> Self {
        Self::start_configured(api, ca, n, port, names, |builder| match seal {
            Some(seal) => builder.seal(seal),
            None => builder,
        })
        .await
    }

    /// Replica `n`, its builder changed by `configure`.
    async fn start_configured(
        api: &KubeApi,
        (pebble, directory): (&Pebble, &str),
        n: u8,
        port: u16,
        names: &[&str],
        configure: impl FnOnce(AcmeBuilder) -> AcmeBuilder,
    ) -> Self {
        let id = format!("replica-{n}");
        let endpoint = api.endpoint().await;
        let mut builder = Acme::builder(directory)
            .contact("ops@example.com")
            .directory_roots(vec![pebble.https_ca_der()])
            .crypto_provider(provider())
            .stagger(Duration::from_millis(10))
            .kubernetes(client_of(&endpoint), "default", "web", id.clone())
            .lease_timing(LEASE, RENEW_DEADLINE, RETRY);
        for name in names {
            builder = builder.name(*name);
        }
        builder = configure(builder);
        let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, n), port));
        let listener = rebind(addr).await;
        Self {
            id,
            endpoint,
            server: Server::start(builder, listener),
        }
    }

    fn leading(&self) -> bool {
        self.server
            .acme
            .leadership()
            .expect("a fleet")
            .borrow()
            .leading
    }

    async fn until_leading(&self) {
        let mut leadership = self.server.acme.leadership().expect("a fleet");
        tokio::time::timeout(PATIENCE, leadership.wait_for(|l| l.leading))
            .await
            .unwrap_or_else(|_| panic!("{} never led", self.id))
            .expect("the election runs");
    }

    /// Killed as on SIGKILL: its API connection is reset first (it cannot release the Lease),
    /// then everything it runs is dropped.
    fn kill(self) {
        self.endpoint.partition(Link::Reset);
        drop(self.server);
    }
}

fn secret(api: &KubeApi, name: &str) -> Option<serde_json::Value> {
    api.get("secrets", "default", name)
}

/// The leader is replica 1 (started first); names point at the others.
async fn fleet(api: &KubeApi, ca: (&Pebble, &str), port: u16, names: &[&str]) -> [Replica; 3] {
    let a = Replica::start(api, ca, 1, port, names).await;
    a.until_leading().await;
    let b = Replica::start(api, ca, 2, port, names).await;
    let c = Replica::start(api, ca, 3, port, names).await;
    [a, b, c]
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_orders_each_name_once_followers_answer_and_a_restart_orders_nothing() {
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let names = ["a.example.com", "b.example.com", "c.example.com"];
    // The CA validates a at replica 2, b at replica 3, c at the leader.
    pebble.add_a(names[0], Ipv4Addr::new(127, 0, 0, 2)).await;
    pebble.add_a(names[1], Ipv4Addr::new(127, 0, 0, 3)).await;
    let api = KubeApi::start().await;
    let root = pebble.issuing_root().await;
    let directory = pebble.directory_url();
    let replicas = fleet(&api, (&pebble, &directory), port, &names).await;
    for replica in &replicas {
        // Every replica's status says what the leader did (the others read its status).
        let status = replica.server.until("every name valid", all_valid).await;
        assert_eq!(status.names.len(), 3);
        assert!(status.account.is_some(), "{}: the account", replica.id);
        until_served(replica.server.addr, &names, &root).await;
    }
    assert!(replicas[0].leading() && !replicas[1].leading() && !replicas[2].leading());
    assert_eq!(pebble.orders(), 3, "one order per name across the fleet");
    // What the fleet keeps: a certificate Secret per name, labelled for the watch and fenced
    // by the leader; the account's public thumbprint on its Secret; no order left in flight.
    for name in names {
        let cert = secret(&api, &format!("web-acme-{name}")).expect("the certificate's Secret");
        assert_eq!(cert["type"], "kubernetes.io/tls");
        assert_eq!(
            cert["metadata"]["labels"][tls_acme::CERTIFICATE_LABEL],
            "web"
        );
        assert_eq!(
            cert["metadata"]["annotations"][tls_k8s::store::HOLDER_ANNOTATION],
            "replica-1"
        );
    }
    let account = secret(&api, "web-acme-account").expect("the account's Secret");
    assert!(
        account["metadata"]["annotations"][tls_acme::THUMBPRINT_ANNOTATION]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    for name in names {
        let state = secret(&api, &format!("web-acme--{name}")).expect("the name's state");
        let keys: Vec<&String> = state["data"].as_object().expect("data").keys().collect();
        assert_eq!(keys, ["acme.json"], "its record, no order left in flight");
    }

    // Every replica restarted: each serves what is stored as soon as it is ready, and nothing
    // is ordered again.
    let ids: Vec<String> = replicas.iter().map(|r| r.id.clone()).collect();
    drop(replicas);
    let replicas = fleet(&api, (&pebble, &directory), port, &names).await;
    for replica in &replicas {
        tokio::time::timeout(PATIENCE, replica.server.reloader.ready())
            .await
            .expect("ready in time")
            .expect("ready");
        assert_served(replica.server.addr, &names, &root).await;
        assert!(ids.contains(&replica.id));
    }
    // The new leader has decided about every name (a name it would order again would show
    // "ordering" from that decision on, and be ordered right after).
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
/// held (after Pebble acted on it, with `forwarded`); the survivors finish the certificate.
/// Returns how many orders Pebble saw.
async fn leader_killed_at(path: &str, forwarded: bool) -> usize {
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let name = "d.example.com";
    pebble.add_a(name, Ipv4Addr::new(127, 0, 0, 2)).await;
    let layer = pebble.layer().await;
    layer.hold_next(path, forwarded);
    let api = KubeApi::start().await;
    let root = pebble.issuing_root().await;
    let directory = layer.directory_url();
    let [leader, b, c] = fleet(&api, (&pebble, &directory), port, &[name]).await;
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
    let new_leader = if b.leading() { &b } else { &c };
    assert!(new_leader.leading(), "{path}: one of the survivors leads");
    let cert = secret(&api, &format!("web-acme-{name}")).expect("the certificate's Secret");
    assert_eq!(
        cert["metadata"]["annotations"][tls_k8s::store::HOLDER_ANNOTATION],
        new_leader.id.as_str(),
        "{path}: written by the new leader"
    );
    pebble.orders()
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_before_its_order_reaches_the_ca_is_succeeded_by_one_order() {
    let orders = leader_killed_at("/order-plz", false).await;
    assert_eq!(orders, 1);
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_after_storing_its_order_is_succeeded_by_one_that_resumes_it() {
    // Held when it tells the CA to validate: the order and the challenge are stored.
    let orders = leader_killed_at("/chalZ/", false).await;
    assert_eq!(orders, 1, "the stored order was resumed");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_after_its_challenge_was_answered_is_succeeded_by_one_that_finalizes() {
    let orders = leader_killed_at("/finalize-order/", false).await;
    assert_eq!(orders, 1, "the stored order was finalized");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_after_finalizing_is_succeeded_by_one_that_downloads_the_certificate() {
    let orders = leader_killed_at("/certZ/", false).await;
    assert_eq!(orders, 1, "the stored order's certificate was downloaded");
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_before_storing_the_url_the_ca_answered_costs_one_more_order() {
    // The only point where a second order is placed: the CA created the order, and the
    // leader died before it could store its URL.
    let orders = leader_killed_at("/order-plz", true).await;
    assert_eq!(orders, 2);
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_account_secret_deleted_is_registered_again_by_the_next_leader_and_every_status_says_so()
{
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let name = "e.example.com";
    pebble.add_a(name, Ipv4Addr::new(127, 0, 0, 2)).await;
    let api = KubeApi::start().await;
    let directory = pebble.directory_url();
    let [leader, b, c] = fleet(&api, (&pebble, &directory), port, &[name]).await;
    let first = b.server.until("issued", all_valid).await;
    assert!(first.account.is_some() && first.account_replaced.is_none());

    assert!(api.delete("secrets", "default", "web-acme-account"));
    leader.kill();
    let mut replaced = Vec::new();
    for replica in [&b, &c] {
        let status = replica
            .server
            .until("the account replaced", |s| {
                s.account_replaced.is_some() && s.account.is_some() && s.account != first.account
            })
            .await;
        replaced.push(status.account_replaced.unwrap());
    }
    assert_eq!(
        replaced[0], replaced[1],
        "the leader's note, read by the other"
    );
    assert!(replaced[0].contains("1 certificate"), "{}", replaced[0]);
    let account = secret(&api, "web-acme-account").expect("a new account Secret");
    assert_eq!(
        account["metadata"]["annotations"][tls_acme::REPLACED_ANNOTATION],
        replaced[0].as_str()
    );
    let root = pebble.issuing_root().await;
    for replica in [&b, &c] {
        until_served(replica.server.addr, &[name], &root).await;
    }
    assert_eq!(pebble.orders(), 1, "the stored certificate was kept");
}

/// The value under `key` of the Secret `name`, decoded.
fn secret_value(api: &KubeApi, name: &str, key: &str) -> Option<Vec<u8>> {
    let secret = secret(api, name)?;
    let encoded = secret["data"][key].as_str()?.to_owned();
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_seal_the_account_and_the_order_keys_are_stored_sealed_and_a_new_leader_opens_them()
{
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let name = "s.example.com";
    pebble.add_a(name, Ipv4Addr::new(127, 0, 0, 2)).await;
    let layer = pebble.layer().await;
    // The leader is stopped once its order is stored, the CA not yet told to validate.
    layer.hold_next("/chalZ/", false);
    let api = KubeApi::start().await;
    let root = pebble.issuing_root().await;
    let directory = layer.directory_url();
    let ring: Arc<dyn Seal> = Arc::new(KeyRing::from_keys([SealKey::generate().unwrap()]).unwrap());
    let ca = (&pebble, directory.as_str());
    let leader = Replica::start_with(&api, ca, 1, port, &[name], Some(Arc::clone(&ring))).await;
    leader.until_leading().await;
    let b = Replica::start_with(&api, ca, 2, port, &[name], Some(Arc::clone(&ring))).await;
    let c = Replica::start_with(&api, ca, 3, port, &[name], Some(Arc::clone(&ring))).await;
    layer.until_held().await;

    let account = secret_value(&api, "web-acme-account", "account.json").expect("the account");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&account).is_err(),
        "the account's credentials are not stored readable"
    );
    let key =
        secret_value(&api, &format!("web-acme--{name}"), "order.key").expect("the order's key");
    assert!(
        !String::from_utf8_lossy(&key).contains("PRIVATE KEY"),
        "the order's key is not stored readable"
    );

    // The next leader opens both: it resumes the stored order with the account.
    leader.kill();
    for replica in [&b, &c] {
        replica
            .server
            .until("issued after the failover", all_valid)
            .await;
        until_served(replica.server.addr, &[name], &root).await;
    }
    assert_eq!(pebble.orders(), 1, "the sealed order was resumed");

    // A replica without the seal cannot use the account: it says so, and registers nothing.
    let accounts = pebble.log_matching("POST /sign-me-up");
    drop((b, c));
    let plain = Replica::start(&api, ca, 1, port, &[name]).await;
    let status = plain
        .server
        .until("the account refused", |s| s.account_error.is_some())
        .await;
    let error = status.account_error.unwrap();
    assert!(
        error.contains("account.json") && error.contains("sealed"),
        "{error}"
    );
    assert_eq!(
        pebble.log_matching("POST /sign-me-up"),
        accounts,
        "no new account"
    );
    until_served(plain.server.addr, &[name], &root).await;
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_given_a_seal_that_adopts_unsealed_state_seals_its_stored_account() {
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let name = "m.example.com";
    let api = KubeApi::start().await;
    let directory = pebble.directory_url();
    let ca = (&pebble, directory.as_str());
    let plain = Replica::start(&api, ca, 1, port, &[name]).await;
    let first = plain.server.until("issued unsealed", all_valid).await;
    let stored = secret_value(&api, "web-acme-account", "account.json").expect("the account");
    assert!(serde_json::from_slice::<serde_json::Value>(&stored).is_ok());
    drop(plain);

    // Restarted with a seal that adopts what is stored unsealed (a migration).
    let ring: Arc<dyn Seal> = Arc::new(
        KeyRing::from_keys([SealKey::generate().unwrap()])
            .unwrap()
            .adopt_unsealed(true),
    );
    let sealed = Replica::start_with(&api, ca, 1, port, &[name], Some(ring)).await;
    sealed.until_leading().await;
    let status = sealed
        .server
        .until("the account loaded", |s| {
            s.account.is_some() && all_valid(s)
        })
        .await;
    assert_eq!(status.account, first.account, "the same account");
    // The leader, loading the account, stores it sealed.
    let sealed_now = || {
        secret_value(&api, "web-acme-account", "account.json")
            .is_some_and(|v| serde_json::from_slice::<serde_json::Value>(&v).is_err())
    };
    tokio::time::timeout(PATIENCE, async {
        while !sealed_now() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the account is stored sealed");
    let status = sealed.server.acme.status().borrow().clone();
    assert!(status.account_error.is_none(), "{status:#?}");
    assert_eq!(status.account, first.account, "still the same account");
    let account = secret(&api, "web-acme-account").expect("the account's Secret");
    assert!(
        account["metadata"]["annotations"][tls_acme::THUMBPRINT_ANNOTATION].is_string(),
        "its annotations kept"
    );
    assert_eq!(pebble.orders(), 1);
}

/// The weekly budget across leaders: every term reads what the last leader stored. Replica 1
/// leads, spends two first orders (one rate limited by the CA), is cut off from the API and
/// loses the Lease; replica 2 leads and spends the third, and is killed; replica 1 leads
/// again: its retry of the rate-limited name finds the budget spent (before, it spent from the
/// copy of its first term and wrote it over replica 2's spend: a fourth first order). Then it
/// is killed and replica 3 leads: its new name waits for the budget too.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_weekly_budget_holds_across_leaders_killed_in_turn_and_no_spend_is_lost() {
    const LIMIT: u32 = 3;
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let (a, b, c, d) = (
        "a.example.com",
        "b.example.com",
        "c.example.com",
        "d.example.com",
    );
    // Each name is validated at the replica that orders it.
    pebble.add_a(a, Ipv4Addr::new(127, 0, 0, 1)).await;
    pebble.add_a(c, Ipv4Addr::new(127, 0, 0, 1)).await;
    pebble.add_a(b, Ipv4Addr::new(127, 0, 0, 2)).await;
    pebble.add_a(d, Ipv4Addr::new(127, 0, 0, 3)).await;
    let layer = pebble.layer().await;
    layer.rate_limit_next_order(Duration::from_secs(12));
    let api = KubeApi::start().await;
    let directory = layer.directory_url();
    let ca = (&pebble, directory.as_str());
    let limited = |builder: AcmeBuilder| builder.new_certificates_per_week(LIMIT);

    let first = Replica::start_configured(&api, ca, 1, port, &[a, c], limited).await;
    first.until_leading().await;
    first
        .server
        .until("c issued, a rate limited", |s| {
            s.names[c].state == NameState::Valid && s.names[a].state == NameState::Backoff
        })
        .await;
    assert_eq!(stored_spends(&api), 2);

    // Replica 1 cut off: replica 2 leads and orders b.
    first.endpoint.partition(Link::Reset);
    let second = Replica::start_configured(&api, ca, 2, port, &[a, c, b], limited).await;
    second.until_leading().await;
    second
        .server
        .until("b issued", |s| s.names[b].state == NameState::Valid)
        .await;
    assert_eq!(stored_spends(&api), 3);
    second.kill();

    // Replica 1 back: it leads again and a's retry finds the budget spent.
    first.endpoint.heal();
    first.until_leading().await;
    let status = first
        .server
        .until("a refused by the budget", |s| {
            s.names[a]
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("budget"))
        })
        .await;
    assert_eq!(status.names[a].state, NameState::Backoff, "{status:#?}");
    first.kill();

    let third = Replica::start_configured(&api, ca, 3, port, &[a, c, b, d], limited).await;
    third.until_leading().await;
    let status = third
        .server
        .until("d waits for the budget", |s| {
            s.names[d]
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("budget"))
        })
        .await;
    assert_eq!(status.names[d].state, NameState::Backoff);
    assert_eq!(stored_spends(&api), LIMIT as usize, "no spend lost");
    // What reached the CA: c and b issued, a's first order refused with a rate limit, nothing
    // more.
    assert_eq!(pebble.orders(), 2, "the limit held over every leader");
}

/// The first orders the fleet's stored budget counts.
fn stored_spends(api: &KubeApi) -> usize {
    let Some(json) = secret_value(api, "web-acme-state", "budget.json") else {
        return 0;
    };
    let budget: std::collections::BTreeMap<String, Vec<u64>> =
        serde_json::from_slice(&json).expect("the budget's format");
    budget.values().map(Vec::len).sum()
}

/// Many orders at once (no stagger): each publishes its challenge in the one challenges
/// Secret, and every follower answers each of them (a leader that merged its changes of the
/// Secret concurrently dropped some: their validations failed).
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_placed_at_once_each_get_their_challenge_published_to_every_replica() {
    let port = tls_test::free_port().port();
    let pebble = Pebble::builder().tls_port(port).start_required().await;
    let names: Vec<String> = (0..16).map(|i| format!("p{i}.example.com")).collect();
    for (i, name) in names.iter().enumerate() {
        let follower = if i % 2 == 0 { 2 } else { 3 };
        pebble.add_a(name, Ipv4Addr::new(127, 0, 0, follower)).await;
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let api = KubeApi::start().await;
    let directory = pebble.directory_url();
    let ca = (&pebble, directory.as_str());
    let at_once = |builder: AcmeBuilder| builder.stagger(Duration::ZERO);
    let leader = Replica::start_configured(&api, ca, 1, port, &names, at_once).await;
    leader.until_leading().await;
    let _b = Replica::start_configured(&api, ca, 2, port, &names, at_once).await;
    let _c = Replica::start_configured(&api, ca, 3, port, &names, at_once).await;
    let mut status = leader.server.acme.status();
    let mut failed = Vec::new();
    tokio::time::timeout(PATIENCE * 3, async {
        loop {
            {
                let now = status.borrow_and_update();
                failed.extend(
                    now.names
                        .iter()
                        .filter_map(|(name, n)| n.last_error.clone().map(|e| (name.clone(), e))),
                );
                if all_valid(&now) || !failed.is_empty() {
                    return;
                }
            }
            status.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not every name issued: {:#?}", *status.borrow()));
    assert!(failed.is_empty(), "names that failed: {failed:?}");
    assert_eq!(pebble.orders(), 16);
}
