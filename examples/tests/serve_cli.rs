//! serve's command line, in-process: the unit tests beside its parser (`serve/cli.rs`),
//! compiled here. (As the example's own tests they would be built instead of the `serve`
//! binary that `tests/serve.rs` runs.)

// The binary uses `Args::from_env`; the tests use the parser.
#[allow(dead_code)]
#[path = "../serve/cli.rs"]
mod cli;
