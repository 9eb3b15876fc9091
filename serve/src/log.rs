//! Logging to stderr, as serve (and the examples) do.

/// Logs to stderr, filtered by `RUST_LOG` or else by `default_filter` (an `EnvFilter`
/// directive such as `info`), in colour on a terminal only: not in a file, a pipe or a
/// container's log, and never with `NO_COLOR` set.
///
/// # Panics
/// If a global subscriber is already set.
pub fn log_to_stderr(default_filter: &str) {
    use std::io::IsTerminal as _;
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
}
