//! Progress on stderr: a bar redrawn in place when stderr is a terminal
//! (indicatif), otherwise a log line every 2 s. Log lines and messages are
//! written above the bar.
//!
//! The progress is drawn from numbers at hand (a counter, the bus's
//! in-memory metrics, the counts the waiting loop reads anyway), never from
//! a query of its own.

use crate::flow::Counts;
use crate::{CONFIRM_ORDER, RESERVE_STOCK, SEND_CONFIRMATION};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tickbox::BusMetrics;

/// The bar drawn at the moment, if any: what is written to stderr goes
/// above it.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Runs `write` with the bar, if one is drawn, hidden meanwhile.
fn above_bar(write: impl FnOnce()) {
    let bar = BAR.lock().unwrap_or_else(PoisonError::into_inner).clone();
    match bar {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// One line on stderr, above the bar.
pub fn say(text: &str) {
    above_bar(|| eprintln!("{text}"));
}

/// Logs go to stderr, above the bar: `RUST_LOG` sets the filter, by default
/// `warn,lapin=off,minishop=info` (`minishop=debug` shows every e-mail
/// sent). lapin, the RabbitMQ client, logs a broker's refusal at error level
/// itself; tickbox reports every broker failure in its own words.
pub fn init_logging(args: &crate::cli::Args) -> Result<Option<Exporting>, (String, u8)> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(LogWriter::default)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,lapin=off,minishop=info".into()),
        );
    let logging = tracing_subscriber::registry().with(log);
    let Some(endpoint) = &args.otlp_endpoint else {
        logging.init();
        return Ok(None);
    };
    #[cfg(feature = "opentelemetry")]
    {
        let service = format!("minishop-{}", args.module_names().join("-"));
        let (spans, exporting) =
            crate::otlp::layer(endpoint, service).map_err(|error| (error, 2))?;
        logging.with(spans).init();
        Ok(Some(exporting))
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = (endpoint, logging);
        Err((
            "--otlp-endpoint needs the `opentelemetry` feature: cargo run --release --features \
             opentelemetry --example minishop -- --otlp-endpoint URL"
                .to_string(),
            2,
        ))
    }
}

/// The span exporter of `--otlp-endpoint`, or nothing (without the
/// `opentelemetry` feature, the flag is refused).
#[cfg(feature = "opentelemetry")]
pub use crate::otlp::Exporting;
/// Nothing to export without the `opentelemetry` feature.
#[cfg(not(feature = "opentelemetry"))]
pub enum Exporting {}

#[cfg(not(feature = "opentelemetry"))]
impl Exporting {
    /// Never called: there is no exporter.
    pub fn finish(self) {
        match self {}
    }
}

/// The log's writer: one formatted event per writer, written out above the
/// bar when it is dropped.
#[derive(Default)]
struct LogWriter(Vec<u8>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            above_bar(|| {
                let mut stderr = std::io::stderr().lock();
                let _ = stderr.write_all(&self.0);
                let _ = stderr.flush();
            });
        }
    }
}

