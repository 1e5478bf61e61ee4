//! Latency: an unthrottled tickbox run finds the peak; a second run at half
//! of it measures latency under a load the system can sustain.

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::pair::{run_tickbox_on, verify, Pair};
use crate::place::Place;
use crate::report::{base_json, lat_json, print_runs, Json};
use crate::Res;

/// Runs the latency scenario on one pair of modules.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let pair = Pair::<B>::new(place, args).await?;
    eprintln!("latency: unthrottled run");
    let peak = run_tickbox_on(&pair, args, 0, args.rate, "tickbox peak").await?;
    let half = peak.per_s / 2.0;
    eprintln!("latency: run at {half:.0}/s");
    let paced = run_tickbox_on(
        &pair,
        args,
        args.messages,
        Some(half),
        "tickbox at half peak",
    )
    .await?;
    verify(&pair, 2 * args.messages).await?;
    println!(
        "\n{} · {} · concurrency {} · {} messages per run",
        args.backend.name(),
        args.transport.name(),
        args.concurrency,
        args.messages
    );
    print_runs(&[peak.clone(), paced.clone()]);
    let mut j = base_json(args);
    j.insert("scenario".into(), "latency".into());
    j.insert("tickbox_per_s".into(), peak.per_s.into());
    j.insert("paced_rate".into(), half.into());
    j.insert("paced_per_s".into(), paced.per_s.into());
    j.insert(
        "latency_measured_to".into(),
        paced.latency_measured_to().into(),
    );
    lat_json(&mut j, "", paced.latency());
    lat_json(&mut j, "handler_end_", paced.commit_to_handler_end);
    lat_json(&mut j, "peak_", peak.latency());
    j.insert("runs".into(), serde_json::to_value([peak, paced])?);
    Ok(j)
}
