//! The `client` example as a user runs it, against `serve` requiring client certificates: one
//! pooled reqwest client whose identity directory rotates while it makes requests.

use std::process::Stdio;

use tls_test::{KubeDir, PATIENCE, TestCa, TestCert, example};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

fn write(kube: &KubeDir, cert: &TestCert, ca: &TestCa) {
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
        ("ca.crt", ca.cert_pem().as_bytes()),
    ])
    .unwrap();
}

/// `serve --cert-dir DIR --client-ca DIR/ca.crt` on a free port: the process, and its port.
async fn serve_mtls(dir: &std::path::Path) -> (tokio::process::Child, String) {
    let mut serve = Command::new(example("serve"))
        .args(["--listen", "127.0.0.1:0", "--cert-dir"])
        .arg(dir)
        .arg("--client-ca")
        .arg(dir.join("ca.crt"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = BufReader::new(serve.stdout.take().unwrap())
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let port = line.rsplit(':').next().unwrap().to_owned();
    (serve, port)
}

#[tokio::test]
async fn the_client_example_keeps_succeeding_while_its_identity_rotates() {
    let (server_ca, clients_ca) = (
        TestCa::new("client ex server"),
        TestCa::new("client ex clients"),
    );
    let dir = tempfile::tempdir().unwrap();
    let server_dir = KubeDir::new(dir.path().join("server")).unwrap();
    write(&server_dir, &server_ca.leaf(&["localhost"]), &clients_ca);
    let (_serve, port) = serve_mtls(server_dir.path()).await;

    let (first, second) = (clients_ca.client_leaf("svc"), clients_ca.client_leaf("svc"));
    let identity = KubeDir::new(dir.path().join("client")).unwrap();
    write(&identity, &first, &server_ca);
    let mut client = Command::new(example("client"))
        .arg(format!("https://localhost:{port}/"))
        .arg("--cert-dir")
        .arg(identity.path())
        .args(["--every", "50ms", "--count", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        if seen.len() == 5 {
            write(&identity, &second, &server_ca);
        }
        seen.push(json);
    }
    assert_eq!(seen.len(), 30);
    for line in &seen {
        assert_eq!(line["status"], 200, "{line}");
        assert!(line["error"].is_null(), "{line}");
    }
    assert_eq!(seen[0]["client_fingerprint_sha256"], first.fingerprint);
    assert_eq!(
        seen[29]["client_fingerprint_sha256"], second.fingerprint,
        "the new identity is presented"
    );
    assert_eq!(
        tokio::time::timeout(PATIENCE, client.wait())
            .await
            .unwrap()
            .unwrap()
            .code(),
        Some(0)
    );
}

/// A client directory holding a server certificate and no `ca.crt` (what `rotate` writes without
/// `--client`): the client exits 1 within its `--ready-timeout`, saying why, instead of
/// waiting in silence.
#[tokio::test]
async fn the_client_example_exits_1_naming_the_reason_when_its_bundle_is_rejected() {
    let ca = TestCa::new("client ex rejected");
    let dir = tempfile::tempdir().unwrap();
    let identity = KubeDir::new(dir.path().join("client")).unwrap();
    let server_only = ca.leaf(&["localhost"]);
    identity
        .write(&[
            ("tls.crt", server_only.chain_pem.as_bytes()),
            ("tls.key", server_only.key_pem.as_bytes()),
        ])
        .unwrap();
    let output = tokio::time::timeout(
        PATIENCE,
        Command::new(example("client"))
            .arg("https://localhost:1/")
            .arg("--cert-dir")
            .arg(identity.path())
            .args(["--count", "1", "--ready-timeout", "500ms"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client ends within its ready timeout")
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no usable client certificate in"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ca.crt"),
        "the missing file is named: {stderr}"
    );
    assert!(output.stdout.is_empty(), "no request was made");
}

/// The README's mTLS walk-through with the repository's own tools: `rotate --signing-ca` for the
/// server's directory and `rotate --signing-ca --client` for the client's, `serve --client-ca`,
/// then `client`: a 200, the server seeing the client's certificate; the CA made once and reused.
#[tokio::test]
async fn rotate_with_a_signing_ca_makes_bundles_the_client_and_serve_use() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, server, client) = (
        dir.path().join("ca"),
        dir.path().join("server"),
        dir.path().join("client"),
    );
    for (target, extra) in [(&server, None), (&client, Some("--client"))] {
        let status = Command::new(example("rotate"))
            .arg(target)
            .arg("--signing-ca")
            .arg(&ca)
            .args(extra)
            .stdout(Stdio::null())
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }
    assert_eq!(
        std::fs::read(server.join("ca.crt")).unwrap(),
        std::fs::read(client.join("ca.crt")).unwrap(),
        "one CA, kept in its directory"
    );
    let (_serve, port) = serve_mtls(&server).await;
    let output = tokio::time::timeout(
        PATIENCE,
        Command::new(example("client"))
            .arg(format!("https://localhost:{port}/"))
            .arg("--cert-dir")
            .arg(&client)
            .args(["--count", "1"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["client_fingerprint_sha256"].is_string(), "{line}");
}
