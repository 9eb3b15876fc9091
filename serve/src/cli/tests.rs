//! The flags as a user gives them: what each parses to, and every usage error, named.

use super::*;

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    Args::parse_from(std::iter::once("serve").chain(args.iter().copied()))
}

/// A usage error: exit status 2, and the message names `flag` and says `why`.
#[track_caller]
fn refused(args: &[&str], flag: &str, why: &str) {
    let err = parse(args).expect_err("refused");
    assert_eq!(err.exit_code(), 2, "{args:?}");
    let text = err.to_string();
    assert!(text.contains(flag), "{args:?}: {text}");
    assert!(text.contains(why), "{args:?}: {text}");
}

#[test]
fn the_defaults_are_a_self_signed_certificate_on_8443() {
    let args = parse(&[]).unwrap();
    assert_eq!(args.listen, "127.0.0.1:8443".parse().unwrap());
    assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
    assert_eq!(args.poll, tls_rotation::tls_source::DEFAULT_POLL_INTERVAL);
    assert_eq!(args.ready_timeout, Duration::from_secs(30));
    assert_eq!(
        args.handshake_timeout,
        tls_rotation::DEFAULT_HANDSHAKE_TIMEOUT
    );
    assert!(args.notify && !args.fail_fast);
    assert_eq!(
        (args.recycle_after, &args.client_ca, args.metrics),
        (None, &None, None)
    );
    assert_eq!(args.sni, Sni::default());
}

#[test]
fn every_flag_takes_its_value_as_documented() {
    let args = parse(&[
        "--listen",
        "[::1]:0",
        "--cert-dir",
        "/etc/tls",
        "--poll",
        "500ms",
        "--no-notify",
        "--sni",
        "api.example.com=/etc/api",
        "--sni",
        "*.example.com=/etc/wild",
        "--sni-strict",
        "--k8s-secrets",
        "web",
        "--selector",
        "app=web",
        "--ready-timeout",
        "5s",
        "--fail-fast",
        "--handshake-timeout",
        "2s",
        "--recycle-after",
        "1m",
        "--client-ca",
        "/etc/ca.crt",
        "--ca-overlap",
        "10m",
        "--metrics",
        "127.0.0.1:9090",
    ])
    .unwrap();
    assert_eq!(args.listen, "[::1]:0".parse().unwrap());
    assert_eq!(args.certs, Certs::Dir("/etc/tls".into()));
    assert_eq!(args.poll, Duration::from_millis(500));
    assert!(!args.notify && args.fail_fast);
    assert_eq!(
        args.sni.routes,
        [
            ("api.example.com".to_owned(), PathBuf::from("/etc/api")),
            ("*.example.com".to_owned(), PathBuf::from("/etc/wild")),
        ]
    );
    assert!(args.sni.strict);
    assert_eq!(args.sni.secrets, Some(("web".into(), "app=web".into())));
    assert_eq!(args.ready_timeout, Duration::from_secs(5));
    assert_eq!(args.handshake_timeout, Duration::from_secs(2));
    assert_eq!(args.recycle_after, Some(Duration::from_secs(60)));
    assert_eq!(
        args.client_ca,
        Some(("/etc/ca.crt".into(), Duration::from_secs(600)))
    );
    assert_eq!(args.metrics, Some("127.0.0.1:9090".parse().unwrap()));

    let files = parse(&["--cert", "a.crt", "--key", "a.key", "--ca", "ca.crt"]).unwrap();
    assert_eq!(
        files.certs,
        Certs::Files {
            cert: "a.crt".into(),
            key: "a.key".into(),
            ca: Some("ca.crt".into())
        }
    );
    let own = parse(&[
        "--name",
        "web",
        "--name",
        "10.0.0.1",
        "--self-signed-validity",
        "6s",
        "--self-signed-dir",
        "/var/lib/tls",
        "--self-signed-ca",
    ])
    .unwrap();
    assert_eq!(
        own.certs,
        Certs::SelfSigned(SelfSignedArgs {
            names: vec!["web".into(), "10.0.0.1".into()],
            validity: Some(Duration::from_secs(6)),
            dir: Some("/var/lib/tls".into()),
            ca: true,
        })
    );
    let shared = parse(&[
        "--k8s-shared",
        "default/web-tls",
        "--lease",
        "w",
        "--identity",
        "pod-0",
    ])
    .unwrap();
    assert!(matches!(
        shared.certs,
        Certs::Shared { ref namespace, ref name, lease: Some(ref lease), ref identity, .. }
            if namespace == "default" && name == "web-tls" && lease == "w" && identity == "pod-0"
    ));
    let sealed = parse(&[
        "--k8s-shared",
        "default/web-tls",
        "--identity",
        "pod-0",
        "--seal-key",
        "/keys/new",
        "--seal-key",
        "/keys/old",
        "--seal-served-key",
    ])
    .unwrap();
    assert_eq!(
        sealed.seal,
        SealArgs {
            keys: vec!["/keys/new".into(), "/keys/old".into()],
            adopt_unsealed: false,
            served_key: true,
        },
        "the key files in their order: the first seals"
    );
    let secret = parse(&["--k8s-secret", "default/web-tls"]).unwrap();
    assert_eq!(
        secret.certs,
        Certs::Secret {
            namespace: "default".into(),
            name: "web-tls".into()
        }
    );
}

