//! The `kube-emulator` binary as a user runs it: it prints its URL, writes a kubeconfig, and
//! keeps a TLS Secret equal to a directory's files, with its labels.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

async fn get(addr: &str, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn the_emulator_binary_serves_a_directory_as_a_labelled_tls_secret() {
    let dir = tempfile_dir();
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
    let addr = url.trim_start_matches("http://").to_owned();
    let kubeconfig = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("server: {url}")),
        "{kubeconfig}"
    );
    // The Secret appears within a tick or two.
    let deadline = tokio::time::Instant::now() + tls_test::PATIENCE;
    let secret = loop {
        let response = get(&addr, "/api/v1/namespaces/default/secrets/web").await;
        if response.starts_with("HTTP/1.1 200") {
            break response;
        }
        assert!(tokio::time::Instant::now() < deadline, "{response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(secret.contains("\"kubernetes.io/tls\""), "{secret}");
    assert!(secret.contains("\"app\":\"web\""), "labelled: {secret}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kube-emulator-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
