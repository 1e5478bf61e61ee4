//! `status`: the outbox backlog, its lag and its stalled messages, the
//! subscriptions, the inbox size, the dead letters, the parked keys and the
//! unknown effects, in one view.

use crate::output::{
    json_line, lag, lag_us, now_us, plural, seconds_of, timestamp, to_json, window,
};
use crate::Failure;
use std::time::Duration;
use tickbox::{diesel, Backend, ModuleHandle};
use uuid::Uuid;

/// What `status` reads from a module's database with SQL of its own, where
/// the library offers no call: written once per backend.
pub(crate) trait Inspect: Backend {
    /// The number of outbox messages still pending that were published
    /// before `before_us` (µs since the Unix epoch).
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64>;
}

/// A row of `SELECT count(*) AS n`.
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The smallest UUIDv7 of the millisecond holding `unix_us`: every UUIDv7
/// made before that millisecond compares lower. Pending messages are told
/// by their ids, as the bus's watchdog tells them (so the pending index
/// answers, and `status` counts what `tickbox_outbox_stalled` counts).
fn earliest_id_at(unix_us: i64) -> Uuid {
    let ms = (unix_us / 1000).max(0) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    Uuid::from_bytes(bytes)
}

#[cfg(feature = "sqlite")]
impl Inspect for tickbox::Sqlite {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use tickbox::diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us).as_bytes().to_vec();
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < ?",
                )
                .bind::<diesel::sql_types::Binary, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }
}

#[cfg(feature = "postgres")]
impl Inspect for tickbox::Postgres {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use tickbox::diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us);
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < $1",
                )
                .bind::<diesel::sql_types::Uuid, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }
}

/// `status`.
pub(crate) async fn status<B: Inspect>(
    module: &ModuleHandle<B>,
    stalled_after: Duration,
    json: bool,
) -> Result<String, Failure> {
    let stats = module.store_stats().await?;
    let subscriptions = module.subscriptions().await?;
    let now = now_us();
    let stalled_before =
        now.saturating_sub(i64::try_from(stalled_after.as_micros()).unwrap_or(i64::MAX));
    let stalled = B::pending_before(module, stalled_before).await?;
    let alive = subscriptions.iter().filter(|s| s.is_alive(now)).count();
    let stopped = subscriptions.len() - alive;
    // The subscription owed the oldest message: the largest lag.
    let lagging = subscriptions
        .iter()
        .filter_map(|s| s.oldest_pending_us.map(|oldest| (oldest, s)))
        .min_by(|(a, x), (b, y)| (a, &x.module, &x.handler).cmp(&(b, &y.module, &y.handler)))
        .map(|(oldest, s)| (lag_us(oldest, now), s));
    let outbox_lag_us = stats.oldest_pending_us.map(|oldest| lag_us(oldest, now));
    if json {
        let mut value = to_json(&stats)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("backend".into(), B::NAME.into());
            object.insert("lag_seconds".into(), outbox_lag_us.map(seconds_of).into());
            object.insert("stalled".into(), stalled.into());
            object.insert(
                "stalled_after_seconds".into(),
                stalled_after.as_secs().into(),
            );
            object.insert("subscriptions_alive".into(), alive.into());
            object.insert("subscriptions_stopped".into(), stopped.into());
            object.insert(
                "subscription_lag_seconds".into(),
                lagging.map(|(lag, _)| seconds_of(lag)).into(),
            );
            object.insert(
                "lagging_subscription".into(),
                lagging.map_or(
                    serde_json::Value::Null,
                    |(_, s)| serde_json::json!({ "module": s.module, "handler": s.handler }),
                ),
            );
        }
        return json_line(&value);
    }
    let outbox_lag = match (outbox_lag_us, stats.oldest_pending_us) {
        (Some(_), Some(oldest)) if oldest > now => format!(
            "0s (oldest pending message published {}, in the future: \
             a clock ahead of this one, or a bad timestamp)",
            timestamp(oldest, false)
        ),
        (Some(us), Some(oldest)) => format!(
            "{} (oldest pending message published {})",
            lag(us),
            timestamp(oldest, false)
        ),
        _ => "0s (nothing pending)".to_string(),
    };
    let mut out = String::new();
    out.push_str(&format!("backend          {}\n", B::NAME));
    out.push_str(&format!(
        "outbox pending   {}\n",
        plural(stats.outbox_pending, "message")
    ));
    out.push_str(&format!("outbox lag       {outbox_lag}\n"));
    out.push_str(&format!(
        "outbox stalled   {} pending longer than {}\n",
        plural(stalled, "message"),
        window(stalled_after)
    ));
    if subscriptions.is_empty() {
        out.push_str(
            "subscriptions    none recorded (no bus with a handler of this outbox's topics has run)\n",
        );
    } else {
        out.push_str(&format!(
            "subscriptions    {}: {alive} alive, {stopped} stopped",
            subscriptions.len()
        ));
        if stopped > 0 {
            out.push_str("  (see `tickbox subscriptions`)");
        }
        out.push('\n');
        let subscription_lag = match lagging {
            Some((us, s)) => format!(
                "{} (handler `{}` of module `{}`, {})",
                lag(us),
                s.handler,
                s.module,
                if s.is_alive(now) { "alive" } else { "stopped" }
            ),
            None => "0s (no subscription owes a message)".to_string(),
        };
        out.push_str(&format!("subscription lag {subscription_lag}\n"));
    }
    out.push_str(&format!("inbox rows       {}\n", stats.inbox_rows));
    out.push_str(&format!("dead letters     {}", stats.dead_letters));
    if stats.dead_letters > 0 {
        out.push_str("  (see `tickbox dead-letters list`)");
    }
    out.push('\n');
    if stats.parked_keys.is_empty() {
        out.push_str("parked keys      none\n");
    } else {
        let parked: Vec<String> = stats
            .parked_keys
            .iter()
            .map(|(handler, keys)| format!("{} by handler `{handler}`", plural(*keys, "key")))
            .collect();
        out.push_str(&format!(
            "parked keys      {}  (held back by a dead letter until it is replayed or skipped)\n",
            parked.join(", ")
        ));
    }
    if stats.unknown_effects.is_empty() {
        out.push_str("unknown effects  none\n");
    } else {
        let unknown: Vec<String> = stats
            .unknown_effects
            .iter()
            .map(|(handler, effects)| {
                format!("{} by handler `{handler}`", plural(*effects, "effect"))
            })
            .collect();
        out.push_str(&format!(
            "unknown effects  {}  (waiting for a person to settle them; see \
             `tickbox effects list --state unknown`)\n",
            unknown.join(", ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_id_of_a_millisecond_orders_below_its_uuidv7s() {
        let at_us = 1_767_225_600_123_456;
        let cutoff = earliest_id_at(at_us);
        let same_ms = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            123_999_000,
        ));
        let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            122_999_000,
        ));
        assert!(earlier < cutoff && cutoff <= same_ms);
        assert_eq!(
            earliest_id_at(-5),
            Uuid::from_bytes([0, 0, 0, 0, 0, 0, 0x70, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        );
    }
}