#[test]
fn values_out_of_their_bounds_are_refused_naming_the_flag_and_the_bounds() {
    refused(
        &["--poll", "18446744073709551615s"],
        "--poll 18446744073709551615s",
        "must be between 10ms and 365d",
    );
    refused(
        &["--poll", "1ns"],
        "--poll 1ns",
        "must be between 10ms and 365d",
    );
    refused(&["--poll", "soon"], "--poll soon", "not a duration");
    refused(
        &["--self-signed-validity", "3650000d"],
        "--self-signed-validity",
        "must be between 3s and 36500d",
    );
    refused(
        &["--self-signed-validity", "1s"],
        "--self-signed-validity",
        "must be between 3s and 36500d",
    );
    refused(
        &["--ready-timeout", "2d"],
        "--ready-timeout",
        "must be between 1ms and 1d",
    );
    refused(
        &["--handshake-timeout", "0s"],
        "--handshake-timeout",
        "must be between 1ms and 1d",
    );
    refused(
        &["--client-ca", "ca", "--ca-overlap", "2d"],
        "--ca-overlap",
        "must be between 0s and 1d",
    );
    refused(
        &["--listen", "256.0.0.1:1"],
        "--listen 256.0.0.1:1",
        "not an address",
    );
    refused(
        &["--metrics", "nowhere"],
        "--metrics nowhere",
        "not an address",
    );
    refused(
        &["--k8s-shared", "web-tls"],
        "--k8s-shared web-tls",
        "expected NAMESPACE/NAME",
    );
    refused(
        &["--k8s-secret", "/web"],
        "--k8s-secret /web",
        "expected NAMESPACE/NAME",
    );
    refused(
        &["--k8s-secrets", "a/b"],
        "--k8s-secrets a/b",
        "expected a NAMESPACE",
    );
    refused(
        &["--sni", "api.example.com"],
        "--sni api.example.com",
        "expected NAME=DIR",
    );
    refused(&["--no-such-flag"], "--no-such-flag", "unexpected argument");
    refused(&["--cert"], "--cert", "a value is required");
}

#[test]
fn flags_that_do_not_go_together_are_refused_naming_them() {
    refused(&["--cert", "only.crt"], "--cert and --key", "go together");
    refused(&["--ca", "ca.crt"], "--cert and --key", "go together");
    refused(
        &["--cert-dir", "/tmp", "--key", "k"],
        "--cert-dir",
        "cannot be combined",
    );
    refused(
        &["--cert-dir", "/tmp", "--self-signed-ca"],
        "--self-signed-*",
        "apply to the self-signed default",
    );
    refused(
        &["--selector", "app=web"],
        "--selector",
        "goes with --k8s-secrets",
    );
    refused(
        &["--lease", "web-writer"],
        "--lease",
        "goes with --k8s-shared",
    );
    refused(
        &["--identity", "web-0"],
        "--identity",
        "goes with --k8s-shared or --etcd-shared",
    );
    refused(
        &["--ca-overlap", "1m"],
        "--ca-overlap",
        "goes with --client-ca",
    );
    refused(
        &["--ready-before-lists"],
        "--ready-before-lists",
        "goes with --k8s-secrets",
    );
    refused(
        &["--seal-key", "/keys/seal.key"],
        "--seal-key",
        "goes with --k8s-shared",
    );
    refused(
        &["--k8s-shared", "default/web-tls", "--seal-adopt-unsealed"],
        "--seal-adopt-unsealed",
        "go with --seal-key",
    );
    refused(
        &[
            "--k8s-secret",
            "default/web",
            "--seal-key",
            "k",
            "--seal-served-key",
        ],
        "--seal-served-key",
        "goes with --k8s-shared",
    );
    // The client CAs are a file of their own, beside any certificate source (a sidecar's
    // certificate from a Secret, its clients' CA from a mounted ConfigMap).
    let args = parse(&["--k8s-secret", "default/web", "--client-ca", "ca"]).unwrap();
    assert_eq!(args.client_ca, Some(("ca".into(), Duration::ZERO)));
    refused(
        &["--k8s-secret", "default/web", "--name", "x"],
        "--k8s-secret",
        "cannot be combined",
    );
    refused(
        &[
            "--k8s-shared",
            "default/web-tls",
            "--self-signed-dir",
            "/tmp/x",
        ],
        "--self-signed-dir",
        "does not go with --k8s-shared",
    );
    refused(
        &[
            "--k8s-shared",
            "default/web-tls",
            "--k8s-secret",
            "default/web",
        ],
        "--k8s-shared",
        "cannot be combined with",
    );
}

const DIRECTORY: &str = "https://acme.example.net/directory";

/// ACME for a fleet: the flags every fleet case below starts from.
const ACME_FLEET: &[&str] = &[
    "--acme-directory",
    DIRECTORY,
    "--acme-domain",
    "a.example.com",
    "--k8s-shared",
    "default/web",
    "--identity",
    "pod-0",
];

