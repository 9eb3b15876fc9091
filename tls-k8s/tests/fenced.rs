//! Fenced writes to a Secret on the API emulator: one accepted write per round between racing
//! writers, a deposed writer refused, and the stored round never going back.

mod common;

use std::collections::BTreeMap;

use tls_k8s::store::{Fence, FencedSecret, Written};
use tls_test::KubeApi;

use common::client;

fn fence(round: u64, holder: &str) -> Fence {
    Fence {
        round,
        holder: holder.to_owned(),
    }
}

fn stored_round(api: &KubeApi) -> u64 {
    let secret = api
        .get("secrets", "default", "shared")
        .expect("the Secret exists");
    secret["metadata"]["annotations"][tls_k8s::store::ROUND_ANNOTATION]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_racing_for_a_thousand_rounds_get_exactly_one_write_each() {
    let api = KubeApi::start().await;
    let (a, b) = (
        FencedSecret::new(client(&api), "default", "shared"),
        FencedSecret::new(client(&api), "default", "shared"),
    );
    let data = |who: &str| BTreeMap::from([("tls.crt".to_owned(), who.as_bytes().to_vec())]);
    let (data_a, data_b) = (data("a"), data("b"));
    let mut last = 0;
    for round in 1..=1000 {
        let (fa, fb) = (fence(round, "a"), fence(round, "b"));
        let (ra, rb) = tokio::join!(a.write(&fa, Some(&data_a)), b.write(&fb, Some(&data_b)));
        let accepted = [ra.unwrap(), rb.unwrap()]
            .iter()
            .filter(|w| matches!(w, Written::Accepted { .. }))
            .count();
        assert_eq!(accepted, 1, "round {round}: exactly one write");
        // A write from the round before is refused.
        let stale = a
            .write(&fence(round - 1, "a"), Some(&data_a))
            .await
            .unwrap();
        assert!(
            matches!(stale, Written::Refused { .. }),
            "round {round}: {stale:?}"
        );
        let now = stored_round(&api);
        assert!(now >= last, "the round never goes back");
        last = now;
    }
    assert_eq!(last, 1000);
}

#[tokio::test]
async fn a_writer_paused_past_its_lease_is_refused_after_its_successor_stamps() {
    let api = KubeApi::start().await;
    let old = FencedSecret::new(client(&api), "default", "shared");
    let new = FencedSecret::new(client(&api), "default", "shared");
    let data = BTreeMap::from([("tls.crt".to_owned(), b"old".to_vec())]);
    assert!(matches!(
        old.write(&fence(1, "old"), Some(&data)).await.unwrap(),
        Written::Accepted { .. }
    ));
    // The successor's first act is the fencing write: data unchanged, its round stamped.
    assert!(matches!(
        new.stamp(&fence(2, "new")).await.unwrap(),
        Written::Accepted { .. }
    ));
    let late = old
        .write(
            &fence(1, "old"),
            Some(&BTreeMap::from([("tls.crt".to_owned(), b"late".to_vec())])),
        )
        .await
        .unwrap();
    assert_eq!(
        late,
        Written::Refused {
            stored: fence(2, "new")
        }
    );
    let secret = api.get("secrets", "default", "shared").unwrap();
    assert_eq!(
        secret["data"]["tls.crt"], "b2xk",
        "still the old data (base64 of `old`)"
    );
    assert_eq!(stored_round(&api), 2);
    // The same round from the same holder is its own: accepted.
    assert!(matches!(
        new.stamp(&fence(2, "new")).await.unwrap(),
        Written::Accepted { .. }
    ));
}

/// One writer's concurrent changes of different keys all land: each conflict makes the change
/// again on what is stored (a whole map written from an older read would drop the others').
/// A change that leaves the data as it is writes nothing, and creates no Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_modifications_of_different_keys_all_land() {
    let api = KubeApi::start().await;
    let secret = FencedSecret::new(client(&api), "default", "shared");
    let term = fence(1, "a");
    let removed = secret
        .modify(&term, |data| {
            data.remove("absent");
        })
        .await
        .unwrap();
    assert!(removed.is_none());
    assert!(
        api.get("secrets", "default", "shared").is_none(),
        "nothing created"
    );

    let changes = (0..16).map(|i| {
        let (secret, term) = (&secret, &term);
        async move {
            secret
                .modify(term, |data| {
                    data.insert(format!("key-{i}"), vec![u8::try_from(i).unwrap()]);
                })
                .await
                .unwrap()
        }
    });
    for written in futures::future::join_all(changes).await {
        assert!(
            matches!(written, Some(Written::Accepted { .. })),
            "{written:?}"
        );
    }
    let stored = api.get("secrets", "default", "shared").unwrap();
    let keys = stored["data"].as_object().unwrap();
    for i in 0..16 {
        assert!(keys.contains_key(&format!("key-{i}")), "key-{i}: {keys:?}");
    }
    // A deposed writer's change is refused.
    let stale = secret
        .modify(&fence(0, "b"), |data| {
            data.insert("late".into(), b"x".to_vec());
        })
        .await
        .unwrap();
    assert!(matches!(stale, Some(Written::Refused { .. })), "{stale:?}");
}
