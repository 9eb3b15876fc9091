//! The cfgs of serve's end-to-end tests: `cfg(pebble)` when Pebble can run (tls-acme's script),
//! `cfg(etcd)` when etcd can (tls-etcd's). Without one, the tests that need it are reported as
//! ignored.

#[path = "../tls-etcd/build.rs"]
mod etcd;
#[path = "../tls-acme/build.rs"]
mod pebble;

fn main() {
    println!("cargo::rerun-if-changed=../tls-acme/build.rs");
    println!("cargo::rerun-if-changed=../tls-etcd/build.rs");
    pebble::main();
    etcd::main();
}
