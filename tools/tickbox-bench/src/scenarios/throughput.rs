//! Throughput: the baseline and tickbox alternated `--repeat` times on fresh
//! databases (over amqp, the raw AMQP baseline too, and the ratio is taken
//! to the lower of the two baselines); with `--peer`, the peer and the
//! producers alone after them; with `--hexeract`, hexeract after them.

use crate::backend::BenchBackend;
use crate::baseline::{run_baseline, run_producers_alone};
use crate::cli::{Args, Transport};
use crate::hexeract::run_hexeract;
use crate::measure::RunResult;
use crate::pair::run_tickbox;
use crate::peer::run_peer;
use crate::place::Place;
use crate::report::{base_json, lat_json, median, print_runs, Json};
use crate::Res;

#[cfg(feature = "amqp")]
use crate::amqp::run_raw;

/// The raw AMQP baseline needs the `amqp` feature (without it the command
/// line refuses `--transport amqp`).
#[cfg(not(feature = "amqp"))]
async fn run_raw(_: &Place, _: &Args, _: u64) -> Res<RunResult> {
    Err("this build has no `amqp` feature".into())
}

/// Runs the throughput scenario; with `--only`, one side and no ratio.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let (mut baselines, mut tickboxes) = (Vec::new(), Vec::new());
    let mut raws: Vec<RunResult> = Vec::new();
    let mut offset = 0;
    for round in 1..=args.repeat {
        if args.runs_baseline() {
            eprintln!("round {round}/{}: baseline", args.repeat);
            baselines.push(run_baseline::<B>(place, args, offset, args.rate).await?);
            offset += args.messages;
            if args.transport == Transport::Amqp {
                eprintln!("round {round}/{}: raw amqp", args.repeat);
                raws.push(run_raw(place, args, offset).await?);
                offset += args.messages;
            }
        }
        if args.runs_tickbox() {
            eprintln!("round {round}/{}: tickbox", args.repeat);
            tickboxes.push(run_tickbox::<B>(place, args, offset, args.rate).await?);
            offset += args.messages;
        }
    }
    if args.only.is_some() {
        let runs: Vec<RunResult> = baselines.into_iter().chain(raws).chain(tickboxes).collect();
        print_runs(&runs);
        let mut j = base_json(args);
        j.insert("scenario".into(), "throughput".into());
        j.insert("runs".into(), serde_json::to_value(&runs)?);
        return Ok(j);
    }
    let runs: Vec<RunResult> = (0..tickboxes.len())
        .flat_map(|i| {
            [Some(&baselines[i]), raws.get(i), Some(&tickboxes[i])]
                .into_iter()
                .flatten()
                .cloned()
        })
        .collect();
    println!(
        "\n{} · {} · concurrency {} · {} messages per run{}{}",
        args.backend.name(),
        args.transport.name(),
        args.concurrency,
        args.messages,
        args.rate
            .map_or(String::new(), |r| format!(" · rate {r:.0}/s")),
        args.keys
            .map_or(String::new(), |k| format!(" · tickbox keyed, {k} keys"))
    );
    print_runs(&runs);
    // Each round's ratio is to the lower of its baselines (over amqp: the
    // database alone or the broker alone, whichever is slower).
    let lower = |i: usize| {
        raws.get(i)
            .map_or(baselines[i].per_s, |r| r.per_s.min(baselines[i].per_s))
    };
    let ratios: Vec<f64> = tickboxes
        .iter()
        .enumerate()
        .map(|(i, t)| t.per_s / lower(i))
        .collect();
    let baseline = median(baselines.iter().map(|r| r.per_s).collect());
    let raw = (!raws.is_empty()).then(|| median(raws.iter().map(|r| r.per_s).collect()));
    let tickbox = median(tickboxes.iter().map(|r| r.per_s).collect());
    // Latency of the median tickbox run.
    let mid = {
        let mut sorted: Vec<&RunResult> = tickboxes.iter().collect();
        sorted.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
        sorted[sorted.len() / 2].clone()
    };
    let ratio = median(ratios.clone());
    let raw_text = raw.map_or(String::new(), |r| {
        format!(
            " · raw amqp {r:.0}/s ({} publishes in flight)",
            args.raw_in_flight
        )
    });
    let over = if raw.is_some() {
        "ratio to the lower baseline"
    } else {
        "ratio"
    };
    println!(
        "\nbaseline (database alone) {baseline:.0}/s{raw_text} · tickbox {tickbox:.0}/s · {over} {ratio:.3} (per round: {})",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut j = base_json(args);
    j.insert("scenario".into(), "throughput".into());
    j.insert("repeat".into(), args.repeat.into());
    j.insert("baseline_per_s".into(), baseline.into());
    if let Some(raw) = raw {
        j.insert("raw_amqp_per_s".into(), raw.into());
        j.insert("raw_in_flight".into(), args.raw_in_flight.into());
        j.insert("amqp_prefetch".into(), args.amqp_prefetch.into());
        if let Some(window) = args.amqp_publish_window {
            j.insert("amqp_publish_window".into(), window.into());
        }
        j.insert(
            "lower_baseline_per_s".into(),
            median((0..tickboxes.len()).map(lower).collect()).into(),
        );
        lat_json(&mut j, "raw_amqp_", raws[0].commit_to_commit);
    }
    j.insert("tickbox_per_s".into(), tickbox.into());
    j.insert("ratio".into(), ratio.into());
    j.insert("ratios".into(), serde_json::json!(ratios));
    j.insert(
        "latency_measured_to".into(),
        mid.latency_measured_to().into(),
    );
    lat_json(&mut j, "", mid.latency());
    lat_json(&mut j, "handler_end_", mid.commit_to_handler_end);
    lat_json(&mut j, "baseline_", baselines[0].commit_to_commit);
    j.insert("runs".into(), serde_json::to_value(&runs)?);

    if args.peer {
        let peer = run_peer(place, args).await?;
        let peer_per_s = peer
            .get("peer_per_s")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        println!(
            "\npeer pg-transactional-outbox ({} mode): {peer_per_s:.0}/s · tickbox/peer {:.2}",
            args.peer_mode.name(),
            tickbox / peer_per_s
        );
        eprintln!("producers alone (no consumer, no bus)");
        let alone = run_producers_alone::<B>(place, args).await?.per_s;
        println!(
            "producers alone, no delivery at all: {alone:.0}/s · producers alone/peer {:.2} (the most any outbox could reach here)",
            alone / peer_per_s
        );
        j.insert("peer_per_s".into(), peer_per_s.into());
        j.insert("tickbox_over_peer".into(), (tickbox / peer_per_s).into());
        j.insert("producers_alone_per_s".into(), alone.into());
        j.insert(
            "producers_alone_over_peer".into(),
            (alone / peer_per_s).into(),
        );
        j.insert("peer".into(), serde_json::Value::Object(peer));
    }
    if args.hexeract {
        let hexeract = run_hexeract(place, args).await?;
        let per_s = hexeract
            .get("peer_per_s")
            .and_then(|v| v.as_f64())
            .unwrap_or(f64::NAN);
        let path = hexeract.get("path").and_then(|v| v.as_str()).unwrap_or("?");
        println!(
            "\nhexeract 0.6 ({path} path): {per_s:.0}/s · tickbox ({}) / hexeract {:.2}",
            args.transport.name(),
            tickbox / per_s
        );
        j.insert("hexeract_per_s".into(), per_s.into());
        j.insert("tickbox_over_hexeract".into(), (tickbox / per_s).into());
        j.insert("hexeract".into(), serde_json::Value::Object(hexeract));
    }
    Ok(j)
}
