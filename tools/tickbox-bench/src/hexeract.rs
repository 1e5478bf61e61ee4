//! The Rust peer: the crate hexeract 0.6 running the same workload, through
//! `benches/hexeract` at the workspace's root — a crate of its own, outside
//! the workspace, so that hexeract's dependencies (sqlx, lapin with TLS)
//! stay out of the library's and the bench's. Built with cargo on first use
//! into its own target directory (`$HEXERACT_TARGET_DIR`, else
//! `benches/hexeract/target`), then run as a subprocess.

use crate::cli::{Args, BackendKind, Transport};
use crate::place::Place;
use crate::report::Json;
use crate::Res;
use std::path::PathBuf;
use std::process::Command;

/// The peer's crate: `benches/hexeract` at the workspace's root.
fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benches/hexeract")
}

/// Builds the peer (release) if needed; returns its binary.
async fn build() -> Res<PathBuf> {
    let dir = crate_dir();
    let target = std::env::var_os("HEXERACT_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("target"));
    let binary = target.join("release/hexeract-peer");
    eprintln!("hexeract: cargo build --release in benches/hexeract");
    let status = tokio::task::spawn_blocking({
        let target = target.clone();
        move || {
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args(["build", "--release", "--quiet", "--manifest-path"])
                .arg(dir.join("Cargo.toml"))
                .arg("--target-dir")
                .arg(target)
                .env_remove("CARGO_TARGET_DIR")
                .status()
        }
    })
    .await??;
    if !status.success() {
        return Err("building benches/hexeract failed (see cargo's output above)".into());
    }
    Ok(binary)
}

/// Runs hexeract on the run's workload — its SQL outbox worker over
/// `--transport local`, its outbox-to-RabbitMQ path over `amqp` — and
/// returns the JSON object it printed last. Its output is shown prefixed
/// with `hexeract | `, URLs with their passwords masked.
pub(crate) async fn run_hexeract(place: &Place, args: &Args) -> Res<Json> {
    let binary = build().await?;
    let path = match args.transport {
        Transport::Local => "outbox",
        Transport::Amqp => "amqp",
    };
    let consumers = args.hexeract_consumers.unwrap_or(args.concurrency);
    eprintln!(
        "hexeract: {path} path, batch {}, polling every {} ms, {} outbox worker(s){}",
        args.hexeract_batch,
        args.hexeract_poll_ms,
        args.hexeract_workers,
        if path == "amqp" {
            format!(
                ", {consumers} RabbitMQ workers, prefetch {}",
                args.amqp_prefetch
            )
        } else {
            String::new()
        }
    );
    let database = match args.backend {
        BackendKind::Postgres => place.pg_url().to_string(),
        BackendKind::Sqlite => place.dir.path().to_string_lossy().into_owned(),
        BackendKind::Mysql => return Err("hexeract has no MySQL store".into()),
    };
    let mut command = Command::new(binary);
    command
        .args(["--backend", args.backend.name()])
        .args(["--database-url", &database])
        .args(["--amqp-url", &args.amqp_url])
        .args(["--path", path])
        .args(["--messages", &args.messages.to_string()])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--batch", &args.hexeract_batch.to_string()])
        .args(["--poll-ms", &args.hexeract_poll_ms.to_string()])
        .args(["--workers", &args.hexeract_workers.to_string()])
        .args(["--consumers", &consumers.to_string()])
        .args(["--prefetch", &args.amqp_prefetch.to_string()])
        .arg("--json");
    if let Some(rate) = args.rate {
        command.args(["--rate", &rate.to_string()]);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let redact = |line: &str| {
        [&database, &args.amqp_url]
            .iter()
            .fold(line.to_string(), |l, url| {
                l.replace(url.as_str(), &tickbox::redact::redact_url(url))
            })
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines().filter(|l| !l.starts_with('{')) {
        println!("hexeract | {}", redact(line));
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        eprintln!("hexeract | {}", redact(line));
    }
    if !output.status.success() {
        return Err(format!("the hexeract benchmark failed ({})", output.status).into());
    }
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("hexeract printed no JSON")?;
    match serde_json::from_str(last)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("hexeract's JSON is not an object".into()),
    }
}
