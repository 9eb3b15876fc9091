//! The `kube-emulator` binary as a user runs it: it prints its URL, writes a kubeconfig, and
//! keeps a TLS Secret equal to a directory's files, with its labels.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

#[tokio::test]
async fn the_emulator_binary_serves_a_directory_as_a_labelled_tls_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let ca = tls_test::TestCa::new("emulator bin");
    let kube = tls_test::KubeDir::new(dir.join("tls")).unwrap();
    let cert = ca.leaf(&["localhost"]);
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .unwrap();
    let mut emulator = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(dir.join("kubeconfig"))
        .arg("--tls-secret")
        .arg(format!("default/web={}", kube.path().display()))
        .args(["--label", "app=web"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(emulator.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    let url = first.rsplit(' ').next().unwrap().to_owned();
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let kubeconfig = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("server: {url}")),
        "{kubeconfig}"
    );
    // The Secret appears within a tick or two.
    let deadline = tokio::time::Instant::now() + tls_test::PATIENCE;
    let secret = loop {
        let response = tls_test::plain_get(addr, "/api/v1/namespaces/default/secrets/web")
            .await
            .unwrap();
        if response.starts_with("HTTP/1.1 200") {
            break response;
        }
        assert!(tokio::time::Instant::now() < deadline, "{response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(secret.contains("\"kubernetes.io/tls\""), "{secret}");
    assert!(secret.contains("\"app\":\"web\""), "labelled: {secret}");
}
