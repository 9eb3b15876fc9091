//! The Kubernetes API emulator on its own, to try `serve --k8s-secret`, `--k8s-secrets` and
//! `--k8s-shared` without a cluster:
//!
//! ```text
//! cargo run -p tls-test --bin kube-emulator -- [--listen ADDR] [--kubeconfig PATH]
//!                                              [--tls-secret NAMESPACE/NAME=DIR]... [--label KEY=VALUE]...
//! ```
//!
//! Listens on `ADDR` (default `127.0.0.1:6443`, plain HTTP, no authentication), writes a
//! kubeconfig for it to `PATH` (default `./kubeconfig`) and prints it. Each `--tls-secret`
//! keeps a `kubernetes.io/tls` Secret equal to `DIR`'s `tls.crt`, `tls.key` (and `ca.crt`
//! when present), labelled with every `--label`: the files are read every second and the
//! Secret updated when they change, so `rotate DIR` rotates the Secret. Secrets and Leases
//! are also served to any client (kubectl is not a goal: list, get, watch, create, replace,
//! delete). Stops on Ctrl-C.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tls_test::KubeApi;

const USAGE: &str = "usage: kube-emulator [--listen ADDR] [--kubeconfig PATH] [--tls-secret NAMESPACE/NAME=DIR]... [--label KEY=VALUE]...";

struct Secret {
    namespace: String,
    name: String,
    dir: PathBuf,
}

struct Args {
    listen: SocketAddr,
    kubeconfig: PathBuf,
    secrets: Vec<Secret>,
    labels: Vec<(String, String)>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        listen: "127.0.0.1:6443".parse().map_err(|_| "default address")?,
        kubeconfig: PathBuf::from("kubeconfig"),
        secrets: Vec::new(),
        labels: Vec::new(),
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--listen" => {
                let v = value()?;
                parsed.listen = v
                    .parse()
                    .map_err(|_| format!("--listen {v}: not ADDR:PORT"))?;
            }
            "--kubeconfig" => parsed.kubeconfig = PathBuf::from(value()?),
            "--tls-secret" => {
                let v = value()?;
                let (object, dir) = v
                    .split_once('=')
                    .ok_or(format!("--tls-secret {v}: not NAMESPACE/NAME=DIR"))?;
                let (namespace, name) = object
                    .split_once('/')
                    .ok_or(format!("--tls-secret {v}: not NAMESPACE/NAME=DIR"))?;
                parsed.secrets.push(Secret {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    dir: PathBuf::from(dir),
                });
            }
            "--label" => {
                let v = value()?;
                let (key, val) = v
                    .split_once('=')
                    .ok_or(format!("--label {v}: not KEY=VALUE"))?;
                parsed.labels.push((key.to_owned(), val.to_owned()));
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(parsed)
}

/// A Secret's data: file names and their bytes.
type Data = Vec<(&'static str, Vec<u8>)>;

/// `dir`'s files as Secret data, if `tls.crt` and `tls.key` can be read.
fn read(dir: &std::path::Path) -> Option<Data> {
    let mut data = Vec::new();
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        match std::fs::read(dir.join(file)) {
            Ok(bytes) => data.push((file, bytes)),
            Err(_) if file == "ca.crt" => {}
            Err(_) => return None,
        }
    }
    Some(data)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(reason) if reason.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(reason) => {
            eprintln!("error: {reason}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let api = match KubeApi::start_on(args.listen).await {
        Ok(api) => api,
        Err(err) => {
            eprintln!("error: cannot listen on {}: {err}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    if let Err(err) = std::fs::write(&args.kubeconfig, api.kubeconfig()) {
        eprintln!("error: cannot write {}: {err}", args.kubeconfig.display());
        return ExitCode::FAILURE;
    }
    println!("Kubernetes API emulator on {}", api.url());
    println!(
        "kubeconfig: {}  (export KUBECONFIG={})",
        args.kubeconfig.display(),
        args.kubeconfig.display()
    );
    let mut last: Vec<Option<Data>> = vec![None; args.secrets.len()];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
        for (secret, last) in args.secrets.iter().zip(last.iter_mut()) {
            let Some(now) = read(&secret.dir) else {
                continue;
            };
            if last.as_ref() == Some(&now) {
                continue;
            }
            let data: Vec<(&str, &[u8])> = now.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            let mut rv = api.put_secret(&secret.namespace, &secret.name, &data);
            for (key, value) in &args.labels {
                rv = api.set_label("secrets", &secret.namespace, &secret.name, key, value);
            }
            println!(
                "secret {}/{} from {} at resourceVersion {rv}",
                secret.namespace,
                secret.name,
                secret.dir.display()
            );
            *last = Some(now);
        }
    }
}
