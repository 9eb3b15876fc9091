//! A fleet's session-ticket keys on the API emulator: the writer of the Lease's round writes
//! them (sealed with a seal), every replica reads the same keys, and a writer whose round is
//! behind the one stamped on the Secret has its write refused and writes no more.

#![cfg(feature = "tickets")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tls_k8s::store::{Fence, FencedSecret, ROUND_ANNOTATION, Written};
use tls_k8s::{FleetTickets, Leadership, TICKETS_KEY};
use tls_test::{KubeApi, PATIENCE};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use common::client;

fn leading(round: u64, holder: &str) -> Leadership {
    let mut leadership = Leadership::default();
    leadership.leading = true;
    leadership.round = round;
    leadership.holder = Some(holder.to_owned());
    leadership
}

fn random() -> &'static dyn rustls::crypto::SecureRandom {
    rustls::crypto::aws_lc_rs::default_provider().secure_random
}

async fn until<T: Clone>(
    what: &str,
    mut rx: watch::Receiver<T>,
    pred: impl FnMut(&T) -> bool,
) -> T {
    tokio::time::timeout(PATIENCE, rx.wait_for(pred))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("the sender lives")
        .clone()
}

fn stored(api: &KubeApi) -> (Vec<u8>, u64) {
    let secret = api
        .get("secrets", "default", "web-tickets")
        .expect("the Secret exists");
    let value = base64::engine::general_purpose::STANDARD
        .decode(secret["data"][TICKETS_KEY].as_str().unwrap())
        .unwrap();
    let round = secret["metadata"]["annotations"][ROUND_ANNOTATION]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    (value, round)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_seals_the_keys_every_replica_reads_them_and_a_deposed_writer_is_refused() {
    let api = KubeApi::start().await;
    let token = CancellationToken::new();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("seal.key");
    std::fs::write(
        &key,
        base64::engine::general_purpose::STANDARD.encode([7u8; 32]),
    )
    .unwrap();
    let seal: Arc<dyn tls_k8s::seal::Seal> =
        Arc::new(tls_k8s::seal::KeyRing::from_files(&[key]).unwrap());

    // The writer of round 1, rotating every two seconds, and a reader.
    let writer = FleetTickets::new(client(&api), "default", "web", random())
        .seal(Arc::clone(&seal))
        .rotation(Duration::from_secs(2));
    let (writer_keys, writes) = (writer.keys(), writer.writes());
    let (_lead, leadership) = watch::channel(leading(1, "web-0"));
    writer.start(leadership, "web-0".into(), token.clone());
    let reader = FleetTickets::new(client(&api), "default", "web", random())
        .seal(Arc::clone(&seal))
        .rotation(Duration::from_secs(2));
    let reader_keys = reader.keys();
    let (_follow, following) = watch::channel(Leadership::default());
    reader.start(following, "web-1".into(), token.clone());

    until("the first write", writes.clone(), |w| w.accepted >= 1).await;
    let (value, round) = stored(&api);
    assert_eq!(round, 1);
    assert_eq!(
        &value[..4],
        b"\x89TSE",
        "sealed: no ticket key readable in the Secret"
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while reader_keys.keys() != writer_keys.keys() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reader reads the writer's keys"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A successor stamps round 2: the writer of round 1 is refused at its next write (a
    // period on) and writes nothing more.
    let successor = FencedSecret::new(client(&api), "default", "web-tickets").secret_type("Opaque");
    let stamped = successor
        .stamp(&Fence {
            round: 2,
            holder: "web-2".into(),
        })
        .await
        .unwrap();
    assert!(matches!(stamped, Written::Accepted { .. }), "{stamped:?}");
    let before = stored(&api);
    let counted = until("a refused write", writes, |w| w.refused >= 1).await;
    assert_eq!(counted.refused, 1);
    assert_eq!(stored(&api), before, "the refused write changed nothing");
    token.cancel();
}

/// A clock that reads one time.
#[derive(Debug)]
struct Fixed(std::time::SystemTime);

impl tls_source::clock::Clock for Fixed {
    fn now(&self) -> std::time::SystemTime {
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_keeps_keys_on_a_clock_in_1950_or_at_the_end_of_9999() {
    let api = KubeApi::start().await;
    let token = CancellationToken::new();
    let end = tls_source::clock::latest();
    for (fleet, now) in [
        ("old", tls_test::new_year(1950)),
        ("late", end),
        ("later", end + Duration::from_secs(86_400)),
    ] {
        let writer = FleetTickets::new(client(&api), "default", fleet, random())
            .rotation(Duration::from_secs(1))
            .clock(Arc::new(Fixed(now)));
        let (keys, writes) = (writer.keys(), writer.writes());
        let (_lead, leadership) = watch::channel(leading(1, "web-0"));
        let task = writer.start(leadership, "web-0".into(), token.clone());
        until("the keys written", writes, |w| w.accepted >= 1).await;
        let written = keys.keys().expect("published");
        assert!(
            !written.is_empty() && written.iter().all(|k| k.from() <= end),
            "{written:?}"
        );
        assert!(!task.is_finished(), "{fleet}: the writer goes on");
    }
    token.cancel();
}