#[test]
fn acme_flags_take_their_values_with_tls_alpn_01_by_default() {
    let args = parse(&[
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "a.example.com",
        "--acme-domain",
        "b.example.com",
        "--acme-email",
        "ops@example.com",
        "--acme-state",
        "/var/lib/acme",
        "--acme-eab-kid",
        "kid-1",
        "--acme-eab-key",
        "c2VjcmV0LWhtYWMta2V5",
    ])
    .unwrap();
    let acme = args.acme.unwrap();
    assert_eq!(acme.directory, DIRECTORY);
    assert_eq!(acme.domains, ["a.example.com", "b.example.com"]);
    assert_eq!(acme.email.as_deref(), Some("ops@example.com"));
    assert_eq!(acme.state, AcmeState::Dir(PathBuf::from("/var/lib/acme")));
    assert_eq!(acme.challenge, ChallengeType::TlsAlpn01);
    assert_eq!(acme.weekly_limit, 50, "Let's Encrypt's limit by default");
    assert_eq!(
        acme.eab,
        Some(("kid-1".into(), EabKey(b"secret-hmac-key".to_vec())))
    );
    assert!(!format!("{acme:?}").contains("c2VjcmV0"), "no key in Debug");
    assert_eq!(
        args.certs,
        Certs::SelfSigned(SelfSignedArgs::default()),
        "the default stays"
    );

    let http = parse(&[
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "a.example.com",
        "--acme-state",
        "/var/lib/acme",
        "--acme-challenge",
        "http-01",
        "--acme-http-listen",
        "0.0.0.0:80",
        "--acme-weekly-limit",
        "7",
    ])
    .unwrap()
    .acme
    .unwrap();
    assert_eq!(http.weekly_limit, 7);
    assert_eq!(http.challenge, ChallengeType::Http01);
    assert_eq!(http.http_listen, Some("0.0.0.0:80".parse().unwrap()));

    let addresses = parse(&[
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "192.0.2.7",
        "--acme-domain",
        "2001:db8::7",
        "--acme-state",
        "/var/lib/acme",
    ])
    .unwrap()
    .acme
    .unwrap();
    assert_eq!(addresses.domains, ["192.0.2.7", "2001:db8::7"]);
}

/// A TSIG key file as `tsig-keygen` writes it, with `mode`.
fn tsig_key_file(mode: u32) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acme-update.key");
    std::fs::write(
        &path,
        "key \"acme-update\" {\n\talgorithm hmac-sha256;\n\tsecret \"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I=\";\n};\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, path)
}

