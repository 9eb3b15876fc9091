//! Which crypto provider a reloader uses when none is given, and what the error says when there
//! is none. Its own test binary: it installs the process default. The crate's features decide
//! what is expected (`cargo test --workspace` unifies in `ring` from the examples).

mod common;

use tls_reload::Reloader;

fn source() -> impl tls_source::CertSource {
    futures::stream::pending()
}

#[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
#[tokio::test]
async fn no_provider_is_a_clear_error_then_the_process_default_is_used() {
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "nothing installed yet"
    );
    // This build of tls-reload has neither `ring` nor `aws-lc-rs`: the message says what to write.
    let err = Reloader::spawn(source()).unwrap_err();
    assert!(matches!(err, tls_reload::Error::NoCryptoProvider));
    let message = err.to_string();
    assert!(
        message.contains(r#"tls-reload = { version = "0.1", features = ["ring"] }"#),
        "{message}"
    );
    assert!(message.contains("Builder::crypto_provider"), "{message}");
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "the library installed nothing"
    );

    rustls::crypto::ring::default_provider()
        .install_default()
        .unwrap();
    Reloader::spawn(source()).expect("the process default is used");
}

#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
#[tokio::test]
async fn the_feature_provider_is_used_and_nothing_is_installed() {
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    Reloader::spawn(source()).expect("ring, from tls-reload's feature");
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "the library installed nothing"
    );
}
