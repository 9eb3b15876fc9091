//! Unit tests of the file source; the behaviour through a reloader is in `tls-reload/tests`.

use std::fs;
use std::time::Duration;

use futures::StreamExt as _;

use super::*;

/// Held to write (for as long as it runs) by a test that starts a child process, and to read
/// by each test that counts inotify events. A child holds a copy of every open descriptor of
/// this process until it runs its program, so a file another test closes meanwhile raises its
/// close event only then: late, among what that test looks at next.
#[cfg(unix)]
pub(super) static CHILDREN: std::sync::RwLock<()> = std::sync::RwLock::new(());

#[cfg(unix)]
#[tokio::test]
async fn warns_once_about_a_key_readable_by_others() {
    use std::os::unix::fs::PermissionsExt as _;
    let logs = tls_test::Logs::global();

    let cert = tls_test::TestCa::new("mode").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    fs::write(&crt, &cert.cert_pem).unwrap();
    fs::write(&key, &cert.key_pem).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let mut source = FileSource::builder(&crt, &key).notify(false).build();
    let trigger = source.trigger();
    source.next().await.unwrap().unwrap();
    trigger.trigger();
    source.next().await.unwrap().unwrap();
    let warnings = logs.lines_with(&key.display().to_string());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("readable by group or others"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("mode=644"), "{warnings:?}");

    // A 0600 key draws no warning.
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    fs::write(&crt, &cert.cert_pem).unwrap();
    fs::write(&key, &cert.key_pem).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let mut quiet = FileSource::builder(&crt, &key).notify(false).build();
    quiet.next().await.unwrap().unwrap();
    assert!(logs.lines_with(&key.display().to_string()).is_empty());
}

#[tokio::test]
async fn unchanged_files_yield_nothing_and_a_repeated_error_is_said_once() {
    let cert = tls_test::TestCa::new("quiet").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    fs::write(&crt, &cert.cert_pem).unwrap();
    fs::write(&key, &cert.key_pem).unwrap();
    let mut source = FileSource::builder(&crt, &key)
        .notify(false)
        .poll_interval(Duration::from_millis(10))
        .build();
    let first = source.next().await.unwrap().unwrap();
    assert_eq!(first.chain().len(), 1);
    // Several polls pass with nothing new.
    let idle = tokio::time::timeout(Duration::from_millis(100), source.next()).await;
    assert!(idle.is_err(), "unchanged files yield nothing");
    fs::remove_file(&key).unwrap();
    let err = source.next().await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Read { .. }), "{err}");
    let repeat = tokio::time::timeout(Duration::from_millis(100), source.next()).await;
    assert!(repeat.is_err(), "the same error is not repeated every poll");
    // Put back whole (a poll between `fs::write`'s create and write would read it empty, and
    // say so: a different error, once).
    tls_test::replace_by_rename(&key, cert.key_pem.as_bytes()).unwrap();
    let back = source.next().await.unwrap().unwrap();
    assert_eq!(back.digest(), first.digest());
}

#[tokio::test]
async fn a_watch_that_cannot_start_is_retried_and_then_delivers() {
    let cert = tls_test::TestCa::new("later").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let later = dir.path().join("later");
    // The poll is an hour away: only the retried watch can deliver in time.
    let mut source = FileSource::kubernetes_dir(&later)
        .poll_interval(Duration::from_secs(3600))
        .build();
    let first = tokio::time::timeout(Duration::from_secs(20), source.next())
        .await
        .expect("a first report")
        .unwrap();
    assert!(first.is_err(), "the directory does not exist yet");
    fs::create_dir(&later).unwrap();
    fs::write(later.join("tls.crt"), &cert.chain_pem).unwrap();
    fs::write(later.join("tls.key"), &cert.key_pem).unwrap();
    let bundle = tokio::time::timeout(Duration::from_secs(20), source.next())
        .await
        .expect("the retried watch reads the files")
        .unwrap()
        .unwrap();
    assert_eq!(bundle.chain().len(), 2);
}

#[tokio::test]
async fn an_optional_ca_is_read_when_present() {
    let cert = tls_test::TestCa::new("ca").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("tls.crt"), &cert.cert_pem).unwrap();
    fs::write(dir.path().join("tls.key"), &cert.key_pem).unwrap();
    let mut source = FileSource::kubernetes_dir(dir.path()).notify(false).build();
    let trigger = source.trigger();
    assert!(source.next().await.unwrap().unwrap().ca().is_empty());
    fs::write(dir.path().join("ca.crt"), &cert.ca_pem).unwrap();
    trigger.trigger();
    let with_ca = source.next().await.unwrap().unwrap();
    assert_eq!(with_ca.ca().len(), 1);
}

#[tokio::test]
async fn an_oversized_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("big.crt"), dir.path().join("tls.key"));
    fs::write(&crt, vec![b'a'; 2048]).unwrap();
    fs::write(&key, b"k").unwrap();
    let mut source = FileSource::builder(&crt, &key)
        .max_size(1024)
        .notify(false)
        .build();
    let err = source.next().await.unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{} is larger than the limit of 1024 bytes", crt.display())
    );
}