#[test]
fn dns_01_takes_a_server_and_a_tsig_key_file_and_allows_wildcards() {
    let (_dir, key) = tsig_key_file(0o600);
    let dns_flags = |key: &str| -> Vec<String> {
        [
            "--acme-directory",
            DIRECTORY,
            "--acme-state",
            "/tmp/acme",
            "--acme-domain",
            "*.example.com",
            "--acme-domain",
            "example.com",
            "--acme-challenge",
            "dns-01",
            "--acme-dns-server",
            "ns1.example.com:5353",
            "--acme-dns-tsig-key",
            key,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let args: Vec<String> = dns_flags(key.to_str().unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let acme = parse(&args).unwrap().acme.unwrap();
    assert_eq!(acme.challenge, ChallengeType::Dns01);
    assert_eq!(acme.domains, ["*.example.com", "example.com"]);
    assert_eq!(
        acme.dns,
        Some(("ns1.example.com:5353".to_owned(), key.clone()))
    );

    // A key file every user may read is refused, naming it; the secret is never shown.
    let (_open_dir, open) = tsig_key_file(0o644);
    let args: Vec<String> = dns_flags(open.to_str().unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = parse(&args).expect_err("world-readable").to_string();
    assert!(
        text.contains("--acme-dns-tsig-key")
            && text.contains("acme-update.key")
            && text.contains("644"),
        "{text}"
    );
    assert!(!text.contains("c2VjcmV0"), "{text}");
    let args: Vec<String> = dns_flags("/nonexistent/acme.key");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&args, "--acme-dns-tsig-key", "/nonexistent/acme.key");
}

#[test]
fn acme_directory_is_repeatable_the_first_preferred_each_with_its_ca_and_binding() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("eab.key");
    std::fs::write(&key, "c2VjcmV0LWhtYWMta2V5\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, tls_test::TestCa::new("fallback CA").cert_pem()).unwrap();
    let second = format!(
        "https://acme.zerossl.example/v2/DV90,ca={},eab-kid=kid-2,eab-key-file={}",
        ca.display(),
        key.display()
    );
    let acme = parse(&[
        "--acme-directory",
        DIRECTORY,
        "--acme-directory",
        &second,
        "--acme-directory",
        "https://third.example/dir",
        "--acme-domain",
        "a.example.com",
        "--acme-state",
        "/tmp/acme",
    ])
    .unwrap()
    .acme
    .unwrap();
    assert_eq!(acme.directory, DIRECTORY);
    assert_eq!(
        acme.fallbacks,
        [
            FallbackArgs {
                url: "https://acme.zerossl.example/v2/DV90".into(),
                ca: Some(ca.clone()),
                eab: Some(("kid-2".into(), EabKey(b"secret-hmac-key".to_vec()))),
            },
            FallbackArgs {
                url: "https://third.example/dir".into(),
                ca: None,
                eab: None,
            },
        ]
    );

    // The first's options are --acme-directory-ca's and --acme-eab-*'s.
    let first = format!("{DIRECTORY},eab-kid=kid-1,eab-key-file={}", key.display());
    let acme = parse(&[
        "--acme-directory",
        &first,
        "--acme-domain",
        "a.example.com",
        "--acme-state",
        "/tmp/acme",
    ])
    .unwrap()
    .acme
    .unwrap();
    assert_eq!(
        acme.eab,
        Some(("kid-1".into(), EabKey(b"secret-hmac-key".to_vec())))
    );
    let base = [
        "--acme-domain",
        "a.example.com",
        "--acme-state",
        "/tmp/acme",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        extra.iter().chain(&base).map(|s| (*s).to_owned()).collect()
    };
    for (args, flag, why) in [
        (
            with(&[
                "--acme-directory",
                &first,
                "--acme-eab-kid",
                "k",
                "--acme-eab-key",
                "AAAA",
            ]),
            "--acme-eab-kid/--acme-eab-key and the first --acme-directory",
            "do not go together",
        ),
        (
            with(&["--acme-directory", &format!("{DIRECTORY},eab-kid=k")]),
            "--acme-directory",
            "eab-kid and eab-key-file go together",
        ),
        (
            with(&["--acme-directory", &format!("{DIRECTORY},colour=blue")]),
            "--acme-directory",
            "unknown option colour",
        ),
        (
            with(&["--acme-directory", DIRECTORY, "--acme-directory", DIRECTORY]),
            "--acme-directory",
            "given twice",
        ),
        (
            with(&[
                "--acme-directory",
                DIRECTORY,
                "--acme-directory",
                "https://b.example/dir,eab-kid=k,eab-key-file=/nonexistent/eab.key",
            ]),
            "eab-key-file=/nonexistent/eab.key",
            "No such file",
        ),
        (
            with(&[
                "--acme-directory",
                DIRECTORY,
                "--acme-directory",
                "https://b.example/dir,ca=/nonexistent/ca.pem",
            ]),
            "--acme-directory https://b.example/dir,ca=/nonexistent/ca.pem",
            "/nonexistent/ca.pem",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, flag, why);
    }
}

#[test]
fn bad_acme_flags_exit_2_with_the_reason() {
    let base = ["--acme-directory", DIRECTORY, "--acme-state", "/tmp/acme"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    refused(
        &with(&["--acme-domain", "*.example.com"]),
        "--acme-domain *.example.com",
        "a wildcard can only be validated by dns-01 (--acme-challenge dns-01",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-challenge",
            "dns-01",
        ]),
        "--acme-challenge dns-01",
        "needs --acme-dns-server HOST:PORT and --acme-dns-tsig-key FILE",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-dns-server",
            "ns1.example.com",
        ]),
        "--acme-dns-server and --acme-dns-tsig-key",
        "go with --acme-challenge dns-01",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-challenge",
            "tls-sni-01",
        ]),
        "--acme-challenge tls-sni-01",
        "expected tls-alpn-01, http-01 or dns-01",
    );
    refused(
        &with(&["--acme-domain", "10.0.0.256"]),
        "--acme-domain 10.0.0.256",
        "is not a DNS name or IP address",
    );
    refused(
        &with(&["--acme-domain", "10.0.0.1", "--acme-domain", "[10.0.0.1]"]),
        "--acme-domain",
        "10.0.0.1 is configured twice",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-domain",
            "A.example.com",
        ]),
        "--acme-domain",
        "configured twice",
    );
    refused(&with(&[]), "--acme-directory", "at least one --acme-domain");
    refused(
        &[
            "--acme-directory",
            DIRECTORY,
            "--acme-domain",
            "a.example.com",
        ],
        "--acme-state",
        "every restart orders every certificate again",
    );
    refused(
        &[
            "--acme-directory",
            "http://acme.example.net/directory",
            "--acme-domain",
            "a.example.com",
        ],
        "--acme-directory http://",
        "https:// URL",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-challenge",
            "http-01",
        ]),
        "--acme-http-listen",
        "where the CA's request arrives",
    );
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-http-listen",
            "0.0.0.0:80",
        ]),
        "--acme-http-listen",
        "goes with --acme-challenge http-01",
    );
    refused(
        &with(&["--acme-domain", "a.example.com", "--acme-eab-kid", "kid"]),
        "--acme-eab-kid and --acme-eab-key",
        "go together",
    );
    let err = parse(&with(&[
        "--acme-domain",
        "a.example.com",
        "--acme-eab-kid",
        "kid",
        "--acme-eab-key",
        "not*base64!xyzzy",
    ]))
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(
        text.contains("--acme-eab-key") && text.contains("not base64url"),
        "{text}"
    );
    assert!(!text.contains("xyzzy"), "the key is never shown: {text}");
    refused(
        &with(&[
            "--acme-domain",
            "a.example.com",
            "--acme-directory-ca",
            "/nonexistent/ca.pem",
        ]),
        "--acme-directory-ca /nonexistent/ca.pem",
        "",
    );
    refused(
        &["--acme-domain", "a.example.com"],
        "--acme-*",
        "go with --acme-directory",
    );
    refused(
        &[
            "--acme-directory",
            DIRECTORY,
            "--acme-domain",
            "a.example.com",
            "--k8s-shared",
            "default/web",
            "--acme-state",
            "/var/lib/acme",
        ],
        "--acme-state",
        "does not go with --k8s-shared or --etcd-shared",
    );
    refused(
        &[
            ACME_FLEET,
            &["--seal-key", "/keys/seal.key", "--seal-served-key"],
        ]
        .concat(),
        "--seal-served-key",
        "label-selector watch",
    );
    refused(
        &[ACME_FLEET, &["--self-signed-dir", "/tmp/x"]].concat(),
        "--self-signed-dir",
        "in memory",
    );
}

