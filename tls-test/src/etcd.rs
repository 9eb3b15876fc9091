//! A real etcd cluster on loopback (Debian's `etcd-server` and `etcd-client`: `etcd` and
//! `etcdctl`): three members by default, on free ports, in a temporary directory on tmpfs
//! where there is one, with election timeouts long enough not to flap on two busy cores.
//!
//! Each member runs under a small `sh` watchdog that holds a pipe from the test process: when
//! the test process ends, however it ends, the pipe closes and the watchdog kills its member
//! and removes its data. So a cluster shared by a whole test binary ([`EtcdCluster::shared`])
//! needs no drop, and a test can SIGKILL a member ([`EtcdCluster::kill`]) and start it again
//! ([`EtcdCluster::restart`]) on the same data.

use std::fmt;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::pebble::which;
use crate::{PATIENCE, TestCa, TestCert, free_port};

const INSTALL: &str = "apt-get install etcd-server etcd-client (Debian/Ubuntu)";

/// Configures an [`EtcdCluster`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct EtcdClusterBuilder {
    members: usize,
    tls: bool,
    auth_token_ttl: Option<u64>,
}

impl EtcdClusterBuilder {
    /// How many members (default 3).
    pub fn members(mut self, members: usize) -> Self {
        self.members = members.max(1);
        self
    }

    /// Clients connect over TLS and must present a certificate from [`EtcdCluster::ca`]
    /// (`--client-cert-auth`); the server certificate is for `127.0.0.1` and `localhost`.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// etcd's `--auth-token-ttl`, in seconds (etcd's default is 300): how long an
    /// authentication token lives unused.
    pub fn auth_token_ttl(mut self, seconds: u64) -> Self {
        self.auth_token_ttl = Some(seconds.max(1));
        self
    }

    /// Starts every member and waits until the cluster is healthy.
    ///
    /// `None` when etcd is not installed and `CI` is not set (the test is skipped, and says how
    /// to install it).
    ///
    /// # Panics
    /// When etcd is not installed under `CI`, or the cluster does not become healthy.
    pub fn start(self) -> Option<EtcdCluster> {
        let (Some(etcd), Some(etcdctl)) = (which("etcd"), which("etcdctl")) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is needed (CI is set): {INSTALL}"
            );
            eprintln!("skipped: etcd is not installed ({INSTALL})");
            return None;
        };
        Some(EtcdCluster::spawn(&self, etcd, etcdctl))
    }
}

/// A running etcd cluster; see the module docs. Its members stop when it is dropped, or when
/// the test process ends.
pub struct EtcdCluster {
    etcd: PathBuf,
    etcdctl: PathBuf,
    dir: PathBuf,
    members: Vec<Member>,
    tls: Option<Tls>,
    auth_token_ttl: Option<u64>,
    user: Mutex<Option<(String, String)>>,
    prefixes: AtomicUsize,
}

struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    process: Mutex<Option<Watchdog>>,
}

/// A member under its `sh` watchdog: closing `stdin` kills it (and `drop` does).
struct Watchdog {
    shell: Child,
    stdin: Option<ChildStdin>,
    /// etcd's own pid.
    pid: u32,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stdin.take()); // the watchdog kills etcd
        let _ = self.shell.wait();
    }
}

struct Tls {
    ca: TestCa,
    server: TestCert,
    client: TestCert,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdCluster {
    /// Starts configuring a cluster.
    pub fn builder() -> EtcdClusterBuilder {
        EtcdClusterBuilder {
            members: 3,
            tls: false,
            auth_token_ttl: None,
        }
    }

    /// The three-member cluster this test binary shares (started by the first test that asks;
    /// give each test its own [`prefix`](Self::prefix)). `None` as for
    /// [`EtcdClusterBuilder::start`]. Tests that stop members or change the cluster's settings
    /// start their own.
    pub fn shared() -> Option<&'static Self> {
        static SHARED: OnceLock<Option<EtcdCluster>> = OnceLock::new();
        SHARED.get_or_init(|| Self::builder().start()).as_ref()
    }

