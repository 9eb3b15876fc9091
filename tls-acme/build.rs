//! Sets `cfg(pebble)` when the tests that need Pebble (the ACME test server, Debian package
//! `pebble`) can run: `pebble` and `pebble-challtestsrv` are on the `PATH`; and `cfg(etcd)`
//! when those of a fleet on etcd can (Debian `etcd-server`, `etcd-client`: `etcd` and
//! `etcdctl`); and `cfg(bind)` when those of DNS-01 through BIND 9 can (Debian `bind9`,
//! `bind9-dnsutils`: `named`, `tsig-keygen`, `dig`; `/usr/sbin` is searched too, off a user's
//! `PATH`). Each is set when `CI` is (where a missing server must fail those tests, not
//! skip them). Only the tests read them: without one they are reported as ignored, rather than
//! passing as if they had run. The library itself does not change. (serve's build script runs
//! this one too, for its end-to-end tests.)

use std::path::Path;

pub(crate) fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=CI");
    cfg_when_found("pebble", &["pebble", "pebble-challtestsrv"]);
    cfg_when_found("etcd", &["etcd", "etcdctl"]);
    cfg_when_found("bind", &["named", "tsig-keygen", "dig"]);
}

/// Sets `cfg(CFG)` when every one of `programs` is on the `PATH` (or in `/usr/sbin`), or `CI`
/// is set.
fn cfg_when_found(cfg: &str, programs: &[&str]) {
    println!("cargo::rustc-check-cfg=cfg({cfg})");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found: Vec<_> = programs
        .iter()
        .filter_map(|program| {
            std::env::split_paths(&path)
                .chain([std::path::PathBuf::from("/usr/sbin")])
                .map(|dir| dir.join(program))
                .find(|candidate| Path::new(candidate).is_file())
        })
        .collect();
    for program in &found {
        // Installed or removed again: the tests' cfg follows.
        println!("cargo::rerun-if-changed={}", program.display());
    }
    if found.len() == programs.len() || std::env::var_os("CI").is_some() {
        println!("cargo::rustc-cfg={cfg}");
    }
}
