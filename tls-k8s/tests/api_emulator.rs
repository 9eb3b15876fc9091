//! The emulator speaks the Kubernetes wire protocol as kube's own client expects it: these drive
//! it with `kube::Api`, so a test against the emulator exercises the production code paths.

mod common;

use std::collections::BTreeMap;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use tls_test::KubeApi;

fn secret(name: &str, value: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "k".to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

fn code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn create_get_replace_patch_delete_with_preconditions() {
    let emulator = KubeApi::start().await;
    let api: Api<Secret> = Api::namespaced(common::client(&emulator), "default");
    let created = api
        .create(&PostParams::default(), &secret("s", "1"))
        .await
        .unwrap();
    let rv1: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        code(
            api.create(&PostParams::default(), &secret("s", "x"))
                .await
                .unwrap_err()
        ),
        409
    );

    let got = api.get("s").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], ByteString(b"1".to_vec()));
    // Stored as the API stores it: data base64-encoded, kind and version set.
    let stored = emulator.get("secrets", "default", "s").unwrap();
    assert_eq!(stored["data"]["k"], "MQ==");
    assert_eq!(
        (stored["kind"].as_str(), stored["apiVersion"].as_str()),
        (Some("Secret"), Some("v1"))
    );

    // Replace with the current resourceVersion: accepted, and the version grows.
    let mut update = secret("s", "2");
    update.metadata.resource_version = Some(rv1.to_string());
    let replaced = api
        .replace("s", &PostParams::default(), &update)
        .await
        .unwrap();
    let rv2: u64 = replaced.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv2 > rv1);
    // A stale resourceVersion: 409 Conflict.
    assert_eq!(
        code(
            api.replace("s", &PostParams::default(), &update)
                .await
                .unwrap_err()
        ),
        409
    );

    // Merge patch, with and without a precondition.
    let patched = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": "edge"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["tier"], "edge");
    let stale = serde_json::json!({"metadata": {"resourceVersion": rv1.to_string()}, "data": {}});
    assert_eq!(
        code(
            api.patch("s", &PatchParams::default(), &Patch::Merge(stale))
                .await
                .unwrap_err()
        ),
        409
    );

    api.delete("s", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(api.get("s").await.unwrap_err()), 404);
    assert_eq!(
        code(api.delete("s", &DeleteParams::default()).await.unwrap_err()),
        404
    );
}

#[tokio::test]
async fn list_and_watch_with_selectors_resume_and_gone() {
    let emulator = KubeApi::start().await;
    let api: Api<Secret> = Api::namespaced(common::client(&emulator), "default");
    api.create(&PostParams::default(), &secret("a", "1"))
        .await
        .unwrap();
    let mut unlabelled = secret("b", "1");
    unlabelled.metadata.labels = None;
    api.create(&PostParams::default(), &unlabelled)
        .await
        .unwrap();

    let by_label = api
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(by_label.items.len(), 1);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    assert_eq!(by_name.items[0].metadata.name.as_deref(), Some("b"));
    let rv = by_name.metadata.resource_version.unwrap();

    // A watch from the list's resourceVersion sees what follows, filtered by name.
    let stream = api
        .watch(&WatchParams::default().fields("metadata.name=a"), &rv)
        .await
        .unwrap();
    let mut stream = stream.boxed();
    api.replace("b", &PostParams::default(), &{
        let mut b = api.get("b").await.unwrap();
        b.data = None;
        b
    })
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"k": "Mg=="}})),
    )
    .await
    .unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(s) => assert_eq!(s.metadata.name.as_deref(), Some("a")),
        other => panic!("expected MODIFIED a, got {other:?}"),
    }
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(matches!(
        stream.try_next().await.unwrap().unwrap(),
        WatchEvent::Deleted(_)
    ));

    // Resuming from an old resourceVersion after compaction: 410 Gone.
    emulator.compact();
    let mut old = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match old.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_and_leases() {
    let emulator = KubeApi::start().await;
    let client = common::client(&emulator);
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("writer".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let mut stream = leases
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Bookmark(bookmark) => assert_eq!(bookmark.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn injected_faults() {
    let emulator = KubeApi::start().await;
    let api: Api<Secret> = Api::namespaced(common::client(&emulator), "default");
    emulator.fail_next(500, 1);
    assert_eq!(
        code(api.list(&ListParams::default()).await.unwrap_err()),
        500
    );
    emulator.fail_next(403, 1);
    let forbidden = api.get("x").await.unwrap_err();
    assert!(
        forbidden
            .to_string()
            .contains("cannot get resource \"secrets\""),
        "{forbidden}"
    );
    assert!(
        api.list(&ListParams::default()).await.is_ok(),
        "faults are consumed"
    );
    api.create(&PostParams::default(), &secret("kept", "1"))
        .await
        .unwrap();
    emulator.restart(true).await;
    assert!(api.get("kept").await.is_ok(), "state kept across a restart");
    emulator.restart(false).await;
    assert_eq!(code(api.get("kept").await.unwrap_err()), 404, "state lost");
}

/// As on the API server, a create is atomic: of many racing creates of one name, exactly one
/// gets 201 and every other 409 (the first write of a fenced Secret relies on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creates_of_one_name_make_exactly_one_object() {
    let emulator = KubeApi::start().await;
    let api: Api<Secret> = Api::namespaced(common::client(&emulator), "default");
    for round in 0..50 {
        let name = format!("race-{round}");
        let creates = (0..4).map(|i| {
            let (api, name) = (api.clone(), name.clone());
            tokio::spawn(async move {
                api.create(&PostParams::default(), &secret(&name, &i.to_string()))
                    .await
            })
        });
        let mut created = 0;
        for create in futures::future::join_all(creates).await {
            match create.unwrap() {
                Ok(_) => created += 1,
                Err(err) => assert_eq!(code(err), 409, "{name}"),
            }
        }
        assert_eq!(created, 1, "{name}: one object");
    }
}

/// A list in pages (`limit`, `continue`), as kube's watcher asks for it (500 a page): every
/// page comes from the snapshot of the first, so a write between pages is not in the list
/// (the watch from the list's resourceVersion brings it), and a token from before a
/// compaction answers 410 Expired, as the API server's does.
#[tokio::test]
async fn a_list_in_pages_is_one_snapshot_and_an_expired_token_is_410() {
    let emulator = KubeApi::start().await;
    let api: Api<Secret> = Api::namespaced(common::client(&emulator), "default");
    for i in 0..5 {
        api.create(&PostParams::default(), &secret(&format!("s{i}"), "1"))
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rv = first.metadata.resource_version.clone();
    // Written after the first page: not in this list.
    api.delete("s4", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &secret("s5", "1"))
        .await
        .unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.metadata.resource_version, rv, "the same snapshot");
    let third = api
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert!(third.metadata.continue_.as_deref().unwrap_or("").is_empty());
    let names: Vec<String> = [first, second, third]
        .into_iter()
        .flat_map(|page| page.items)
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(names, ["s0", "s1", "s2", "s3", "s4"]);

    // Without a limit: one page, no token.
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 5);
    assert!(all.metadata.continue_.as_deref().unwrap_or("").is_empty());

    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    api.create(&PostParams::default(), &secret("s6", "1"))
        .await
        .unwrap();
    emulator.compact();
    let expired = api
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(code(expired), 410);
}
