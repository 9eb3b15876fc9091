//! The cfgs of serve's end-to-end tests: `cfg(pebble)` when Pebble can run and `cfg(etcd)` when
//! etcd can (tls-acme's script sets both). Without one, the tests that need it are reported as
//! ignored.

#[path = "../tls-acme/build.rs"]
mod cfgs;

fn main() {
    println!("cargo::rerun-if-changed=../tls-acme/build.rs");
    cfgs::main();
}
