//! The baseline: tickbox's transactions without tickbox — the database's own
//! limit for this workload.

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::clock::Clock;
use crate::measure::{now_us, produce, wait_handled, RunResult, Stamp};
use crate::place::Place;
use crate::workload::{note, Work, HANDLER};
use crate::{BoxError, Res};
use std::sync::atomic::Ordering::Relaxed;
use tickbox::Message;
use uuid::Uuid;

/// The baseline: the same producer and consumer transactions, executed
/// directly with diesel-async on tickbox's own tables, same pools, same
/// transaction modes, no bus. A committed message goes to its consumer
/// through memory (a spawned task per message, waiting for one of the
/// consumer pool's C connections) — the cheapest possible hand-off.
pub(crate) async fn run_baseline<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
) -> Res<RunResult> {
    run_direct::<B>(place, args, offset, rate, true).await
}

/// The producers' transactions alone, with no consumer and no bus: the most
/// messages per second any outbox could take in on this database, whatever
/// delivers them.
pub(crate) async fn run_producers_alone<B: BenchBackend>(
    place: &Place,
    args: &Args,
) -> Res<RunResult> {
    run_direct::<B>(place, args, 0, None, false).await
}

/// The producer's transaction: its business row and tickbox's outbox row,
/// committed, or rolled back on an error.
async fn produce_one<B: BenchBackend>(
    conn: &mut B::Connection,
    n: u64,
    id: Uuid,
    payload: &str,
) -> Res<()> {
    B::raw_begin(conn).await?;
    let written = async {
        B::insert_order(conn, n as i64, &note(n)).await?;
        B::raw_insert_outbox(conn, id, Work::TOPIC, payload, now_us()).await
    }
    .await;
    match written {
        Ok(()) => Ok(B::raw_commit(conn).await?),
        Err(e) => {
            B::raw_rollback(conn).await?;
            Err(e.into())
        }
    }
}

/// The consumer's transaction: tickbox's inbox row and, unless it was there
/// already, the business row; committed, or rolled back on an error.
async fn consume_one<B: BenchBackend>(
    conn: &mut B::Connection,
    id: Uuid,
    payload: &str,
) -> Res<()> {
    B::raw_begin(conn).await?;
    let written = async {
        if B::raw_insert_inbox(conn, id, HANDLER, now_us()).await? {
            let work: Work = serde_json::from_str(payload)?;
            B::insert_change(conn, work.n as i64, id).await?;
        }
        Ok::<_, BoxError>(())
    }
    .await;
    match written {
        Ok(()) => Ok(B::raw_commit(conn).await?),
        Err(e) => {
            B::raw_rollback(conn).await?;
            Err(e)
        }
    }
}

/// The workload with plain diesel-async; with `consume`, each committed
/// message then goes through memory to a consumer transaction.
async fn run_direct<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
    consume: bool,
) -> Res<RunResult> {
    let (shop, ledger) = (place.fresh("shop"), place.fresh("ledger"));
    // Starting a module runs tickbox's migrations: the baseline writes the
    // very tables (and indexes) tickbox writes.
    let shop_module = B::module(place, &shop).pool_size(1).start().await?;
    let ledger_module = B::module(place, &ledger).pool_size(1).start().await?;
    let producers = B::raw_pool(place, &shop, args.concurrency)?;
    let consumers = B::raw_pool(place, &ledger, args.concurrency)?;
    B::batch(&mut *B::raw_get(&producers).await?, B::CREATE_ORDERS).await?;
    B::batch(&mut *B::raw_get(&consumers).await?, B::CREATE_EFFECTS).await?;

    let clock = Clock::new(offset, args.messages, true);
    let task_clock = clock.clone();
    let produced = produce(
        args,
        &clock,
        rate,
        (args.concurrency, Stamp::After),
        move |n| {
            let (producers, consumers, clock) =
                (producers.clone(), consumers.clone(), task_clock.clone());
            async move {
                let id = Uuid::now_v7();
                let payload = serde_json::to_string(&Work { n })?;
                produce_one::<B>(&mut *B::raw_get(&producers).await?, n, id, &payload).await?;
                if !consume {
                    clock.handler_committed_index(n);
                    clock.handled.fetch_add(1, Relaxed);
                    return Ok(());
                }
                tokio::spawn(async move {
                    let consumed = async {
                        consume_one::<B>(&mut *B::raw_get(&consumers).await?, id, &payload).await
                    }
                    .await;
                    match consumed {
                        Ok(()) => {
                            clock.handler_committed_index(n);
                            clock.handled.fetch_add(1, Relaxed);
                        }
                        Err(e) => {
                            eprintln!("baseline consumer failed: {e}");
                            clock.failed.store(true, Relaxed);
                        }
                    }
                });
                Ok(())
            }
        },
    )
    .await?;
    let seconds = wait_handled(&clock, args.messages, || clock.handled.load(Relaxed)).await?;
    drop((shop_module, ledger_module));
    let what = if consume {
        "baseline"
    } else {
        "producers alone"
    };
    Ok(RunResult::new(what, args, &clock, seconds, produced))
}
