//! Bad Secret data never puts key material in the logs: kube never has a body to complain
//! about, because the source decodes the data itself. Every log line, at trace level, from
//! every crate, is scanned. (One test in this binary: it installs the global subscriber.)

mod common;

use base64::Engine as _;
use futures::StreamExt as _;
use tls_k8s::SecretSource;
use tls_test::{KubeApi, PATIENCE, TestCa};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_base64_in_a_secret_is_our_error_and_no_key_reaches_the_logs() {
    let logs = tls_test::Logs::global_at(tracing::Level::TRACE);

    let api = KubeApi::start().await;
    let cert = TestCa::new("log safety").leaf(&["localhost"]);
    let key_b64 = base64::engine::general_purpose::STANDARD.encode(&cert.key_pem);
    api.put_secret_raw(
        "default",
        "tls",
        &[("tls.crt", "%%% not base64 %%%"), ("tls.key", &key_b64)],
    );
    let mut source = SecretSource::builder(common::client(&api), "default", "tls").build();
    let first = tokio::time::timeout(PATIENCE, source.next())
        .await
        .expect("a report in time")
        .expect("an item");
    let err = first.expect_err("bad data is an error").to_string();
    assert_eq!(
        err,
        "secret default/tls: the Secret's data key tls.crt is not valid base64"
    );

    // A good update afterwards is served as usual.
    common::put(&api, &cert);
    let bundle = tokio::time::timeout(PATIENCE, source.next())
        .await
        .expect("the good data in time")
        .expect("an item")
        .expect("a bundle");
    assert_eq!(tls_test::fingerprint(&bundle.chain()[0]), cert.fingerprint);
    drop(source);

    let text = logs.text();
    assert!(
        text.contains("TRACE") || text.contains("DEBUG"),
        "the logs were captured: {text}"
    );
    tls_test::assert_no_key_material(&text, &cert);
}
