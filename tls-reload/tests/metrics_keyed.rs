//! Keyed routes (Secrets by the thousand) leave no series behind: their metrics are one series
//! for all of them (`route="(keyed)"`, the earliest `notAfter`), so routes that come and go do
//! not grow what a scrape returns, and a removed route's expiry never fires an alert.
//!
//! One test in this binary: the recorder is the process's global one.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusBuilder;
use tls_reload::Reloader;
use tls_source::{Keyed, KeyedUpdate};
use tls_test::{PATIENCE, TestCa};

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_routes_share_one_series_that_follows_the_earliest_expiry() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let series = || {
        handle
            .render()
            .lines()
            .filter(|l| !l.starts_with('#') && l.starts_with("tls_"))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let gauge = || {
        handle.render().lines().find_map(|l| {
            l.strip_prefix("tls_certificate_expiration_timestamp_seconds{")
                .filter(|rest| rest.contains("route=\"(keyed)\""))
                .and_then(|rest| rest.rsplit_once(' '))
                .and_then(|(_, v)| v.parse::<f64>().ok())
        })
    };
    let ca = TestCa::new("keyed metrics");
    let now = SystemTime::now();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let put = |key: String, days: u64| {
        let cert = ca.leaf_valid(
            &[&format!("{key}.example.com")],
            now - Duration::from_secs(60),
            now + Duration::from_secs(days * 86_400),
        );
        tx.unbounded_send(Ok(Keyed {
            key,
            update: KeyedUpdate::Put(common::bundle(&cert)),
        }))
        .unwrap();
    };
    let remove = |key: String| {
        tx.unbounded_send(Ok(Keyed {
            key,
            update: KeyedUpdate::Remove,
        }))
        .unwrap();
    };
    for i in 0..20 {
        put(format!("a{i:02}"), 30 + i);
    }
    let reloader = Reloader::builder()
        .crypto_provider(common::provider())
        .routes(rx)
        .spawn_routes()
        .unwrap();
    let routes = |n: usize| {
        let status = reloader.status();
        async move {
            tls_test::wait_for(status, "the routes", |s| {
                s.routes.len() == n && s.routes.values().all(|r| r.current.is_some())
            })
            .await;
        }
    };
    routes(20).await;
    let earliest = |key: &str| {
        unix(
            reloader.status().borrow().routes[key]
                .current
                .as_ref()
                .unwrap()
                .not_after,
        )
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while gauge() != Some(earliest("a00")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = series();
    assert!(
        before.iter().all(|s| !s.contains("route=\"a")),
        "no series of a keyed route of its own: {before:#?}"
    );

    // Twenty routes go, twenty others come, the earliest among them later than before.
    for i in 0..20 {
        remove(format!("a{i:02}"));
    }
    for i in 0..20 {
        put(format!("b{i:02}"), 60 + i);
    }
    tls_test::wait_for(reloader.status(), "the new routes", |s| {
        s.routes.len() == 20 && s.routes.keys().all(|k| k.starts_with('b'))
    })
    .await;
    routes(20).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while gauge() != Some(earliest("b00")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(series(), before, "churn leaves no series behind");

    // Every keyed route gone: nothing expires (+Inf, which no expiry alert fires on).
    for i in 0..20 {
        remove(format!("b{i:02}"));
    }
    tls_test::wait_for(reloader.status(), "no routes", |s| s.routes.is_empty()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while gauge() != Some(f64::INFINITY) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
