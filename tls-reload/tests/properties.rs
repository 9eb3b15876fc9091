//! A property test: random sequences of what happens to certificate files (kubelet swaps,
//! in-place writes whole or in chunks, truncation, deletion, a chmod that makes the key
//! unreadable, rename, the directory removed and laid out again, garbage, a mismatched pair,
//! an expired certificate) against a running
//! `FileSource` and reloader, with a real handshake after every step:
//!
//! - no handshake fails, and each is served one of the valid certificates written so far, with
//!   its whole chain (leaf and intermediate): never a mismatched pair (the client checks the
//!   handshake signature against the leaf), never a partial chain, never bad input;
//! - once the writes stop, if what is left on disk is a valid pair, it is served (a pair that
//!   was on disk only for the moment before garbage replaced it may never be read; what is
//!   served is then still one of the valid pairs written).
//!
//! Each case is a few hundred milliseconds. `TLS_ROTATION_PROPTEST_CASES` sets how many (default
//! 24); a failing case shrinks to a short, readable sequence of `Op`s.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use tls_reload::Reloader;
use tls_source::FileSource;
use tls_test::{KubeDir, TestCa, TestCert, TestServer};

/// How many valid pairs the operations pick from.
const PAIRS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// The kubelet's swap of a whole valid pair.
    Kubelet(usize),
    /// Both files overwritten in place, certificate then key.
    InPlace(usize),
    /// The same, each file written in chunks of this many bytes with short pauses.
    InPlaceChunks(usize, usize),
    /// The certificate file truncated to nothing.
    Truncate,
    /// Both visible files deleted.
    Delete,
    /// The key file made unreadable (mode 000; root reads it anyway).
    Chmod,
    /// A valid pair renamed over both files (as `mv`: plain files replace the links).
    Rename(usize),
    /// The directory removed, then laid out again by the kubelet with a valid pair.
    Recreate(usize),
    /// Garbage in both files, by a kubelet swap.
    Garbage,
    /// The certificate of one pair with the key of another, by a kubelet swap.
    Mismatched(usize, usize),
    /// A pair that is not valid now, by a kubelet swap: expired yesterday, expired in 1951, not
    /// valid before 9999, or with its notAfter before its notBefore.
    Expired(usize),
}

impl Op {
    /// The pair this operation leaves valid on disk, if it writes one (anything else leaves
    /// the files invalid).
    fn writes_valid(&self) -> Option<usize> {
        match self {
            Self::Kubelet(i)
            | Self::InPlace(i)
            | Self::InPlaceChunks(i, _)
            | Self::Rename(i)
            | Self::Recreate(i) => Some(*i),
            _ => None,
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let pair = 0..PAIRS;
    prop_oneof![
        3 => pair.clone().prop_map(Op::Kubelet),
        2 => pair.clone().prop_map(Op::InPlace),
        2 => (pair.clone(), 64usize..400).prop_map(|(i, c)| Op::InPlaceChunks(i, c)),
        1 => Just(Op::Truncate),
        1 => Just(Op::Delete),
        1 => Just(Op::Chmod),
        1 => pair.clone().prop_map(Op::Rename),
        1 => pair.clone().prop_map(Op::Recreate),
        1 => Just(Op::Garbage),
        1 => (pair.clone(), pair).prop_map(|(a, b)| Op::Mismatched(a, b)),
        1 => (0..INVALID).prop_map(Op::Expired),
    ]
}

struct World {
    kube: KubeDir,
    pairs: Vec<TestCert>,
    other: TestCert,
    invalid: Vec<TestCert>,
}

impl World {
    fn kubelet(&self, cert: &[u8], key: &[u8]) {
        // The kubelet owns its directory: visible names are its links again.
        for name in ["tls.crt", "tls.key"] {
            let path = self.kube.file(name);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_symlink()) {
                std::fs::remove_file(&path).unwrap();
            }
        }
        self.kube
            .write(&[("tls.crt", cert), ("tls.key", key)])
            .unwrap();
    }

    fn in_place(path: &Path, content: &[u8], chunk: Option<usize>) {
        use std::io::Write as _;
        // An operator writing in place first makes the file writable again (after a chmod).
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt as _;
            if meta.permissions().mode() & 0o600 != 0o600 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        match chunk {
            None => file.write_all(content).unwrap(),
            Some(size) => {
                for part in content.chunks(size) {
                    file.write_all(part).unwrap();
                    file.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(3));
                }
            }
        }
    }

