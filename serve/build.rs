//! The cfgs of serve's end-to-end tests: `cfg(pebble)` when Pebble can run, `cfg(etcd)` when
//! etcd can and `cfg(bind)` when BIND 9 can (tls-acme's script sets them). Without one, the tests that need it are reported as
//! ignored.

#[path = "../tls-acme/build.rs"]
mod cfgs;

fn main() {
    println!("cargo::rerun-if-changed=../tls-acme/build.rs");
    cfgs::main();
}
