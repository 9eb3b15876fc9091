//! The Lease and shared-store metrics (feature `metrics`), as the Prometheus exporter renders
//! them: a replica that leads says so, with its round, and its fenced writes are counted.
//!
//! One test in this binary: the recorder is the process's global one.

mod common;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use tls_k8s::SharedSelfSigned;
use tls_selfsigned::SelfSigned;
use tls_test::{KubeApi, PATIENCE};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_and_fenced_writes_are_recorded() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let api = KubeApi::start().await;
    let generator = SelfSigned::builder()
        .dns_name("localhost")
        .ca()
        .build()
        .unwrap();
    let token = CancellationToken::new();
    let shared = SharedSelfSigned::new(common::client(&api), "default", "tls", "a", generator)
        .lease_timing(
            Duration::from_millis(1500),
            Duration::from_millis(1000),
            Duration::from_millis(200),
        )
        .start(&token);
    let reloader = tls_reload::Reloader::builder()
        .crypto_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .spawn(shared)
        .unwrap();
    reloader.ready_timeout(PATIENCE).await.unwrap();
    let wanted = [
        "tls_lease_leading{lease=\"tls-writer\"} 1",
        "tls_lease_round{lease=\"tls-writer\"} 0",
        // The CA Secret, then the TLS Secret.
        "tls_shared_writes_total{secret=\"default/tls-ca\",outcome=\"accepted\"} 1",
        "tls_shared_writes_total{secret=\"default/tls\",outcome=\"accepted\"} 1",
    ];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = handle.render();
        if wanted.iter().all(|w| text.contains(w)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped, it no longer leads.
    token.cancel();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !handle
        .render()
        .contains("tls_lease_leading{lease=\"tls-writer\"} 0")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
