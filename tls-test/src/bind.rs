//! BIND 9 (`named`, Debian package `bind9`), run per test on a free loopback port as the
//! primary of a few zones that take RFC 2136 updates signed with a TSIG key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::PATIENCE;
use crate::pebble::{free_udp_and_tcp_port, joined, lines_matching, run, which};

/// How to install BIND, for the message of a test that needs it.
const INSTALL: &str = "apt-get install bind9 bind9-dnsutils (named, tsig-keygen, dig)";

/// The key the zones' `update-policy` grants ([`BindBuilder::grant`]).
pub const UPDATE_KEY: &str = "acme-update";
/// A key the server knows and grants nothing: its updates are refused.
pub const UNGRANTED_KEY: &str = "no-grant";

/// Configures a [`Bind`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct BindBuilder {
    zones: Vec<(String, Vec<String>)>,
    grants: Vec<String>,
}

impl BindBuilder {
    /// A zone with `origin` (no final dot), its SOA and `NS ns1.example.test.` (which resolves
    /// to 127.0.0.1 when `example.test` is one of the zones) and `records` in zone-file form
    /// relative to the origin (`"www A 127.0.0.1"`).
    pub fn zone(mut self, origin: &str, records: &[&str]) -> Self {
        self.zones.push((
            origin.to_owned(),
            records.iter().map(|r| (*r).to_owned()).collect(),
        ));
        self
    }

    /// A rule of every zone's `update-policy` for [`UPDATE_KEY`], after `grant acme-update`:
    /// e.g. `name _acme-challenge.w.example.test. TXT`.
    pub fn grant(mut self, rule: &str) -> Self {
        self.grants.push(rule.to_owned());
        self
    }

    /// Starts `named` and waits until it has loaded its zones.
    ///
    /// `None` when BIND is not installed and `CI` is not set (the test is skipped, and says how
    /// to install it).
    ///
    /// # Panics
    /// When BIND is not installed under `CI`, or it does not start.
    pub async fn start(self) -> Option<Bind> {
        let (Some(named), Some(keygen)) = (find("named"), find("tsig-keygen")) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "BIND is needed (CI is set): {INSTALL}"
            );
            eprintln!("skipped: BIND is not installed ({INSTALL})");
            return None;
        };
        Some(Bind::spawn(self, &named, &keygen).await)
    }
}

/// `program` on `PATH`, or in `/usr/sbin` (where Debian puts `named`, off a user's `PATH`).
fn find(program: &str) -> Option<PathBuf> {
    which(program).or_else(|| {
        let path = Path::new("/usr/sbin").join(program);
        path.is_file().then_some(path)
    })
}

/// A running `named`, stopped when dropped.
pub struct Bind {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    _named: Child,
}

