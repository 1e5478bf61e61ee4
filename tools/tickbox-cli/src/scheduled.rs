//! `scheduled list`, `show` and `cancel`: the messages waiting in the
//! modules' outboxes until they are due.

use crate::modules::{on_module, Attached, Modules};
use crate::output::{
    indent, json_line, lag, now_us, page_footer, pretty_json, table, timestamp, to_json,
    with_module,
};
use crate::{Command, Failure};
use tickbox::Scheduled;
use uuid::Uuid;

/// `scheduled list`: the scheduled messages of every module seen, soonest
/// due first, a page of them.
pub(crate) async fn list(
    modules: &Modules,
    offset: u64,
    limit: u64,
    json: bool,
) -> Result<String, Failure> {
    // The page of all modules together is within the first offset + limit
    // of each.
    let wanted = offset.saturating_add(limit);
    let mut waiting: Vec<(&str, Scheduled)> = Vec::new();
    let mut total = 0;
    for module in &modules.all {
        let (found, count) = on_module!(&module.handle, handle => {
            let found = handle.scheduled(0, wanted).await?;
            let count = if json { 0 } else { handle.store_stats().await?.outbox_scheduled.max(0) as u64 };
            (found, count)
        });
        waiting.extend(found.into_iter().map(|s| (module.name.as_str(), s)));
        total += count;
    }
    waiting.sort_by_key(|(_, s)| (s.due_at_us, s.message_id));
    let waiting: Vec<(&str, Scheduled)> = waiting
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect();
    if json {
        let mut all = Vec::with_capacity(waiting.len());
        for (module, scheduled) in &waiting {
            all.push(with_module(to_json(scheduled)?, "module", module));
        }
        return json_line(&serde_json::Value::Array(all));
    }
    if waiting.is_empty() {
        return Ok(if total == 0 {
            "no scheduled messages\n".to_string()
        } else {
            format!(
                "no scheduled messages from offset {offset} (there are {total}; try a smaller --offset)\n"
            )
        });
    }
    let now = now_us();
    let rows = waiting
        .iter()
        .map(|(module, scheduled)| {
            [
                module.to_string(),
                scheduled.message_id.to_string(),
                scheduled.topic.clone(),
                scheduled.ordering_key.clone().unwrap_or_else(|| "-".into()),
                timestamp(scheduled.due_at_us, false),
                format!("in {}", lag(scheduled.due_at_us.saturating_sub(now).max(0))),
            ]
        })
        .collect();
    let mut out = table(
        [
            "MODULE",
            "MESSAGE ID",
            "TOPIC",
            "KEY",
            "DUE AT (UTC)",
            "DUE",
        ],
        rows,
    );
    out.push_str(&page_footer(
        "scheduled message",
        offset,
        waiting.len(),
        limit,
        total,
    ));
    Ok(out)
}

/// The module holding scheduled message `id`, and the message; fails with
/// "not found", or asks for `--module` when several modules hold one.
async fn find<'a>(
    modules: &'a Modules,
    id: Uuid,
    command: &Command,
) -> Result<(&'a Attached, Scheduled), Failure> {
    let mut holders = Vec::new();
    for module in &modules.all {
        let found = on_module!(&module.handle, handle => handle.scheduled_message(id).await?);
        holders.extend(found.map(|scheduled| (module, scheduled)));
    }
    let what = format!("scheduled message {id} is");
    Modules::choose(holders, &what, || not_found(id, &modules.scope()), command)
}

/// The "no such scheduled message" failure, saying where the tool looked.
fn not_found(id: Uuid, scope: &str) -> Failure {
    Failure::Failed(format!(
        "no scheduled message {id} waiting in {scope}: it was delivered, cancelled, or never \
         scheduled (`tickbox scheduled list` shows those waiting)"
    ))
}

/// `scheduled show`.
pub(crate) async fn show(
    modules: &Modules,
    id: Uuid,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, scheduled) = find(modules, id, command).await?;
    if json {
        return json_line(&with_module(to_json(&scheduled)?, "module", &module.name));
    }
    let now = now_us();
    let mut out = format!("module           {}\n", module.name);
    out.push_str(&format!("message id       {}\n", scheduled.message_id));
    out.push_str(&format!("topic            {}\n", scheduled.topic));
    if let Some(key) = &scheduled.ordering_key {
        out.push_str(&format!(
            "ordering key     {key} (numbered in its key when it is due)\n"
        ));
    }
    let state = if scheduled.due_at_us > now {
        format!("in {}", lag(scheduled.due_at_us - now))
    } else if scheduled.taken {
        "due, being delivered".to_string()
    } else {
        "due, waiting for the application's bus".to_string()
    };
    out.push_str(&format!(
        "due at           {} ({state})\n",
        timestamp(scheduled.due_at_us, true)
    ));
    out.push_str(&format!(
        "published at     {}\n",
        timestamp(scheduled.created_at_us, true)
    ));
    out.push_str(&format!("correlation id   {}\n", scheduled.correlation_id));
    out.push_str(&format!(
        "causation id     {}\n",
        scheduled
            .causation_id
            .map_or_else(|| "- (none)".to_string(), |id| id.to_string())
    ));
    match pretty_json(&scheduled.payload) {
        Ok(pretty) => {
            out.push_str("payload (JSON)\n");
            out.push_str(&indent(&pretty));
        }
        Err(_) => {
            out.push_str("payload (not valid JSON; as stored)\n");
            out.push_str(&indent(&scheduled.payload));
        }
    }
    Ok(out)
}

/// `scheduled cancel`.
pub(crate) async fn cancel(
    modules: &Modules,
    id: Uuid,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, scheduled) = find(modules, id, command).await?;
    let cancelled = on_module!(&module.handle, handle => handle.cancel_scheduled(id).await?);
    if !cancelled {
        return Err(Failure::Failed(format!(
            "scheduled message {id} (topic {}, module `{}`) is due already: it is being \
             delivered, and can no longer be cancelled",
            scheduled.topic, module.name
        )));
    }
    if json {
        return json_line(&serde_json::json!({
            "module": module.name,
            "message_id": id,
            "topic": scheduled.topic,
            "due_at_us": scheduled.due_at_us,
            "cancelled": true,
        }));
    }
    Ok(format!(
        "cancelled scheduled message {id} (topic {}, module `{}`, due at {}):\n\
         it is gone from the outbox and will not be delivered.\n",
        scheduled.topic,
        module.name,
        timestamp(scheduled.due_at_us, false)
    ))
}
