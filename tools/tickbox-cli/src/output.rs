//! What the tool prints: tables (comfy-table), JSON (serde_json), times and
//! durations (jiff), and the few words around them.

use crate::Failure;
use comfy_table::{presets, Table};
use jiff::fmt::friendly::{Designator, FractionalUnit, Spacing, SpanPrinter};
use jiff::{RoundMode, SignedDuration, SignedDurationRound, Span, SpanRound, Timestamp, Unit};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// Writes `text` to stdout; a closed pipe (`tickbox … | head`) is not an
/// error.
pub(crate) fn print(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

/// Serializes a value for `--json`.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(value).map_err(|e| Failure::Failed(format!("cannot encode JSON: {e}")))
}

/// One JSON document on one line.
pub(crate) fn json_line(value: &serde_json::Value) -> Result<String, Failure> {
    Ok(format!("{value}\n"))
}

/// One JSON object per module: the object alone when the command line names
/// one module, else an array of them.
pub(crate) fn json_per_module(
    mut objects: Vec<serde_json::Value>,
    single: bool,
) -> Result<String, Failure> {
    if single && objects.len() == 1 {
        return json_line(&objects.remove(0));
    }
    json_line(&serde_json::Value::Array(objects))
}

/// `value`, a JSON object, with `key` set to `module`.
pub(crate) fn with_module(
    mut value: serde_json::Value,
    key: &str,
    module: &str,
) -> serde_json::Value {
    if let Some(object) = value.as_object_mut() {
        object.insert(key.into(), module.into());
    }
    value
}

