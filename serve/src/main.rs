//! `serve`: an HTTPS server whose certificate rotates without a restart. The flags are in the
//! crate docs (`tls_rotation_serve`) and in `serve --help`.

fn main() -> std::process::ExitCode {
    tls_rotation_serve::main()
}
