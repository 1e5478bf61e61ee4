//! What the bench prints: the table of runs (comfy-table), the JSON object
//! of `--json`, and the medians over rounds.

use crate::cli::Args;
use crate::clock::Latency;
use crate::measure::RunResult;
use crate::memory::peak_rss_mb;
use comfy_table::{presets, CellAlignment, Table};
use serde_json::Value;

/// The JSON object a scenario reports, printed as one line with `--json`.
pub(crate) type Json = serde_json::Map<String, Value>;

/// The median of a few figures (the rounds of a command).
pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

/// `p50 / p99 / max` in milliseconds, or `-` when not measured.
fn fmt_latency(l: Option<Latency>) -> String {
    l.map_or_else(
        || "-".into(),
        |l| format!("{:.2} / {:.2} / {:.1}", l.p50, l.p99, l.max),
    )
}

/// Prints the runs as a table, one line each.
pub(crate) fn print_runs(runs: &[RunResult]) {
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header([
        "run",
        "messages",
        "seconds",
        "msg/s",
        "produced/s",
        "commit->commit p50/p99/max ms",
        "commit->handler end",
    ]);
    for r in runs {
        table.add_row([
            r.what.clone(),
            r.messages.to_string(),
            format!("{:.2}", r.seconds),
            format!("{:.0}", r.per_s),
            format!("{:.0}", r.produced_per_s),
            fmt_latency(r.commit_to_commit),
            fmt_latency(r.commit_to_handler_end),
        ]);
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        if (1..=4).contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    println!("{}", table.trim_fmt());
}

/// The fields every scenario reports: what was run.
pub(crate) fn base_json(args: &Args) -> Json {
    let mut j = Json::new();
    j.insert("backend".into(), args.backend.name().into());
    j.insert("transport".into(), args.transport.name().into());
    j.insert("concurrency".into(), args.concurrency.into());
    j.insert("batch".into(), args.batch.into());
    j.insert("keys".into(), args.keys.into());
    j.insert("messages".into(), args.messages.into());
    j.insert("rate".into(), serde_json::json!(args.rate));
    j.insert("trace_layer".into(), args.trace().into());
    j
}

/// Adds `{prefix}p50_ms`, `{prefix}p99_ms` and `{prefix}max_ms` (null when
/// not measured).
pub(crate) fn lat_json(j: &mut Json, prefix: &str, l: Option<Latency>) {
    for (name, value) in [
        ("p50", l.map(|l| l.p50)),
        ("p99", l.map(|l| l.p99)),
        ("max", l.map(|l| l.max)),
    ] {
        j.insert(format!("{prefix}{name}_ms"), serde_json::json!(value));
    }
}

/// Ends a successful command: the peak memory, then with `--json` the
/// scenario's object on one line (`baseline_per_s`, `ratio`, `p50_ms` and
/// `p99_ms` always present, null when the scenario has none).
pub(crate) fn finish(args: &Args, mut json: Json) {
    let peak = peak_rss_mb();
    println!("peak RSS (VmHWM) {peak:.1} MiB");
    json.insert("peak_rss_mb".into(), peak.into());
    for key in ["baseline_per_s", "ratio", "p50_ms", "p99_ms"] {
        json.entry(key).or_insert(Value::Null);
    }
    if args.json {
        println!("{}", Value::Object(json));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