/// Valid JSON text re-indented, two spaces a level, its keys in their stored
/// order (read into a `serde_json::Value`, they would come out sorted).
pub(crate) fn pretty_json(text: &str) -> Result<String, serde_json::Error> {
    let mut out = Vec::with_capacity(text.len() * 2);
    let mut reader = serde_json::Deserializer::from_str(text);
    serde_transcode::transcode(&mut reader, &mut serde_json::Serializer::pretty(&mut out))?;
    reader.end()?;
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// A table with a header line, its columns two spaces apart, no borders.
pub(crate) fn table<const N: usize>(header: [&str; N], rows: Vec<[String; N]>) -> String {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(header)
        .add_rows(rows);
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out = table.trim_fmt();
    out.push('\n');
    out
}

/// `1 row`, `2 rows`.
pub(crate) fn plural(n: i64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// What follows a page of a list of `noun`s: a blank line, then how many
/// there are when the page shows them all, or else which of them it shows
/// (`offset` skipped, `shown` on it) and the options of the next page.
pub(crate) fn page_footer(noun: &str, offset: u64, shown: usize, limit: u64, total: u64) -> String {
    let (first, last) = (offset + 1, offset + shown as u64);
    if first == 1 && last >= total {
        return format!("\n{}\n", plural(total as i64, noun));
    }
    let mut footer = format!("\n{noun}s {first}-{last} of {total}");
    if last < total {
        footer.push_str(&format!("; next page: --offset {last} --limit {limit}"));
    }
    footer.push('\n');
    footer
}

/// The first line of `text`, at most `width` characters, marked when cut.
pub(crate) fn one_line(text: &str, width: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        flat
    } else {
        let mut cut: String = flat.chars().take(width.saturating_sub(3)).collect();
        cut.push_str("...");
        cut
    }
}

/// Indents every line of `text` by four spaces, ending with a newline.
pub(crate) fn indent(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    if text.is_empty() {
        out.push_str("    (empty)\n");
    }
    out
}

/// Microseconds since the Unix epoch, now.
pub(crate) fn now_us() -> i64 {
    Timestamp::now().as_microsecond()
}

/// How long ago (µs) a message stamped `created_at_us` was published, as
/// seen at `now_us`: 0 for a timestamp in the future, and no overflow for
/// any stored value (a row may hold 0, a negative number or `i64::MAX`).
pub(crate) fn lag_us(created_at_us: i64, now_us: i64) -> i64 {
    now_us.saturating_sub(created_at_us).max(0)
}

/// Microseconds as seconds for `--json`, to the millisecond.
pub(crate) fn seconds_of(us: i64) -> f64 {
    (us / 1000) as f64 / 1e3
}

/// Microseconds since the Unix epoch as UTC ISO 8601:
/// `2026-12-01T10:20:30Z`, or with `precise` `2026-12-01T10:20:30.123456Z`.
/// A stored value beyond the calendar (years -9999 to 9999: a bad clock, a
/// hand-written row) is shown as the number it is.
pub(crate) fn timestamp(us: i64, precise: bool) -> String {
    match Timestamp::from_microsecond(us) {
        Ok(at) if precise => format!("{at:.6}"),
        Ok(at) => format!("{at:.0}"),
        Err(_) => format!("{us} µs from the Unix epoch, beyond the years -9999 to 9999"),
    }
}

/// A lag for people: `850ms`, `42.3s`, `5m 12s`, `3h 4m`, `2d 5h` — the two
/// largest units, cut rather than rounded.
pub(crate) fn lag(us: i64) -> String {
    let lag = SignedDuration::from_micros(us.max(0));
    if lag < SignedDuration::from_secs(1) {
        return format!("{}ms", lag.as_millis());
    }
    if lag < SignedDuration::from_mins(1) {
        return SpanPrinter::new()
            .fractional(Some(FractionalUnit::Second))
            .precision(Some(1))
            .duration_to_string(&lag);
    }
    let cut = |span: Span, smallest: Unit| {
        span.round(
            SpanRound::new()
                .largest(Unit::Day)
                .smallest(smallest)
                .mode(RoundMode::Trunc)
                .days_are_24_hours(),
        )
    };
    let two_units = Span::try_from(lag)
        .and_then(|span| cut(span, Unit::Second))
        .and_then(|span| {
            let next = if span.get_days() != 0 {
                Unit::Hour
            } else if span.get_hours() != 0 {
                Unit::Minute
            } else {
                Unit::Second
            };
            cut(span, next)
        });
    match two_units {
        Ok(span) => format!("{span:#}"),
        // Beyond what a span holds (some 20,000 years): in hours.
        Err(_) => {
            let hours = lag
                .round(
                    SignedDurationRound::new()
                        .smallest(Unit::Hour)
                        .mode(RoundMode::Trunc),
                )
                .unwrap_or(lag);
            format!("{hours:#}")
        }
    }
}

/// A window as written on the command line: `7d`, `1h30m`, `1m`.
pub(crate) fn window(window: Duration) -> String {
    let compact = SpanPrinter::new()
        .designator(Designator::Compact)
        .spacing(Spacing::None);
    let Ok(signed) = SignedDuration::try_from(window) else {
        return format!("{}s", window.as_secs());
    };
    match Span::try_from(signed)
        .and_then(|span| span.round(SpanRound::new().largest(Unit::Day).days_are_24_hours()))
    {
        Ok(span) => compact.span_to_string(&span),
        Err(_) => compact.duration_to_string(&signed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps_as_utc_iso8601() {
        assert_eq!(timestamp(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(
            timestamp(951_782_400_000_000, false),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            timestamp(1_700_000_000_123_456, true),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(
            timestamp(1_700_000_000_123_456, false),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            timestamp(1_767_225_600_000_000, true),
            "2026-01-01T00:00:00.000000Z"
        );
        assert_eq!(timestamp(-1, true), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            timestamp(4_102_444_800_000_000, false),
            "2100-01-01T00:00:00Z"
        );
        assert!(timestamp(i64::MAX, false).starts_with("9223372036854775807 µs"));
        assert!(timestamp(i64::MIN, true).starts_with("-9223372036854775808 µs"));
    }

    #[test]
    fn prints_lags_with_two_units() {
        assert_eq!(lag(0), "0ms");
        assert_eq!(lag(-5), "0ms");
        assert_eq!(lag(i64::MIN), "0ms");
        assert_eq!(lag(500_000), "500ms");
        assert_eq!(lag(42_345_678), "42.3s");
        assert_eq!(lag(90_000_000), "1m 30s");
        assert_eq!(lag(90_999_999), "1m 30s");
        assert_eq!(lag(312_000_000), "5m 12s");
        assert_eq!(
            lag(3 * 3_600_000_000 + 4 * 60_000_000 + 59_000_000),
            "3h 4m"
        );
        assert_eq!(lag(3 * 86_400_000_000 + 7_200_000_000), "3d 2h");
        assert_eq!(lag(1_767_225_600_000_000), "20454d");
        assert_eq!(lag(i64::MAX), "2562047788h");
    }

    #[test]
    fn prints_windows_as_written() {
        assert_eq!(window(Duration::from_secs(5400)), "1h30m");
        assert_eq!(window(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(window(Duration::from_secs(60)), "1m");
        assert_eq!(window(Duration::from_secs(86_401)), "1d1s");
    }

    #[test]
    fn shows_a_sane_lag_for_any_stored_timestamp() {
        let now = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
        assert_eq!(lag_us(now - 90_000_000, now), 90_000_000);
        assert_eq!(lag_us(now, now), 0);
        // In the future: no lag, not a negative one.
        assert_eq!(lag_us(now + 1, now), 0);
        assert_eq!(lag_us(i64::MAX, now), 0);
        assert_eq!(lag_us(i64::MAX, i64::MIN), 0);
        // Far in the past: saturates instead of overflowing.
        assert_eq!(lag_us(0, now), now);
        assert_eq!(lag_us(-1, now), now + 1);
        assert_eq!(lag_us(i64::MIN, now), i64::MAX);
        assert_eq!(lag_us(i64::MIN + 1, 0), i64::MAX);
        assert_eq!(lag_us(i64::MIN, i64::MIN), 0);
    }

    #[test]
    fn pretty_prints_json_in_its_own_key_order() {
        assert_eq!(
            pretty_json(r#"{"z":1,"a":[1, 2.50,{}],"s":"x,{\"y\":[]}","e":[]}"#).unwrap(),
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"s\": \"x,{\\\"y\\\":[]}\",\n  \"e\": []\n}"
        );
        assert_eq!(pretty_json(" 42 ").unwrap(), "42");
        assert!(pretty_json("not json").is_err());
        assert!(pretty_json("{} {}").is_err());
    }

    #[test]
    fn aligns_tables_and_shortens_reasons() {
        let out = table(
            ["ID", "HANDLER", "N"],
            vec![
                ["abc".into(), "-".into(), "10".into()],
                ["abcdefghij".into(), "orders.ping".into(), "1".into()],
            ],
        );
        assert_eq!(
            out,
            "ID          HANDLER      N\nabc         -            10\nabcdefghij  orders.ping  1\n"
        );
        assert_eq!(one_line("a\n  b", 10), "a b");
        assert_eq!(one_line("abcdefghijk", 8), "abcde...");
        assert_eq!(plural(1, "row"), "1 row");
        assert_eq!(plural(0, "row"), "0 rows");
    }
}
