//! The emulator scenarios against a real cluster. Ignored by default: they need a cluster.
//!
//! ```sh
//! kind create cluster            # or: k3d cluster create
//! cargo test -p tls-k8s -- --ignored
//! ```
//! They use the ambient kubeconfig (`Client::try_default`), write a Secret named
//! `tls-rotation-test-<pid>` in `$TLS_K8S_TEST_NAMESPACE` (default `default`), and delete it.

mod common;

use std::collections::BTreeMap;

use common::Served;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use tls_test::{TestCa, TestCert};

struct Cluster {
    api: Api<Secret>,
    client: kube::Client,
    namespace: String,
    name: String,
}

impl Cluster {
    async fn connect() -> Self {
        let client = kube::Client::try_default()
            .await
            .expect("a cluster from the kubeconfig");
        let namespace =
            std::env::var("TLS_K8S_TEST_NAMESPACE").unwrap_or_else(|_| "default".into());
        Self {
            api: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            name: format!("tls-rotation-test-{}", std::process::id()),
        }
    }

    async fn put(&self, data: &[(&str, &[u8])]) {
        let data: BTreeMap<String, ByteString> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
            .collect();
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": self.name}, "data": data,
        });
        self.api
            .patch(
                &self.name,
                &PatchParams::apply("tls-rotation-test").force(),
                &Patch::Apply(secret),
            )
            .await
            .expect("apply the Secret");
    }

    async fn put_cert(&self, cert: &TestCert) {
        self.put(&[
            ("tls.crt", cert.chain_pem.as_bytes()),
            ("tls.key", cert.key_pem.as_bytes()),
        ])
        .await;
    }

    async fn delete(&self) {
        let _ = self.api.delete(&self.name, &DeleteParams::default()).await;
    }
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn rotation_deletion_bad_data_and_labels_on_a_real_cluster() {
    let cluster = Cluster::connect().await;
    let ca = TestCa::new("cluster");
    let (a, b, c) = (
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
    );
    cluster.put_cert(&a).await;
    let served = Served::start(cluster.client.clone(), &cluster.namespace, &cluster.name).await;
    assert_eq!(served.served().await, a.fingerprint);

    cluster.put_cert(&b).await;
    served.expect_served(&b).await;

    let generation = served.status().generation;
    cluster
        .api
        .patch(
            &cluster.name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    cluster
        .put(&[("tls.crt", b"garbage"), ("tls.key", b.key_pem.as_bytes())])
        .await;
    served.expect_reported("key tls.crt", &b).await;
    assert_eq!(
        served.status().generation,
        generation,
        "no swap for a label or bad data"
    );

    cluster.delete().await;
    served.expect_reported("the Secret was deleted", &b).await;
    cluster.put_cert(&c).await;
    served.expect_served(&c).await;
    served.expect_recovered().await;
    cluster.delete().await;
}
