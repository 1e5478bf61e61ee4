//! The peer: the npm package pg-transactional-outbox running the same
//! workload on the same PostgreSQL, through `benches/peer/bench.js` at the
//! workspace's root.

use crate::cli::Args;
use crate::place::Place;
use crate::report::Json;
use crate::Res;
use std::path::PathBuf;
use std::process::Command;

/// The peer's directory: `benches/peer` at the workspace's root.
fn peer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benches/peer")
}

/// Installs the peer's packages with `npm ci` unless they are there.
async fn install(dir: PathBuf) -> Res<()> {
    if dir.join("node_modules").exists() {
        return Ok(());
    }
    eprintln!("peer: installing benches/peer with npm ci");
    let status = tokio::task::spawn_blocking(move || {
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(dir)
            .status()
    })
    .await??;
    if !status.success() {
        return Err("`npm ci` in benches/peer failed".into());
    }
    Ok(())
}

/// Runs the peer's benchmark with the run's figures; returns the JSON object
/// it printed last. Its output is shown prefixed with `peer | `, its
/// database URL with the password masked.
pub(crate) async fn run_peer(place: &Place, args: &Args) -> Res<Json> {
    let dir = peer_dir();
    install(dir.clone()).await?;
    let url = place.pg_url().to_string();
    let batch = args.peer_batch.unwrap_or(2 * args.concurrency);
    let mode = args.peer_mode.name();
    eprintln!(
        "peer: pg-transactional-outbox, {mode} mode, batch {batch}, polling every {} ms",
        args.peer_poll_ms
    );
    let mut command = Command::new("node");
    command
        .arg(dir.join("bench.js"))
        .args(["--database-url", &url])
        .args(["--messages", &args.messages.to_string()])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--mode", mode])
        .args(["--batch", &batch.to_string()])
        .args(["--poll-ms", &args.peer_poll_ms.to_string()])
        .arg("--json");
    if let Some(rate) = args.rate {
        command.args(["--rate", &rate.to_string()]);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    // The peer may echo its database URL: shown with the password masked.
    let redacted = tickbox::redact::redact_url(&url);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        if !line.starts_with('{') {
            println!("peer | {}", line.replace(&url, &redacted));
        }
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        eprintln!("peer | {}", line.replace(&url, &redacted));
    }
    if !output.status.success() {
        return Err(format!("the peer benchmark failed ({})", output.status).into());
    }
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("the peer printed no JSON")?;
    match serde_json::from_str(last)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("the peer's JSON is not an object".into()),
    }
}