#[test]
fn acme_with_k8s_shared_is_a_fleet_served_on_the_in_memory_default() {
    let args = parse(&[ACME_FLEET, &["--lease", "edge-orders"]].concat()).unwrap();
    assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
    assert_eq!(
        args.acme.unwrap().state,
        AcmeState::Fleet {
            namespace: "default".into(),
            name: "web".into(),
            lease: Some("edge-orders".into()),
            identity: "pod-0".into(),
        }
    );
    let args = parse(
        &[
            ACME_FLEET,
            &["--cert", "/etc/tls/tls.crt", "--key", "/etc/tls/tls.key"],
        ]
        .concat(),
    )
    .unwrap();
    assert!(
        matches!(args.certs, Certs::Files { .. }),
        "{:?}",
        args.certs
    );
}

#[test]
fn acme_with_etcd_shared_is_a_fleet_on_etcd_served_on_the_in_memory_default() {
    const ETCD_FLEET: &[&str] = &[
        "--etcd",
        "127.0.0.1:2379",
        "--etcd-shared",
        "web",
        "--identity",
        "web-0",
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "a.example.com",
    ];
    let args = parse(
        &[
            ETCD_FLEET,
            &["--etcd-lease-ttl", "6s", "--etcd-prefix", "/p/"],
        ]
        .concat(),
    )
    .unwrap();
    assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
    assert_eq!(
        args.acme.unwrap().state,
        AcmeState::Etcd {
            prefix: "/p/".into(),
            name: "web".into(),
            identity: "web-0".into(),
            ttl: Duration::from_secs(6),
        }
    );
    refused(
        &[ETCD_FLEET, &["--acme-state", "/var/lib/acme"]].concat(),
        "--acme-state",
        "does not go with --k8s-shared or --etcd-shared",
    );
    refused(
        &[ETCD_FLEET, &["--self-signed-ca"]].concat(),
        "--self-signed-ca",
        "--etcd-shared: the self-signed default is kept in memory",
    );
    refused(
        &[ETCD_FLEET, &["--seal-key", "/k", "--seal-served-key"]].concat(),
        "--seal-served-key",
        "every private key is sealed",
    );
}

#[test]
fn help_lists_every_flag() {
    let help = Cli::command().render_long_help().to_string();
    for flag in [
        "--listen",
        "--ready-timeout",
        "--fail-fast",
        "--handshake-timeout",
        "--recycle-after",
        "--client-ca",
        "--ca-overlap",
        "--metrics",
        "--cert",
        "--key",
        "--ca ",
        "--cert-dir",
        "--poll",
        "--no-notify",
        "--k8s-secret ",
        "--k8s-shared",
        "--lease",
        "--identity",
        "--sni ",
        "--sni-strict",
        "--k8s-secrets",
        "--selector",
        "--name",
        "--self-signed-validity",
        "--self-signed-dir",
        "--self-signed-ca",
        "--acme-directory ",
        "--acme-domain",
        "--acme-email",
        "--acme-directory-ca",
        "--acme-state",
        "--acme-challenge",
        "--acme-http-listen",
        "--acme-eab-kid",
        "--acme-eab-key",
        "--etcd ",
        "--etcd-prefix",
        "--etcd-cert ",
        "--etcd-certs",
        "--etcd-user",
        "--etcd-password-file",
        "--etcd-ca",
        "--etcd-client-cert",
        "--etcd-client-key",
        "--etcd-shared",
        "--etcd-lease-ttl",
    ] {
        assert!(help.contains(flag), "{flag} in:\n{help}");
    }
    let err = parse(&["--help"]).unwrap_err();
    assert_eq!(err.exit_code(), 0, "--help is not an error");
    Cli::command().debug_assert();
}

