//! `serve` as a user runs it: a real process, real files swapped the kubelet's way, real HTTPS
//! requests, real signals.
//!
//! The binary is this package's (cargo builds it before these tests), or the one `SERVE_BIN`
//! names: `cargo install --path serve --features __test-hooks --root DIR` and
//! `SERVE_BIN=DIR/bin/serve cargo test -p tls-rotation-serve --test serve` test an installed
//! one (the hooks are for the test of a contained panic).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tls_test::{KubeDir, PATIENCE, Serve, TestCa, TestCert};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// The `serve` under test: `SERVE_BIN` when set (an installed one, say), else this package's.
fn serve_bin() -> PathBuf {
    std::env::var_os("SERVE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_serve")), PathBuf::from)
}

/// Starts serve with `args`; see [`Serve::start`].
async fn start(args: &[&str]) -> Serve {
    Serve::start(&serve_bin(), args).await
}

/// Starts serve with `args` and `env`; see [`Serve::start_with_env`].
async fn start_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Serve {
    Serve::start_with_env(&serve_bin(), args, env).await
}

/// An ordinary kubeconfig in `dir` pointing at the emulator.
fn kubeconfig(api: &tls_test::KubeApi, dir: &std::path::Path) -> PathBuf {
    kubeconfig_at(&api.url(), dir)
}

/// An ordinary kubeconfig in `dir` pointing at `url` (the emulator, or one client's endpoint).
fn kubeconfig_at(url: &str, dir: &std::path::Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, tls_test::kubeconfig(url)).unwrap();
    kubeconfig
}

/// The fingerprint a handshake for `name` is served, `None` if it fails.
async fn served_for(addr: SocketAddr, name: &str) -> Option<String> {
    tls_test::served_as(addr, name).await.ok()
}

