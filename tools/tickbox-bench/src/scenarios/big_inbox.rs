//! Big inbox: the same workload on an empty inbox and on one holding
//! `--inbox-rows` rows, alternated `--repeat` times (3 unless given).

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::measure::RunResult;
use crate::pair::{count, run_tickbox_on, verify, Pair};
use crate::place::Place;
use crate::prefill::{after_prefill, prefill};
use crate::report::{base_json, median, print_runs, Json};
use crate::Res;

/// Rounds when `--repeat` is left at 1.
const DEFAULT_ROUNDS: usize = 3;

/// Runs the big-inbox scenario.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let empty = Pair::<B>::new(place, args).await?;
    let big = Pair::<B>::new(place, args).await?;
    eprintln!("big-inbox: prefilling {} inbox rows", args.inbox_rows);
    let prefill_s = prefill(&big.ledger, args.inbox_rows, B::prefill_inbox_sql, "inbox").await?;
    after_prefill(place, &big.ledger).await?;
    let rows = count(&big.ledger, "SELECT count(*) AS n FROM tickbox_inbox").await?;
    eprintln!("big-inbox: {rows} inbox rows after {prefill_s:.0} s");
    let rounds = if args.repeat == 1 {
        DEFAULT_ROUNDS
    } else {
        args.repeat
    };
    let (mut on_empty, mut on_big) = (Vec::new(), Vec::new());
    let mut offset = 0;
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}: empty inbox");
        on_empty
            .push(run_tickbox_on(&empty, args, offset, args.rate, "tickbox, empty inbox").await?);
        eprintln!("round {round}/{rounds}: big inbox");
        on_big.push(run_tickbox_on(&big, args, offset, args.rate, "tickbox, big inbox").await?);
        offset += args.messages;
    }
    verify(&empty, offset).await?;
    verify(&big, offset).await?;
    let runs: Vec<RunResult> = on_empty
        .iter()
        .zip(&on_big)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    println!(
        "\n{} · inbox of {rows} rows vs empty · concurrency {} · {} messages per run",
        args.backend.name(),
        args.concurrency,
        args.messages
    );
    print_runs(&runs);
    let e = median(on_empty.iter().map(|r| r.per_s).collect());
    let b = median(on_big.iter().map(|r| r.per_s).collect());
    println!(
        "\nempty inbox {e:.0}/s · {rows}-row inbox {b:.0}/s · big/empty {:.3}",
        b / e
    );
    let mut j = base_json(args);
    j.insert("scenario".into(), "big-inbox".into());
    j.insert("inbox_rows".into(), rows.into());
    j.insert("prefill_seconds".into(), prefill_s.into());
    j.insert("empty_per_s".into(), e.into());
    j.insert("big_per_s".into(), b.into());
    j.insert("tickbox_per_s".into(), b.into());
    j.insert("big_over_empty".into(), (b / e).into());
    j.insert("runs".into(), serde_json::to_value(&runs)?);
    Ok(j)
}