impl std::fmt::Debug for Bind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bind")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Bind {
    /// Configures a BIND for one test.
    pub fn builder() -> BindBuilder {
        BindBuilder::default()
    }

    async fn spawn(config: BindBuilder, named: &Path, keygen: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().to_owned();
        for key in [UPDATE_KEY, UNGRANTED_KEY] {
            let output = std::process::Command::new(keygen)
                .args(["-a", "hmac-sha256", key])
                .output()
                .expect("run tsig-keygen");
            assert!(output.status.success(), "tsig-keygen failed");
            let file = path.join(format!("{key}.key"));
            std::fs::write(&file, &output.stdout).expect("write the key");
            set_mode(&file, 0o600);
        }
        // The port is free when chosen, but another process may take it before named binds
        // it: named then runs without that listener. Such an attempt is retried on another.
        for attempt in 1..=5 {
            let addr = free_udp_and_tcp_port();
            let mut conf = format!(
                "options {{\n  directory \"{dir}\";\n  listen-on port {port} {{ 127.0.0.1; }};\n  listen-on-v6 {{ none; }};\n  pid-file \"{dir}/named.pid\";\n  session-keyfile \"{dir}/session.key\";\n  managed-keys-directory \"{dir}\";\n  recursion no;\n  dnssec-validation no;\n  notify no;\n  allow-transfer {{ 127.0.0.1; }};\n}};\ncontrols {{ }};\ninclude \"{dir}/{UPDATE_KEY}.key\";\ninclude \"{dir}/{UNGRANTED_KEY}.key\";\n",
                dir = path.display(),
                port = addr.port(),
            );
            let policy: String = config
                .grants
                .iter()
                .map(|rule| format!(" grant {UPDATE_KEY} {rule};"))
                .collect();
            for (origin, records) in &config.zones {
                let file = path.join(format!("{origin}.zone"));
                let mut zone = format!(
                    "$ORIGIN {origin}.\n$TTL 60\n@ IN SOA ns1.example.test. hostmaster.example.test. 1 3600 600 86400 60\n@ IN NS ns1.example.test.\n"
                );
                if origin == "example.test" {
                    zone.push_str("ns1 IN A 127.0.0.1\n");
                }
                for record in records {
                    zone.push_str(record);
                    zone.push('\n');
                }
                std::fs::write(&file, zone).expect("write a zone");
                conf.push_str(&format!(
                    "zone \"{origin}\" {{ type primary; file \"{}\"; update-policy {{{policy} }}; }};\n",
                    file.display()
                ));
            }
            let conf_file = path.join("named.conf");
            std::fs::write(&conf_file, conf).expect("write named.conf");

            let log = Arc::new(Mutex::new(Vec::new()));
            let mut command = Command::new(named);
            command
                .arg("-g")
                .arg("-n")
                .arg("1")
                .arg("-c")
                .arg(&conf_file);
            let child = run(command, "named", &log);
            let started = tokio::time::timeout(PATIENCE, async {
                while lines_matching(&log, "running") == 0 {
                    assert!(
                        lines_matching(&log, "exiting (due to fatal error)") == 0,
                        "named did not start:\n{}",
                        joined(&log)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(started.is_ok(), "named did not start:\n{}", joined(&log));
            // Listening on TCP within two seconds, and not told the port was taken.
            let listening = tokio::time::timeout(Duration::from_secs(2), async {
                loop {
                    if lines_matching(&log, "address in use") > 0 {
                        return false;
                    }
                    if tokio::net::TcpStream::connect(addr).await.is_ok() {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .unwrap_or(false);
            if listening {
                return Self {
                    dir,
                    addr,
                    log,
                    _named: child,
                };
            }
            assert!(
                attempt < 5,
                "named does not listen on {addr}:\n{}",
                joined(&log)
            );
            // Stopped and waited for; the next attempt takes another port.
            let mut child = child;
            let _ = child.kill().await;
        }
        unreachable!("the last attempt returns")
    }

    /// Where `named` listens (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The file of a key the server knows ([`UPDATE_KEY`] or [`UNGRANTED_KEY`]), in BIND's
    /// format, mode 600.
    pub fn key_file(&self, key: &str) -> PathBuf {
        self.dir.path().join(format!("{key}.key"))
    }

    /// The values of the TXT records at `name`, as `named` answers them.
    pub async fn txt(&self, name: &str) -> Vec<String> {
        self.short("TXT", name)
            .await
            .into_iter()
            .filter(|line| line.starts_with('"'))
            .map(|line| line.trim_matches('"').to_owned())
            .collect()
    }

    /// What `named` answers for `name` and `kind` (`dig +short`: one line per record).
    pub async fn short(&self, kind: &str, name: &str) -> Vec<String> {
        self.dig(&["+short", kind, name])
            .await
            .lines()
            .map(|line| line.trim().to_owned())
            .collect()
    }

    /// Every record of `zone` (an AXFR), one per line in `dig`'s form.
    pub async fn zone_records(&self, zone: &str) -> Vec<String> {
        self.dig(&["+noall", "+answer", "AXFR", zone])
            .await
            .lines()
            .map(str::to_owned)
            .collect()
    }

    async fn dig(&self, args: &[&str]) -> String {
        let output = Command::new(find("dig").expect("dig (bind9-dnsutils)"))
            .arg(format!("@{}", self.addr.ip()))
            .args(["-p", &self.addr.port().to_string(), "+tcp"])
            .args(args)
            .output()
            .await
            .expect("run dig");
        assert!(output.status.success(), "dig {args:?} failed");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// How many lines of `named`'s log contain `needle`.
    pub fn log_matching(&self, needle: &str) -> usize {
        lines_matching(&self.log, needle)
    }

    /// `named`'s log so far.
    pub fn log(&self) -> String {
        joined(&self.log)
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
