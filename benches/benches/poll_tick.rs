//! 5. Steady-state cost: one poll tick when nothing changed, on a realistic 3-certificate chain in
//!    a kubelet-style directory. This is the work `FileSource` does every poll interval (stat,
//!    read, SHA-256, compare; no parse), measured through its reading half, `FileReader`.
//!
//! `cargo bench -p benches --bench poll_tick`

use criterion::{Criterion, criterion_group, criterion_main};
use tls_source::FileSource;
use tls_test::{KubeDir, TestCa};

fn poll_tick(c: &mut Criterion) {
    let leaf = TestCa::new("bench leaf issuer").leaf(&["localhost"]);
    let extra = TestCa::new("bench root").cert_pem();
    let chain = format!("{}{extra}", leaf.chain_pem); // leaf, intermediate, root
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDir::new(dir.path().join("tls")).unwrap();
    kube.write(&[
        ("tls.crt", chain.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("ca.crt", extra.as_bytes()),
    ])
    .unwrap();
    let mut reader = FileSource::kubernetes_dir(kube.path()).build_reader();
    let first = reader.check().unwrap().unwrap();
    assert_eq!(first.chain().len(), 3);
    c.bench_function("poll tick, nothing changed (3-certificate chain)", |b| {
        b.iter(|| assert!(reader.check().is_none()));
    });
    c.bench_function("read and decode, changed (for comparison)", |b| {
        b.iter(|| reader.read_now().unwrap());
    });
}

criterion_group!(benches, poll_tick);
criterion_main!(benches);
