//! Scheduled messages: how late `--scheduled-messages` messages due over
//! `--due-over` seconds are handled (their handler's end against their due
//! time), and the immediate path's throughput with `--scheduled-rows` rows
//! scheduled for tomorrow in the outbox against an outbox without them,
//! alternated `--repeat` times (3 unless given), with the process's memory.

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::clock::Clock;
use crate::measure::now_us;
use crate::memory::{peak_rss_mb, rss_mb};
use crate::pair::{count, run_tickbox_on, verify, Pair};
use crate::place::Place;
use crate::prefill::{after_prefill, prefill_from};
use crate::report::{base_json, median, print_runs, Json};
use crate::workload::Work;
use crate::Res;
use std::time::{Duration, Instant};

/// Rounds when `--repeat` is left at 1.
const DEFAULT_ROUNDS: usize = 3;
/// Scheduled messages published per transaction.
const PER_TRANSACTION: u64 = 1000;
/// The first message falls due this long after the publishing starts.
const LEAD: Duration = Duration::from_secs(10);
/// How long the handling may go without progress.
const STALLED_AFTER: Duration = Duration::from_secs(60);

/// Runs the scheduled scenario.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let mut j = base_json(args);
    j.insert("scenario".into(), "scheduled".into());
    lateness::<B>(place, args, &mut j).await?;
    beside_tomorrow::<B>(place, args, &mut j).await?;
    Ok(j)
}

/// The lateness of messages due over `--due-over` seconds.
async fn lateness<B: BenchBackend>(place: &Place, args: &Args, j: &mut Json) -> Res<()> {
    let n = args.scheduled_messages;
    let pair = Pair::<B>::new(place, args).await?;
    let bus = pair.bus(args).await?;
    let clock = Clock::new(0, n, true);
    pair.set_clock(clock.clone());
    // Due times on the clock's scale: t0 is now, on the wall clock too.
    let t0_us = now_us();
    let over_us = args.due_over as i64 * 1_000_000;
    let due_us = |i: u64| t0_us + LEAD.as_micros() as i64 + over_us * i as i64 / n as i64;
    let due_ns: Vec<u64> = (0..n)
        .map(|i| ((due_us(i) - t0_us) * 1000) as u64)
        .collect();
    let rss_before = rss_mb();
    let mut lo = 0;
    while lo < n {
        let hi = (lo + PER_TRANSACTION).min(n);
        let when: Vec<(u64, i64)> = (lo..hi).map(|i| (i, due_us(i))).collect();
        pair.shop
            .transaction(async move |tx| {
                for (i, due) in when {
                    let at = std::time::UNIX_EPOCH + Duration::from_micros(due as u64);
                    tx.publish_at(at, &Work { n: i })?;
                }
                Ok::<_, tickbox::Error>(())
            })
            .await?;
        lo = hi;
    }
    let published_s = clock.t0.elapsed().as_secs_f64();
    eprintln!(
        "scheduled: {n} messages published in {published_s:.1} s, the first due at {:.0} s",
        LEAD.as_secs_f64()
    );
    if published_s >= LEAD.as_secs_f64() {
        return Err(format!("publishing took {published_s:.1} s, past the first due time: use fewer --scheduled-messages").into());
    }
    let mut max_rss = rss_mb();
    let mut last = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        max_rss = max_rss.max(rss_mb());
        let done = pair.handled();
        if done >= n {
            break;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > STALLED_AFTER
            && clock.t0.elapsed() > LEAD + Duration::from_secs(args.due_over)
        {
            pair.stop().await;
            return Err(format!("scheduled handling stalled at {done} of {n}").into());
        }
    }
    let (late, early) = clock.lateness(&due_ns);
    let late = late.ok_or("no message was stamped")?;
    let outbox = bus
        .metrics()
        .modules
        .into_iter()
        .find(|m| m.module == pair.shop.name())
        .map(|m| m.outbox.lateness);
    verify(&pair, n).await?;
    println!(
        "\n{} · {} · {n} scheduled messages due over {} s",
        args.backend.name(),
        args.transport.name(),
        args.due_over
    );
    println!(
        "lateness, due to handler's end (ms): p50 {:.1} · p99 {:.1} · max {:.1} · {} early",
        late.p50, late.p99, late.max, early
    );
    println!("RSS before publishing / max while due {rss_before:.1} / {max_rss:.1} MiB");
    if early != 0 {
        return Err(format!("{early} messages were handled before they were due").into());
    }
    j.insert("scheduled_messages".into(), n.into());
    j.insert("due_over_seconds".into(), args.due_over.into());
    j.insert("lateness_ms".into(), serde_json::to_value(late)?);
    j.insert("handled_early".into(), early.into());
    j.insert(
        "outbox_lateness_count".into(),
        outbox.map_or(0, |l| l.count).into(),
    );
    j.insert("rss_before_mb".into(), rss_before.into());
    j.insert("rss_max_while_due_mb".into(), max_rss.into());
    Ok(())
}

