//! Which crypto provider a reloader uses when none is given, and what the error says when there
//! is none. Its own test binary: it installs the process default. The crate's features decide
//! what is expected, one test per case: `cargo test -p tls-reload` (neither), `--features ring`,
//! `--features aws-lc-rs` (what `cargo test --workspace` unifies in from the examples), and
//! `--features ring,aws-lc-rs` (.ci/run runs each).

mod common;

use rustls::NamedGroup;
use tls_reload::Reloader;

fn source() -> impl tls_source::CertSource {
    futures::stream::pending()
}

/// The key-exchange groups a server built by `reloader` offers, in its order of preference:
/// what tells aws-lc-rs (the post-quantum hybrid first) from ring.
fn groups(reloader: &Reloader) -> Vec<NamedGroup> {
    let config = reloader.server_config().expect("a server config");
    config
        .crypto_provider()
        .kx_groups
        .iter()
        .map(|group| group.name())
        .collect()
}

fn assert_nothing_installed() {
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "the library installed nothing"
    );
}

#[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
#[tokio::test]
async fn no_provider_is_a_clear_error_then_the_process_default_is_used() {
    assert_nothing_installed();
    // This build of tls-reload has neither `ring` nor `aws-lc-rs`: the message says what to write.
    let err = Reloader::spawn(source()).unwrap_err();
    assert!(matches!(err, tls_reload::Error::NoCryptoProvider));
    let message = err.to_string();
    assert!(
        message.contains(r#"tls-reload = { version = "0.1", features = ["aws-lc-rs"] }"#),
        "{message}"
    );
    assert!(message.contains("Builder::crypto_provider"), "{message}");
    assert_nothing_installed();

    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .unwrap();
    let reloader = Reloader::spawn(source()).expect("the process default is used");
    assert_eq!(groups(&reloader)[0], NamedGroup::X25519MLKEM768);
}

#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
#[tokio::test]
async fn ring_alone_is_used_and_nothing_is_installed() {
    assert_nothing_installed();
    let reloader = Reloader::spawn(source()).expect("ring, from tls-reload's feature");
    // ring's groups (rustls 0.23.48: secp384r1, X25519, secp256r1): no post-quantum one.
    let groups = groups(&reloader);
    assert!(groups.contains(&NamedGroup::X25519), "{groups:?}");
    assert!(!groups.contains(&NamedGroup::X25519MLKEM768), "{groups:?}");
    assert_nothing_installed();
    the_feature_provider_wins_over_the_process_default();
}

/// aws-lc-rs alone, or with ring too (features add up across a dependency graph): aws-lc-rs,
/// the post-quantum hybrid first, and no error.
#[cfg(feature = "aws-lc-rs")]
#[tokio::test]
async fn aws_lc_rs_is_used_alone_or_beside_ring_and_nothing_is_installed() {
    assert_nothing_installed();
    let reloader = Reloader::spawn(source()).expect("aws-lc-rs, from tls-reload's feature");
    assert_eq!(groups(&reloader)[0], NamedGroup::X25519MLKEM768);
    assert_nothing_installed();
    the_feature_provider_wins_over_the_process_default();
}

/// With a feature's provider, a process default installed by someone else changes nothing.
/// (Called at the end of the one test of a build: tests of a binary share the process.)
#[cfg(any(feature = "ring", feature = "aws-lc-rs"))]
fn the_feature_provider_wins_over_the_process_default() {
    // A process default with one group, which neither feature's provider has alone.
    let mut other = rustls::crypto::aws_lc_rs::default_provider();
    other.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::MLKEM1024];
    other
        .install_default()
        .expect("nothing was installed before");
    let reloader = Reloader::spawn(source()).expect("the feature's provider");
    assert_ne!(groups(&reloader), [NamedGroup::MLKEM1024]);
}
