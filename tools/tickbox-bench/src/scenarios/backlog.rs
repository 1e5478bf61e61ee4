//! Backlog: N messages wait in the outbox (bulk-inserted with set-based SQL
//! while no bus runs); then the bus starts and drains them. Reports the
//! drain rate per 10-second window and the process's memory while draining.

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::clock::Clock;
use crate::memory::{peak_rss_mb, rss_mb};
use crate::pair::{count, Pair};
use crate::place::Place;
use crate::prefill::{after_prefill, prefill};
use crate::report::{base_json, median, Json};
use crate::Res;
use std::time::{Duration, Instant};

/// How often the drain is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The length of a window of the drain rate, in seconds.
const WINDOW_S: f64 = 10.0;
/// How long the drain may go without a message handled.
const STALLED_AFTER: Duration = Duration::from_secs(60);
/// How often the outbox's pending count is read, to time its emptying.
const OUTBOX_EVERY: Duration = Duration::from_millis(100);

/// One sample of the drain.
struct Sample {
    /// Seconds since the bus started.
    t: f64,
    /// Messages handled by then.
    handled: u64,
    /// Resident memory then, in MiB.
    rss: f64,
}

/// The drain rate of each full 10-second window, in messages/s (the last,
/// partial window left out).
fn windows(samples: &[Sample]) -> Vec<f64> {
    let mut windows = Vec::new();
    let (mut t0, mut h0) = (0.0, 0);
    for s in samples {
        if s.t - t0 >= WINDOW_S {
            windows.push((s.handled - h0) as f64 / (s.t - t0));
            (t0, h0) = (s.t, s.handled);
        }
    }
    windows
}

/// Runs the backlog scenario.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let pair = Pair::<B>::new(place, args).await?;
    eprintln!("backlog: prefilling {} outbox rows", args.messages);
    let prefill_s = prefill(&pair.shop, args.messages, B::prefill_outbox_sql, "outbox").await?;
    after_prefill(place, &pair.shop).await?;
    let pending = pair.shop.store_stats().await?.outbox_pending;
    eprintln!("backlog: {pending} pending after {prefill_s:.0} s; starting the bus");
    let rss_before = rss_mb();
    let hwm_before = peak_rss_mb();

    pair.set_clock(Clock::new(0, args.messages, false));
    let started = Instant::now();
    let bus = pair.bus(args).await?;
    // When the outbox is empty: every row delivered and marked (over a
    // broker: published, confirmed and marked, the relay's own pace).
    let shop = pair.shop.clone();
    let outbox_emptied = tokio::spawn(async move {
        loop {
            tokio::time::sleep(OUTBOX_EVERY).await;
            if shop
                .store_stats()
                .await
                .is_ok_and(|s| s.outbox_pending == 0)
            {
                return started.elapsed().as_secs_f64();
            }
        }
    });
    let mut samples: Vec<Sample> = Vec::new();
    let mut last_progress = (0, Instant::now());
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let done = pair.handled();
        let t = started.elapsed().as_secs_f64();
        let rss = rss_mb();
        samples.push(Sample {
            t,
            handled: done,
            rss,
        });
        if samples.len().is_multiple_of(10) {
            let queued = Pair::queued(&bus)
                .map_or(String::new(), |q| format!(", {q} in the broker's queue"));
            eprintln!("  {t:>5.0} s: {done} handled, RSS {rss:.1} MiB{queued}");
        }
        if done >= args.messages {
            break;
        }
        if done != last_progress.0 {
            last_progress = (done, Instant::now());
        } else if last_progress.1.elapsed() > STALLED_AFTER {
            pair.stop().await;
            return Err(format!("backlog drain stalled at {done}").into());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let emptied_s = outbox_emptied.await?;
    pair.stop().await;
    let pending_after = pair.shop.store_stats().await?.outbox_pending;
    let changes = count(&pair.ledger, "SELECT count(*) AS n FROM bench_changes").await?;
    pair.shop.close();
    pair.ledger.close();

    let windows = windows(&samples);
    let max_rss = samples.iter().map(|s| s.rss).fold(0.0, f64::max);
    let peak = peak_rss_mb();
    let rate = args.messages as f64 / seconds;
    println!(
        "\n{} · {} · backlog of {} messages · concurrency {}",
        args.backend.name(),
        args.transport.name(),
        args.messages,
        args.concurrency
    );
    println!("prefill (set-based SQL)            {prefill_s:>10.1} s");
    println!("drain                              {seconds:>10.1} s   {rate:.0} msg/s");
    println!(
        "outbox emptied                     {emptied_s:>10.1} s   {:.0} msg/s",
        args.messages as f64 / emptied_s
    );
    if !windows.is_empty() {
        println!(
            "10-s windows msg/s (min/median/max) {:>9.0} / {:.0} / {:.0}   ({} windows)",
            windows.iter().copied().fold(f64::INFINITY, f64::min),
            median(windows.clone()),
            windows.iter().copied().fold(0.0, f64::max),
            windows.len()
        );
    }
    println!("RSS before bus / max while draining {rss_before:>9.1} / {max_rss:.1} MiB   (VmHWM {hwm_before:.1} -> {peak:.1} MiB)");
    println!("after: {pending_after} pending in the outbox, {changes} changes");
    if pending_after != 0 || changes as u64 != args.messages {
        return Err("backlog verification failed".into());
    }
    let mut j = base_json(args);
    j.insert("scenario".into(), "backlog".into());
    j.insert("prefill_seconds".into(), prefill_s.into());
    j.insert("drain_seconds".into(), seconds.into());
    j.insert("tickbox_per_s".into(), rate.into());
    j.insert("outbox_emptied_seconds".into(), emptied_s.into());
    j.insert(
        "outbox_emptied_per_s".into(),
        (args.messages as f64 / emptied_s).into(),
    );
    j.insert("window_per_s".into(), serde_json::json!(windows));
    j.insert("rss_before_mb".into(), rss_before.into());
    j.insert("rss_max_draining_mb".into(), max_rss.into());
    j.insert(
        "rss_samples_mb".into(),
        serde_json::json!(samples
            .iter()
            .map(|s| (s.t.round(), s.handled, (s.rss * 10.0).round() / 10.0))
            .collect::<Vec<_>>()),
    );
    j.insert("peak_rss_before_mb".into(), hwm_before.into());
    Ok(j)
}
