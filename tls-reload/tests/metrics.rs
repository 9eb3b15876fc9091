//! The metrics (feature `metrics`) as an exporter would read them: a reloader on kubelet-style
//! files, a real handshake, then a rejected pair, garbage, an expired certificate and a good
//! one again, then one that expires while served, each reflected in the counters and gauges.
//!
//! One test in this binary: the recorder is the process's global one.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tls_test::TestCa;

use common::{Harness, Mode, write_kube};

/// The Prometheus exporter's text, as a scrape would read it.
struct Exported(PrometheusHandle);

impl Exported {
    /// The value of the series `name` whose labels include every one of `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.0.render();
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (series_name, rest) = series.split_once('{').unwrap_or((series, "}"));
                let matches = series_name == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
                matches.then(|| value.parse().ok()).flatten()
            })
    }

    async fn eventually(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        let deadline = tokio::time::Instant::now() + tls_test::PATIENCE;
        loop {
            let got = self.value(name, labels);
            if got == Some(want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}{labels:?} is {got:?}, not {want}:\n{}",
                self.0.render()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn unix(t: std::time::SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_rejections_expiry_and_readiness_are_recorded() {
    let exported = Exported(
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this test binary"),
    );

    let ca = TestCa::new("metrics");
    let now = std::time::SystemTime::now();
    let a = ca.leaf(&["localhost"]);
    // Another expiry, so the gauge is seen to move.
    let b = ca.leaf_valid(
        &["localhost"],
        now - Duration::from_secs(60),
        now + Duration::from_secs(30 * 86400),
    );
    let harness = Harness::kube(&a, Mode::Notify).await;
    let source = format!("files:{}", harness.kube.file("tls.crt").display());
    let default = [("route", ""), ("source", source.as_str())];

    exported.eventually("tls_reload_ready", &[], 1.0).await;
    // The counters exist at 0 before their first event, for every known reason, so that an
    // `increase()` alert sees the first one.
    for reason in [
        "key_mismatch",
        "parse",
        "expired",
        "served_expired",
        "internal",
    ] {
        assert_eq!(
            exported.value(
                "tls_reload_rejections_total",
                &[("route", ""), ("reason", reason)]
            ),
            Some(0.0),
            "{reason} at 0 from the start:\n{}",
            exported.0.render()
        );
    }
    assert_eq!(
        exported.value("tls_source_errors_total", &[("route", "")]),
        Some(0.0)
    );
    exported
        .eventually("tls_reload_installs_total", &[("route", "")], 1.0)
        .await;
    let not_after = unix(harness.status().current.expect("installed").not_after);
    let expiry = exported.value("tls_certificate_expiration_timestamp_seconds", &default);
    assert_eq!(expiry, Some(not_after), "the served leaf's notAfter");
    let loaded = exported
        .value(
            "tls_reload_last_success_timestamp_seconds",
            &[("route", "")],
        )
        .expect("a last success");
    let now = unix(now);
    assert!((now - loaded).abs() < 60.0, "{loaded} is about now ({now})");

    // A pair whose key is of another certificate: a rejection, nothing installed.
    write_kube(&harness.kube, &a.with_key_of(&b));
    exported
        .eventually(
            "tls_reload_rejections_total",
            &[("route", ""), ("reason", "key_mismatch")],
            1.0,
        )
        .await;
    // Garbage: a source error, and a rejection for parse.
    harness
        .kube
        .write(&[("tls.crt", b"not PEM"), ("tls.key", b"not PEM")])
        .unwrap();
    exported
        .eventually(
            "tls_reload_rejections_total",
            &[("route", ""), ("reason", "parse")],
            1.0,
        )
        .await;
    assert!(exported.value("tls_source_errors_total", &[("route", "")]) >= Some(1.0));
    // An expired certificate.
    write_kube(&harness.kube, &ca.expired_leaf(&["localhost"]));
    exported
        .eventually(
            "tls_reload_rejections_total",
            &[("route", ""), ("reason", "expired")],
            1.0,
        )
        .await;
    assert_eq!(
        exported.value("tls_reload_installs_total", &[("route", "")]),
        Some(1.0),
        "nothing bad was installed"
    );
    assert_eq!(harness.served().await, a.fingerprint);

    // A good one: installed, its expiry recorded.
    write_kube(&harness.kube, &b);
    harness.expect_served(&b).await;
    exported
        .eventually("tls_reload_installs_total", &[("route", "")], 2.0)
        .await;
    let not_after = unix(harness.status().current.expect("installed").not_after);
    assert_ne!(Some(not_after), expiry, "b expires before a");
    assert_eq!(
        exported.value("tls_certificate_expiration_timestamp_seconds", &default),
        Some(not_after)
    );

    // A certificate that expires while served: counted as served_expired.
    let now = std::time::SystemTime::now();
    let short = ca.leaf_valid(
        &["localhost"],
        now - Duration::from_secs(60),
        now + Duration::from_secs(2),
    );
    write_kube(&harness.kube, &short);
    harness.expect_served(&short).await;
    exported
        .eventually(
            "tls_reload_rejections_total",
            &[("route", ""), ("reason", "served_expired")],
            1.0,
        )
        .await;
}