    fn apply(&self, op: &Op) {
        let pem = |i: usize| {
            (
                self.pairs[i].chain_pem.as_bytes(),
                self.pairs[i].key_pem.as_bytes(),
            )
        };
        match op {
            Op::Kubelet(i) => {
                let (cert, key) = pem(*i);
                self.kubelet(cert, key);
            }
            Op::InPlace(i) | Op::InPlaceChunks(i, _) => {
                let chunk = match op {
                    Op::InPlaceChunks(_, size) => Some(*size),
                    _ => None,
                };
                let (cert, key) = pem(*i);
                Self::in_place(&self.kube.file("tls.crt"), cert, chunk);
                Self::in_place(&self.kube.file("tls.key"), key, chunk);
            }
            Op::Truncate => {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(self.kube.file("tls.crt"));
            }
            Op::Delete => {
                for name in ["tls.crt", "tls.key"] {
                    let _ = std::fs::remove_file(self.kube.file(name));
                }
            }
            Op::Chmod => {
                use std::os::unix::fs::PermissionsExt as _;
                let _ = std::fs::set_permissions(
                    self.kube.file("tls.key"),
                    std::fs::Permissions::from_mode(0o000),
                );
            }
            Op::Rename(i) => {
                let (cert, key) = pem(*i);
                tls_test::replace_by_rename(&self.kube.file("tls.crt"), cert).unwrap();
                tls_test::replace_by_rename(&self.kube.file("tls.key"), key).unwrap();
            }
            Op::Recreate(i) => {
                std::fs::remove_dir_all(self.kube.path()).unwrap();
                let (cert, key) = pem(*i);
                KubeDir::new(self.kube.path())
                    .unwrap()
                    .write(&[("tls.crt", cert), ("tls.key", key)])
                    .unwrap();
            }
            Op::Garbage => self.kubelet(b"-----BEGIN CERTIFICATE-----\ngarbage", b"junk"),
            Op::Mismatched(a, b) => {
                let b = if a == b { &self.other } else { &self.pairs[*b] };
                self.kubelet(self.pairs[*a].chain_pem.as_bytes(), b.key_pem.as_bytes());
            }
            Op::Expired(i) => self.kubelet(
                self.invalid[*i].chain_pem.as_bytes(),
                self.invalid[*i].key_pem.as_bytes(),
            ),
        }
    }
}

/// How many pairs that are not valid now the operations choose from.
const INVALID: usize = 4;

/// Valid pairs over the whole range a certificate can carry: days, until 9999 (RFC 5280's "no
/// expiration"), from 1950 to 9999, eight thousand years from now (saturating at 9999).
fn valid_pair(ca: &TestCa, i: usize) -> TestCert {
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    match i % 4 {
        0 => ca.leaf(&["localhost"]),
        1 => ca.leaf_valid(&["localhost"], now - hour, tls_source::clock::latest()),
        2 => ca.leaf_valid(
            &["localhost"],
            tls_test::new_year(1950),
            tls_source::clock::latest(),
        ),
        _ => ca.leaf_valid(
            &["localhost"],
            now - Duration::from_secs(1),
            tls_source::clock::saturating_add(now, Duration::from_secs(8000 * 365 * 86_400)),
        ),
    }
}

fn invalid_pair(ca: &TestCa, i: usize) -> TestCert {
    let now = SystemTime::now();
    match i % INVALID {
        0 => ca.expired_leaf(&["localhost"]),
        1 => ca.leaf_valid(
            &["localhost"],
            tls_test::new_year(1950),
            tls_test::new_year(1951),
        ),
        2 => ca.leaf_valid(
            &["localhost"],
            tls_test::new_year(9999),
            tls_source::clock::latest(),
        ),
        _ => ca.leaf_valid(
            &["localhost"],
            now + Duration::from_secs(86_400),
            now - Duration::from_secs(86_400),
        ),
    }
}