#[test]
fn an_acme_profile_is_preferred_or_required_and_never_both() {
    let base = [
        "--acme-directory",
        DIRECTORY,
        "--acme-domain",
        "a.example.com",
        "--acme-state",
        "/var/lib/acme",
    ];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(extra).copied().collect()
    }
    let acme = parse(&with(&base, &[])).unwrap().acme.unwrap();
    assert_eq!(acme.profile, None, "the CA's default unless asked");
    let acme = parse(&with(&base, &["--acme-profile", "shortlived"]))
        .unwrap()
        .acme
        .unwrap();
    assert_eq!(acme.profile, Some(("shortlived".into(), false)));
    let acme = parse(&with(&base, &["--acme-profile-required", "tlsserver"]))
        .unwrap()
        .acme
        .unwrap();
    assert_eq!(acme.profile, Some(("tlsserver".into(), true)));
    refused(
        &with(
            &base,
            &[
                "--acme-profile",
                "shortlived",
                "--acme-profile-required",
                "tlsserver",
            ],
        ),
        "--acme-profile-required",
        "do not go together",
    );
    refused(
        &with(&base, &["--acme-profile", ""]),
        "--acme-profile",
        "profile name",
    );
    refused(
        &["--acme-profile", "shortlived"],
        "--acme-*",
        "go with --acme-directory",
    );
}

#[test]
fn session_tickets_are_off_by_default_and_a_file_or_the_fleet_when_asked() {
    assert_eq!(parse(&[]).unwrap().tickets, Tickets::Off);
    let dir = tempfile::tempdir().unwrap();
    let (good, short) = (dir.path().join("good"), dir.path().join("short"));
    std::fs::write(&good, "c2VjcmV0LXRpY2tldC1zZWNyZXQtb2YtMzItYnl0ZXM=\n").unwrap();
    std::fs::write(&short, "c2hvcnQ=").unwrap();
    let args = parse(&[
        "--session-tickets",
        good.to_str().unwrap(),
        "--ticket-rotation",
        "1h",
    ])
    .unwrap();
    let Tickets::File {
        secret, rotation, ..
    } = &args.tickets
    else {
        panic!("{:?}", args.tickets)
    };
    assert_eq!(
        (secret.0.as_slice(), *rotation),
        (
            &b"secret-ticket-secret-of-32-bytes"[..],
            Duration::from_secs(3600)
        )
    );
    assert!(!format!("{args:?}").contains("c2Vj"), "no secret in Debug");
    refused(
        &["--session-tickets", short.to_str().unwrap()],
        "--session-tickets",
        "not 32 or more bytes in base64",
    );
    refused(
        &["--session-tickets", "/nonexistent/tickets"],
        "--session-tickets /nonexistent/tickets",
        "cannot read it",
    );
    refused(
        &["--session-tickets", "fleet"],
        "--session-tickets fleet",
        "goes with --k8s-shared",
    );
    refused(
        &["--ticket-rotation", "1h"],
        "--ticket-rotation",
        "goes with --session-tickets",
    );
    refused(
        &[
            "--session-tickets",
            "fleet",
            "--k8s-shared",
            "default/web",
            "--ticket-rotation",
            "0s",
        ],
        "--ticket-rotation",
        "1s",
    );
    let fleet = parse(&[
        "--session-tickets",
        "fleet",
        "--k8s-shared",
        "default/web",
        "--identity",
        "web-0",
    ])
    .unwrap();
    assert_eq!(
        fleet.tickets,
        Tickets::Fleet {
            namespace: "default".into(),
            name: "web".into(),
            identity: "web-0".into(),
            rotation: Duration::from_secs(6 * 3600),
        }
    );
}

#[test]
fn etcd_serves_the_key_under_the_prefix_or_every_key_there() {
    let args = parse(&[
        "--etcd",
        "127.0.0.1:2379, 127.0.0.2:2379",
        "--etcd-cert",
        "web",
    ])
    .unwrap();
    assert_eq!(
        args.certs,
        Certs::Etcd {
            key: "/tls-rotation/certs/web".into()
        }
    );
    let etcd = args.etcd.unwrap();
    assert_eq!(etcd.endpoints, ["127.0.0.1:2379", "127.0.0.2:2379"]);
    assert_eq!((etcd.user, etcd.ca, etcd.client), (None, None, None));

    let args = parse(&[
        "--etcd",
        "https://etcd:2379",
        "--etcd-prefix",
        "/apps/web",
        "--etcd-certs",
        "--etcd-user",
        "web",
        "--etcd-password-file",
        "/run/etcd-password",
        "--etcd-ca",
        "/etc/etcd/ca.pem",
        "--etcd-client-cert",
        "/etc/etcd/client.pem",
        "--etcd-client-key",
        "/etc/etcd/client-key.pem",
        "--ready-before-lists",
    ])
    .unwrap();
    assert_eq!(args.certs, Certs::SelfSigned(SelfSignedArgs::default()));
    assert_eq!(args.sni.etcd_certs.as_deref(), Some("/apps/web/certs/"));
    assert!(args.sni.ready_before_lists);
    let etcd = args.etcd.unwrap();
    assert_eq!(etcd.user, Some(("web".into(), "/run/etcd-password".into())));
    assert_eq!(etcd.ca, Some("/etc/etcd/ca.pem".into()));
    assert_eq!(
        etcd.client,
        Some((
            "/etc/etcd/client.pem".into(),
            "/etc/etcd/client-key.pem".into()
        ))
    );
}

