//! The shared store sealed at rest, on the API emulator with real handshakes: what an attacker
//! who can read or update Secrets tries (a byte flipped, a value copied from another fleet,
//! unsealed state planted), a replica with the wrong key, and a key rolled across the fleet
//! while replicas hold different key lists. Through all of it the fleet keeps serving, and no
//! private key is readable in any Secret of our state or in any log line.

#![cfg(feature = "self-signed")]

mod common;

use std::sync::Arc;

use base64::Engine as _;
use common::fleet::*;
use tls_k8s::StateAccess;
use tls_k8s::seal::{KeyRing, Location, Plain, Seal, SealKey, envelope};
use tls_test::{KubeApi, Logs, TestCa, TestCert};

fn ring(keys: &[&SealKey]) -> Arc<dyn Seal> {
    Arc::new(KeyRing::from_keys(keys.iter().map(|k| (*k).clone())).expect("keys"))
}

fn key() -> SealKey {
    SealKey::generate().expect("a key")
}

/// A replica of the fleet `tls` in CA mode, sealing with `seal`.
async fn sealed(api: &KubeApi, id: &str, seal: Arc<dyn Seal>) -> Replica {
    Replica::start_with(api, id, generator(&["localhost"], true), |s| s.seal(seal)).await
}

/// Waits until `replica` can no longer open the state, and returns why.
async fn refused(replica: &Replica) -> String {
    let access = tls_test::wait_for(replica.access.clone(), "the state refused", |a| {
        matches!(a, StateAccess::Refused { .. })
    })
    .await;
    match access {
        StateAccess::Refused { reason } => reason,
        other => unreachable!("waited for a refusal: {other:?}"),
    }
}

/// The key id an envelope stored at `key` of the Secret `name` names.
fn sealed_by(api: &KubeApi, name: &str, key: &str) -> Option<[u8; 8]> {
    let value = secret_value(api, name, key)?;
    if !value.starts_with(&envelope::MAGIC) {
        return None;
    }
    value.get(6..14)?.try_into().ok()
}

/// Whether every value of the CA Secret is sealed with `key`.
fn all_sealed_by(api: &KubeApi, key: &SealKey) -> bool {
    ["ca.crt", "ca.key"]
        .iter()
        .all(|k| sealed_by(api, "tls-ca", k) == Some(*key.id().as_bytes()))
}

/// The fingerprint of the fleet CA, opened with `seal`.
fn stored_ca(api: &KubeApi, seal: &dyn Seal) -> String {
    let value = secret_value(api, "tls-ca", "ca.crt").expect("ca.crt");
    let pem = seal
        .open(Location::new("default", "tls-ca", "ca.crt"), &value)
        .expect("opens")
        .into_plaintext();
    tls_test::fingerprint(&certificates(&pem)[0])
}