/// Runs `ops`; an `Err` says which step broke which promise.
async fn run(ops: &[Op], ca: &TestCa) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let world = World {
        kube: KubeDir::new(dir.path().join("tls")).unwrap(),
        pairs: (0..PAIRS).map(|i| valid_pair(ca, i)).collect(),
        other: ca.leaf(&["localhost"]),
        invalid: (0..INVALID).map(|i| invalid_pair(ca, i)).collect(),
    };
    world.apply(&Op::Kubelet(0));
    let source = FileSource::builder(world.kube.file("tls.crt"), world.kube.file("tls.key"))
        .poll_interval(Duration::from_millis(200))
        .build();
    let reloader = Reloader::builder()
        .crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .spawn(source)
        .unwrap();
    reloader.ready_timeout(tls_test::PATIENCE).await.unwrap();
    let server = TestServer::start(reloader.resolver()).await;
    let chains: Vec<Vec<String>> = world
        .pairs
        .iter()
        .map(|p| {
            tls_source::Decoder::new()
                .certificates("chain", p.chain_pem.as_bytes())
                .unwrap()
                .iter()
                .map(|c| tls_test::fingerprint(c))
                .collect()
        })
        .collect();
    let mut written = vec![0];
    let mut on_disk = Some(0);
    let check = |step: &str, served: tls_test::Served, written: &[usize]| {
        let chain: Vec<String> = served
            .chain
            .iter()
            .map(|c| tls_test::fingerprint(c))
            .collect();
        match chains.iter().position(|c| *c == chain) {
            Some(i) if written.contains(&i) => Ok(()),
            Some(i) => Err(format!("{step}: served pair {i}, never written")),
            None => Err(format!(
                "{step}: served a chain of {} that is no valid pair's whole chain",
                chain.len()
            )),
        }
    };
    for (n, op) in ops.iter().enumerate() {
        world.apply(op);
        on_disk = match op {
            // Unreadable, unless this process reads it anyway (root): then nothing changed.
            Op::Chmod if std::fs::read(world.kube.file("tls.key")).is_ok() => on_disk,
            _ => op.writes_valid(),
        };
        written.extend(op.writes_valid());
        let step = format!("after step {n} ({op:?})");
        let served = tls_test::probe(server.addr(), "localhost")
            .await
            .map_err(|e| format!("{step}: the handshake failed: {e}"))?;
        check(&step, served, &written)?;
    }
    // Converges to the valid pair left on disk, if any (after the in-place quiet period, or
    // the poll); else keeps serving one written before.
    let Some(last_valid) = on_disk else {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let served = tls_test::probe(server.addr(), "localhost")
            .await
            .map_err(|e| format!("at the end: the handshake failed: {e}"))?;
        return check("at the end, invalid files left", served, &written);
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let served = tls_test::probe(server.addr(), "localhost")
            .await
            .map_err(|e| format!("at the end: the handshake failed: {e}"))?;
        let fingerprint = served.fingerprint.clone();
        check("at the end", served, &written)?;
        if fingerprint == world.pairs[last_valid].fingerprint {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "did not converge to pair {last_valid}, the valid pair left on disk"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 24 cases from a fixed seed (the same sequences in every run, so the default run is
/// repeatable), or `TLS_ROTATION_PROPTEST_CASES` cases from a random seed.
fn config() -> ProptestConfig {
    let asked = std::env::var("TLS_ROTATION_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    ProptestConfig {
        cases: asked.unwrap_or(24),
        rng_seed: match asked {
            Some(_) => proptest::test_runner::RngSeed::Random,
            None => proptest::test_runner::RngSeed::Fixed(0x7157_2026),
        },
        max_shrink_iters: 64,

        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_sequence_of_file_operations_serves_only_valid_pairs_and_converges(
        ops in proptest::collection::vec(op(), 1..10)
    ) {
        let ca = TestCa::new("properties").intermediate("properties intermediate");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let outcome = runtime.block_on(run(&ops, &ca));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