/// The immediate path with `--scheduled-rows` rows scheduled for tomorrow
/// against an outbox without them.
async fn beside_tomorrow<B: BenchBackend>(place: &Place, args: &Args, j: &mut Json) -> Res<()> {
    let plain = Pair::<B>::new(place, args).await?;
    let beside = Pair::<B>::new(place, args).await?;
    eprintln!(
        "scheduled: prefilling {} rows scheduled for tomorrow",
        args.scheduled_rows
    );
    let tomorrow_ms = now_us() / 1000 + 86_400_000;
    let prefill_s = prefill_from(
        &beside.shop,
        args.scheduled_rows,
        B::prefill_outbox_sql,
        "scheduled",
        tomorrow_ms,
    )
    .await?;
    // Rows written as tickbox writes a scheduled message: due at their
    // ids' time, committed now.
    let committed = now_us();
    beside
        .shop
        .transaction(async move |tx| {
            B::batch(
                tx.conn(),
                &format!(
                    "UPDATE tickbox_outbox SET due_at_us = created_at_us, created_at_us = {committed} \
                     WHERE delivered_at_us IS NULL AND due_at_us IS NULL"
                ),
            )
            .await?;
            Ok::<_, tickbox::Error>(())
        })
        .await?;
    // Both outboxes as production's (statistics, checkpoint), so that only
    // the scheduled rows tell them apart.
    after_prefill(place, &beside.shop).await?;
    after_prefill(place, &plain.shop).await?;
    let waiting = beside.shop.store_stats().await?.outbox_scheduled;
    eprintln!("scheduled: {waiting} rows scheduled for tomorrow after {prefill_s:.0} s");
    if waiting as u64 != args.scheduled_rows {
        return Err(format!("{waiting} rows scheduled, not {}", args.scheduled_rows).into());
    }
    let rounds = if args.repeat == 1 {
        DEFAULT_ROUNDS
    } else {
        args.repeat
    };
    let (mut on_plain, mut on_beside) = (Vec::new(), Vec::new());
    let mut offset = args.scheduled_messages;
    let rss_before = rss_mb();
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}: no scheduled rows");
        on_plain.push(run_tickbox_on(&plain, args, offset, args.rate, "tickbox").await?);
        eprintln!("round {round}/{rounds}: beside the scheduled rows");
        on_beside.push(
            run_tickbox_on(
                &beside,
                args,
                offset,
                args.rate,
                "tickbox, rows scheduled for tomorrow",
            )
            .await?,
        );
        offset += args.messages;
    }
    let rss_after = rss_mb();
    let still = beside.shop.store_stats().await?.outbox_scheduled;
    let handled_early = count(&beside.ledger, "SELECT count(*) AS n FROM bench_changes").await?
        as u64
        - rounds as u64 * args.messages;
    verify(&plain, rounds as u64 * args.messages).await?;
    verify(&beside, rounds as u64 * args.messages).await?;
    let runs: Vec<_> = on_plain
        .iter()
        .zip(&on_beside)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    println!(
        "\n{} · {} rows scheduled for tomorrow vs none · concurrency {} · {} messages per run",
        args.backend.name(),
        args.scheduled_rows,
        args.concurrency,
        args.messages
    );
    print_runs(&runs);
    let p = median(on_plain.iter().map(|r| r.per_s).collect());
    let b = median(on_beside.iter().map(|r| r.per_s).collect());
    println!(
        "\nno scheduled rows {p:.0}/s · beside {} scheduled {b:.0}/s · beside/none {:.3}",
        args.scheduled_rows,
        b / p
    );
    println!(
        "RSS before the runs / after {rss_before:.1} / {rss_after:.1} MiB (VmHWM {:.1} MiB); still scheduled after: {still}",
        peak_rss_mb()
    );
    if still as u64 != args.scheduled_rows || handled_early != 0 {
        return Err("rows scheduled for tomorrow were delivered".into());
    }
    j.insert("scheduled_rows".into(), args.scheduled_rows.into());
    j.insert("prefill_seconds".into(), prefill_s.into());
    j.insert("none_per_s".into(), p.into());
    j.insert("beside_per_s".into(), b.into());
    j.insert("tickbox_per_s".into(), b.into());
    j.insert("beside_over_none".into(), (b / p).into());
    j.insert("rss_after_runs_mb".into(), rss_after.into());
    j.insert("runs".into(), serde_json::to_value(&runs)?);
    Ok(())
}