/// Lease writes (take-overs, renewals, releases) in a replica's requests.
fn lease_writes(replica: &Replica) -> Vec<String> {
    replica
        .endpoint
        .request_log()
        .into_iter()
        .filter(|r| r.contains("/leases") && !r.starts_with("GET "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_flipped_in_a_sealed_value_is_refused_reported_not_replaced_and_the_fleet_serves() {
    let api = KubeApi::start().await;
    let k = key();
    let (a, b) = tokio::join!(
        sealed(&api, "a", ring(&[&k])),
        sealed(&api, "b", ring(&[&k]))
    );
    let leaf = converged(&api, &[&a, &b]).await;
    until("the CA sealed", || all_sealed_by(&api, &k)).await;
    let good = secret_value(&api, "tls-ca", "ca.key").expect("ca.key");
    let crt = secret_value(&api, "tls-ca", "ca.crt").expect("ca.crt");
    let mut tampered = good.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x01;
    api.put_secret(
        "default",
        "tls-ca",
        &[("ca.crt", crt.as_slice()), ("ca.key", tampered.as_slice())],
    );
    for replica in [&a, &b] {
        let reason = refused(replica).await;
        assert!(
            reason.contains("default/tls-ca ca.key") && reason.contains("altered"),
            "{reason}"
        );
        assert_eq!(replica.served().await, leaf, "{} keeps serving", replica.id);
    }
    until("the leader stepped down", || !a.leading() && !b.leading()).await;
    let status = tls_test::wait_for(a.reloader.status(), "the refusal reported", |s| {
        s.last_error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("does not lead"))
    })
    .await;
    assert!(
        status
            .last_error
            .expect("reported")
            .to_string()
            .contains("ca.key"),
        "the report names the value"
    );
    assert_eq!(
        secret_value(&api, "tls-ca", "ca.key"),
        Some(tampered),
        "nothing replaced what does not open"
    );
    assert_eq!(total(&[&a, &b], |s| s.generated_cas), 1, "no second CA");
    // Restored, the fleet opens it again by itself and one replica leads.
    api.put_secret(
        "default",
        "tls-ca",
        &[("ca.crt", crt.as_slice()), ("ca.key", good.as_slice())],
    );
    leader(&[&a, &b]).await;
    for replica in [&a, &b] {
        tls_test::wait_for(replica.access.clone(), "the state opens again", |access| {
            *access == StateAccess::Open
        })
        .await;
    }
    assert_eq!(converged(&api, &[&a, &b]).await, leaf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sealed_value_copied_into_another_fleets_secret_does_not_open_there() {
    let api = KubeApi::start().await;
    let k = key();
    let one = sealed(&api, "one", ring(&[&k])).await;
    converged(&api, &[&one]).await;
    until("the CA sealed", || all_sealed_by(&api, &k)).await;
    // Fleet two, with the same key, finds fleet one's sealed CA copied into its CA Secret.
    let copied: Vec<(&str, Vec<u8>)> = ["ca.crt", "ca.key"]
        .into_iter()
        .map(|key| {
            (
                key,
                secret_value(&api, "tls-ca", key).expect("sealed value"),
            )
        })
        .collect();
    let data: Vec<(&str, &[u8])> = copied.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    api.put_secret("default", "two-ca", &data);
    let endpoint = api.endpoint().await;
    let shared = tls_k8s::SharedSelfSigned::new(
        client_of(&endpoint),
        "default",
        "two",
        "two-0",
        generator(&["localhost"], true),
    )
    .lease_timing(LEASE, RENEW_DEADLINE, RETRY)
    .seal(ring(&[&k]))
    .start(&tokio_util::sync::CancellationToken::new());
    let two = Replica::serve("two-0", endpoint, shared).await;
    let reason = refused(&two).await;
    assert!(
        reason.contains("default/two-ca") && reason.contains("sealed for another object"),
        "{reason}"
    );
    assert_eq!(two.stats().generated_cas, 0, "no CA of its own over it");
    assert!(lease_writes(&two).is_empty(), "it never campaigned");
    for (key, value) in &copied {
        assert_eq!(secret_value(&api, "two-ca", key).as_ref(), Some(value));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unsealed_state_is_refused_without_the_migration_and_sealed_with_it() {
    let api = KubeApi::start().await;
    let plain = sealed(&api, "plain", Arc::new(Plain)).await;
    let leaf = converged(&api, &[&plain]).await;
    let ca = stored_ca(&api, &Plain);
    plain.stop().await;
    assert!(
        secret_value(&api, "tls-ca", "ca.key")
            .is_some_and(|k| k.starts_with(b"-----BEGIN PRIVATE KEY-----")),
        "stored unsealed by a replica without a seal"
    );
    let k = key();
    let refusing = sealed(&api, "refusing", ring(&[&k])).await;
    let reason = refused(&refusing).await;
    assert!(reason.contains("stored unsealed"), "{reason}");
    assert_eq!(
        converged(&api, &[&refusing]).await,
        leaf,
        "it serves the TLS Secret"
    );
    assert!(lease_writes(&refusing).is_empty(), "it never campaigned");
    assert!(
        secret_value(&api, "tls-ca", "ca.key").is_some_and(|k| k.starts_with(b"-----BEGIN")),
        "nothing sealed without the migration"
    );
    refusing.stop().await;
    let adopting: Arc<dyn Seal> = Arc::new(
        KeyRing::from_keys([k.clone()])
            .expect("a key")
            .adopt_unsealed(true),
    );
    let migrating = sealed(&api, "migrating", adopting).await;
    until("the CA sealed by the migration", || all_sealed_by(&api, &k)).await;
    assert_eq!(stored_ca(&api, &*ring(&[&k])), ca, "the same CA, sealed");
    assert_eq!(converged(&api, &[&migrating]).await, leaf, "the same leaf");
    assert_eq!(migrating.stats().generated_cas, 0);
    assert_eq!(migrating.stats().generated_leaves, 0);
    // From now on a replica without the key refuses what is sealed, and a replica with the
    // key and no migration opens it.
    migrating.stop().await;
    let without = sealed(&api, "without", Arc::new(Plain)).await;
    let reason = refused(&without).await;
    assert!(reason.contains("no seal key is configured"), "{reason}");
    let with = sealed(&api, "with", ring(&[&k])).await;
    leader(&[&without, &with]).await;
    assert!(with.leading());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_with_the_wrong_key_serves_writes_nothing_never_leads_and_recovers_when_given_the_key()
 {
    let api = KubeApi::start().await;
    let right = key();
    let wrong = key();
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("seal.key");
    std::fs::write(&path, wrong.export_base64()).expect("the key file");
    let a = sealed(&api, "a", ring(&[&right])).await;
    let leaf = converged(&api, &[&a]).await;
    until("the CA sealed", || all_sealed_by(&api, &right)).await;
    let from_file: Arc<dyn Seal> = Arc::new(KeyRing::from_files([&path]).expect("the key file"));
    let c = sealed(&api, "c", from_file).await;
    let reason = refused(&c).await;
    assert!(
        reason.contains(&right.id().to_string())
            && reason.contains("not in the key ring")
            && reason.contains(&wrong.id().to_string()),
        "{reason}"
    );
    assert_eq!(converged(&api, &[&c]).await, leaf, "it serves");
    // The only holder goes away (and releases the Lease): the lease is free, and the replica
    // with the wrong key still does not take it.
    a.stop().await;
    let b = sealed(&api, "b", ring(&[&right])).await;
    leader(&[&b, &c]).await;
    assert!(b.leading());
    assert!(lease_writes(&c).is_empty(), "{:?}", lease_writes(&c));
    assert_eq!(c.stats().accepted, 0, "it wrote nothing");
    assert!(
        c.endpoint
            .request_log()
            .iter()
            .all(|r| r.starts_with("GET ")),
        "nothing but reads: {:?}",
        c.endpoint.request_log()
    );
    // Given the right key (its file rewritten, as a secrets-store driver does), it opens the
    // state again by itself.
    std::fs::write(&path, right.export_base64()).expect("the key file");
    tls_test::wait_for(c.access.clone(), "the state opens again", |a| {
        *a == StateAccess::Open
    })
    .await;
    b.stop().await;
    until("the recovered replica leads", || c.leading()).await;
    assert_eq!(converged(&api, &[&c]).await, leaf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_key_rolls_across_the_fleet_in_three_rollouts_while_replicas_hold_different_lists() {
    let api = KubeApi::start().await;
    let old = key();
    let new = key();
    let mut fleet = Vec::new();
    for id in ["a0", "b0", "c0"] {
        fleet.push(sealed(&api, id, ring(&[&old])).await);
    }
    let leaf = converged(&api, &fleet.iter().collect::<Vec<_>>()).await;
    until("sealed with the old key", || all_sealed_by(&api, &old)).await;
    let ca = stored_ca(&api, &*ring(&[&old]));
    // The CAs generated, counted as each replica goes and at the end.
    let mut generated_cas = 0;
    // Three rollouts, one replica at a time (a new one up before an old one goes): the new key
    // second everywhere; then first; then alone.
    for (step, keys) in [
        (1, vec![&old, &new]),
        (2, vec![&new, &old]),
        (3, vec![&new]),
    ] {
        if step == 3 {
            until("every value sealed with the new key", || {
                all_sealed_by(&api, &new)
            })
            .await;
        }
        for index in 0..3 {
            let id = format!("{}{step}", ["a", "b", "c"][index]);
            let replica = sealed(&api, &id, ring(&keys)).await;
            let up: Vec<&Replica> = fleet.iter().chain([&replica]).collect();
            assert_eq!(converged(&api, &up).await, leaf, "step {step}: all serve");
            leader(&up).await;
            for r in &up {
                let access = tls_test::wait_for(r.access.clone(), "the state read", |a| {
                    *a != StateAccess::Unknown
                })
                .await;
                assert_eq!(access, StateAccess::Open, "step {step}: {}", r.id);
            }
            let gone = fleet.remove(0);
            generated_cas += gone.stats().generated_cas;
            gone.stop().await;
            fleet.push(replica);
        }
    }
    // After the roll only the new key is needed, and nothing was regenerated.
    let all: Vec<&Replica> = fleet.iter().collect();
    leader(&all).await;
    assert!(all_sealed_by(&api, &new));
    assert_eq!(
        stored_ca(&api, &*ring(&[&new])),
        ca,
        "the same CA throughout"
    );
    assert_eq!(
        converged(&api, &all).await,
        leaf,
        "the same leaf throughout"
    );
    generated_cas += total(&all, |s| s.generated_cas);
    assert_eq!(generated_cas, 1, "one CA in all");
    let err = ring(&[&old])
        .open(
            Location::new("default", "tls-ca", "ca.key"),
            &secret_value(&api, "tls-ca", "ca.key").expect("ca.key"),
        )
        .expect_err("the old key opens nothing any more");
    assert!(err.to_string().contains("not in the key ring"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_private_key_is_readable_in_any_secret_of_our_state_or_in_any_log_line() {
    let logs = Logs::global();
    let api = KubeApi::start().await;
    let k = key();
    let seal = ring(&[&k]);
    let start = |id: &'static str| {
        let seal = seal.clone();
        let api = &api;
        async move {
            Replica::start_with(api, id, generator(&["localhost"], true), |s| {
                s.seal(seal).seal_served_key(true)
            })
            .await
        }
    };
    let (a, b) = tokio::join!(start("a"), start("b"));
    // The readers open the sealed tls.key: the served leaf is the stored one.
    let leaf = converged(&api, &[&a, &b]).await;
    until("the CA sealed", || all_sealed_by(&api, &k)).await;
    // A tampered value and a refusal, so that the logs carry the warnings too.
    let crt = secret_value(&api, "tls-ca", "ca.crt").expect("ca.crt");
    let good = secret_value(&api, "tls-ca", "ca.key").expect("ca.key");
    api.put_secret(
        "default",
        "tls-ca",
        &[
            ("ca.crt", crt.as_slice()),
            ("ca.key", &good[..good.len() - 1]),
        ],
    );
    refused(&a).await;
    api.put_secret(
        "default",
        "tls-ca",
        &[("ca.crt", crt.as_slice()), ("ca.key", good.as_slice())],
    );
    leader(&[&a, &b]).await;
    assert_eq!(converged(&api, &[&a, &b]).await, leaf);

    // Every private key of the fleet, as PEM and DER, and base64 of each.
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    for (name, key) in [("tls-ca", "ca.key"), ("tls", "tls.key")] {
        let stored = secret_value(&api, name, key).expect("stored");
        assert!(
            stored.starts_with(&envelope::MAGIC),
            "{name} {key} is sealed"
        );
        let pem = seal
            .open(Location::new("default", name, key), &stored)
            .expect("opens")
            .into_plaintext();
        let der = tls_source::Decoder::new()
            .private_key(key, &pem)
            .expect("a private key")
            .secret_der()
            .to_vec();
        let b64 = base64::engine::general_purpose::STANDARD;
        secrets.extend([
            b64.encode(&pem).into_bytes(),
            b64.encode(&der).into_bytes(),
            der,
            pem,
        ]);
    }
    // What is public: each certificate stored in the clear, as PEM and DER and base64 of each.
    // A P-256 PKCS#8 key carries its public point, which its certificate's key info carries
    // too: a window of a key found in a certificate is that public half, not a leak (without
    // this the test failed now and then, when the point's offsets lined up in both).
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut public: Vec<Vec<u8>> = Vec::new();
    for (name, key) in [("tls-ca", "ca.crt"), ("tls", "tls.crt"), ("tls", "ca.crt")] {
        let Some(pem) = secret_value(&api, name, key) else {
            continue;
        };
        // A sealed value is not a certificate in the clear.
        let Ok(ders) = tls_source::Decoder::new().certificates(key, &pem) else {
            continue;
        };
        for der in ders {
            public.extend([b64.encode(&der).into_bytes(), der.to_vec()]);
        }
        public.extend([b64.encode(&pem).into_bytes(), pem]);
    }
    assert!(
        !public.is_empty(),
        "the served certificate is stored in the clear"
    );
    let found =
        |haystack: &[u8], window: &[u8]| haystack.windows(window.len()).any(|h| h == window);
    let contains = |haystack: &[u8], needle: &[u8]| {
        // A 24-byte window of each: a leak need not be whole to be a leak.
        needle
            .windows(24)
            .step_by(12)
            .filter(|w| !public.iter().any(|p| found(p, w)))
            .any(|w| found(haystack, w))
    };
    for name in ["tls-ca", "tls"] {
        let secret = api.get("secrets", "default", name).expect("the Secret");
        let text = secret.to_string();
        assert!(!text.contains("PRIVATE KEY"), "{name}");
        for (key, value) in secret["data"].as_object().expect("data") {
            let value = base64::engine::general_purpose::STANDARD
                .decode(value.as_str().expect("a string"))
                .expect("base64");
            assert!(
                !String::from_utf8_lossy(&value).contains("PRIVATE KEY"),
                "{name} {key}"
            );
            for leak in &secrets {
                assert!(!contains(&value, leak), "{name} {key} holds key material");
                assert!(
                    !contains(text.as_bytes(), leak),
                    "{name} holds key material"
                );
            }
        }
    }
    let text = logs.text();
    assert!(text.contains("cannot be opened"), "the refusal was logged");
    assert!(!text.contains("PRIVATE KEY"));
    for leak in &secrets {
        assert!(
            !contains(text.as_bytes(), leak),
            "a log line holds key material"
        );
    }
}

/// `cert` in the Secret `default/tls`, its key sealed with `seal` (or altered after).
fn put_sealed(api: &KubeApi, seal: &dyn Seal, cert: &TestCert, alter: bool) {
    let mut key = seal
        .seal(
            Location::new("default", "tls", "tls.key"),
            cert.key_pem.as_bytes(),
        )
        .expect("sealed");
    if alter {
        key[30] ^= 0x01;
    }
    api.put_secret(
        "default",
        "tls",
        &[
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", key.as_slice()),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_secret_source_with_a_seal_serves_a_sealed_key_and_keeps_the_last_good_when_one_does_not_open()
 {
    let api = KubeApi::start().await;
    let ca = TestCa::new("sealed");
    let (first, second, third) = (
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
    );
    let k = key();
    let seal = ring(&[&k]);
    put_sealed(&api, &*seal, &first, false);
    let source = tls_k8s::SecretSource::builder(common::client(&api), "default", "tls")
        .seal(seal.clone())
        .build();
    let served = common::Served::serve(source).await;
    served.expect_served(&first).await;
    // Altered, unsealed (planted), sealed with another key: each reported by place, and the
    // last good keeps serving.
    put_sealed(&api, &*seal, &second, true);
    served
        .expect_reported("default/tls tls.key does not open", &first)
        .await;
    common::put(&api, &second);
    served
        .expect_reported("default/tls tls.key is stored unsealed", &first)
        .await;
    put_sealed(&api, &*ring(&[&key()]), &second, false);
    served.expect_reported("not in the key ring", &first).await;
    // Good input again: served.
    put_sealed(&api, &*seal, &third, false);
    served.expect_served(&third).await;
    served.expect_recovered().await;
}
