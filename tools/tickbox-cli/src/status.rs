//! `status`: the outbox backlog, its lag and its stalled messages, the
//! subscriptions, the inbox size, the dead letters, the parked keys and the
//! unknown effects, in one view per module.

use crate::modules::{on_module, Modules};
use crate::output::{
    json_per_module, lag, lag_us, now_us, plural, seconds_of, timestamp, to_json, window,
};
use crate::Failure;
use std::time::Duration;
use tickbox::{Backend, ModuleHandle, StoreStats, Subscription};

/// What `status` read from one module's database.
pub(crate) struct Status {
    /// The module's backend (`sqlite`, `postgres`).
    backend: &'static str,
    /// Its tables' figures.
    stats: StoreStats,
    /// The subscriptions recorded in its outbox.
    subscriptions: Vec<Subscription>,
    /// Its messages pending for longer than `stalled_after`.
    stalled: i64,
    /// The threshold `stalled` counts by.
    stalled_after: Duration,
    /// When it was read (µs since the Unix epoch).
    now: i64,
}

/// `status` of every module seen: one block of text each, or with `--json`
/// one object per module (one object alone when the command line names one
/// module).
pub(crate) async fn status(
    modules: &Modules,
    stalled_after: Duration,
    json: bool,
) -> Result<String, Failure> {
    let mut all = Vec::with_capacity(modules.all.len());
    for module in &modules.all {
        let status = on_module!(&module.handle, handle => read(handle, stalled_after).await?);
        all.push((module.name.as_str(), status));
    }
    if json {
        let mut objects = Vec::with_capacity(all.len());
        for (name, status) in &all {
            objects.push(status.json(name)?);
        }
        return json_per_module(objects, modules.single);
    }
    let blocks: Vec<String> = all.iter().map(|(name, status)| status.text(name)).collect();
    Ok(blocks.join("\n"))
}

/// Reads one module's status.
async fn read<B: Backend>(
    module: &ModuleHandle<B>,
    stalled_after: Duration,
) -> Result<Status, Failure> {
    let stats = module.store_stats().await?;
    let subscriptions = module.subscriptions().await?;
    let now = now_us();
    let stalled_before =
        now.saturating_sub(i64::try_from(stalled_after.as_micros()).unwrap_or(i64::MAX));
    let stalled = module.pending_published_before(stalled_before).await?;
    Ok(Status {
        backend: B::NAME,
        stats,
        subscriptions,
        stalled,
        stalled_after,
        now,
    })
}

impl Status {
    /// How many subscriptions are alive.
    fn alive(&self) -> usize {
        self.subscriptions
            .iter()
            .filter(|s| s.is_alive(self.now))
            .count()
    }

    /// The subscription owed the oldest message, and its lag (µs): the
    /// largest lag.
    fn lagging(&self) -> Option<(i64, &Subscription)> {
        self.subscriptions
            .iter()
            .filter_map(|s| s.oldest_pending_us.map(|oldest| (oldest, s)))
            .min_by(|(a, x), (b, y)| (a, &x.module, &x.handler).cmp(&(b, &y.module, &y.handler)))
            .map(|(oldest, s)| (lag_us(oldest, self.now), s))
    }

    /// The status of module `module` as one JSON object.
    fn json(&self, module: &str) -> Result<serde_json::Value, Failure> {
        let Status {
            backend,
            stats,
            subscriptions,
            stalled,
            stalled_after,
            now,
        } = self;
        let alive = self.alive();
        let lagging = self.lagging();
        let outbox_lag_us = stats.oldest_pending_us.map(|oldest| lag_us(oldest, *now));
        let mut value = to_json(stats)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("module".into(), module.into());
            object.insert("backend".into(), (*backend).into());
            object.insert("lag_seconds".into(), outbox_lag_us.map(seconds_of).into());
            object.insert("stalled".into(), (*stalled).into());
            object.insert(
                "stalled_after_seconds".into(),
                stalled_after.as_secs().into(),
            );
            object.insert("subscriptions_alive".into(), alive.into());
            object.insert(
                "subscriptions_stopped".into(),
                (subscriptions.len() - alive).into(),
            );
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
        Ok(value)
    }

    /// The status of module `module` as text.
    fn text(&self, module: &str) -> String {
        let Status {
            backend,
            stats,
            subscriptions,
            stalled,
            stalled_after,
            now,
        } = self;
        let now = *now;
        let alive = self.alive();
        let stopped = subscriptions.len() - alive;
        let lagging = self.lagging();
        let outbox_lag_us = stats.oldest_pending_us.map(|oldest| lag_us(oldest, now));
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
        let mut out = format!("module           {module}\n");
        out.push_str(&format!("backend          {backend}\n"));
        if let Some(encrypted) = stats.encrypted {
            out.push_str(&format!(
                "connection       {}\n",
                if encrypted {
                    "encrypted (TLS)"
                } else {
                    "in clear (no TLS)"
                }
            ));
        }
        out.push_str(&format!(
            "outbox pending   {}\n",
            plural(stats.outbox_pending, "message")
        ));
        out.push_str(&format!("outbox lag       {outbox_lag}\n"));
        if stats.outbox_scheduled > 0 {
            out.push_str(&format!(
                "outbox scheduled {} not yet due (see `tickbox scheduled list`)\n",
                plural(stats.outbox_scheduled, "message")
            ));
        }
        out.push_str(&format!(
            "outbox stalled   {} pending longer than {}\n",
            plural(*stalled, "message"),
            window(*stalled_after)
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
        out
    }
}
