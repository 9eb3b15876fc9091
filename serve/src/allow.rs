//! `--allow-cn`, `--allow-dns`, `--allow-uri` and `--allow-file`: the authorization the TLS
//! server applies to verified clients, the file's rules read again when it changes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tls_rotation::{AllowList, Authorization};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::cli::AllowArgs;

/// The authorization of `args`: the flags' rules, then the file's. The file is read now (a
/// file that cannot be read or parsed stops serve, naming it) and then every `poll` and on
/// each `reread` (SIGHUP) until `shutdown`: a change that parses replaces the rules (open
/// connections they refuse are closed); one that does not is logged and changes nothing.
pub(crate) fn authorization(
    args: &AllowArgs,
    poll: Duration,
    reread: Arc<Notify>,
    shutdown: CancellationToken,
) -> anyhow::Result<Authorization> {
    let Some(path) = args.file.clone() else {
        return Ok(Authorization::new(args.rules.clone()));
    };
    let text = read(&path)?;
    let file = AllowList::parse(&text).with_context(|| rule_context(&path))?;
    let rules = args.rules.clone().and(&file);
    tracing::info!(rules = rules.rules().len(), file = %path.display(), "client authorization rules");
    let authorization = Authorization::new(rules);
    let flags = args.rules.clone();
    let handle = authorization.clone();
    tokio::spawn(async move {
        let mut last = text;
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = reread.notified() => {}
                () = shutdown.cancelled() => return,
            }
            let text = match read(&path) {
                Ok(text) => text,
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "--allow-file: keeping the rules in force");
                    continue;
                }
            };
            if text == last {
                continue;
            }
            match AllowList::parse(&text) {
                Ok(file) => {
                    let rules = flags.clone().and(&file);
                    tracing::info!(rules = rules.rules().len(), file = %path.display(), "client authorization rules changed");
                    handle.set(rules);
                }
                Err(err) => {
                    tracing::warn!(file = %path.display(), error = %format!("{}: {err}", rule_context(&path)), "--allow-file: keeping the rules in force");
                }
            }
            last = text;
        }
    });
    Ok(authorization)
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("--allow-file {}", path.display()))
}

fn rule_context(path: &Path) -> String {
    format!("--allow-file {}", path.display())
}
