//! `cargo run --example serve -- FLAGS`: the `serve` binary (the `tls-rotation-serve` crate in
//! `serve/`), run from the repository. Its flags are in that crate's docs and `--help`.

fn main() -> std::process::ExitCode {
    tls_rotation_serve::main()
}
