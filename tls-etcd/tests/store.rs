//! The fleet store on a real etcd cluster: one writer elected on a lease, writes fenced by its
//! round.

use std::time::{Duration, Instant};

use tls_etcd::Etcd;
use tls_etcd::store::{FencedError, FencedKeys, Leadership, LeaseHandle, WriterLease};
use tls_test::{EtcdCluster, PATIENCE};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use tls_test::TcpLink as Link;

const TTL: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

fn candidate(etcd: Etcd, prefix: &str, identity: &str, token: &CancellationToken) -> LeaseHandle {
    WriterLease::new(etcd, prefix, "web", identity)
        .ttl(TTL)
        .retry_period(RETRY)
        .spawn(token)
}

async fn wait(
    rx: watch::Receiver<Leadership>,
    what: &str,
    pred: impl FnMut(&Leadership) -> bool,
) -> Leadership {
    tls_test::wait_for(rx, what, pred).await
}

fn leaders(handles: &[LeaseHandle]) -> Vec<usize> {
    handles
        .iter()
        .enumerate()
        .filter(|(_, h)| h.leadership().borrow().leading)
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn one_of_three_leads_a_stopped_one_hands_over_at_once_a_killed_one_within_the_ttl() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("election");
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let token = CancellationToken::new();
    let handles: Vec<LeaseHandle> = ["a", "b", "c"]
        .iter()
        .map(|id| candidate(etcd.clone(), &prefix, id, &token))
        .collect();
    let first = tokio::time::timeout(PATIENCE, async {
        loop {
            let leading = leaders(&handles);
            if leading.len() == 1 {
                return leading[0];
            }
            assert!(leading.len() < 2, "two leaders at once");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a leader");
    let led = handles[first].leadership().borrow().clone();
    // Every follower names the holder and its round.
    for (i, handle) in handles.iter().enumerate().filter(|(i, _)| *i != first) {
        let seen = wait(handle.leadership(), "the holder seen", |l| {
            l.round == led.round
        })
        .await;
        assert_eq!(seen.holder, led.holder, "follower {i}");
        assert!(!seen.leading);
    }

    // Stopped (released): another leads at once, in a new round.
    handles[first].stop();
    let start = Instant::now();
    let next = tokio::time::timeout(PATIENCE, async {
        loop {
            let leading: Vec<usize> = leaders(&handles)
                .into_iter()
                .filter(|i| *i != first)
                .collect();
            if let [one] = leading[..] {
                return one;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a new leader");
    let handover = start.elapsed();
    assert!(handover < TTL, "released: {handover:?}, not a TTL");
    let round = handles[next].leadership().borrow().round;
    assert!(
        round > led.round,
        "a new round: {round} after {}",
        led.round
    );

    // Killed (nothing revoked): the last one leads once the lease expired.
    handles[next].abort();
    let start = Instant::now();
    let last = handles
        .iter()
        .enumerate()
        .find(|(i, _)| *i != first && *i != next)
        .map(|(i, _)| i)
        .unwrap();
    wait(handles[last].leadership(), "the last one leads", |l| {
        l.leading
    })
    .await;
    let failover = start.elapsed();
    assert!(
        failover <= TTL + RETRY * 4,
        "killed: {failover:?}, against a TTL of {TTL:?} and a retry of {RETRY:?}"
    );
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_writer_cut_off_steps_down_by_itself_and_its_late_write_is_refused() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("fenced");
    let state = format!("{prefix}fleets/web/state");
    let token = CancellationToken::new();
    // A reaches etcd through a link the test cuts; B directly.
    let link = Link::to(cluster.addrs()[0]).await;
    let through = Etcd::builder([link.addr.to_string()]).build().unwrap();
    let direct = Etcd::builder(cluster.endpoints()).build().unwrap();
    let a = candidate(through.clone(), &prefix, "a", &token);
    let a_led = wait(a.leadership(), "a leads", |l| l.leading).await;
    let b = candidate(direct.clone(), &prefix, "b", &token);
    wait(b.leadership(), "b follows a", |l| {
        l.holder.as_deref() == Some("a")
    })
    .await;
    let key = WriterLease::new(direct.clone(), &prefix, "web", "x")
        .key()
        .to_owned();
    let a_writes = FencedKeys::new(through, key.clone());
    let b_writes = FencedKeys::new(direct.clone(), key);
    let a_fence = a_led.fence().unwrap();
    a_writes
        .put(a_fence, [(state.clone(), b"from a".to_vec())])
        .await
        .unwrap();

    // Cut off: A says it no longer leads before its lease can expire; B leads after it did.
    link.cut();
    let cut = Instant::now();
    wait(a.leadership(), "a steps down", |l| !l.leading).await;
    let stepped_down = cut.elapsed();
    let b_led = wait(b.leadership(), "b leads", |l| l.leading).await;
    let taken_over = cut.elapsed();
    assert!(
        stepped_down < taken_over,
        "a stopped ({stepped_down:?}) before b took over ({taken_over:?})"
    );
    assert!(b_led.round > a_led.round);

    // Back: A's write with its old fence is refused; B's goes through.
    link.restore();
    let late = a_writes
        .put(a_fence, [(state.clone(), b"late from a".to_vec())])
        .await;
    assert!(matches!(late, Err(FencedError::Fenced { .. })), "{late:?}");
    assert_eq!(a_writes.refused(), 1);
    b_writes
        .put(
            b_led.fence().unwrap(),
            [(state.clone(), b"from b".to_vec())],
        )
        .await
        .unwrap();
    let mut client = direct.connect().await.unwrap();
    let stored = client.get(state.as_str(), None).await.unwrap();
    assert_eq!(stored.kvs()[0].value(), b"from b");
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn a_holder_whose_key_is_deleted_by_hand_stops_leading_and_campaigns_again() {
    let Some(cluster) = EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("deleted");
    let etcd = Etcd::builder(cluster.endpoints()).build().unwrap();
    let token = CancellationToken::new();
    let lease = candidate(etcd, &prefix, "a", &token);
    let first = wait(lease.leadership(), "leading", |l| l.leading).await;
    cluster.delete(&format!("{prefix}fleets/web/writer"));
    let again = wait(lease.leadership(), "leading in a new round", |l| {
        l.leading && l.round > first.round
    })
    .await;
    assert_eq!(again.holder.as_deref(), Some("a"));
    token.cancel();
}