    fn spawn(config: &EtcdClusterBuilder, etcd: PathBuf, etcdctl: PathBuf) -> Self {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("tls-test-etcd-")
            .tempdir_in(base)
            .expect("a temporary directory")
            .keep();
        let members = (0..config.members)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                process: Mutex::new(None),
            })
            .collect();
        let tls = config.tls.then(|| {
            let ca = TestCa::new("tls-test etcd CA");
            let server = ca.leaf(&["127.0.0.1", "localhost"]);
            let client = ca.client_leaf("root");
            for (name, pem) in [
                ("ca.pem", ca.cert_pem()),
                ("server.pem", server.cert_pem.clone()),
                ("server-key.pem", server.key_pem.clone()),
                ("client.pem", client.cert_pem.clone()),
                ("client-key.pem", client.key_pem.clone()),
            ] {
                std::fs::write(dir.join(name), pem).expect("write a TLS file");
            }
            Tls { ca, server, client }
        });
        let cluster = Self {
            etcd,
            etcdctl,
            dir,
            members,
            tls,
            auth_token_ttl: config.auth_token_ttl,
            user: Mutex::new(None),
            prefixes: AtomicUsize::new(0),
        };
        for i in 0..cluster.members.len() {
            cluster.launch(i, true);
        }
        cluster.wait_healthy();
        cluster
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Starts member `i` under its watchdog (`new`: as part of the cluster's first start).
    fn launch(&self, i: usize, new: bool) {
        let member = &self.members[i];
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let client_url = format!("{}://{}", self.scheme(), member.client);
        let data = self.dir.join(&member.name);
        let mut args: Vec<String> = vec![
            "--name".into(),
            member.name.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen-client-urls".into(),
            client_url.clone(),
            "--advertise-client-urls".into(),
            client_url,
            "--listen-peer-urls".into(),
            format!("http://{}", member.peer),
            "--initial-advertise-peer-urls".into(),
            format!("http://{}", member.peer),
            "--initial-cluster".into(),
            initial_cluster,
            "--initial-cluster-token".into(),
            self.dir.display().to_string(),
            "--initial-cluster-state".into(),
            if new { "new" } else { "existing" }.into(),
            // Two busy cores: a heartbeat missed now and then must not start an election.
            "--heartbeat-interval".into(),
            "200".into(),
            "--election-timeout".into(),
            "2000".into(),
            "--logger".into(),
            "zap".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        if let Some(ttl) = self.auth_token_ttl {
            args.extend(["--auth-token-ttl".into(), ttl.to_string()]);
        }
        if self.tls.is_some() {
            for (flag, file) in [
                ("--cert-file", "server.pem"),
                ("--key-file", "server-key.pem"),
                ("--trusted-ca-file", "ca.pem"),
            ] {
                args.extend([flag.into(), self.dir.join(file).display().to_string()]);
            }
            args.push("--client-cert-auth".into());
        }
        let log = self.dir.join(format!("{}.log", member.name));
        // The watchdog: etcd in the background, its pid on stdout; when stdin closes (the test
        // process ended, or `kill`/`drop`), it kills etcd and removes its data.
        let script = r#"etcd="$1"; log="$2"; data="$3"; shift 3
"$etcd" "$@" </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid"
read -r line
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[ "$line" = keep ] || { rm -rf "$data" "$log"; rmdir "$(dirname "$data")" 2>/dev/null; }
true"#;
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&self.etcd)
            .arg(&log)
            .arg(&data)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd's watchdog: {e}"));
        let mut pid = String::new();
        {
            use std::io::BufRead as _;
            let stdout = shell.stdout.take().expect("piped");
            std::io::BufReader::new(stdout)
                .read_line(&mut pid)
                .expect("the watchdog says etcd's pid");
        }
        let pid = pid.trim().parse().expect("etcd's pid");
        let stdin = shell.stdin.take();
        *member
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Watchdog { shell, stdin, pid });
    }

    /// The members' client URLs (`http://127.0.0.1:PORT`, or `https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://{}", self.scheme(), m.client))
            .collect()
    }

    /// The client URLs of the members running now.
    fn running(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| {
                m.process
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some()
            })
            .map(|m| format!("{}://{}", self.scheme(), m.client))
            .collect()
    }

    /// The members' client addresses, `127.0.0.1:PORT`.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.client).collect()
    }

    /// A prefix of its own for one test of a shared cluster: `/tls-test/N-NAME/`.
    pub fn prefix(&self, name: &str) -> String {
        let n = self.prefixes.fetch_add(1, Ordering::Relaxed);
        format!("/tls-test/{n}-{name}/")
    }

    /// With [`tls`](EtcdClusterBuilder::tls): the CA etcd's certificates come from (the server's,
    /// and clients' it accepts).
    ///
    /// # Panics
    /// Without TLS.
    pub fn ca(&self) -> &TestCa {
        &self.tls.as_ref().expect("a cluster started with tls()").ca
    }

    /// With TLS, the file of the CA's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A directory for a test's own files, removed with the cluster's.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `etcdctl` against every member running (with the cluster's TLS client certificate, and
    /// the user set by [`enable_auth`](Self::enable_auth)), `input` on its standard input.
    ///
    /// # Errors
    /// etcdctl's standard error, when it fails.
    pub fn etcdctl_with(&self, args: &[&str], input: Option<&[u8]>) -> Result<String, String> {
        let mut command = Command::new(&self.etcdctl);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.running().join(",")))
            .arg("--command-timeout=10s")
            .arg("--dial-timeout=5s");
        if self.tls.is_some() {
            command
                .arg(format!("--cacert={}", self.dir.join("ca.pem").display()))
                .arg(format!("--cert={}", self.dir.join("client.pem").display()))
                .arg(format!(
                    "--key={}",
                    self.dir.join("client-key.pem").display()
                ));
        }
        if let Some((user, password)) = &*self.user.lock().unwrap_or_else(PoisonError::into_inner) {
            command.arg(format!("--user={user}:{password}"));
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run etcdctl: {e}"))?;
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("piped");
            stdin
                .write_all(input)
                .map_err(|e| format!("etcdctl's input: {e}"))?;
        }
        drop(child.stdin.take());
        let out = child
            .wait_with_output()
            .map_err(|e| format!("etcdctl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// [`etcdctl_with`](Self::etcdctl_with) without input, panicking on failure.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.etcdctl_with(args, None)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Puts `value` at `key` (read by etcdctl from its standard input) and returns the revision.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn put(&self, key: &str, value: &[u8]) -> i64 {
        let out = self
            .etcdctl_with(&["put", key, "-w", "json"], Some(value))
            .unwrap_or_else(|err| panic!("{err}"));
        revision_of(&out)
    }

    /// Deletes `key`; returns the revision.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn delete(&self, key: &str) -> i64 {
        revision_of(&self.etcdctl(&["del", key, "-w", "json"]))
    }

    /// The cluster's current revision.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn revision(&self) -> i64 {
        revision_of(&self.etcdctl(&["get", "/", "--limit=1", "-w", "json"]))
    }

    /// Compacts the history up to the current revision (a watch resuming from before it is
    /// told `ErrCompacted`); returns that revision.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn compact(&self) -> i64 {
        let revision = self.revision();
        self.etcdctl(&["compact", &revision.to_string(), "--physical"]);
        revision
    }

    /// Adds `root` with `password`, enables authentication, and uses that user for etcdctl
    /// from now on; adds `user` with `user_password`, allowed to read every key.
    ///
    /// # Panics
    /// When etcdctl fails.
    pub fn enable_auth(&self, password: &str, user: &str, user_password: &str) {
        self.etcdctl(&["user", "add", &format!("root:{password}")]);
        self.etcdctl(&["user", "add", &format!("{user}:{user_password}")]);
        self.etcdctl(&["role", "add", "reader"]);
        self.etcdctl(&[
            "role",
            "grant-permission",
            "reader",
            "read",
            "/",
            "--prefix",
        ]);
        self.etcdctl(&["user", "grant-role", user, "reader"]);
        self.etcdctl(&["auth", "enable"]);
        *self.user.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(("root".to_owned(), password.to_owned()));
    }

    /// The index of the member that leads the cluster now.
    ///
    /// # Panics
    /// When no member is the leader within [`PATIENCE`].
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(leader) = self.try_leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no etcd leader within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_leader(&self) -> Option<usize> {
        let out = self
            .etcdctl_with(&["endpoint", "status", "-w", "json"], None)
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_str(&out).ok()?;
        for (i, member) in self.members.iter().enumerate() {
            let Some(own) = statuses.as_array()?.iter().find(|s| {
                s["Endpoint"]
                    .as_str()
                    .is_some_and(|e| e.ends_with(&member.client.to_string()))
            }) else {
                continue; // not running
            };
            let status = &own["Status"];
            if status["leader"].as_u64().is_some()
                && status["leader"] == status["header"]["member_id"]
            {
                return Some(i);
            }
        }
        None
    }

    /// SIGKILLs member `i` (its data stays, for [`restart`](Self::restart)).
    ///
    /// # Panics
    /// When it is not running.
    pub fn kill(&self, i: usize) {
        let mut process = self.members[i]
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let watchdog = process.as_mut().expect("the member is running");
        let killed = Command::new("kill")
            .args(["-KILL", &watchdog.pid.to_string()])
            .status()
            .expect("kill");
        assert!(killed.success(), "kill -KILL {}", watchdog.pid);
        // The watchdog keeps the data when it is told to stop now.
        if let Some(mut stdin) = watchdog.stdin.take() {
            let _ = writeln!(stdin, "keep");
        }
        let _ = watchdog.shell.wait();
        *process = None;
    }

    /// Starts member `i` again after [`kill`](Self::kill), on its data, and waits until the
    /// cluster is healthy.
    pub fn restart(&self, i: usize) {
        self.launch(i, false);
        self.wait_healthy();
    }

    /// Waits until every running member answers and the cluster has a leader.
    ///
    /// # Panics
    /// After [`PATIENCE`].
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let healthy = self.etcdctl_with(&["endpoint", "health"], None).is_ok();
            if healthy && self.try_leader().is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within {PATIENCE:?}; its logs are in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The client certificate etcdctl presents (for `tls()` clusters): one a test may copy.
    ///
    /// # Panics
    /// Without TLS.
    pub fn client_cert(&self) -> &TestCert {
        &self
            .tls
            .as_ref()
            .expect("a cluster started with tls()")
            .client
    }

    /// The server certificate the members present.
    ///
    /// # Panics
    /// Without TLS.
    pub fn server_cert(&self) -> &TestCert {
        &self
            .tls
            .as_ref()
            .expect("a cluster started with tls()")
            .server
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &self.members {
            drop(
                member
                    .process
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take(),
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn revision_of(json: &str) -> i64 {
    let value: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("etcdctl's JSON ({e}): {json}"));
    value["header"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no header.revision in {json}"))
}
