//! The axum, hyper and tonic examples as a user runs them: a real process on a kubelet-style
//! directory, a request, a rotation seen by a fresh client, and a graceful stop.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tls_test::{KubeDir, PATIENCE, TestCa, TestCert, example};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

fn write(kube: &KubeDir, cert: &TestCert) {
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .unwrap();
}

struct Example {
    child: Child,
    addr: SocketAddr,
    kube: KubeDir,
    _dir: tempfile::TempDir,
}

impl Example {
    async fn start(name: &str, first: &TestCert) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kube = KubeDir::new(dir.path().join("tls")).unwrap();
        write(&kube, first);
        let mut child = Command::new(example(name))
            .arg(kube.path())
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {name} example (built by cargo test): {e}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("announces itself in time")
            .unwrap()
            .unwrap();
        let addr = line
            .strip_prefix("listening on https://")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .parse()
            .unwrap();
        Self {
            child,
            addr,
            kube,
            _dir: dir,
        }
    }

    /// Rotates to `cert` and waits until a fresh handshake gets it.
    async fn rotate_to(&self, cert: &TestCert) {
        write(&self.kube, cert);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let served = tls_test::probe(self.addr, "localhost").await.unwrap();
            if served.fingerprint == cert.fingerprint {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "rotation not served"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn terminate(&self) {
        let pid = self.child.id().unwrap().to_string();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    async fn exit_code(mut self) -> Option<i32> {
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits in time")
            .unwrap()
            .code()
    }
}

/// An HTTP server example: a request, a rotation, and a request in flight during the stop
/// (its head half sent) that still gets its answer.
async fn http_example(name: &str) {
    let ca = TestCa::new(name);
    let (first, second) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let ex = Example::start(name, &first).await;
    let (code, body, served) = tls_test::https_get(ex.addr, "localhost", "/")
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "hello\n"));
    assert_eq!(served.fingerprint, first.fingerprint);

    ex.rotate_to(&second).await;
    let (code, _, served) = tls_test::https_get(ex.addr, "localhost", "/")
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(served.fingerprint, second.fingerprint);

    let mut config = tls_test::client_config();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut tls = tls_test::connect(ex.addr, "localhost", config)
        .await
        .unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    ex.terminate();
    tokio::time::sleep(Duration::from_millis(200)).await;
    tls.write_all(b"Connection: close\r\n\r\n").await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("hello\n"), "{response}");
    assert_eq!(ex.exit_code().await, Some(0));
}

#[tokio::test]
async fn axum_example_serves_rotates_and_stops_gracefully() {
    http_example("axum").await;
}

#[tokio::test]
async fn hyper_example_serves_rotates_and_stops_gracefully() {
    http_example("hyper").await;
}

/// A gRPC health client over a TLS connection made by the test's client (ALPN h2).
async fn health_client(
    addr: SocketAddr,
) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
    let connector = tower::service_fn(move |_: tonic::transport::Uri| async move {
        let mut config = tls_test::client_config();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tls = tls_test::connect(addr, "localhost", config).await?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .unwrap();
    tonic_health::pb::health_client::HealthClient::new(channel)
}

fn all_services() -> tonic_health::pb::HealthCheckRequest {
    tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    }
}

async fn health_check(addr: SocketAddr) -> i32 {
    let mut client = health_client(addr).await;
    client
        .check(all_services())
        .await
        .unwrap()
        .into_inner()
        .status
}

#[tokio::test]
async fn tonic_example_answers_grpc_rotates_and_stops() {
    let ca = TestCa::new("tonic");
    let (first, second) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let ex = Example::start("tonic", &first).await;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(health_check(ex.addr).await, serving);
    ex.rotate_to(&second).await;
    assert_eq!(health_check(ex.addr).await, serving);

    // A streaming call in flight (health Watch) is not cut by the graceful stop: the server
    // waits for it, and exits once the client ends it.
    let mut client = health_client(ex.addr).await;
    let mut watch = client.watch(all_services()).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().expect("the first status");
    assert_eq!(first.status, serving);
    ex.terminate();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ex = ex;
    assert!(
        ex.child.try_wait().unwrap().is_none(),
        "waits for the call in flight"
    );
    drop(watch);
    drop(client);
    assert_eq!(ex.exit_code().await, Some(0));
}