fn write(kube: &KubeDir, cert: &TestCert) {
    kube.write(&[
        ("tls.crt", cert.chain_pem.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .unwrap();
}

#[tokio::test]
async fn default_is_a_self_signed_certificate_for_localhost() {
    let serve = start(&[]).await;
    let status = serve.status().await;
    assert_eq!(status["origin"], "self-signed");
    assert_eq!(status["generation"], 1);
    assert_eq!(status["last_error"], serde_json::Value::Null);
    assert_eq!(status["dns_names"], serde_json::json!(["localhost"]));
    assert_eq!(
        status["ip_addresses"],
        serde_json::json!(["127.0.0.1", "::1"])
    );
    let not_after = status["not_after"].as_str().unwrap();
    assert!(
        not_after.ends_with('Z') && not_after.len() == 20,
        "RFC 3339: {not_after}"
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// A current Rust client (rustls on aws-lc-rs with its defaults, X25519MLKEM768 first, as
/// reqwest's) gets the post-quantum hybrid from `serve` at once: no `HelloRetryRequest`, so no
/// extra round trip (on ring, every such full handshake took one).
#[tokio::test]
async fn a_current_rustls_client_gets_the_post_quantum_hybrid_without_a_retry() {
    use rustls::{HandshakeKind, NamedGroup};
    let serve = start(&[]).await;
    let config = tls_test::client_config();
    let offered: Vec<_> = config
        .crypto_provider()
        .kx_groups
        .iter()
        .map(|g| g.name())
        .collect();
    assert_eq!(offered[0], NamedGroup::X25519MLKEM768, "{offered:?}");
    for config in [config, tls_test::client_config(), tls_test::client_config()] {
        // A config each: a full handshake each (a shared one would resume).
        let tls = tls_test::connect(serve.addr, "localhost", config)
            .await
            .unwrap();
        let (_, connection) = tls.get_ref();
        assert_eq!(
            connection
                .negotiated_key_exchange_group()
                .map(rustls::crypto::SupportedKxGroup::name),
            Some(NamedGroup::X25519MLKEM768)
        );
        assert_eq!(connection.handshake_kind(), Some(HandshakeKind::Full));
    }
}

#[tokio::test]
async fn follows_a_kubelet_style_directory_and_reports_bad_updates() {
    let ca = TestCa::new("serve example");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("certs")).unwrap();
    kube.write(&[
        ("tls.crt", a.chain_pem.as_bytes()),
        ("tls.key", a.key_pem.as_bytes()),
        ("ca.crt", a.ca_pem.as_bytes()),
    ])
    .unwrap();
    let serve = start(&[
        "--cert-dir",
        kube.path().to_str().unwrap(),
        "--poll",
        "100ms",
    ])
    .await;
    let status = serve.status().await;
    assert_eq!(status["fingerprint_sha256"], a.fingerprint);
    assert!(
        status["origin"].as_str().unwrap().contains("tls.crt"),
        "{status}"
    );

    write(&kube, &b);
    serve
        .wait_status("the rotated certificate", |s| {
            s["fingerprint_sha256"] == b.fingerprint
        })
        .await;

    kube.write(&[("tls.crt", b"garbage"), ("tls.key", b.key_pem.as_bytes())])
        .unwrap();
    let status = serve
        .wait_status("the error", |s| !s["last_error"].is_null())
        .await;
    assert_eq!(
        status["fingerprint_sha256"], b.fingerprint,
        "the last good one keeps serving"
    );
    assert!(
        status["last_error"].as_str().unwrap().contains("tls.crt"),
        "{status}"
    );

    write(&kube, &a);
    let status = serve
        .wait_status("recovery", |s| s["fingerprint_sha256"] == a.fingerprint)
        .await;
    assert_eq!(status["last_error"], serde_json::Value::Null);

    serve.signal("-INT");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
async fn sighup_rereads_the_files() {
    let ca = TestCa::new("serve sighup");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    std::fs::write(&cert, &a.chain_pem).unwrap();
    std::fs::write(&key, &a.key_pem).unwrap();
    let args = [
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--no-notify",
        "--poll",
        "1h",
    ];
    let serve = start(&args).await;
    assert_eq!(serve.status().await["fingerprint_sha256"], a.fingerprint);
    std::fs::write(&cert, &b.chain_pem).unwrap();
    std::fs::write(&key, &b.key_pem).unwrap();
    // Neither a watch nor a poll will see it: only SIGHUP.
    serve.signal("-HUP");
    serve
        .wait_status("the re-read", |s| s["fingerprint_sha256"] == b.fingerprint)
        .await;
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
async fn bad_arguments_are_explained() {
    let out = tokio::time::timeout(
        PATIENCE,
        Command::new(serve_bin())
            .args(["--cert", "only.crt"])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The rules and bounds of every flag are unit tests of the parser (serve/src/cli/tests.rs); this is
    // what a user sees of one.
    assert!(stderr.contains("--cert and --key go together"), "{stderr}");
    assert!(stderr.contains("--help"), "{stderr}");
}

#[tokio::test]
async fn self_signed_options_names_ca_persistence_and_renewal() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("self-signed");
    let args = [
        "--name",
        "api.test",
        "--name",
        "10.1.2.3",
        "--self-signed-ca",
        "--self-signed-dir",
        keep.to_str().unwrap(),
        "--self-signed-validity",
        "3s",
    ];
    let serve = start(&args).await;
    let first = serve.status().await;
    assert_eq!(
        first["dns_names"],
        serde_json::json!(["localhost", "api.test"])
    );
    assert_eq!(
        first["ip_addresses"],
        serde_json::json!(["127.0.0.1", "::1", "10.1.2.3"])
    );
    let ca = first["ca_fingerprints_sha256"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(ca.len(), 64, "{first}");
    // Renewed before the 3 s run out, under the same CA.
    let renewed = serve
        .wait_status("a renewal", |s| s["generation"].as_u64() >= Some(2))
        .await;
    assert_ne!(renewed["fingerprint_sha256"], first["fingerprint_sha256"]);
    assert_eq!(renewed["ca_fingerprints_sha256"][0], ca.as_str());
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));

    // A restart reuses the persisted CA.
    let again = start(&args).await;
    assert_eq!(
        again.status().await["ca_fingerprints_sha256"][0],
        ca.as_str()
    );
    again.signal("-TERM");
    assert_eq!(again.exit_code().await, Some(0));
    assert!(keep.join("ca.key").exists() && keep.join("tls.key").exists());
}

#[tokio::test]
async fn follows_a_kubernetes_secret_through_the_api() {
    let api = tls_test::KubeApi::start().await;
    let ca = TestCa::new("serve k8s");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let put = |cert: &TestCert| {
        api.put_secret(
            "default",
            "web-tls",
            &[
                ("tls.crt", cert.chain_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        )
    };
    put(&a);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(&api, dir.path());
    let serve = start_with_env(
        &["--k8s-secret", "default/web-tls"],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    )
    .await;
    let status = serve.status().await;
    assert_eq!(status["fingerprint_sha256"], a.fingerprint);
    let rv = put(&b);
    let status = serve
        .wait_status("the updated Secret", |s| {
            s["fingerprint_sha256"] == b.fingerprint
        })
        .await;
    assert_eq!(
        status["origin"],
        format!("secret default/web-tls at resourceVersion {rv}")
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
async fn sni_routes_from_directories_with_a_default_and_a_strict_mode() {
    let ca = TestCa::new("serve sni");
    let (api, wild) = (ca.leaf(&["api.example.com"]), ca.leaf(&["*.example.com"]));
    let dir = tempfile::tempdir().unwrap();
    let api_dir = KubeDir::new(dir.path().join("api")).unwrap();
    let wild_dir = KubeDir::new(dir.path().join("wild")).unwrap();
    write(&api_dir, &api);
    write(&wild_dir, &wild);
    let api_route = format!("api.example.com={}", api_dir.path().display());
    let wild_route = format!("*.example.com={}", wild_dir.path().display());
    let serve = start(&["--sni", &api_route, "--sni", &wild_route]).await;

    assert_eq!(
        served_for(serve.addr, "api.example.com").await,
        Some(api.fingerprint.clone())
    );
    assert_eq!(
        served_for(serve.addr, "www.example.com").await,
        Some(wild.fingerprint.clone())
    );
    let status = serve.status().await; // for localhost: the self-signed default
    assert_ne!(status["fingerprint_sha256"], api.fingerprint);
    let route = &status["routes"]["api.example.com"];
    assert_eq!(route["fingerprint_sha256"], api.fingerprint);
    assert_eq!(route["generation"], 1);
    assert!(
        route["not_after"].as_str().unwrap().ends_with('Z'),
        "{route}"
    );
    assert_eq!(route["last_error"], serde_json::Value::Null);
    assert_eq!(
        status["routes"]["*.example.com"]["fingerprint_sha256"],
        wild.fingerprint
    );

    let api2 = ca.leaf(&["api.example.com"]);
    write(&api_dir, &api2);
    let status = serve
        .wait_status("the api route rotated", |s| {
            s["routes"]["api.example.com"]["fingerprint_sha256"] == api2.fingerprint
        })
        .await;
    assert_eq!(status["routes"]["api.example.com"]["generation"], 2);
    assert_eq!(status["routes"]["*.example.com"]["generation"], 1);
    assert_eq!(
        served_for(serve.addr, "api.example.com").await,
        Some(api2.fingerprint.clone())
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));

    let strict = start(&["--sni", &api_route, "--sni-strict"]).await;
    assert_eq!(
        served_for(strict.addr, "api.example.com").await,
        Some(api2.fingerprint.clone())
    );
    assert_eq!(served_for(strict.addr, "unknown.example.org").await, None);
    strict.signal("-TERM");
    assert_eq!(strict.exit_code().await, Some(0));
}

#[tokio::test]
async fn sni_routes_from_secrets_by_label_selector() {
    let api = tls_test::KubeApi::start().await;
    let ca = TestCa::new("serve secrets");
    let (a, b) = (ca.leaf(&["a.example.com"]), ca.leaf(&["b.example.com"]));
    for (name, cert) in [("web-a", &a), ("web-b", &b)] {
        api.put_secret(
            "default",
            name,
            &[
                ("tls.crt", cert.chain_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        );
        api.set_label("secrets", "default", name, "app", "web");
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(&api, dir.path());
    let serve = start_with_env(
        &["--k8s-secrets", "default", "--selector", "app=web"],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    )
    .await;
    let status = serve
        .wait_status("both routes", |s| {
            s["routes"]["default/web-a"]["fingerprint_sha256"] == a.fingerprint
                && s["routes"]["default/web-b"]["fingerprint_sha256"] == b.fingerprint
        })
        .await;
    assert_eq!(
        status["routes"]["default/web-b"]["names"],
        serde_json::json!(["b.example.com"])
    );
    assert_eq!(
        served_for(serve.addr, "a.example.com").await,
        Some(a.fingerprint.clone())
    );
    assert_eq!(
        served_for(serve.addr, "b.example.com").await,
        Some(b.fingerprint.clone())
    );

    api.remove_label("secrets", "default", "web-a", "app");
    serve
        .wait_status("web-a removed", |s| {
            s["routes"].get("default/web-a").is_none()
        })
        .await;
    assert_ne!(
        served_for(serve.addr, "a.example.com").await,
        Some(a.fingerprint.clone())
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// After a restart, an estate of 2,000 labelled Secrets with `--sni-strict` and a default
/// certificate: a client probing listed names from the moment serve starts is refused at TCP
/// while the list loads (serve does not listen yet), then served each name's own certificate;
/// never the default, never a refused handshake. The API answers slowly, so the list takes a
/// while to come in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estate_of_2000_secrets_is_never_served_wrong_or_refused_while_its_list_loads() {
    const N: usize = 2000;
    let api = tls_test::KubeApi::start().await;
    let ca = TestCa::new("estate");
    let mut expected = Vec::with_capacity(N);
    for i in 0..N {
        let name = format!("host-{i}.estate.test");
        let cert = ca.leaf(&[&name]);
        let secret = format!("estate-{i}");
        api.put_secret(
            "default",
            &secret,
            &[
                ("tls.crt", cert.chain_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        );
        api.set_label("secrets", "default", &secret, "app", "estate");
        expected.push((name, cert.fingerprint));
    }
    api.set_delay(Duration::from_millis(800));
    let dir = tempfile::tempdir().unwrap();
    let default = ca.leaf(&["localhost"]);
    let kube = KubeDir::new(dir.path().join("default")).unwrap();
    write(&kube, &default);
    let kubeconfig = kubeconfig(&api, dir.path());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let addr: SocketAddr = listen.parse().unwrap();
    let _serve = Command::new(serve_bin())
        .args(["--listen", &listen, "--cert-dir"])
        .arg(dir.path().join("default"))
        .args([
            "--k8s-secrets",
            "default",
            "--selector",
            "app=estate",
            "--sni-strict",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (mut refused_at_tcp, mut served) = (0usize, 0usize);
    let mut i = 0;
    while served < 300 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{served} served, {refused_at_tcp} refused at TCP"
        );
        // Names spread over the whole list, the last ones listed included.
        let (name, fingerprint) = &expected[(i * 7919) % N];
        i += 1;
        if let Err(err) = tokio::net::TcpStream::connect(addr).await {
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
            refused_at_tcp += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let got = tls_test::served_as(addr, name).await;
        assert_eq!(
            got.as_ref().ok(),
            Some(fingerprint),
            "{name} after {served} served: {got:?}"
        );
        served += 1;
    }
    assert!(refused_at_tcp > 0, "the probe began before serve listened");
}

/// A free port on loopback, never one this process was given before (`tls_test::free_port`).
fn free_port() -> u16 {
    tls_test::free_port().port()
}

#[tokio::test]
async fn connections_are_refused_until_the_first_certificate_then_served() {
    let cert = TestCa::new("serve refused").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("later");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(serve_bin())
        .args(["--listen", &listen, "--cert-dir", certs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The port is bound but nothing listens: refused at once, never a hanging handshake.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = tokio::net::TcpStream::connect(&listen).await;
    assert_eq!(
        early.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );

    let kube = KubeDir::new(&certs).unwrap();
    write(&kube, &cert);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(line, format!("listening on https://{listen}"));
    let served = tls_test::probe(listen.parse().unwrap(), "localhost")
        .await
        .unwrap();
    assert_eq!(served.fingerprint, cert.fingerprint);
}

/// Runs `serve` to its end; its exit code, its stderr, and how long it ran.
async fn run_to_end(args: &[&str]) -> (Option<i32>, String, Duration) {
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        PATIENCE,
        Command::new(serve_bin())
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output(),
    )
    .await
    .expect("serve ends in time")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.stdout.is_empty(), "never announced");
    (out.status.code(), stderr, started.elapsed())
}

/// What serve logs to a pipe or a file (a container's log, a journal) is plain text: no
/// terminal colour codes around the level and the fields.
#[tokio::test]
async fn logs_to_a_pipe_are_plain_text() {
    let (code, stderr, _) =
        run_to_end(&["--cert-dir", "/nonexistent/tls", "--ready-timeout", "300ms"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("WARN tls_reload::engine::events: certificate source error"),
        "the source's error is logged: {stderr}"
    );
    assert!(!stderr.contains('\x1b'), "no escape codes: {stderr:?}");
}

#[tokio::test]
async fn no_certificate_within_the_ready_timeout_fails_with_the_error() {
    let (code, stderr, took) =
        run_to_end(&["--cert-dir", "/nonexistent/tls", "--ready-timeout", "500ms"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("no certificate installed after 500ms"),
        "{stderr}"
    );
    assert!(
        stderr.contains("/nonexistent/tls/tls.crt"),
        "names the file: {stderr}"
    );
    assert!(took < Duration::from_secs(10));
}

/// One unreadable `--sni` route among good ones: when the ready time-out passes, the error (and
/// the log) name that route and its path, not "no certificate" in general.
#[tokio::test]
async fn an_unreadable_sni_route_is_named_with_its_path_when_the_ready_timeout_passes() {
    let ca = TestCa::new("serve sni unreadable");
    let dir = tempfile::tempdir().unwrap();
    let good = KubeDir::new(dir.path().join("api")).unwrap();
    write(&good, &ca.leaf(&["api.example.com"]));
    let missing = dir.path().join("www-missing");
    let (code, stderr, _) = run_to_end(&[
        "--sni",
        &format!("api.example.com={}", good.path().display()),
        "--sni",
        &format!("www.example.com={}", missing.display()),
        "--ready-timeout",
        "1s",
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    let error = stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.contains("no certificate installed for route www.example.com after 1s"),
        "{error}"
    );
    assert!(
        !error.contains("api.example.com"),
        "the good route is in: {error}"
    );
    let path = missing.join("tls.crt").display().to_string();
    assert!(error.contains(&path), "names the path: {error}");
    assert!(
        stderr.lines().any(|line| line.contains("source error")
            && line.contains("www.example.com")
            && line.contains(&path)),
        "the log names the route and its path: {stderr}"
    );
}

#[tokio::test]
async fn a_missing_client_ca_file_is_named_when_the_ready_timeout_passes() {
    let (code, stderr, _) = run_to_end(&[
        "--client-ca",
        "/nonexistent/clients.pem",
        "--ready-timeout",
        "500ms",
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the certificate is installed, but no client CA is trusted after 500ms"),
        "{stderr}"
    );
    assert!(
        stderr.contains("/nonexistent/clients.pem"),
        "names the file: {stderr}"
    );
}

#[tokio::test]
async fn fail_fast_stops_at_the_first_failed_read() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tls.key");
    std::fs::write(&key, TestCa::new("fail fast").leaf(&["localhost"]).key_pem).unwrap();
    // A mistyped certificate path, and the default 30 s ready time-out: --fail-fast does not wait.
    let (code, stderr, took) = run_to_end(&[
        "--cert",
        "/nonexistent/tls.crtt",
        "--key",
        key.to_str().unwrap(),
        "--fail-fast",
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--fail-fast"), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/tls.crtt"),
        "names the file: {stderr}"
    );
    assert!(
        took < Duration::from_secs(10),
        "did not wait for the time-out: {took:?}"
    );
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once() {
    let serve = start(&[]).await;
    // A request whose head never completes keeps the graceful stop waiting (up to 10 s).
    let mut tls = tls_test::connect(serve.addr, "localhost", tls_test::client_config())
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tls, b"GET / HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    serve.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    serve.signal("-TERM");
    let started = std::time::Instant::now();
    assert_eq!(serve.exit_code().await, Some(130));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not the 10 s grace"
    );
    drop(tls);
}

#[tokio::test]
async fn a_port_another_server_listens_on_fails_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let out = tokio::time::timeout(
        PATIENCE,
        Command::new(serve_bin())
            .args(["--listen", &listen])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {listen}")),
        "{stderr}"
    );
}

/// Reads one HTTP/1.1 response (with a content length) from a keep-alive connection.
async fn read_response(tls: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a whole response");
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|l| l.trim().parse().ok())
                .expect("a content length");
            if body.len() >= length {
                return text;
            }
        }
    }
}

#[tokio::test]
async fn recycle_after_closes_keep_alive_connections_once_a_newer_certificate_is_in() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let ca = TestCa::new("serve recycle");
    let (first, second) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write(&kube, &first);
    let serve = start(&[
        "--cert-dir",
        kube.path().to_str().unwrap(),
        "--recycle-after",
        "200ms",
    ])
    .await;
    let mut config = tls_test::client_config();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut tls = tls_test::connect(serve.addr, "localhost", config)
        .await
        .unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let response = read_response(&mut tls).await;
    assert!(response.contains(&first.fingerprint), "{response}");

    // Idle on keep-alive, until the rotation: then the server closes it (gracefully: no
    // request was in flight), and the next connection gets the new certificate.
    write(&kube, &second);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the server closed the connection: {closed:?}"
    );
    serve
        .wait_status("the new certificate", |s| {
            s["fingerprint_sha256"] == second.fingerprint
        })
        .await;
}

#[tokio::test]
async fn client_ca_requires_client_certificates_and_rotates_with_an_overlap() {
    let (server_ca, a, b) = (
        TestCa::new("serve server"),
        TestCa::new("serve clients A"),
        TestCa::new("serve clients B"),
    );
    let (client_a, client_b) = (a.client_leaf("a"), b.client_leaf("b"));
    let fp = |ca: &TestCa| tls_test::fingerprint(ca.cert_der().as_ref());
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write(&kube, &server_ca.leaf(&["localhost"]));
    let clients = dir.path().join("clients.pem");
    std::fs::write(&clients, a.cert_pem()).unwrap();
    let serve = start(&[
        "--cert-dir",
        kube.path().to_str().unwrap(),
        "--client-ca",
        clients.to_str().unwrap(),
        "--ca-overlap",
        "3s",
    ])
    .await;
    let get = |client: Option<&TestCert>| {
        let client = client.cloned();
        async move {
            tls_test::https_get_as(serve.addr, "localhost", "/", client.as_ref())
                .await
                .map(|(code, body, _)| {
                    assert_eq!(code, 200, "{body}");
                    serde_json::from_str::<serde_json::Value>(&body).unwrap()
                })
        }
    };
    let status = get(Some(&client_a)).await.unwrap();
    assert_eq!(status["client_fingerprint_sha256"], client_a.fingerprint);
    assert_eq!(
        status["client_ca_fingerprints_sha256"],
        serde_json::json!([fp(&a)])
    );
    assert!(get(None).await.is_err(), "no client certificate, no entry");
    assert!(get(Some(&client_b)).await.is_err(), "B is not trusted yet");

    // The CA file moves to B: B is let in, A too for the overlap, then A is refused.
    tls_test::replace_by_rename(&clients, b.cert_pem().as_bytes()).unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while get(Some(&client_b)).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "B never trusted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = get(Some(&client_a)).await.expect("A during the overlap");
    assert_eq!(
        during["client_ca_fingerprints_sha256"],
        serde_json::json!([fp(&a), fp(&b)])
    );
    while get(Some(&client_a)).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A still trusted after the overlap"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = get(Some(&client_b)).await.unwrap();
    assert_eq!(
        after["client_ca_fingerprints_sha256"],
        serde_json::json!([fp(&b)])
    );
    assert_eq!(after["client_fingerprint_sha256"], client_b.fingerprint);
}

/// The value of the Prometheus series `line_prefix` (e.g. `name{label="x"}`) in a scrape.
fn scraped(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().expect("a number"))
}

/// `--cert-dir DIR --client-ca PATH`: the server's CA is `DIR/ca.crt`, the client CAs only
/// `PATH`'s; a change of `PATH` is a trust change of its own (counted), not an install of the
/// server's certificate: `generation` stays.
#[tokio::test]
async fn the_client_ca_file_is_not_the_servers_ca_and_its_change_installs_nothing() {
    let metrics_addr = tls_test::free_port();
    let (server_ca, a, b) = (
        TestCa::new("serve own CA"),
        TestCa::new("serve clients A"),
        TestCa::new("serve clients B"),
    );
    let fp = |ca: &TestCa| tls_test::fingerprint(ca.cert_der().as_ref());
    let (client_a, client_b) = (a.client_leaf("a"), b.client_leaf("b"));
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    let leaf = server_ca.leaf(&["localhost"]);
    kube.write(&[
        ("tls.crt", leaf.chain_pem.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("ca.crt", server_ca.cert_pem().as_bytes()),
    ])
    .unwrap();
    let clients = dir.path().join("clients.pem");
    std::fs::write(&clients, a.cert_pem()).unwrap();
    let serve = start(&[
        "--cert-dir",
        kube.path().to_str().unwrap(),
        "--client-ca",
        clients.to_str().unwrap(),
        "--metrics",
        &metrics_addr.to_string(),
    ])
    .await;
    let get = |client: &TestCert| {
        let client = client.clone();
        async move {
            let (code, body, _) =
                tls_test::https_get_as(serve.addr, "localhost", "/", Some(&client)).await?;
            assert_eq!(code, 200, "{body}");
            Ok::<_, std::io::Error>(serde_json::from_str::<serde_json::Value>(&body).unwrap())
        }
    };
    let before = get(&client_a).await.unwrap();
    assert_eq!(
        before["ca_fingerprints_sha256"],
        serde_json::json!([fp(&server_ca)])
    );
    assert_eq!(
        before["client_ca_fingerprints_sha256"],
        serde_json::json!([fp(&a)])
    );
    assert_eq!(before["generation"], 1);
    let changes = |text: &str| scraped(text, "tls_reload_client_ca_changes_total").unwrap_or(0.0);
    let first = changes(&http_get(metrics_addr, "/metrics").await);
    assert!(first >= 1.0, "the first client CAs applied are counted");

    tls_test::replace_by_rename(&clients, b.cert_pem().as_bytes()).unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let after = loop {
        if let Ok(status) = get(&client_b).await {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "B never trusted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        after["client_ca_fingerprints_sha256"],
        serde_json::json!([fp(&b)])
    );
    assert_eq!(
        after["ca_fingerprints_sha256"],
        serde_json::json!([fp(&server_ca)])
    );
    assert_eq!(
        after["generation"], 1,
        "no install of the server's certificate"
    );
    assert_eq!(after["fingerprint_sha256"], leaf.fingerprint);
    let text = http_get(metrics_addr, "/metrics").await;
    assert_eq!(changes(&text), first + 1.0, "{text}");
    assert_eq!(
        scraped(&text, "tls_reload_installs_total{route=\"\"}"),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test]
async fn client_ca_goes_with_the_self_signed_default_too() {
    let clients = TestCa::new("serve clients of the default");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients.pem");
    std::fs::write(&path, clients.cert_pem()).unwrap();
    let serve = start(&["--client-ca", path.to_str().unwrap()]).await;
    let leaf = clients.client_leaf("c");
    let (code, body, _) = tls_test::https_get_as(serve.addr, "localhost", "/", Some(&leaf))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["origin"], "self-signed");
    assert_eq!(status["client_fingerprint_sha256"], leaf.fingerprint);
    let anonymous = tls_test::https_get_as(serve.addr, "localhost", "/", None).await;
    assert!(anonymous.is_err(), "no client certificate: refused");
}

/// Three replicas of `serve --k8s-shared`, each through its own API endpoint: one leader
/// generates one CA and one leaf, all three serve them, and each status says who leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_shared_replicas_serve_one_self_signed_certificate_and_say_who_leads() {
    let api = tls_test::KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for id in ["web-0", "web-1", "web-2"] {
        // Its own endpoint, as a pod has its own connection to the API server.
        let endpoint = api.endpoint().await;
        let kubeconfig = kubeconfig_at(&endpoint.url(), &dir.path().join(id));
        let serve = start_with_env(
            &[
                "--k8s-shared",
                "default/web-tls",
                "--identity",
                id,
                "--self-signed-ca",
                "--name",
                "web.test",
            ],
            &[("KUBECONFIG", kubeconfig.as_os_str())],
        )
        .await;
        replicas.push((endpoint, serve));
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let statuses = loop {
        let mut statuses = Vec::new();
        for (_, serve) in &replicas {
            statuses.push(serve.status().await);
        }
        let agreed = statuses.iter().all(|s| {
            s["fingerprint_sha256"] == statuses[0]["fingerprint_sha256"]
                && s["leader"]["holder"] == statuses[0]["leader"]["holder"]
                && s["leader"]["holder"].is_string()
        });
        let leading = statuses
            .iter()
            .filter(|s| s["leader"]["leading"] == true)
            .count();
        if agreed && leading == 1 {
            break statuses;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replicas did not agree: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ids = ["web-0", "web-1", "web-2"];
    let at = statuses
        .iter()
        .position(|s| s["leader"]["leading"] == true)
        .unwrap();
    assert_eq!(
        statuses[at]["leader"],
        serde_json::json!({"holder": ids[at], "round": 0, "leading": true}),
        "the leader says it is the holder"
    );
    for status in &statuses {
        assert_eq!(
            status["origin"],
            format!(
                "secret default/web-tls at resourceVersion {}",
                api.get("secrets", "default", "web-tls").unwrap()["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
            )
        );
        assert_eq!(
            status["ca_fingerprints_sha256"].as_array().unwrap().len(),
            1
        );
        assert_eq!(
            status["ca_fingerprints_sha256"], statuses[0]["ca_fingerprints_sha256"],
            "one CA for the fleet"
        );
        assert_eq!(
            status["dns_names"],
            serde_json::json!(["localhost", "web.test"])
        );
    }
    assert!(api.get("secrets", "default", "web-tls-ca").is_some());

    // The leader stopped with SIGTERM releases its Lease: another replica leads within a few
    // retry periods (2 s each), not after the 15 s lease duration.
    // Its endpoint stays up: the release goes through it.
    let (_endpoint, leader) = replicas.remove(at);
    leader.signal("-TERM");
    assert_eq!(leader.exit_code().await, Some(0));
    // Released (no holder), or already taken by a follower that saw the release on its
    // watch: never still held by the replica that stopped.
    let stored = api.get("leases", "default", "web-tls-writer").unwrap();
    assert_ne!(
        stored["spec"]["holderIdentity"], ids[at],
        "released on SIGTERM: {stored}"
    );
    let released = tokio::time::Instant::now();
    loop {
        let mut leading = 0;
        for (_, serve) in &replicas {
            leading += usize::from(serve.status().await["leader"]["leading"] == true);
        }
        if leading == 1 {
            break;
        }
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "no replica led within 10 s of the release (the lease duration is 15 s)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (_, serve) in replicas {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
}

/// A key file made as the docs say (`openssl rand -base64 32`) at `path`: a seal key or a
/// session-ticket secret.
fn key_file(path: &std::path::Path) -> PathBuf {
    let made = std::process::Command::new("openssl")
        .args(["rand", "-out"])
        .arg(path)
        .args(["-base64", "32"])
        .status()
        .expect("openssl");
    assert!(made.success());
    path.to_owned()
}

/// `serve --k8s-shared --seal-key`: the replica with the key leads and seals the CA Secret; one
/// with another key and one with none serve the same certificate, refuse the state, say why
/// in the status, and never lead. The key files are made as the docs say, with openssl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_shared_with_a_seal_key_seals_the_ca_and_a_replica_without_the_key_says_why() {
    let api = tls_test::KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = |name: &str| key_file(&dir.path().join(name));
    let (right, wrong) = (key_file("right.key"), key_file("wrong.key"));
    let start = |id: &'static str, seal: Vec<std::ffi::OsString>| {
        let kubeconfig = kubeconfig_at(&api.url(), &dir.path().join(id));
        async move {
            let mut args: Vec<std::ffi::OsString> = [
                "--k8s-shared",
                "default/web-tls",
                "--identity",
                id,
                "--self-signed-ca",
            ]
            .map(Into::into)
            .to_vec();
            args.extend(seal);
            let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
            start_with_env(&args, &[("KUBECONFIG", kubeconfig.as_os_str())]).await
        }
    };
    let sealing = start("web-0", vec!["--seal-key".into(), right.clone().into()]).await;
    let status = sealing
        .wait_status("web-0 leads", |s| s["leader"]["leading"] == true)
        .await;
    assert_eq!(status["seal"]["state"], "open", "{status}");
    assert_eq!(status["seal"]["key_ids"].as_array().unwrap().len(), 1);
    let ca_key = api.get("secrets", "default", "web-tls-ca").unwrap()["data"]["ca.key"]
        .as_str()
        .map(|v| base64::engine::general_purpose::STANDARD.decode(v).unwrap())
        .unwrap();
    assert_eq!(&ca_key[..4], b"\x89TSE", "ca.key is sealed");
    let others = [
        (
            start("web-1", vec!["--seal-key".into(), wrong.into()]).await,
            "not in the key ring",
        ),
        (start("web-2", vec![]).await, "no seal key is configured"),
    ];
    for (serve, says) in &others {
        let status = serve
            .wait_status("the state refused", |s| s["seal"]["state"] == "refused")
            .await;
        let reason = status["seal"]["reason"].as_str().unwrap();
        assert!(
            reason.contains(says) && reason.contains("default/web-tls-ca"),
            "{reason}"
        );
        assert_eq!(status["leader"]["leading"], false);
        assert_eq!(status["leader"]["holder"], "web-0");
        assert_eq!(
            status["fingerprint_sha256"],
            sealing.status().await["fingerprint_sha256"],
            "it serves the fleet's certificate"
        );
    }
    for (serve, _) in others {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
    sealing.signal("-TERM");
    assert_eq!(sealing.exit_code().await, Some(0));
}

/// Three `serve --k8s-shared default/web-tls --session-tickets fleet` replicas on the emulator,
/// each with `extra` flags and a kubeconfig of its own in `dir`.
async fn ticket_fleet(
    api: &tls_test::KubeApi,
    dir: &std::path::Path,
    extra: &[&str],
) -> Vec<Serve> {
    let mut replicas = Vec::new();
    for id in ["web-0", "web-1", "web-2"] {
        let kubeconfig = kubeconfig_at(&api.url(), &dir.join(id));
        let mut args = vec![
            "--k8s-shared",
            "default/web-tls",
            "--identity",
            id,
            "--session-tickets",
            "fleet",
        ];
        args.extend(extra);
        replicas.push(start_with_env(&args, &[("KUBECONFIG", kubeconfig.as_os_str())]).await);
    }
    replicas
}

/// `--session-tickets fleet`: three `serve --k8s-shared --seal-key` replicas, the Lease holder
/// writes the ticket keys sealed into `web-tls-tickets`, every replica reads them, and a client
/// with one session cache going round-robin resumes on every connection after its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tickets_of_a_fleet_resume_a_client_on_every_replica() {
    let api = tls_test::KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir.path().join("seal.key"));
    let replicas = ticket_fleet(&api, dir.path(), &["--seal-key", key.to_str().unwrap()]).await;
    let mut key_ids = Vec::new();
    for serve in &replicas {
        let status = serve
            .wait_status("the fleet's ticket keys", |s| {
                s["session_tickets"]["source"] == "fleet"
            })
            .await;
        let tickets = &status["session_tickets"];
        assert_eq!(tickets["rotation_seconds"], 6 * 3600, "{tickets}");
        assert!(tickets["note"].is_null(), "{tickets}");
        key_ids.push(tickets["key_id"].clone());
    }
    assert!(key_ids.iter().all(|id| *id == key_ids[0]), "{key_ids:?}");
    let stored = api.get("secrets", "default", "web-tls-tickets").unwrap();
    let value = base64::engine::general_purpose::STANDARD
        .decode(stored["data"]["tickets.json"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        &value[..4],
        b"\x89TSE",
        "the keys are sealed: none readable in the Secret"
    );

    let config = Arc::new(tls_test::client_config());
    let mut resumed = 0;
    for _ in 0..3 {
        for serve in &replicas {
            let kind = tickets_get(serve.addr, &config).await;
            resumed += usize::from(kind == rustls::HandshakeKind::Resumed);
        }
    }
    assert_eq!(resumed, 8, "every connection after the first resumed");
    for serve in replicas {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
}

/// One TLS 1.3 connection with `config` (any certificate accepted) making one request: how its
/// handshake went. The response is read whole, so the tickets the server sends are kept.
async fn tickets_get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> rustls::HandshakeKind {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
        .expect("the handshake succeeds");
    let kind = tls.get_ref().1.handshake_kind().unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    assert!(response.starts_with(b"HTTP/1.1 200"), "served");
    kind
}

/// `--session-tickets fleet --ticket-rotation 3s`: once the keys have rotated two periods past
/// the one that sealed a client's ticket, that client makes a full handshake (and succeeds),
/// on every replica alike (three here); then resumes again on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tickets_of_a_fleet_stop_resuming_two_periods_after_their_key() {
    let api = tls_test::KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let replicas = ticket_fleet(&api, dir.path(), &["--ticket-rotation", "3s"]).await;
    let key_id = |s: &serde_json::Value| s["session_tickets"]["key_id"].clone();
    for serve in &replicas {
        serve
            .wait_status("the fleet's keys", |s| {
                s["session_tickets"]["source"] == "fleet"
            })
            .await;
    }
    // A client's ticket, sealed by the key current before and after its connection.
    let (config, sealed_by) = loop {
        let config = Arc::new(tls_test::client_config());
        let before = key_id(&replicas[0].status().await);
        assert_eq!(
            tickets_get(replicas[0].addr, &config).await,
            rustls::HandshakeKind::Full
        );
        if key_id(&replicas[0].status().await) == before {
            break (config, before);
        }
    };
    // Two keys on, the one that sealed it opens nothing any more.
    let mut seen = vec![sealed_by];
    while seen.len() < 3 {
        let now = replicas[1]
            .wait_status("the next key", |s| !seen.contains(&key_id(s)))
            .await;
        seen.push(key_id(&now));
    }
    assert_eq!(
        tickets_get(replicas[1].addr, &config).await,
        rustls::HandshakeKind::Full,
        "a ticket two periods old is a full handshake, not a failure"
    );
    for serve in [&replicas[2], &replicas[0]] {
        assert_eq!(
            tickets_get(serve.addr, &config).await,
            rustls::HandshakeKind::Resumed,
            "and the new tickets resume on the other replicas"
        );
    }
    for serve in replicas {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
}

/// `--session-tickets FILE`: two processes given the same file share tickets with no store;
/// one given another file does not, and its handshake is a full one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tickets_from_a_file_are_shared_by_the_processes_given_it() {
    let dir = tempfile::tempdir().unwrap();
    let (same, other) = (
        key_file(&dir.path().join("tickets")),
        key_file(&dir.path().join("other")),
    );
    let ca = TestCa::new("serve tickets");
    let cert = ca.leaf(&["localhost"]);
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write(&kube, &cert);
    let start_with = |tickets: PathBuf| {
        let cert_dir = kube.path().to_str().unwrap().to_owned();
        async move {
            start(&[
                "--cert-dir",
                &cert_dir,
                "--session-tickets",
                tickets.to_str().unwrap(),
            ])
            .await
        }
    };
    let (one, two, three) = (
        start_with(same.clone()).await,
        start_with(same).await,
        start_with(other).await,
    );
    let status = one.status().await;
    assert_eq!(status["session_tickets"]["source"], "secret", "{status}");
    assert_eq!(
        status["session_tickets"]["key_id"],
        two.status().await["session_tickets"]["key_id"]
    );
    let config = Arc::new(tls_test::client_config());
    assert_eq!(
        tickets_get(one.addr, &config).await,
        rustls::HandshakeKind::Full
    );
    assert_eq!(
        tickets_get(two.addr, &config).await,
        rustls::HandshakeKind::Resumed
    );
    assert_eq!(
        tickets_get(three.addr, &config).await,
        rustls::HandshakeKind::Full
    );
    for serve in [one, two, three] {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
}

/// A plain-HTTP GET of `path` from `addr`: the body.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let response = tls_test::plain_get(addr, path).await.expect("a response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// `--metrics ADDR`: Prometheus metrics a scrape reads, agreeing with the status JSON, and a
/// rejected update counted by its reason.
#[tokio::test]
async fn metrics_are_served_for_prometheus() {
    let metrics_addr = tls_test::free_port();
    let ca = TestCa::new("serve metrics");
    let (a, b) = (ca.leaf(&["localhost"]), ca.leaf(&["localhost"]));
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    write(&kube, &a);
    let serve = start(&[
        "--cert-dir",
        kube.path().to_str().unwrap(),
        "--metrics",
        &metrics_addr.to_string(),
    ])
    .await;
    let status = serve.status().await;
    let not_after = humantime::parse_rfc3339(status["not_after"].as_str().unwrap()).unwrap();
    let unix = not_after
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let text = http_get(metrics_addr, "/metrics").await;
    let expiry = text
        .lines()
        .find(|l| l.starts_with("tls_certificate_expiration_timestamp_seconds{"))
        .unwrap_or_else(|| panic!("no expiry gauge in:\n{text}"));
    assert!(expiry.contains("route=\"\""), "{expiry}");
    assert!(expiry.contains("source=\"files:"), "{expiry}");
    assert!(expiry.ends_with(&format!(" {unix}")), "{expiry} is {unix}");
    assert!(text.contains("tls_reload_ready 1"), "{text}");
    assert!(
        text.contains("tls_reload_installs_total{route=\"\"} 1"),
        "{text}"
    );
    // A mismatched pair is refused, and counted.
    write(&kube, &a.with_key_of(&b));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = http_get(metrics_addr, "/metrics").await;
        if text.contains("tls_reload_rejections_total{route=\"\",reason=\"key_mismatch\"} 1") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(serve.status().await["fingerprint_sha256"], a.fingerprint);
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// `--cert` and `--key` replaced one after the other, milliseconds apart (two renames): the new
/// pair is served, and nothing was logged or counted as a rejection on the way. A key that stays
/// alone is still refused and counted.
#[tokio::test]
async fn a_pair_replaced_file_by_file_is_no_rejection_and_a_lone_key_still_is() {
    let metrics_addr = tls_test::free_port();
    let ca = TestCa::new("serve two renames");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, &a.chain_pem).unwrap();
    std::fs::write(&key, &a.key_pem).unwrap();
    let serve = start(&[
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--metrics",
        &metrics_addr.to_string(),
    ])
    .await;
    assert_eq!(serve.status().await["fingerprint_sha256"], a.fingerprint);
    let mismatches = |text: &str| {
        scraped(
            text,
            "tls_reload_rejections_total{route=\"\",reason=\"key_mismatch\"}",
        )
        .unwrap_or(0.0)
    };

    tls_test::replace_by_rename(&key, b.key_pem.as_bytes()).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await; // the writer's pause between its files
    tls_test::replace_by_rename(&crt, b.chain_pem.as_bytes()).unwrap();
    let status = serve
        .wait_status("the new pair", |s| s["fingerprint_sha256"] == b.fingerprint)
        .await;
    assert_eq!(status["last_error"], serde_json::Value::Null);
    assert_eq!(status["generation"], 2, "one install, nothing between");
    let text = http_get(metrics_addr, "/metrics").await;
    assert_eq!(mismatches(&text), 0.0, "{text}");

    // A key alone, which stays alone: refused and counted, once its quiet is over.
    tls_test::replace_by_rename(&key, c.key_pem.as_bytes()).unwrap();
    let status = serve
        .wait_status("the lone key refused", |s| !s["last_error"].is_null())
        .await;
    assert!(
        status["last_error"]
            .as_str()
            .unwrap()
            .contains("does not match"),
        "{status}"
    );
    assert_eq!(status["fingerprint_sha256"], b.fingerprint);
    let text = http_get(metrics_addr, "/metrics").await;
    assert_eq!(mismatches(&text), 1.0, "{text}");
}

/// A kubelet-style directory holding `first`, and serve following it.
async fn serve_dir(
    first: &TestCert,
    env: &[(&str, &std::ffi::OsStr)],
) -> (tempfile::TempDir, KubeDir, Serve) {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("certs")).unwrap();
    write(&kube, first);
    let serve = start_with_env(
        &[
            "--cert-dir",
            kube.path().to_str().unwrap(),
            "--poll",
            "100ms",
        ],
        env,
    )
    .await;
    (dir, kube, serve)
}

#[tokio::test]
async fn certificates_valid_until_9999_or_from_1950_are_served_and_rotation_goes_on() {
    let ca = TestCa::new("serve dates");
    let first = ca.leaf(&["localhost"]);
    let (_dir, kube, serve) = serve_dir(&first, &[]).await;

    let forever = ca.leaf_valid(
        &["localhost"],
        std::time::SystemTime::now() - Duration::from_secs(3600),
        tls_rotation::tls_source::clock::latest(),
    );
    write(&kube, &forever);
    let status = serve
        .wait_status("the certificate valid until 9999", |s| {
            s["fingerprint_sha256"] == forever.fingerprint
        })
        .await;
    assert_eq!(status["not_after"], "9999-12-31T23:59:59Z");
    assert_eq!(status["expiring"], false);
    assert_eq!(status["running"], true);

    let old = ca.leaf_valid(
        &["localhost"],
        tls_test::new_year(1950),
        tls_test::new_year(2049),
    );
    write(&kube, &old);
    let status = serve
        .wait_status("the certificate from 1950", |s| {
            s["fingerprint_sha256"] == old.fingerprint
        })
        .await;
    assert_eq!(status["not_before"], "1950-01-01T00:00:00Z");
    assert_eq!(status["not_after"], "2049-01-01T00:00:00Z");

    let next = ca.leaf(&["localhost"]);
    write(&kube, &next);
    serve
        .wait_status("the next rotation", |s| {
            s["fingerprint_sha256"] == next.fingerprint
        })
        .await;
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
async fn a_pair_not_valid_before_9999_is_refused_and_the_next_good_pair_served() {
    let ca = TestCa::new("serve dates");
    let first = ca.leaf(&["localhost"]);
    let (_dir, kube, serve) = serve_dir(&first, &[]).await;

    let future = ca.leaf_valid(
        &["localhost"],
        tls_test::new_year(9999),
        tls_rotation::tls_source::clock::latest(),
    );
    write(&kube, &future);
    let status = serve
        .wait_status("the refusal", |s| !s["last_error"].is_null())
        .await;
    assert_eq!(status["fingerprint_sha256"], first.fingerprint);
    let err = status["last_error"].as_str().unwrap();
    assert!(
        err.contains("not valid before 9999-01-01T00:00:00Z"),
        "{err}"
    );

    let next = ca.leaf(&["localhost"]);
    write(&kube, &next);
    let status = serve
        .wait_status("the next good pair", |s| {
            s["fingerprint_sha256"] == next.fingerprint
        })
        .await;
    assert_eq!(status["last_error"], serde_json::Value::Null);
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
async fn a_panic_on_one_input_is_contained_and_one_that_stops_the_task_exits_1() {
    let ca = TestCa::new("serve panics");
    let (first, poison, next, fatal) = (
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
    );
    let (_dir, kube, serve) = serve_dir(
        &first,
        &[
            ("TLS_RELOAD_TEST_PANIC_ON", poison.fingerprint.as_ref()),
            ("TLS_RELOAD_TEST_PANIC_TASK_ON", fatal.fingerprint.as_ref()),
        ],
    )
    .await;

    // Checking this one panics: it is refused, reason internal, and the first keeps serving.
    write(&kube, &poison);
    let status = serve
        .wait_status("the contained panic", |s| !s["last_error"].is_null())
        .await;
    assert_eq!(status["fingerprint_sha256"], first.fingerprint);
    let err = status["last_error"].as_str().unwrap();
    assert!(
        err.contains("internal error") && err.contains("route default"),
        "{err}"
    );
    assert_eq!(status["running"], true);

    // The next one is served: rotation goes on.
    write(&kube, &next);
    serve
        .wait_status("the next rotation", |s| {
            s["fingerprint_sha256"] == next.fingerprint
        })
        .await;

    // This one panics the task itself: serve stops serving gracefully and exits 1, for an
    // orchestrator to restart it.
    write(&kube, &fatal);
    assert_eq!(serve.exit_code().await, Some(1));
}

#[tokio::test]
async fn a_self_signed_validity_of_a_hundred_years_is_served() {
    // Past 795 days this once panicked the reload task (the expiry timer's deadline).
    let serve = start(&["--self-signed-validity", "36500d"]).await;
    let status = serve.status().await;
    let not_after = humantime::parse_rfc3339(status["not_after"].as_str().unwrap()).unwrap();
    let left = not_after
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(left > Duration::from_secs(36_000 * 86_400), "{status}");
    assert_eq!(status["expiring"], false);
    assert_eq!(status["running"], true);
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// ACME against Pebble: each `--acme-domain` gets its certificate (TLS-ALPN-01 answered on
/// `--listen`), served as its SNI route and shown under `acme` in the status; a restart on
/// `--acme-state` serves them at once and orders nothing (orders counted in Pebble's log).
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_certificates_are_served_as_routes_and_a_restart_orders_nothing() {
    let port = free_port();
    let pebble = tls_test::Pebble::builder()
        .tls_port(port)
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let (listen, directory, ca) = (
        format!("127.0.0.1:{port}"),
        pebble.directory_url(),
        pebble.https_ca_file(),
    );
    let args = [
        "--listen",
        &listen,
        "--acme-directory",
        &directory,
        "--acme-domain",
        "a.example.com",
        "--acme-domain",
        "b.example.com",
        "--acme-email",
        "ops@example.com",
        "--acme-directory-ca",
        ca.to_str().unwrap(),
        "--acme-state",
        state.path().to_str().unwrap(),
        "--sni-strict",
    ];
    let serve = start(&args).await;
    let status = serve
        .wait_status("both names issued", |s| {
            ["a.example.com", "b.example.com"].iter().all(|n| {
                s["acme"]["names"][n]["state"] == "valid"
                    && s["acme"]["names"][n]["renew_after"].is_string()
                    && s["routes"][n]["fingerprint_sha256"].is_string()
            })
        })
        .await;
    let acme = &status["acme"];
    assert_eq!(acme["directory"], directory.as_str());
    assert!(acme["account"].is_string(), "{acme}");
    let a = &acme["names"]["a.example.com"];
    assert!(
        a["not_after"].is_string() && a["retry_at"].is_null() && a["last_error"].is_null(),
        "{a}"
    );
    // Pebble has no ARI: renewal by the lifetime, no ARI check planned.
    assert_eq!(a["renew_reason"], "lifetime", "{a}");
    assert!(a["ari_next"].is_null(), "{a}");
    let root = pebble.issuing_root().await;
    for name in ["a.example.com", "b.example.com"] {
        let served = tls_test::probe_trusting(serve.addr, name, std::slice::from_ref(&root))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            status["routes"][name]["fingerprint_sha256"],
            served.fingerprint
        );
    }
    assert_eq!(pebble.orders(), 2, "{}", pebble.log());

    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
    let serve = start(&args).await;
    for name in ["a.example.com", "b.example.com"] {
        tls_test::probe_trusting(serve.addr, name, std::slice::from_ref(&root))
            .await
            .unwrap_or_else(|e| panic!("{name} at once after a restart: {e}"));
    }
    serve
        .wait_status("both scheduled for renewal", |s| {
            ["a.example.com", "b.example.com"]
                .iter()
                .all(|n| s["acme"]["names"][n]["renew_after"].is_string())
        })
        .await;
    assert_eq!(pebble.orders(), 2, "nothing ordered after the restart");
}

/// A new user's first try: `--listen` on a port the CA does not validate at fails the name,
/// which then waits an hour. Restarted with the right `--listen`, it is ordered at once; a
/// second restart keeps its renewal time to the second.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_after_a_failed_validation_a_fixed_listen_flag_orders_at_once() {
    let port = free_port();
    let pebble = tls_test::Pebble::builder()
        .tls_port(port)
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let (directory, ca) = (pebble.directory_url(), pebble.https_ca_file());
    let args = |listen: &str| -> Vec<String> {
        [
            "--listen",
            listen,
            "--acme-directory",
            &directory,
            "--acme-domain",
            "first.example.com",
            "--acme-directory-ca",
            ca.to_str().unwrap(),
            "--acme-state",
            state.path().to_str().unwrap(),
            "--acme-weekly-limit",
            "5",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let wrong = format!("127.0.0.1:{}", free_port());
    let serve = start(&args(&wrong).iter().map(String::as_str).collect::<Vec<_>>()).await;
    let failed = serve
        .wait_status("the validation failed", |s| {
            s["acme"]["names"]["first.example.com"]["state"] == "backoff"
        })
        .await;
    let name = &failed["acme"]["names"]["first.example.com"];
    assert!(
        name["retry_at"].is_string() && name["last_error"].is_string(),
        "{name}"
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));

    let right = format!("127.0.0.1:{port}");
    let began = std::time::Instant::now();
    let serve = start(&args(&right).iter().map(String::as_str).collect::<Vec<_>>()).await;
    let issued = serve
        .wait_status("issued after the fix", |s| {
            s["acme"]["names"]["first.example.com"]["state"] == "valid"
                && s["acme"]["names"]["first.example.com"]["renew_after"].is_string()
        })
        .await;
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "not after the hour"
    );
    let renew_after = issued["acme"]["names"]["first.example.com"]["renew_after"].clone();
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));

    let serve = start(&args(&right).iter().map(String::as_str).collect::<Vec<_>>()).await;
    let again = serve
        .wait_status("the stored renewal", |s| {
            s["acme"]["names"]["first.example.com"]["renew_after"].is_string()
        })
        .await;
    assert_eq!(
        again["acme"]["names"]["first.example.com"]["renew_after"],
        renew_after
    );
    assert_eq!(
        pebble.orders(),
        2,
        "the failed order and the one after the fix"
    );
}

#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_http_01_is_answered_on_its_own_port() {
    let http_port = free_port();
    let pebble = tls_test::Pebble::builder()
        .http_port(http_port)
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let (http, directory, ca) = (
        format!("127.0.0.1:{http_port}"),
        pebble.directory_url(),
        pebble.https_ca_file(),
    );
    let serve = start(&[
        "--acme-directory",
        &directory,
        "--acme-domain",
        "web.example.com",
        "--acme-directory-ca",
        ca.to_str().unwrap(),
        "--acme-state",
        state.path().to_str().unwrap(),
        "--acme-challenge",
        "http-01",
        "--acme-http-listen",
        &http,
        "--metrics",
        &metrics,
    ])
    .await;
    serve
        .wait_status("the name issued", |s| {
            s["acme"]["names"]["web.example.com"]["state"] == "valid"
        })
        .await;
    let root = pebble.issuing_root().await;
    tls_test::probe_trusting(serve.addr, "web.example.com", std::slice::from_ref(&root))
        .await
        .unwrap();
    let other = tls_test::plain_get(http.parse().unwrap(), "/.well-known/acme-challenge/abc")
        .await
        .unwrap();
    assert!(
        other.starts_with("HTTP/1.1 404"),
        "no answer for a host that is not ours: {other}"
    );
}

/// Two CAs: `--acme-directory` given twice, the first a Pebble that was stopped, the second
/// (with its own root, `,ca=`) serves every name; the status names the issuer and why it is
/// not the first.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_a_second_directory_serves_every_name_while_the_first_is_stopped() {
    let port = free_port();
    let stopped = tls_test::Pebble::builder()
        .tls_port(port)
        .start_required()
        .await;
    let (first, first_ca) = (stopped.directory_url(), stopped.https_ca_file());
    let first_ca_pem = std::fs::read(&first_ca).unwrap();
    drop(stopped);
    let pebble = tls_test::Pebble::builder()
        .tls_port(port)
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let kept = tempfile::tempdir().unwrap();
    let first_ca = kept.path().join("first-ca.pem");
    std::fs::write(&first_ca, first_ca_pem).unwrap();
    let listen = format!("127.0.0.1:{port}");
    let second = format!(
        "{},ca={}",
        pebble.directory_url(),
        pebble.https_ca_file().display()
    );
    let serve = start(&[
        "--listen",
        &listen,
        "--acme-directory",
        &first,
        "--acme-directory-ca",
        first_ca.to_str().unwrap(),
        "--acme-directory",
        &second,
        "--acme-domain",
        "a.example.com",
        "--acme-domain",
        "b.example.com",
        "--acme-state",
        state.path().to_str().unwrap(),
    ])
    .await;
    let status = serve
        .wait_status("both names issued by the second CA", |s| {
            ["a.example.com", "b.example.com"]
                .iter()
                .all(|n| s["acme"]["names"][n]["state"] == "valid")
        })
        .await;
    let root = pebble.issuing_root().await;
    for name in ["a.example.com", "b.example.com"] {
        let n = &status["acme"]["names"][name];
        assert_eq!(n["issuer"], pebble.directory_url().as_str(), "{n}");
        assert!(
            n["fallback_reason"]
                .as_str()
                .is_some_and(|r| r.contains(&first)),
            "{n}"
        );
        tls_test::probe_trusting(serve.addr, name, std::slice::from_ref(&root))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_eq!(status["acme"]["directory"], first.as_str());
    assert!(
        status["acme"]["account_error"]
            .as_str()
            .is_some_and(|e| e.contains(&first)),
        "{status}"
    );
}

/// DNS-01 through BIND 9 (RFC 2136 updates signed with TSIG): `--acme-domain '*.w.example.test'`
/// with `--acme-challenge dns-01`, Pebble's validator reading the record from that BIND. The
/// wildcard is served to `x.w.example.test`, verified against Pebble's root, and the zone is
/// left as it was.
#[cfg_attr(
    not(all(pebble, bind)),
    ignore = "needs Pebble and BIND 9 (apt install pebble bind9 bind9-dnsutils)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_dns_01_through_bind_serves_a_wildcard_and_leaves_the_zone_as_it_was() {
    let bind = tls_test::Bind::builder()
        .zone("example.test", &["*.w IN A 127.0.0.1"])
        .grant("name _acme-challenge.w.example.test. TXT")
        .start()
        .await
        .expect("BIND is needed (the test is ignored where it is not installed)");
    let zone = |records: Vec<String>| -> Vec<String> {
        records
            .into_iter()
            .filter(|r| !r.contains("\tSOA\t"))
            .collect()
    };
    let before = zone(bind.zone_records("example.test").await);
    let pebble = tls_test::Pebble::builder()
        .dns_server(bind.addr())
        .start_required()
        .await;
    let state = tempfile::tempdir().unwrap();
    let (directory, ca, server, key) = (
        pebble.directory_url(),
        pebble.https_ca_file(),
        bind.addr().to_string(),
        bind.key_file(tls_test::UPDATE_KEY),
    );
    let serve = start(&[
        "--acme-directory",
        &directory,
        "--acme-domain",
        "*.w.example.test",
        "--acme-directory-ca",
        ca.to_str().unwrap(),
        "--acme-state",
        state.path().to_str().unwrap(),
        "--acme-challenge",
        "dns-01",
        "--acme-dns-server",
        &server,
        "--acme-dns-tsig-key",
        key.to_str().unwrap(),
    ])
    .await;
    serve
        .wait_status("the wildcard issued", |s| {
            s["acme"]["names"]["*.w.example.test"]["state"] == "valid"
        })
        .await;
    let root = pebble.issuing_root().await;
    tls_test::probe_trusting(serve.addr, "x.w.example.test", std::slice::from_ref(&root))
        .await
        .unwrap();
    assert_eq!(zone(bind.zone_records("example.test").await), before);
}

/// ACME for an IP address (RFC 8738): `--acme-domain 127.0.0.2` with serve listening there,
/// validated by TLS-ALPN-01 at the address (the CA's server name is the address's
/// reverse-mapping name); `127.0.0.3` by HTTP-01 (`Host: 127.0.0.3`); and `::1` both ways
/// (`Host: [::1]`) where the machine has IPv6 loopback. A handshake without a server name, as
/// any client connecting to an address makes, is served the certificate for the address,
/// verified against Pebble's root for its IP SAN.
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_an_ip_address_is_ordered_and_served_to_handshakes_without_a_server_name() {
    let (tls_port, http_port) = (free_port(), free_port());
    let pebble = tls_test::Pebble::builder()
        .tls_port(tls_port)
        .http_port(http_port)
        .start_required()
        .await;
    let (directory, ca) = (pebble.directory_url(), pebble.https_ca_file());
    // (the address, where serve listens, how the CA's validation reaches it)
    let mut cases = vec![
        ("127.0.0.2", format!("127.0.0.2:{tls_port}"), None),
        (
            "127.0.0.3",
            format!("127.0.0.3:{}", free_port()),
            Some(format!("127.0.0.3:{http_port}")),
        ),
    ];
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        cases.push(("::1", format!("[::1]:{tls_port}"), None));
        cases.push((
            "::1",
            format!("[::1]:{}", free_port()),
            Some(format!("[::1]:{http_port}")),
        ));
    } else {
        eprintln!("::1 skipped: this machine has no IPv6 loopback");
    }
    let root = pebble.issuing_root().await;
    for (address, listen, http) in &cases {
        let state = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--listen",
            listen,
            "--acme-directory",
            &directory,
            "--acme-domain",
            address,
            "--acme-directory-ca",
            ca.to_str().unwrap(),
            "--acme-state",
            state.path().to_str().unwrap(),
        ];
        if let Some(http) = http {
            args.extend(["--acme-challenge", "http-01", "--acme-http-listen", http]);
        }
        let serve = start(&args).await;
        let status = serve
            .wait_status("the address issued", |s| {
                s["acme"]["names"][*address]["state"] == "valid"
                    && s["routes"][*address]["fingerprint_sha256"].is_string()
            })
            .await;
        let route = &status["routes"][*address];
        assert_eq!(route["names"][0], *address, "{route}");
        let verified = tls_test::probe_trusting(serve.addr, address, std::slice::from_ref(&root))
            .await
            .unwrap_or_else(|e| panic!("{address} ({listen}) without SNI: {e}"));
        assert_eq!(route["fingerprint_sha256"], verified.fingerprint);
        // A server name still gets the default (serve's self-signed localhost certificate).
        let named = tls_test::probe(serve.addr, "localhost").await.unwrap();
        assert_ne!(named.fingerprint, verified.fingerprint);
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
    assert_eq!(pebble.orders(), cases.len(), "{}", pebble.log());
}

/// Pebble validating TLS-ALPN-01 at `port`, with the two names the fleet tests order resolving
/// to 127.0.0.2 and 127.0.0.3: the replicas there, not the first one (which leads), answer
/// the CA's validations.
async fn pebble_validating_at_followers(port: u16) -> (tls_test::Pebble, [&'static str; 2]) {
    let pebble = tls_test::Pebble::builder()
        .tls_port(port)
        .start_required()
        .await;
    let names = ["a.example.com", "b.example.com"];
    pebble
        .add_a(names[0], std::net::Ipv4Addr::new(127, 0, 0, 2))
        .await;
    pebble
        .add_a(names[1], std::net::Ipv4Addr::new(127, 0, 0, 3))
        .await;
    (pebble, names)
}

/// ACME for a fleet: three `serve --k8s-shared --acme-directory` replicas on 127.0.0.1, .2 and
/// .3, each through its own API endpoint; the first leads and orders, the CA's validation of
/// each name reaches another replica (challtestsrv points the names there), every replica
/// serves every name and shows the leader's ACME status. Restarted, the fleet orders nothing
/// (orders counted in Pebble's log).
#[cfg_attr(
    not(pebble),
    ignore = "needs Pebble, the ACME test server (apt install pebble)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_fleet_orders_once_every_replica_answers_and_serves_and_a_restart_orders_nothing() {
    let port = free_port();
    let (pebble, names) = pebble_validating_at_followers(port).await;
    let api = tls_test::KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (directory, ca) = (pebble.directory_url(), pebble.https_ca_file());
    let root = pebble.issuing_root().await;
    let start = |n: u8| {
        let (api, dir, directory, ca) = (&api, dir.path(), directory.clone(), ca.clone());
        async move {
            let endpoint = api.endpoint().await;
            let id = format!("web-{n}");
            let kubeconfig = kubeconfig_at(&endpoint.url(), &dir.join(&id));
            let listen = format!("127.0.0.{n}:{port}");
            let args = [
                "--listen",
                &listen,
                "--acme-directory",
                &directory,
                "--acme-domain",
                names[0],
                "--acme-domain",
                names[1],
                "--acme-directory-ca",
                ca.to_str().unwrap(),
                "--k8s-shared",
                "default/web",
                "--identity",
                &id,
            ];
            let serve = start_with_env(&args, &[("KUBECONFIG", kubeconfig.as_os_str())]).await;
            (endpoint, serve)
        }
    };
    let issued = |s: &serde_json::Value| {
        names.iter().all(|n| {
            s["acme"]["names"][n]["state"] == "valid"
                && s["routes"][n]["fingerprint_sha256"].is_string()
        })
    };
    for round in ["first start", "restart"] {
        let first = start(1).await;
        first
            .1
            .wait_status("the first replica leads", |s| {
                s["leader"]["leading"] == true
            })
            .await;
        let replicas = [first, start(2).await, start(3).await];
        for (_, serve) in &replicas {
            let status = serve.wait_status("both names issued", issued).await;
            assert_eq!(status["leader"]["holder"], "web-1", "{round}: {status}");
            assert!(status["acme"]["account"].is_string(), "{round}: {status}");
            for name in names {
                tls_test::probe_trusting(serve.addr, name, std::slice::from_ref(&root))
                    .await
                    .unwrap_or_else(|e| panic!("{round}: {name} at {}: {e}", serve.addr));
            }
        }
        assert_eq!(
            pebble.orders(),
            2,
            "{round}: one order per name for the fleet"
        );
        for (_, serve) in replicas {
            serve.signal("-TERM");
            assert_eq!(serve.exit_code().await, Some(0));
        }
    }
    assert!(
        api.get("secrets", "default", "web-acme-a.example.com")
            .is_some()
    );
}

/// The etcd value of `cert`: what the README's `etcdctl put` writes.
fn etcd_value(cert: &TestCert) -> Vec<u8> {
    tls_rotation::etcd::value(&cert.chain_pem, &cert.key_pem, None).into_bytes()
}

#[tokio::test]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcd_cert_serves_the_certificate_at_its_key_and_each_put_after() {
    let Some(cluster) = tls_test::EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("serve-cert");
    let ca = TestCa::new("serve etcd");
    let [first, second]: [TestCert; 2] = ca.leaves(&["localhost"]);
    cluster.put(&format!("{prefix}certs/web"), &etcd_value(&first));
    let endpoints = cluster.endpoints().join(",");
    let serve = start(&[
        "--etcd",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--etcd-cert",
        "web",
    ])
    .await;
    let status = serve.status().await;
    assert_eq!(status["fingerprint_sha256"], first.fingerprint);

    // A bad value keeps the certificate; the next good one is served.
    cluster.put(&format!("{prefix}certs/web"), b"{\"tls.crt\": 1}");
    let status = serve
        .wait_status("the bad value reported", |s| {
            s["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("certs/web"))
        })
        .await;
    assert_eq!(status["fingerprint_sha256"], first.fingerprint);
    cluster.put(&format!("{prefix}certs/web"), &etcd_value(&second));
    serve
        .wait_status("the second certificate", |s| {
            s["fingerprint_sha256"] == second.fingerprint
        })
        .await;
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcd_certs_serves_every_certificate_under_the_prefix_by_its_names() {
    let Some(cluster) = tls_test::EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("serve-certs");
    let ca = TestCa::new("serve etcd routes");
    let (a, b) = (ca.leaf(&["a.example.com"]), ca.leaf(&["b.example.com"]));
    cluster.put(&format!("{prefix}certs/a"), &etcd_value(&a));
    cluster.put(&format!("{prefix}certs/b"), &etcd_value(&b));
    let endpoints = cluster.endpoints().join(",");
    let serve = start(&[
        "--etcd",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--etcd-certs",
    ])
    .await;
    // Listening means listed: both routes are there at once.
    let status = serve.status().await;
    assert_eq!(status["routes"]["a"]["fingerprint_sha256"], a.fingerprint);
    assert_eq!(
        status["routes"]["b"]["names"],
        serde_json::json!(["b.example.com"])
    );
    assert_eq!(
        served_for(serve.addr, "a.example.com").await,
        Some(a.fingerprint.clone())
    );
    assert_eq!(
        served_for(serve.addr, "b.example.com").await,
        Some(b.fingerprint.clone())
    );

    cluster.delete(&format!("{prefix}certs/a"));
    let c = ca.leaf(&["c.example.com"]);
    cluster.put(&format!("{prefix}certs/c"), &etcd_value(&c));
    serve
        .wait_status("a removed, c added", |s| {
            s["routes"].get("a").is_none()
                && s["routes"]["c"]["fingerprint_sha256"] == c.fingerprint
        })
        .await;
    assert_ne!(
        served_for(serve.addr, "a.example.com").await,
        Some(a.fingerprint.clone())
    );
    assert_eq!(
        served_for(serve.addr, "c.example.com").await,
        Some(c.fingerprint.clone())
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

#[tokio::test]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcd_over_tls_with_a_client_certificate_from_files() {
    let Some(cluster) = tls_test::EtcdCluster::builder().members(1).tls().start() else {
        return;
    };
    let served = TestCa::new("serve etcd tls").leaf(&["localhost"]);
    cluster.put("/tls-rotation/certs/web", &etcd_value(&served));
    let dir = tempfile::tempdir().unwrap();
    let client = cluster.ca().client_leaf("serve");
    let (cert, key) = (
        dir.path().join("client.pem"),
        dir.path().join("client-key.pem"),
    );
    std::fs::write(&cert, &client.chain_pem).unwrap();
    std::fs::write(&key, &client.key_pem).unwrap();
    let endpoints = cluster.endpoints().join(",");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (ca, cert, key) = (path(&cluster.ca_file()), path(&cert), path(&key));
    let serve = start(&[
        "--etcd",
        &endpoints,
        "--etcd-cert",
        "web",
        "--etcd-ca",
        &ca,
        "--etcd-client-cert",
        &cert,
        "--etcd-client-key",
        &key,
    ])
    .await;
    assert_eq!(
        serve.status().await["fingerprint_sha256"],
        served.fingerprint
    );
    serve.signal("-TERM");
    assert_eq!(serve.exit_code().await, Some(0));
}

/// Three `serve --etcd-shared` replicas with a 3 s writer lease, self-signed with a CA.
async fn etcd_fleet(cluster: &tls_test::EtcdCluster, prefix: &str, extra: &[&str]) -> Vec<Serve> {
    let endpoints = cluster.endpoints().join(",");
    let mut replicas = Vec::new();
    for id in ["web-0", "web-1", "web-2"] {
        let mut args = vec![
            "--etcd",
            &endpoints,
            "--etcd-prefix",
            prefix,
            "--etcd-shared",
            "web",
            "--identity",
            id,
            "--etcd-lease-ttl",
            "3s",
            "--self-signed-ca",
        ];
        args.extend_from_slice(extra);
        replicas.push(start(&args).await);
    }
    replicas
}

/// Waits until the live replicas (`None`: stopped or killed) serve one leaf and name one
/// holder, exactly one of them leading; returns the statuses (in the replicas' order).
async fn etcd_fleet_agrees(replicas: &[Option<Serve>]) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut statuses = Vec::new();
        for serve in replicas.iter().flatten() {
            statuses.push(serve.status().await);
        }
        let agreed = statuses.iter().all(|s| {
            s["fingerprint_sha256"] == statuses[0]["fingerprint_sha256"]
                && s["leader"]["holder"] == statuses[0]["leader"]["holder"]
                && s["leader"]["round"] == statuses[0]["leader"]["round"]
        });
        let leading = statuses
            .iter()
            .filter(|s| s["leader"]["leading"] == true)
            .count();
        if agreed && leading == 1 {
            let mut all = statuses.into_iter();
            return replicas
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map_or(serde_json::Value::Null, |_| all.next().unwrap())
                })
                .collect();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replicas did not agree: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn leading(statuses: &[serde_json::Value]) -> usize {
    statuses
        .iter()
        .position(|s| s["leader"]["leading"] == true)
        .expect("a leader")
}

/// Handshakes with every address (those of replicas meant to be up), one after another until
/// `stop`, counting failures.
fn etcd_fleet_load(
    addrs: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    use std::sync::atomic::Ordering;
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            let now = addrs.lock().unwrap().clone();
            for addr in &now {
                match tls_test::served_as(*addr, "localhost").await {
                    Ok(_) => ok += 1,
                    Err(err) => {
                        eprintln!("handshake with {addr} failed: {err}");
                        failed += 1;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (ok, failed)
    })
}

/// The writer killed, the next one paused past its lease and resumed, every replica restarted:
/// one CA and one leaf throughout, none generated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcd_shared_keeps_one_leaf_through_a_killed_and_a_paused_writer_and_a_restart_of_all() {
    let Some(cluster) = tls_test::EtcdCluster::shared() else {
        return;
    };
    let prefix = cluster.prefix("serve-fleet");
    let mut replicas: Vec<Option<Serve>> = etcd_fleet(cluster, &prefix, &[])
        .await
        .into_iter()
        .map(Some)
        .collect();
    let statuses = etcd_fleet_agrees(&replicas).await;
    let (leaf, ca) = (
        statuses[0]["fingerprint_sha256"].clone(),
        statuses[0]["ca_fingerprints_sha256"].clone(),
    );
    assert_eq!(ca.as_array().unwrap().len(), 1);
    assert!(
        statuses[0]["origin"]
            .as_str()
            .unwrap()
            .starts_with(&format!("etcd {prefix}fleets/web/tls at revision ")),
        "{}",
        statuses[0]["origin"]
    );

    // SIGKILL of the writer: another leads within the lease TTL (3 s) and one retry (1 s).
    let first = leading(&statuses);
    let round = statuses[first]["leader"]["round"].as_u64().unwrap();
    replicas[first].take().unwrap().signal("-KILL");
    let killed = tokio::time::Instant::now();
    let statuses = etcd_fleet_agrees(&replicas).await;
    let failover = killed.elapsed();
    let second = leading(&statuses);
    assert!(statuses[second]["leader"]["round"].as_u64().unwrap() > round);
    assert!(
        failover < Duration::from_secs(3 + 1 + 1),
        "failover took {failover:?}"
    );
    for status in statuses.iter().filter(|s| !s.is_null()) {
        assert_eq!(status["fingerprint_sha256"], leaf, "nothing generated");
        assert_eq!(status["ca_fingerprints_sha256"], ca);
    }

    // SIGSTOP of the new writer past its lease, then SIGCONT: the last replica leads; the one
    // resumed follows, and the fleet still serves the one leaf.
    let paused = replicas[second].as_ref().unwrap();
    paused.signal("-STOP");
    let other = (0..3).find(|i| *i != first && *i != second).unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while replicas[other].as_ref().unwrap().status().await["leader"]["leading"] != true {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no writer after the pause"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    paused.signal("-CONT");
    let statuses = etcd_fleet_agrees(&replicas).await;
    assert_eq!(leading(&statuses), other);
    assert_eq!(statuses[second]["leader"]["leading"], false);
    for status in statuses.iter().filter(|s| !s.is_null()) {
        assert_eq!(status["fingerprint_sha256"], leaf);
        assert_eq!(status["ca_fingerprints_sha256"], ca);
    }

    // Every replica restarted at once: the same leaf and CA.
    for serve in replicas.into_iter().flatten() {
        serve.signal("-TERM");
        assert_eq!(serve.exit_code().await, Some(0));
    }
    let replicas: Vec<Option<Serve>> = etcd_fleet(cluster, &prefix, &[])
        .await
        .into_iter()
        .map(Some)
        .collect();
    for status in etcd_fleet_agrees(&replicas).await {
        assert_eq!(
            status["fingerprint_sha256"], leaf,
            "a restart generates nothing"
        );
        assert_eq!(status["ca_fingerprints_sha256"], ca);
    }
}

/// `serve --etcd-shared` with `--acme-*` and `--seal-key`: three replicas against Pebble on
/// one port (127.0.0.1, .2, .3; the CA validates each name at a follower). The leader is killed
/// (SIGKILL) once its first order is stored, the CA not yet told to validate: a survivor leads
/// within the lease, resumes that order, and every survivor serves each name a chain of
/// Pebble's, one order per name in all; the status names the new leader on every survivor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(all(pebble, etcd)),
    ignore = "needs Pebble and etcd (apt-get install pebble etcd-server etcd-client)"
)]
async fn etcd_shared_acme_orders_each_name_once_and_a_killed_leaders_order_is_resumed() {
    let cluster = tls_test::EtcdCluster::shared().expect("etcd");
    let prefix = cluster.prefix("serve-acme");
    let port = free_port();
    let (pebble, names) = pebble_validating_at_followers(port).await;
    let layer = pebble.layer().await;
    layer.hold_next("/chalZ/", false);
    let (directory, ca, root) = (
        layer.directory_url(),
        pebble.https_ca_file(),
        pebble.issuing_root().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir.path().join("seal.key"));
    let endpoints = cluster.endpoints().join(",");
    let mut replicas = Vec::new();
    for n in 1..=3 {
        let (listen, id) = (format!("127.0.0.{n}:{port}"), format!("web-{n}"));
        let args = [
            "--listen",
            &listen,
            "--etcd",
            &endpoints,
            "--etcd-prefix",
            &prefix,
            "--etcd-shared",
            "web",
            "--identity",
            &id,
            "--etcd-lease-ttl",
            "2s",
            "--seal-key",
            key.to_str().unwrap(),
            "--acme-directory",
            &directory,
            "--acme-domain",
            names[0],
            "--acme-domain",
            names[1],
            "--acme-directory-ca",
            ca.to_str().unwrap(),
        ];
        let serve = start(&args).await;
        if n == 1 {
            serve
                .wait_status("the first replica leads", |s| {
                    s["leader"]["leading"] == true
                })
                .await;
        }
        replicas.push(serve);
    }
    layer.until_held().await;
    let round = replicas[0].status().await["leader"]["round"]
        .as_u64()
        .unwrap();
    replicas.remove(0).signal("-KILL");

    for serve in &replicas {
        let status = serve
            .wait_status("both names issued and served after the failover", |s| {
                names.iter().all(|n| {
                    s["acme"]["names"][n]["state"] == "valid"
                        && s["routes"][n]["fingerprint_sha256"].is_string()
                }) && s["leader"]["round"].as_u64() > Some(round)
            })
            .await;
        assert_ne!(status["leader"]["holder"], "web-1", "{status}");
        for name in names {
            let served = tls_test::probe_trusting(serve.addr, name, std::slice::from_ref(&root))
                .await
                .unwrap_or_else(|e| panic!("{name} at {}: {e}", serve.addr));
            assert!(served.chain.len() >= 2, "{name}: leaf and intermediate");
        }
    }
    assert_eq!(
        pebble.orders(),
        names.len(),
        "one order per name: the killed leader's was resumed"
    );
    let stored = cluster.etcdctl(&["get", "--prefix", &prefix]);
    assert!(!stored.contains("PRIVATE KEY"), "{stored}");
    assert!(stored.contains("\"tls.key.sealed\""), "{stored}");
}

/// etcd's own faults under a `serve --etcd-shared --seal-key` fleet: its leader member
/// killed, then two of three members down (no quorum). No handshake fails; without a quorum
/// nobody writes; all recover by themselves. No private key is readable in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(etcd),
    ignore = "needs etcd (apt-get install etcd-server etcd-client)"
)]
async fn etcd_shared_rides_out_etcds_leader_killed_and_a_lost_quorum() {
    let Some(cluster) = tls_test::EtcdCluster::builder().start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir.path().join("seal.key"));
    let key = key.to_str().unwrap();
    let mut replicas: Vec<Option<Serve>> =
        etcd_fleet(&cluster, "/tls-rotation/", &["--seal-key", key])
            .await
            .into_iter()
            .map(Some)
            .collect();
    let statuses = etcd_fleet_agrees(&replicas).await;
    let leaf = statuses[0]["fingerprint_sha256"].clone();
    assert_eq!(statuses[0]["seal"]["state"], "open");
    let stored = cluster.etcdctl(&["get", "--prefix", "/tls-rotation/"]);
    assert!(
        !stored.contains("PRIVATE KEY"),
        "a private key readable in etcd:\n{stored}"
    );

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addrs = Arc::new(std::sync::Mutex::new(
        replicas
            .iter()
            .flatten()
            .map(|s| s.addr)
            .collect::<Vec<_>>(),
    ));
    let load = etcd_fleet_load(addrs.clone(), stop.clone());

    // etcd's leader member killed: a new etcd leader; the fleet writes again (a new writer
    // takes the key once the serve writer is killed too).
    let member = cluster.leader();
    cluster.kill(member);
    cluster.wait_healthy();
    let writer = leading(&statuses);
    let round = statuses[writer]["leader"]["round"].as_u64().unwrap();
    let killed = replicas[writer].take().unwrap();
    addrs.lock().unwrap().retain(|a| *a != killed.addr);
    killed.signal("-KILL");
    let statuses = etcd_fleet_agrees(&replicas).await;
    let writer = leading(&statuses);
    assert!(
        statuses[writer]["leader"]["round"].as_u64().unwrap() > round,
        "a new round written"
    );
    cluster.restart(member);

    // Two of three members down: no quorum, nobody writes, everybody serves.
    let down: Vec<usize> = (0..3).filter(|m| *m != cluster.leader()).collect();
    for m in &down {
        cluster.kill(*m);
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut leading = 0;
        for serve in replicas.iter().flatten() {
            let status = serve.status().await;
            assert_eq!(status["fingerprint_sha256"], leaf);
            leading += usize::from(status["leader"]["leading"] == true);
        }
        if leading == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a writer without a quorum"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One member back: a quorum, a writer again, the same leaf.
    cluster.restart(down[0]);
    let statuses = etcd_fleet_agrees(&replicas).await;
    for status in statuses.iter().filter(|s| !s.is_null()) {
        assert_eq!(status["fingerprint_sha256"], leaf, "nothing generated");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(ok > 10);
    assert_eq!(failed, 0, "no handshake failed ({ok} succeeded)");
    cluster.restart(down[1]);
}
