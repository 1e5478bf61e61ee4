//! One measured run: the producers, waiting for the handlers, and what the
//! run produced.

use crate::cli::Args;
use crate::clock::{Clock, Latency};
use crate::{BoxError, Res};
use serde::Serialize;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a run may go without a message handled before it is a failure.
const STALLED_AFTER: Duration = Duration::from_secs(60);

/// Microseconds since the Unix epoch, as tickbox stamps its rows.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// What one measured run produced.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunResult {
    /// The run's name in the table.
    pub(crate) what: String,
    /// Messages handled.
    pub(crate) messages: u64,
    /// First producer start to the last handler commit.
    pub(crate) seconds: f64,
    /// Messages handled per second, end to end.
    pub(crate) per_s: f64,
    /// Producers alone: messages committed per second while producing.
    pub(crate) produced_per_s: f64,
    /// Producer commit to handler commit (observed through the tracing layer
    /// for tickbox, directly for the baseline).
    pub(crate) commit_to_commit: Option<Latency>,
    /// Producer commit to the end of the handler, before its commit.
    pub(crate) commit_to_handler_end: Option<Latency>,
}

impl RunResult {
    /// The run's result, from its clock: `seconds` end to end, `produced`
    /// seconds for the producers.
    pub(crate) fn new(what: &str, args: &Args, clock: &Clock, seconds: f64, produced: f64) -> Self {
        RunResult {
            what: what.into(),
            messages: args.messages,
            seconds,
            per_s: args.messages as f64 / seconds,
            produced_per_s: args.messages as f64 / produced,
            commit_to_commit: clock.commit_to_commit(),
            commit_to_handler_end: clock.commit_to_handler_end(),
        }
    }

    /// The latency reported: to the handler's commit when it was observed,
    /// else to the handler's end.
    pub(crate) fn latency(&self) -> Option<Latency> {
        self.commit_to_commit.or(self.commit_to_handler_end)
    }

    /// What [`RunResult::latency`] measures to, for the JSON.
    pub(crate) fn latency_measured_to(&self) -> &'static str {
        if self.commit_to_commit.is_some() {
            "handler commit"
        } else {
            "handler end"
        }
    }
}

/// When a message counts as committed for the latency clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Once `produce(n)` returned (a database commit).
    After,
    /// Just before `produce(n)` starts: a consumer may have the message
    /// before `produce` returns (a broker's confirm).
    Before,
}

/// Runs `produce(n)` for n in `offset..offset + messages` on `tasks`
/// tasks, paced at `rate` messages/s when given, stamping each message as
/// `stamp` says. Returns when all are produced, with the seconds that took.
pub(crate) async fn produce<F, Fut>(
    args: &Args,
    clock: &Arc<Clock>,
    rate: Option<f64>,
    (tasks_n, stamp): (usize, Stamp),
    produce: F,
) -> Res<f64>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Res<()>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..tasks_n {
        let (next, clock, produce, total) =
            (next.clone(), clock.clone(), produce.clone(), args.messages);
        tasks.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Relaxed);
                if k >= total || clock.failed.load(Relaxed) {
                    return Ok::<_, BoxError>(());
                }
                if let Some(rate) = rate {
                    let at = clock.t0 + Duration::from_secs_f64(k as f64 / rate);
                    tokio::time::sleep_until(at.into()).await;
                }
                let n = clock.offset + k;
                if stamp == Stamp::Before {
                    clock.producer_committed(n);
                }
                if let Err(e) = produce(n).await {
                    clock.failed.store(true, Relaxed);
                    return Err(e);
                }
                if stamp == Stamp::After {
                    clock.producer_committed(n);
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(clock.t0.elapsed().as_secs_f64())
}

/// Waits until `handled()` reaches `target`; fails when nothing moves for a
/// minute. Returns the seconds since the clock's start.
pub(crate) async fn wait_handled(
    clock: &Clock,
    target: u64,
    handled: impl Fn() -> u64,
) -> Res<f64> {
    let (mut last, mut last_change) = (0, Instant::now());
    loop {
        let now = handled();
        if now >= target {
            return Ok(clock.t0.elapsed().as_secs_f64());
        }
        if clock.failed.load(Relaxed) {
            return Err("a producer failed".into());
        }
        if now != last {
            (last, last_change) = (now, Instant::now());
        } else if last_change.elapsed() > STALLED_AFTER {
            return Err(format!(
                "stalled: {now} of {target} handled after a minute without progress"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}
