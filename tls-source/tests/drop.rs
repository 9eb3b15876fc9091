//! A source dropped while a read is in flight leaves nothing behind: the read finishes on its
//! blocking thread and is discarded, the watch thread stops, and the blocking thread goes.
//! Its own test binary: it counts the process's threads.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _};
use tls_source::FileSource;
use tls_test::{KubeDir, TestCa};

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line["Threads:".len()..].trim().parse().unwrap()
}

/// Waits until the process has `n` threads again; what it has at the end.
fn settle_to(n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads() != n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    threads()
}

#[test]
fn a_source_dropped_mid_read_leaves_no_thread_or_task_behind() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_millis(10))
        .build()
        .unwrap();
    let ca = TestCa::new("drop");
    let cert = ca.leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    // A large chain file (many copies of the chain, under the 1 MiB limit), so a read takes a
    // while: there is time to drop the source while it runs.
    let chain = cert.chain_pem.repeat(900_000 / cert.chain_pem.len());
    kube.write(&[
        ("tls.crt", chain.as_bytes()),
        ("tls.key", cert.key_pem.as_bytes()),
    ])
    .unwrap();
    let baseline = threads();

    runtime.block_on(async {
        let mut source = FileSource::kubernetes_dir(kube.path()).build();
        let trigger = source.trigger();
        source.next().await.unwrap().unwrap();
        // The next poll sets the watch up (a thread) and starts the triggered read (another).
        trigger.trigger();
        let polled = source.next().now_or_never();
        assert!(polled.is_none(), "the read is still running");
        assert!(
            threads() > baseline,
            "a watch thread and a reading thread run"
        );
        drop(source);
    });
    assert_eq!(
        settle_to(baseline),
        baseline,
        "the watch thread and the blocking thread are gone"
    );
    assert_eq!(runtime.metrics().num_alive_tasks(), 0, "no task is left");
}
