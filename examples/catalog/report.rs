//! The report at the end of a run: text on stdout, or with `--json` one
//! JSON line and nothing else.
//!
//! The figures are read from the databases (every run's work); `this_run`
//! is what this process did, from the bus's counters.

use crate::check::{Disturbance, Figures, Found};
use crate::disturb::Sent;
use serde::Serialize;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;
use tickbox::BusMetrics;

/// How the waiting for the deliveries ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Every message was delivered.
    Finished,
    /// Ctrl-C: the rest stays pending for `--resume`.
    Interrupted,
    /// `--timeout` passed first.
    TimedOut,
}

/// What this process did.
#[derive(Debug, Serialize)]
pub struct ThisRun {
    /// Changes it published.
    pub published: u64,
    /// Deliveries the bus made twice on purpose (`--duplicate-rate`).
    pub duplicates_injected: u64,
    /// Deliveries the inboxes skipped as duplicates.
    pub duplicates_skipped: u64,
    /// Handler attempts that failed and were retried (`--fail-rate`, and a
    /// keyed message that came before its predecessor was done).
    pub failed_attempts: u64,
    /// How long the run took.
    pub seconds: f64,
}

impl ThisRun {
    /// This run's figures from the bus's counters.
    pub fn new(published: u64, metrics: &BusMetrics, took: Duration) -> Self {
        ThisRun {
            published,
            duplicates_injected: metrics.duplicates_injected,
            duplicates_skipped: metrics.total(|h| h.duplicates_skipped),
            failed_attempts: metrics.total(|h| h.failed),
            seconds: (took.as_secs_f64() * 100.0).round() / 100.0,
        }
    }
}

/// What a run found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// All is well: every message delivered and no problem found.
    pub ok: bool,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// How the waiting for the deliveries ended.
    pub ending: Ending,
    /// What the databases hold.
    #[serde(flatten)]
    pub figures: Figures,
    /// With `--disturb`: what the safeguards did with the messages sent.
    pub disturbance: Option<Disturbance>,
    /// What this process did.
    pub this_run: ThisRun,
    /// What is wrong, in words.
    pub problems: Vec<String>,
}

impl Report {
    /// The report of a run that ended as `ending`, on what the databases
    /// hold.
    pub fn new(
        backend: &'static str,
        ending: Ending,
        found: &Found,
        sent: Option<&Sent>,
        this_run: ThisRun,
    ) -> Self {
        let figures = found.figures();
        let disturbance = sent.map(|sent| found.disturbance(sent));
        let problems = found.problems(&figures, disturbance.as_ref());
        Report {
            ok: ending == Ending::Finished && problems.is_empty(),
            backend,
            ending,
            figures,
            disturbance,
            this_run,
            problems,
        }
    }

    /// One line of JSON.
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("the report serializes")
    }

    /// The report as text.
    pub fn print(&self) {
        let f = &self.figures;
        let r = &self.this_run;
        let order = if f.keyed {
            "keyed by product"
        } else {
            "some without a key"
        };
        println!(
            "catalog on {}: {} of {} planned changes published over {} products, {order}",
            self.backend, f.changes, f.planned, f.products
        );
        println!(
            "  this run:   {} published in {:.1} s; {} duplicate deliveries injected, {} skipped \
             by the inboxes; {} failed attempts retried",
            r.published, r.seconds, r.duplicates_injected, r.duplicates_skipped, r.failed_attempts
        );
        println!(
            "  storefront: {} applied, {} ignored as older than the copy; {} copies differ from \
             the catalog",
            f.applied, f.stale_ignored, f.mismatches
        );
        println!(
            "  journeys:   {} rows for {} changes; {} event ids twice; {} not matching a change",
            f.journeys, f.changes, f.duplicate_journeys, f.journey_mismatches
        );
        println!(
            "  outboxes:   {} pending; {} dead letters",
            f.pending, f.dead_letters
        );
        if let Some(d) = &self.disturbance {
            println!(
                "  disturbed:  {} older changes sent to the storefront, {} ignored; {} repeated \
                 events sent to the journeys, {} ignored",
                d.stale_sent, d.stale_ignored, d.repeats_sent, d.repeats_ignored
            );
        }
        match self.ending {
            Ending::Finished if self.ok => println!("OK"),
            Ending::Finished => println!("PROBLEMS:"),
            Ending::Interrupted => println!("INTERRUPTED (--resume finishes the work):"),
            Ending::TimedOut => println!("TIMED OUT (--resume finishes the work):"),
        }
        for problem in &self.problems {
            println!("  - {problem}");
        }
    }

    /// 0 when all is well, 130 when interrupted, 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self.ending {
            _ if self.ok => ExitCode::SUCCESS,
            Ending::Interrupted => ExitCode::from(130),
            _ => ExitCode::FAILURE,
        }
    }
}

/// Logs to stderr: the example's own progress, and of tickbox's logs only
/// errors (a dead letter), since every injected failure would log a
/// warning (`RUST_LOG=warn` shows them).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error,catalog=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Prints the report of a run, or why there is none, and gives the exit
/// code: the report's own, or 1 (130 when interrupted).
pub fn finish(result: Result<Report, String>, json: bool, interrupted: bool) -> ExitCode {
    match result {
        Ok(report) => {
            if json {
                println!("{}", report.json());
            } else {
                report.print();
            }
            report.exit_code()
        }
        Err(error) => {
            eprintln!("catalog: {error}");
            if json {
                println!("{}", serde_json::json!({ "ok": false, "error": error }));
            }
            if interrupted {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
