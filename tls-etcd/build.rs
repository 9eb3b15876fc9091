//! Sets `cfg(etcd)` when the tests that need etcd (Debian packages `etcd-server` and
//! `etcd-client`) can run: `etcd` and `etcdctl` are on the `PATH`, or `CI` is set (where a
//! missing etcd must fail those tests, not skip them). Only the tests read it: without it they
//! are reported as ignored, rather than passing as if they had run. The library itself does not
//! change. (tls-acme's build script sets `cfg(etcd)` the same way, for its tests and serve's.)

use std::path::Path;

pub(crate) fn main() {
    println!("cargo::rustc-check-cfg=cfg(etcd)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=CI");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found: Vec<_> = ["etcd", "etcdctl"]
        .iter()
        .filter_map(|program| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| Path::new(candidate).is_file())
        })
        .collect();
    for program in &found {
        // Installed or removed again: the tests' cfg follows.
        println!("cargo::rerun-if-changed={}", program.display());
    }
    if found.len() == 2 || std::env::var_os("CI").is_some() {
        println!("cargo::rustc-cfg=etcd");
    }
}