#[test]
fn etcd_flags_that_do_not_go_together_are_refused_naming_them() {
    refused(
        &["--etcd-cert", "web"],
        "--etcd-cert",
        "goes with --etcd ENDPOINTS",
    );
    refused(
        &["--etcd-ca", "ca.pem"],
        "--etcd-ca",
        "goes with --etcd ENDPOINTS",
    );
    refused(
        &["--etcd", "127.0.0.1:2379"],
        "--etcd",
        "needs --etcd-cert NAME, --etcd-certs or --etcd-shared NAME",
    );
    refused(
        &["--etcd", " , ", "--etcd-certs"],
        "--etcd",
        "expected ENDPOINTS",
    );
    let etcd = ["--etcd", "127.0.0.1:2379", "--etcd-cert", "web"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        etcd.iter().chain(extra).copied().collect()
    };
    refused(
        &with(&["--etcd-user", "web"]),
        "--etcd-user and --etcd-password-file",
        "go together",
    );
    refused(
        &with(&["--etcd-client-cert", "c.pem", "--etcd-client-key", "k.pem"]),
        "--etcd-client-cert",
        "needs --etcd-ca",
    );
    refused(
        &with(&["--etcd-client-key", "k.pem"]),
        "--etcd-client-cert and --etcd-client-key",
        "go together",
    );
    refused(
        &with(&["--cert-dir", "/tls"]),
        "--etcd-cert",
        "cannot be combined",
    );
    refused(
        &with(&["--k8s-secret", "default/web"]),
        "--k8s-secret",
        "cannot be combined",
    );
    assert!(
        parse(&with(&["--client-ca", "ca.pem"]))
            .unwrap()
            .client_ca
            .is_some()
    );
    refused(
        &[
            "--etcd",
            "127.0.0.1:2379",
            "--etcd-certs",
            "--k8s-secrets",
            "default",
        ],
        "--etcd-certs",
        "cannot be combined with --k8s-secrets",
    );
    refused(
        &["--etcd", "127.0.0.1:2379", "--etcd-cert", "/web"],
        "--etcd-cert",
        "expected a NAME",
    );
    refused(
        &["--ready-before-lists"],
        "--ready-before-lists",
        "--etcd-certs",
    );
}

#[test]
fn etcd_shared_is_the_self_signed_fleet_on_etcd() {
    let args = parse(&[
        "--etcd",
        "127.0.0.1:2379",
        "--etcd-shared",
        "web",
        "--identity",
        "web-0",
        "--self-signed-ca",
        "--name",
        "web.internal",
        "--seal-key",
        "/etc/seal/key",
        "--etcd-lease-ttl",
        "5s",
    ])
    .unwrap();
    assert_eq!(
        args.certs,
        Certs::EtcdShared {
            prefix: "/tls-rotation/".into(),
            name: "web".into(),
            identity: "web-0".into(),
            ttl: Duration::from_secs(5),
            options: SelfSignedArgs {
                names: vec!["web.internal".into()],
                ca: true,
                ..SelfSignedArgs::default()
            },
        }
    );
    assert_eq!(args.seal.keys, [PathBuf::from("/etc/seal/key")]);
    let shared = ["--etcd", "127.0.0.1:2379", "--etcd-shared", "web"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        shared.iter().chain(extra).copied().collect()
    };
    refused(
        &["--etcd-shared", "web"],
        "--etcd-shared",
        "goes with --etcd ENDPOINTS",
    );
    refused(
        &with(&["--etcd-cert", "x"]),
        "--etcd-shared",
        "cannot be combined",
    );
    refused(
        &with(&["--cert-dir", "/tls"]),
        "--etcd-shared",
        "cannot be combined",
    );
    refused(
        &with(&["--self-signed-dir", "/d"]),
        "--self-signed-dir",
        "etcd is the store",
    );
    refused(
        &with(&["--etcd-lease-ttl", "1s"]),
        "--etcd-lease-ttl",
        "between 2s and 1d",
    );
    refused(
        &["--etcd-lease-ttl", "5s"],
        "--etcd-lease-ttl",
        "goes with --etcd-shared",
    );
    refused(
        &["--etcd", "127.0.0.1:2379", "--etcd-shared", "a/b"],
        "--etcd-shared",
        "expected a NAME",
    );
}

#[test]
fn the_sidecar_flags_take_their_values() {
    let args = parse(&["--upstream", "127.0.0.1:8080"]).unwrap();
    assert_eq!(
        args.mode,
        Mode::Http(HttpProxy {
            upstream: Upstream::Tcp("127.0.0.1:8080".into()),
            request_timeout: sidecar::DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: sidecar::DEFAULT_IDLE_TIMEOUT,
            max_request_body: sidecar::DEFAULT_MAX_REQUEST_BODY,
        })
    );
    let args = parse(&[
        "--upstream",
        "/run/app.sock",
        "--request-timeout",
        "5s",
        "--idle-timeout",
        "30s",
        "--max-request-body",
        "512KiB",
        "--status-listen",
        "127.0.0.1:9901",
    ])
    .unwrap();
    assert_eq!(
        args.mode,
        Mode::Http(HttpProxy {
            upstream: Upstream::Unix("/run/app.sock".into()),
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_request_body: 512 * 1024,
        })
    );
    assert_eq!(args.status_listen, Some("127.0.0.1:9901".parse().unwrap()));
    let args = parse(&["--upstream-tcp", "unix:/run/db.sock", "--proxy-protocol"]).unwrap();
    assert_eq!(
        args.mode,
        Mode::Tcp {
            upstream: Upstream::Unix("/run/db.sock".into()),
            proxy_protocol: true,
            idle_timeout: sidecar::DEFAULT_IDLE_TIMEOUT,
        }
    );
    assert_eq!(parse(&[]).unwrap().mode, Mode::Status);
    assert_eq!(sidecar::parse_size("16MiB"), Ok(16 << 20));
    assert_eq!(sidecar::parse_size("1G"), Ok(1 << 30));
    assert_eq!(sidecar::parse_size("100"), Ok(100));
}