#[cfg(unix)]
#[tokio::test]
async fn a_fifo_or_a_directory_in_place_of_a_file_is_refused_without_waiting() {
    let cert = tls_test::TestCa::new("fifo").leaf(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    fs::write(&crt, &cert.cert_pem).unwrap();
    // A FIFO with no writer: opened to be read, it would wait for one forever.
    let made = {
        let _children = CHILDREN
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::process::Command::new("mkfifo")
            .arg(&key)
            .status()
            .unwrap()
    };
    assert!(made.success());
    // Read on a thread of its own: a read that waited would block the thread it runs on.
    let (tx, rx) = std::sync::mpsc::channel();
    let (c, k) = (crt.clone(), key.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut source = FileSource::builder(&c, &k).notify(false).build();
        let _ = tx.send(runtime.block_on(source.next()).unwrap());
    });
    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the read does not wait for a writer");
    match first {
        Err(Error::NotAFile { path }) => assert_eq!(path, key),
        other => panic!("expected NotAFile for the key, got {other:?}"),
    }

    // A directory where the certificate should be.
    let crt_dir = dir.path().join("crt-dir");
    fs::create_dir(&crt_dir).unwrap();
    let key_file = dir.path().join("key.pem");
    fs::write(&key_file, &cert.key_pem).unwrap();
    let mut source = FileSource::builder(&crt_dir, &key_file)
        .notify(false)
        .build();
    match source.next().await.unwrap() {
        Err(Error::NotAFile { path }) => assert_eq!(path, crt_dir),
        other => panic!("expected NotAFile for the certificate, got {other:?}"),
    }
}

/// What a new watch could have missed is re-checked by the files' stamps: unchanged files ask
/// for no read; content written in place, a kubelet swap, an optional CA that appears, or a
/// read that failed do.
#[test]
fn the_recheck_after_a_new_watch_reads_only_when_a_stamp_changed() {
    let ca = tls_test::TestCa::new("recheck");
    let (a, b, c) = (
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
        ca.leaf(&["localhost"]),
    );
    let root = tempfile::tempdir().unwrap();
    let kube = tls_test::KubeDir::new(root.path().join("tls")).unwrap();
    let files = |cert: &tls_test::TestCert| {
        [
            ("tls.crt", cert.chain_pem.clone().into_bytes()),
            ("tls.key", cert.key_pem.clone().into_bytes()),
        ]
    };
    let write = |cert: &tls_test::TestCert| {
        let files = files(cert);
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, c)| (*n, c.as_slice())).collect();
        kube.write(&refs).unwrap();
    };
    write(&a);
    let mut reader = FileSource::kubernetes_dir(kube.path()).build_reader();
    assert!(!reader.unchanged(), "no read yet");
    reader.check().unwrap().unwrap();
    assert!(reader.unchanged());

    write(&b);
    assert!(!reader.unchanged(), "a kubelet swap");
    reader.check().unwrap().unwrap();
    assert!(reader.unchanged());

    let real = fs::canonicalize(kube.file("tls.crt")).unwrap();
    tls_test::overwrite_in_place(&real, c.chain_pem.as_bytes()).unwrap();
    assert!(!reader.unchanged(), "written in place");
    let _ = reader.read_now();
    assert!(reader.unchanged());

    fs::write(kube.file("ca.crt"), &a.ca_pem).unwrap();
    assert!(!reader.unchanged(), "an optional CA appeared");

    fs::remove_dir_all(kube.path()).unwrap();
    let _ = reader.read_now();
    assert!(!reader.unchanged(), "the last read failed");
}

/// `--cert` and `--key` replaced one after the other (two renames): the half-written pair is
/// held for `in_place_quiet`, so the reader passes on the good pair once, not a mismatch first;
/// a half that stays is passed on after the quiet (for the reload core to refuse); a renewal
/// that keeps the key passes at once (told from one for another key by the leaf's key: `x509`).
#[cfg(feature = "x509")]
#[test]
fn a_pair_replaced_one_file_after_the_other_is_passed_on_once_whole() {
    let ca = tls_test::TestCa::new("two renames");
    let [a, b, c] = ca.leaves(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    fs::write(&crt, &a.cert_pem).unwrap();
    fs::write(&key, &a.key_pem).unwrap();
    let quiet = Duration::from_millis(50);
    let mut reader = FileSource::builder(&crt, &key)
        .in_place_quiet(quiet)
        .build_reader();
    let served = |item: Option<Result<CertBundle, Error>>| {
        tls_test::fingerprint(item.expect("an item").expect("a bundle").chain()[0].as_ref())
    };
    assert_eq!(served(reader.check()), a.fingerprint);

    // Key first, then its certificate: nothing until the certificate is there, then the pair.
    tls_test::replace_by_rename(&key, b.key_pem.as_bytes()).unwrap();
    assert!(reader.check().is_none(), "the key alone is held");
    assert!(reader.settling().is_some(), "and looked at again");
    tls_test::replace_by_rename(&crt, b.cert_pem.as_bytes()).unwrap();
    assert_eq!(served(reader.check()), b.fingerprint);

    // Certificate first (for another key), then the key.
    tls_test::replace_by_rename(&crt, c.cert_pem.as_bytes()).unwrap();
    assert!(
        reader.check().is_none(),
        "a certificate for another key alone is held"
    );
    tls_test::replace_by_rename(&key, c.key_pem.as_bytes()).unwrap();
    assert_eq!(served(reader.check()), c.fingerprint);

    // A renewal that keeps the key: at once.
    let renewed = ca.renewed(&["localhost"], &c);
    tls_test::replace_by_rename(&crt, renewed.cert_pem.as_bytes()).unwrap();
    assert_eq!(served(reader.check()), renewed.fingerprint);

    // A key alone that stays alone: passed on after the quiet, for the reload core to refuse.
    tls_test::replace_by_rename(&key, a.key_pem.as_bytes()).unwrap();
    assert!(reader.check().is_none());
    std::thread::sleep(quiet);
    let stays = reader.check().expect("passed on after the quiet").unwrap();
    assert_eq!(
        tls_test::fingerprint(stays.chain()[0].as_ref()),
        renewed.fingerprint
    );
}
