//! The watchdog: a pending message that has not been delivered for longer
//! than the bus's stall threshold is reported — counted in
//! `tickbox_outbox_stalled`, and logged at warn level with its id and what
//! holds it up — so that work never sits stuck in silence.

use crate::store::backend::Backend;
use crate::store::schema::Id;
use std::time::Duration;
use uuid::Uuid;

/// What the watchdog found in one outbox.
#[derive(Debug, Default)]
pub(crate) struct Stalled {
    /// Pending messages published longer ago than the threshold.
    pub(crate) count: i64,
    /// The oldest of them, if any.
    pub(crate) oldest: Option<StalledMessage>,
}

/// The oldest stalled message and what the database says of it.
#[derive(Debug)]
pub(crate) struct StalledMessage {
    pub(crate) id: Uuid,
    /// The bus holding it and until when, if any.
    pub(crate) claim: Option<(Uuid, i64)>,
    /// The subscriptions still owing it: module, handler, alive until.
    pub(crate) owing: Vec<(String, String, i64)>,
}

/// Reads the pending messages of the outbox on `conn` published before
/// `now_us - threshold` (by their UUIDv7 ids, so the pending index answers).
pub(crate) async fn look<B: Backend>(
    conn: &mut B::Connection,
    now_us: i64,
    threshold: Duration,
) -> crate::error::Result<Stalled> {
    let before = Id::earliest_at(now_us.saturating_sub(threshold.as_micros() as i64)).0;
    let count = B::count_stalled(conn, before).await?;
    if count == 0 {
        return Ok(Stalled::default());
    }
    let Some(row) = B::oldest_stalled(conn, before).await? else {
        return Ok(Stalled::default());
    };
    let owing = B::owing(conn, row.id.0).await?;
    let claim = match (row.claimed_by.0, row.claimed_until_us.0) {
        (Ok(Some(bus)), Ok(Some(until))) => Some((bus.0, until)),
        _ => None,
    };
    Ok(Stalled {
        count,
        oldest: Some(StalledMessage {
            id: row.id.0,
            claim,
            owing: owing
                .into_iter()
                .map(|o| (o.module, o.handler, o.alive_until_us))
                .collect(),
        }),
    })
}

impl StalledMessage {
    /// What holds the message up, in words, as seen by bus `bus` at
    /// `now_us`; `here` is what this bus knows of it when it holds it in
    /// memory (a retry note, or that it is in delivery).
    pub(crate) fn blocked_by(&self, bus: Uuid, now_us: i64, here: Option<String>) -> String {
        let mut reasons = Vec::new();
        match (&here, self.claim) {
            (Some(note), _) => reasons.push(format!("in delivery by this bus: {note}")),
            (None, Some((holder, until))) if until > now_us && holder != bus => reasons.push(
                format!("claimed by bus {holder} of another process for {} more", seconds(until - now_us)),
            ),
            (None, Some((holder, until))) if until <= now_us => reasons.push(format!(
                "claimed by bus {holder}, whose claim expired {} ago (its process may have died); it is taken over at the next scan",
                seconds(now_us - until)
            )),
            _ => {}
        }
        let waiting: Vec<String> = self
            .owing
            .iter()
            .map(|(module, handler, alive_until)| {
                if *alive_until > now_us {
                    format!("`{handler}` of module `{module}` (its process runs)")
                } else {
                    format!(
                        "`{handler}` of module `{module}` (no running process has served it for {}: start it, or if the handler is gone for good retire the subscription with `tickbox subscriptions retire {module} {handler} --yes`)",
                        seconds(now_us - alive_until)
                    )
                }
            })
            .collect();
        if !waiting.is_empty() {
            reasons.push(format!("still owed to {}", waiting.join(", ")));
        }
        if reasons.is_empty() {
            reasons.push("pending and unclaimed; no running bus has taken it".into());
        }
        reasons.join("; ")
    }
}

/// A span of microseconds as whole seconds, for people.
fn seconds(us: i64) -> String {
    format!("{} s", us.max(0) / 1_000_000)
}
