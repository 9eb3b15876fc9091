//! Certificate generation time: a self-signed ECDSA P-256 leaf (the default), a CA-signed leaf,
//! other curves, and RSA-2048 when built with `--features rsa` (aws-lc-rs).
//!
//! `cargo bench -p benches --bench generate` (add `--features rsa` for RSA)

use criterion::{Criterion, criterion_group, criterion_main};
use tls_selfsigned::{KeyAlgorithm, SelfSigned};

fn generate(c: &mut Criterion) {
    let mut group = c.benchmark_group("generate");
    let algorithms = [
        ("self-signed P-256", KeyAlgorithm::EcdsaP256),
        ("self-signed P-384", KeyAlgorithm::EcdsaP384),
        ("self-signed Ed25519", KeyAlgorithm::Ed25519),
        ("self-signed RSA-2048", KeyAlgorithm::Rsa2048),
    ];
    for (name, algorithm) in algorithms {
        if !algorithm.is_available() {
            eprintln!("{name}: skipped (build with --features rsa)");
            continue;
        }
        let generator = SelfSigned::builder()
            .dns_name("localhost")
            .name("127.0.0.1")
            .key_algorithm(algorithm)
            .build()
            .unwrap();
        if algorithm == KeyAlgorithm::Rsa2048 {
            group.sample_size(20);
        }
        group.bench_function(name, |b| {
            b.iter(|| generator.generate().unwrap());
        });
    }
    group.sample_size(100);
    let ca_mode = SelfSigned::builder()
        .dns_name("localhost")
        .name("127.0.0.1")
        .ca()
        .build()
        .unwrap();
    ca_mode.generate().unwrap(); // the CA is made once, outside the measurement
    group.bench_function("CA-signed P-256 leaf", |b| {
        b.iter(|| ca_mode.generate().unwrap());
    });
    let check = SelfSigned::builder()
        .dns_name("localhost")
        .name("127.0.0.1")
        .build()
        .unwrap();
    let bundle = check.generate().unwrap();
    group.bench_function("fit check (what runs instead of generating)", |b| {
        b.iter(|| check.check_bundle(&bundle).unwrap());
    });
    group.finish();
}

criterion_group!(benches, generate);
criterion_main!(benches);
