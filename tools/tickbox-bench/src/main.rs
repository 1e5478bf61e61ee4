//! ```text
//! cargo run --release -p tickbox-bench -- --backend sqlite --messages 20000 --concurrency 4
//! cargo run --release -p tickbox-bench --features postgres -- --backend postgres \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --messages 20000 --concurrency 4 --json
//! cargo run --release -p tickbox-bench --features mysql -- --backend mysql \
//!     --database-url mysql://root@127.0.0.1:3306 --messages 20000 --concurrency 4 --json
//! ```
//!
//! `bench` — the tickbox benchmark: end-to-end messages per second through
//! the bus, measured in the same run against the database's own limit (the
//! same producer and consumer transactions run directly with diesel-async,
//! no bus) and, with `--peer`, against the npm package
//! `pg-transactional-outbox` on the same PostgreSQL, or with `--hexeract`,
//! against the Rust crate hexeract. With `--transport amqp` (feature `amqp`)
//! the bus runs over RabbitMQ, and a second baseline measures the broker
//! alone (lapin publishing with confirms and consuming with acks). Also measures
//! commit-to-handled latency, peak memory, a 1,000,000-message backlog drain
//! and handling with a 10,000,000-row inbox.
//!
//! Other scenarios (`--scenario latency|backlog|big-inbox|scheduled`), the peer
//! comparison (`--peer`) and every flag are described by `--help` and in
//! BENCHMARKS.md, which also records the results.
//!
//! Workload: C producer tasks each commit a business row and publish one
//! message per transaction; one handler per message inserts a business row in
//! its inbox-guarded transaction; the run ends when N messages are handled.
//!
//! Exit status: 0 on success, 1 when a run failed (a database error, a
//! stalled run, a failed verification), 2 on a usage error.
//!
//! # Layout
//!
//! - `main.rs` — the flow: arguments, the backend, the scenario, the final
//!   report.
//! - `cli.rs` — the command line (clap).
//! - `workload.rs` — the message, the handler, the business rows.
//! - `clock.rs` — each measured run's timestamps and their latencies
//!   (hdrhistogram).
//! - `trace.rs` — the tracing layer that timestamps each handler's COMMIT.
//! - `place.rs` — where the databases of one process live.
//! - `backend.rs` — what the bench needs from a backend beyond tickbox's API;
//!   `sqlite.rs`, `postgres.rs` and `mysql.rs` (MariaDB, MySQL) implement
//!   it.
//! - `measure.rs` — one measured run: producers, waiting for the handlers,
//!   what a run produced.
//! - `baseline.rs` — the workload without tickbox (the database's limit).
//! - `pair.rs` — the workload through tickbox: two modules and their bus.
//! - `prefill.rs` — bulk loading of outbox and inbox rows.
//! - `scenarios/` — throughput, latency, backlog, big-inbox, scheduled.
//! - `peer.rs` — the peer, pg-transactional-outbox (benches/peer/bench.js).
//! - `hexeract.rs` — the Rust peer, hexeract 0.6 (benches/hexeract, its own
//!   crate outside the workspace), run as a subprocess.
//! - `amqp.rs` — over RabbitMQ: each run's namespace and clean-up, and the
//!   raw AMQP baseline (lapin alone, no database).
//! - `report.rs` — the tables and the JSON object printed.
//! - `memory.rs` — the process's resident memory.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    clippy::missing_docs_in_private_items
)]

#[cfg(feature = "amqp")]
mod amqp;
mod backend;
mod baseline;
mod cli;
mod clock;
mod hexeract;
mod measure;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
mod pair;
mod peer;
mod place;
#[cfg(feature = "postgres")]
mod postgres;
mod prefill;
mod report;
mod scenarios;
#[cfg(feature = "sqlite")]
mod sqlite;
mod trace;
mod workload;

use cli::{Args, BackendKind};
use place::Place;
use report::Json;
use std::process::ExitCode;

/// Any failure of a run, shown to the operator as text.
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The result of a step of a run.
type Res<T> = Result<T, BoxError>;

/// Runs the chosen scenario on the chosen backend, then drops the
/// PostgreSQL schemas or MariaDB/MySQL databases the run created (SQLite's
/// temporary directory goes with [`Place`]).
async fn run(args: &Args) -> Res<Json> {
    let place = Place::new(args)?;
    let result = match args.backend {
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => scenarios::run::<tickbox::Sqlite>(&place, args).await,
        #[cfg(not(feature = "sqlite"))]
        BackendKind::Sqlite => Err("this build has no `sqlite` feature".into()),
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => scenarios::run::<tickbox::Postgres>(&place, args).await,
        #[cfg(not(feature = "postgres"))]
        BackendKind::Postgres => Err("--backend postgres needs the `postgres` feature: \
             cargo run --release -p tickbox-bench --features postgres -- --backend postgres ..."
            .into()),
        #[cfg(feature = "mysql")]
        BackendKind::Mysql => scenarios::run::<tickbox::Mysql>(&place, args).await,
        #[cfg(not(feature = "mysql"))]
        BackendKind::Mysql => Err("--backend mysql needs the `mysql` feature: \
             cargo run --release -p tickbox-bench --features mysql -- --backend mysql ..."
            .into()),
    };
    #[cfg(feature = "postgres")]
    if args.backend == BackendKind::Postgres {
        if let Err(e) = postgres::drop_schemas(&place).await {
            eprintln!("warning: dropping the benchmark's schemas failed: {e}");
        }
    }
    #[cfg(feature = "mysql")]
    if args.backend == BackendKind::Mysql {
        if let Err(e) = mysql::drop_databases(&place).await {
            eprintln!("warning: dropping the benchmark's databases failed: {e}");
        }
    }
    result
}

fn main() -> ExitCode {
    let args = match cli::parse() {
        Ok(args) => args,
        Err(code) => return code,
    };
    if args.trace() {
        trace::install();
    }
    match actix::System::new().block_on(run(&args)) {
        Ok(json) => {
            report::finish(&args, json);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