#[test]
fn the_allow_flags_become_one_rule_list_after_which_the_file_comes() {
    let args = parse(&[
        "--cert-dir",
        "/etc/tls",
        "--client-ca",
        "/etc/ca.pem",
        "--allow-uri",
        "spiffe://example.org/ns/prod/*",
        "--allow-cn",
        "backup",
        "--allow-dns",
        "web.example.com",
        "--allow-file",
        "/etc/allow",
    ])
    .unwrap();
    let allow = args.allow.unwrap();
    let rules: Vec<String> = allow
        .rules
        .rules()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        rules,
        [
            "cn=backup",
            "dns=web.example.com",
            "uri=spiffe://example.org/ns/prod/*"
        ]
    );
    assert_eq!(allow.file, Some("/etc/allow".into()));
    assert_eq!(parse(&["--cert-dir", "/etc/tls"]).unwrap().allow, None);
}

#[test]
fn connect_takes_its_listener_ca_and_server_name() {
    let args = parse(&[
        "--cert-dir",
        "/etc/tls",
        "--connect",
        "db.internal:5432",
        "--client-listen",
        "127.0.0.1:15432",
        "--connect-ca",
        "/etc/db-ca.pem",
    ])
    .unwrap();
    assert_eq!(
        args.mode,
        Mode::Connect(ConnectArgs {
            server: "db.internal:5432".into(),
            listen: "127.0.0.1:15432".parse().unwrap(),
            ca: Some("/etc/db-ca.pem".into()),
            sni: "db.internal".into(),
        })
    );
    let args = parse(&[
        "--connect",
        "[::1]:443",
        "--client-listen",
        "127.0.0.1:0",
        "--connect-sni",
        "api.example.com",
    ])
    .unwrap();
    let Mode::Connect(connect) = args.mode else {
        panic!("{:?}", args.mode)
    };
    assert_eq!(
        (connect.sni.as_str(), connect.ca),
        ("api.example.com", None)
    );
}

#[test]
fn the_sidecar_flags_refuse_what_does_not_go_together() {
    refused(
        &["--upstream", "127.0.0.1:1", "--upstream-tcp", "127.0.0.1:2"],
        "--upstream-tcp",
        "cannot be combined",
    );
    refused(
        &["--upstream", "localhost"],
        "--upstream localhost",
        "HOST:PORT",
    );
    refused(
        &["--upstream", "127.0.0.1:1", "--proxy-protocol"],
        "--proxy-protocol",
        "--upstream-tcp",
    );
    refused(
        &["--request-timeout", "5s"],
        "--request-timeout",
        "--upstream",
    );
    refused(&["--idle-timeout", "5s"], "--idle-timeout", "--upstream");
    refused(
        &["--upstream", "127.0.0.1:1", "--max-request-body", "lots"],
        "--max-request-body lots",
        "expected bytes",
    );
    refused(&["--allow-cn", "web"], "--allow-cn", "--client-ca");
    refused(
        &[
            "--cert-dir",
            "/d",
            "--client-ca",
            "/ca",
            "--allow-uri",
            "spiffe://example.org/*/x",
        ],
        "--allow-uri spiffe://example.org/*/x",
        "last path segments",
    );
    refused(
        &[
            "--cert-dir",
            "/d",
            "--client-ca",
            "/ca",
            "--allow-dns",
            "*.example.com",
        ],
        "--allow-dns",
        "without wildcards",
    );
    refused(&["--connect", "db:5432"], "--connect", "--client-listen");
    refused(
        &["--connect", "db", "--client-listen", "127.0.0.1:1"],
        "--connect db",
        "HOST:PORT",
    );
    refused(&["--connect-ca", "/ca"], "--connect-ca", "--connect");
    refused(
        &[
            "--connect",
            "db:1",
            "--client-listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
        ],
        "--connect",
        "cannot be combined",
    );
    refused(
        &[
            "--cert-dir",
            "/d",
            "--client-ca",
            "/ca",
            "--connect",
            "db:1",
            "--client-listen",
            "127.0.0.1:1",
        ],
        "--client-ca",
        "serves no TLS",
    );
}

#[test]
fn no_resumption_is_a_flag_of_its_own() {
    assert!(parse(&["--no-resumption"]).unwrap().no_resumption);
    assert!(!parse(&[]).unwrap().no_resumption);
    refused(
        &["--no-resumption", "--session-tickets", "/etc/tickets"],
        "--no-resumption",
        "cannot be combined with --session-tickets",
    );
}