/// The progress of one run: placing orders, then waiting for the flow.
pub struct Progress {
    /// The current phase's bar, on a terminal.
    bar: Option<ProgressBar>,
    tty: bool,
    /// When it was last shown.
    last: Option<Instant>,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            bar: None,
            tty: std::io::stderr().is_terminal(),
            last: None,
        }
    }

    /// Whether it is time to show it again: on a terminal ten times a
    /// second, otherwise every 2 s.
    pub fn due(&self) -> bool {
        self.last.is_none_or(|at| at.elapsed() >= self.every())
    }

    /// How often the progress is redrawn.
    pub fn every(&self) -> Duration {
        if self.tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        }
    }

    /// Placing: orders placed so far by this run, and what the bus reports
    /// it has done with them, from its in-memory counters. Pending is
    /// estimated from them too: the messages this run published (one per
    /// order placed, one per reservation and per confirmation handled) less
    /// those delivered.
    pub fn placing(&mut self, placed: u64, total: u64, metrics: &BusMetrics) {
        let handled = |name: &str| -> u64 {
            metrics
                .modules
                .iter()
                .flat_map(|m| &m.handlers)
                .filter(|h| h.handler == name)
                .map(|h| h.handled)
                .sum()
        };
        let published = placed + handled(RESERVE_STOCK) + handled(CONFIRM_ORDER);
        let pending = published.saturating_sub(metrics.delivered);
        // Calls waiting on a database that does not answer (its network
        // went quiet): said while it lasts.
        let stuck: i64 = metrics.modules.iter().map(|m| m.database_calls.stuck).sum();
        let waiting = if stuck > 0 {
            format!("  waiting on the database: {stuck} calls")
        } else {
            String::new()
        };
        let text = format!(
            "{placed}/{total} orders  confirmed {}  e-mails {}  pending {pending}{waiting}",
            handled(CONFIRM_ORDER),
            handled(SEND_CONFIRMATION)
        );
        self.show("placing", placed, total, &text);
    }

    /// Waiting: the counts read from the databases seen here.
    pub fn draining(&mut self, counts: &Counts) {
        let shown = |n: Option<i64>| n.map_or("-".to_string(), |n| n.to_string());
        let Counts {
            orders,
            confirmed,
            rejected,
            cancelled,
            reservations,
            emails,
            pending,
            scheduled,
        } = *counts;
        let Some((orders, confirmed)) = orders.zip(confirmed) else {
            // Without the orders database: what its own database holds.
            let text = format!(
                "reservations {}  e-mails {}  pending {pending}",
                shown(reservations),
                shown(emails)
            );
            let done = reservations.unwrap_or(0) + emails.unwrap_or(0);
            return self.show("draining", done.max(0) as u64, 0, &text);
        };
        // Each order is settled once (confirmed, rejected or cancelled);
        // each confirmed one is e-mailed once.
        let (rejected, cancelled) = (rejected.unwrap_or(0), cancelled.unwrap_or(0));
        let mut done = (confirmed + rejected + cancelled).min(orders);
        let mut total = orders;
        if let Some(emails) = emails {
            done += emails.min(confirmed);
            total += orders - rejected - cancelled;
        }
        let mut others = String::new();
        for (n, what) in [(rejected, "rejected"), (cancelled, "cancelled")] {
            if n > 0 {
                others.push_str(&format!("  {what} {n}"));
            }
        }
        if scheduled > 0 {
            others.push_str(&format!("  timeouts to come {scheduled}"));
        }
        let text = format!(
            "{confirmed}/{orders} confirmed{others}  e-mails {}  pending {pending}",
            shown(emails)
        );
        self.show("draining", done.max(0) as u64, total.max(0) as u64, &text);
    }

    fn show(&mut self, phase: &'static str, done: u64, total: u64, text: &str) {
        self.last = Some(Instant::now());
        if !self.tty {
            tracing::info!("{phase}: {}", text.replace("  ", ", "));
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let style = ProgressStyle::with_template("{prefix:8} [{bar:20}] {msg}")
                .expect("a valid template")
                .progress_chars("#>.");
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
                .with_style(style)
                .with_prefix(phase);
            *BAR.lock().unwrap_or_else(PoisonError::into_inner) = Some(bar.clone());
            bar
        });
        if bar.prefix() != phase {
            self.finish();
            return self.show(phase, done, total, text);
        }
        bar.set_length(total.max(1));
        bar.set_position(if total == 0 { 1 } else { done });
        bar.set_message(text.to_string());
    }

    /// Whether a bar is drawn (on a terminal).
    pub fn drawn(&self) -> bool {
        self.bar.is_some()
    }

    /// Leaves the current bar drawn as it is; what follows goes below it.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            *BAR.lock().unwrap_or_else(PoisonError::into_inner) = None;
            bar.abandon();
        }
    }
}
