//! A server process under test that prints `listening on https://ADDR` once it serves and answers
//! `GET /` with its status as JSON: the `serve` binary, through its end-to-end tests and the
//! examples' walk-throughs.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::PATIENCE;

/// A running `serve` (or a server like it), its address, and the rest of its stdout.
#[derive(Debug)]
pub struct Serve {
    /// The process (killed when dropped).
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its stdout after the first line.
    pub lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

/// What [`announced`] returns: the process (killed when dropped), its first line on stdout,
/// and the rest of its stdout.
pub type Announced = (
    Child,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
);

/// Starts `command` (stdout read here, stderr dropped, killed when dropped) and waits for the
/// first line it prints: a process that announces where it listens (serve, the sidecar tests'
/// upstream).
///
/// # Panics
/// When it does not start or print a line within [`PATIENCE`].
pub async fn announced(mut command: Command) -> Announced {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{command:?} announces itself in time"))
        .expect("its stdout reads")
        .unwrap_or_else(|| panic!("{command:?} printed no line"));
    (child, line, lines)
}

impl Serve {
    /// Starts `bin` with `args` (and `--listen 127.0.0.1:0` unless `--listen` is among them),
    /// and waits for its `listening on https://ADDR` line.
    ///
    /// # Panics
    /// When it does not start or announce itself within [`PATIENCE`].
    pub async fn start(bin: &Path, args: &[&str]) -> Self {
        Self::start_with_env(bin, args, &[]).await
    }

    /// [`start`](Self::start) with environment variables added.
    ///
    /// # Panics
    /// When it does not start or announce itself within [`PATIENCE`].
    pub async fn start_with_env(
        bin: &Path,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        let listen: &[&str] = if args.contains(&"--listen") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut command = Command::new(bin);
        command
            .args(listen)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info");
        let (child, line, lines) = announced(command).await;
        let addr = line
            .strip_prefix("listening on https://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Self { child, addr, lines }
    }

    /// `GET /`: the JSON status and the fingerprint of the certificate the connection was served.
    ///
    /// # Panics
    /// When the request fails or the answer is not a 200 with JSON.
    pub async fn get(&self) -> (serde_json::Value, String) {
        let (code, body, served) = crate::https_get(self.addr, "localhost", "/")
            .await
            .expect("GET /");
        assert_eq!(code, 200, "{body}");
        let json = serde_json::from_str(&body).expect("JSON status");
        (json, served.fingerprint)
    }

    /// The status while nothing rotates: it describes the certificate served.
    ///
    /// # Panics
    /// As [`get`](Self::get), and when the status does not describe what is served.
    pub async fn status(&self) -> serde_json::Value {
        let (json, served) = self.get().await;
        assert_eq!(
            json["fingerprint_sha256"], served,
            "status describes what is served"
        );
        json
    }

    /// Polls `GET /` until `pred` holds.
    ///
    /// # Panics
    /// When `pred` does not hold within [`PATIENCE`].
    pub async fn wait_status(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            // A rotation may land between the handshake and the request: wait until both agree.
            let (status, served) = self.get().await;
            if pred(&status) && status["fingerprint_sha256"] == served {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {status}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends the signal `sig` (as `kill` names it, e.g. `-HUP`).
    ///
    /// # Panics
    /// When the process is gone or `kill` fails.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Waits for the process to exit; checks that stdout had exactly the one line.
    ///
    /// # Panics
    /// When it does not exit within [`PATIENCE`] or printed more than the one line.
    pub async fn exit_code(mut self) -> Option<i32> {
        let code = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits in time")
            .unwrap()
            .code();
        let extra = self.lines.next_line().await.unwrap();
        assert_eq!(extra, None, "nothing but the listening line on stdout");
        code
    }
}
