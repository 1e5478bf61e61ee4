//! `dead-letters list`, `show`, `replay`, `skip` and `discard`: the
//! deliveries the bus gave up on, and what an operator does about them.

use crate::output::{indent, json_line, one_line, plural, pretty_json, table, timestamp, to_json};
use crate::{handler_label, DeadLetterKey, Failure};
use tickbox::{Backend, DeadLetter, ModuleHandle};

/// Characters of a dead letter's reason shown in `dead-letters list`.
const REASON_WIDTH: usize = 60;

/// `dead-letters list`.
pub(crate) async fn list<B: Backend>(
    module: &ModuleHandle<B>,
    offset: u64,
    limit: u64,
    json: bool,
) -> Result<String, Failure> {
    let letters = module.dead_letters(offset, limit).await?;
    if json {
        return json_line(&to_json(&letters)?);
    }
    let total = module.store_stats().await?.dead_letters.max(0) as u64;
    if letters.is_empty() {
        return Ok(if total == 0 {
            "no dead letters\n".to_string()
        } else {
            format!(
                "no dead letters from offset {offset} (there are {total}; try a smaller --offset)\n"
            )
        });
    }
    let rows = letters
        .iter()
        .map(|letter| {
            [
                letter.message_id.to_string(),
                if letter.handler.is_empty() {
                    "-".to_string()
                } else {
                    letter.handler.clone()
                },
                letter.topic.clone(),
                key_label(letter),
                letter.attempts.to_string(),
                timestamp(letter.dead_at_us, false),
                one_line(&letter.reason, REASON_WIDTH),
            ]
        })
        .collect();
    let mut out = table(
        [
            "MESSAGE ID",
            "HANDLER",
            "TOPIC",
            "KEY #SEQ",
            "ATTEMPTS",
            "DEAD AT (UTC)",
            "REASON",
        ],
        rows,
    );
    let first = offset + 1;
    let last = offset + letters.len() as u64;
    out.push('\n');
    if first == 1 && last >= total {
        out.push_str(&format!("{}\n", plural(total as i64, "dead letter")));
    } else {
        out.push_str(&format!("dead letters {first}-{last} of {total}"));
        if last < total {
            out.push_str(&format!("; next page: --offset {last} --limit {limit}"));
        }
        out.push('\n');
    }
    Ok(out)
}

/// A dead letter's ordering key and sequence number, `parked` when it waits
/// behind another; `-` without a key.
fn key_label(letter: &DeadLetter) -> String {
    match (&letter.keyed, letter.parked_behind) {
        (None, _) => "-".to_string(),
        (Some(keyed), None) => format!("{} #{}", keyed.key, keyed.sequence),
        (Some(keyed), Some(_)) => format!("{} #{} (parked)", keyed.key, keyed.sequence),
    }
}

/// Reads a dead letter or fails with "not found".
async fn find<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
) -> Result<DeadLetter, Failure> {
    module
        .dead_letter(key.message_id, &key.handler)
        .await?
        .ok_or_else(|| not_found(key))
}

/// The "no such dead letter" failure.
fn not_found(key: &DeadLetterKey) -> Failure {
    Failure::Failed(format!(
        "no dead letter for message {} and {} in this database \
         (`tickbox dead-letters list` shows them)",
        key.message_id,
        handler_label(&key.handler)
    ))
}

/// `dead-letters show`.
pub(crate) async fn show<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    if json {
        return json_line(&to_json(&letter)?);
    }
    let handler = if letter.handler.is_empty() {
        "- (none: no handler could be chosen, the topic is unknown)".to_string()
    } else {
        letter.handler.clone()
    };
    let mut out = String::new();
    out.push_str(&format!("message id       {}\n", letter.message_id));
    out.push_str(&format!("handler          {handler}\n"));
    out.push_str(&format!("topic            {}\n", letter.topic));
    if let Some(keyed) = &letter.keyed {
        out.push_str(&format!(
            "ordering key     {} (sequence {}, numbered by module `{}`)\n",
            keyed.key, keyed.sequence, keyed.publisher
        ));
        match letter.parked_behind {
            Some(head) => out.push_str(&format!(
                "parked behind    {head} (delivered when that one is replayed or skipped)\n"
            )),
            None => out.push_str(
                "parks its key    the key's later messages wait until this one is replayed \
                 or skipped\n",
            ),
        }
    }
    out.push_str(&format!("attempts         {}\n", letter.attempts));
    out.push_str(&format!(
        "dead at          {}\n",
        timestamp(letter.dead_at_us, true)
    ));
    out.push_str(&format!(
        "published at     {}\n",
        timestamp(letter.created_at_us, true)
    ));
    out.push_str(&format!("correlation id   {}\n", letter.correlation_id));
    out.push_str(&format!(
        "causation id     {}\n",
        letter
            .causation_id
            .map_or_else(|| "- (none)".to_string(), |id| id.to_string())
    ));
    out.push_str("reason\n");
    out.push_str(&indent(&letter.reason));
    match pretty_json(&letter.payload) {
        Ok(pretty) => {
            out.push_str("payload (JSON)\n");
            out.push_str(&indent(&pretty));
        }
        Err(_) => {
            out.push_str("payload (not valid JSON; as stored)\n");
            out.push_str(&indent(&letter.payload));
        }
    }
    Ok(out)
}

/// `dead-letters replay`.
pub(crate) async fn replay<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    requeue(module, key).await?;
    if json {
        return json_line(&serde_json::json!({
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "requeued": true,
        }));
    }
    Ok(requeued(&letter))
}

/// Puts a dead letter's message back in the outbox (with the messages of
/// its key parked behind it) for the application's bus: a replay that needs
/// no handler code, as `dead-letters replay` and the `effects` commands do
/// it.
pub(crate) async fn requeue<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
) -> Result<(), Failure> {
    module
        .requeue_dead_letter(key.message_id, &key.handler)
        .await
        .map_err(|error| match error {
            tickbox::Error::NoSuchDeadLetter { .. } => not_found(key),
            other => other.into(),
        })
}

/// What `dead-letters replay` says of a dead letter it put back in the
/// outbox.
pub(crate) fn requeued(letter: &DeadLetter) -> String {
    let mut out = format!(
        "requeued message {} (topic {}, {}):\n\
         it is back in the outbox as pending, and its dead letter is gone.\n\
         The application's bus delivers it again to every subscriber of its topic:\n\
         at once on PostgreSQL, on its next outbox scan on SQLite, or when it starts.\n\
         Handlers that already processed it skip it in their inbox. `tickbox status`\n\
         counts it as pending until then.\n",
        letter.message_id,
        letter.topic,
        handler_label(&letter.handler),
    );
    if letter.handler.is_empty() {
        out.push_str(
            "If still no module on the bus publishes its topic, it becomes a dead letter again.\n",
        );
    }
    out
}

/// `dead-letters skip`.
pub(crate) async fn skip<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    if !module
        .skip_dead_letter(key.message_id, &key.handler)
        .await?
    {
        return Err(not_found(key));
    }
    if json {
        return json_line(&serde_json::json!({
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "ordering_key": letter.keyed.as_ref().map(|k| &k.key),
            "skipped": true,
        }));
    }
    Ok(match &letter.keyed {
        Some(keyed) => format!(
            "skipped message {} (topic {}, {}, key {} #{}):\n\
             its dead letter is gone and the handler's place in the key moved past it;\n\
             the key's messages parked behind it are back in the outbox, and the\n\
             application's bus delivers them in the key's order.\n",
            letter.message_id,
            letter.topic,
            handler_label(&letter.handler),
            keyed.key,
            keyed.sequence
        ),
        None => format!(
            "skipped message {} (topic {}, {}): it has no ordering key, so its dead letter\n\
             was simply deleted; it will not be delivered to that handler again.\n",
            letter.message_id,
            letter.topic,
            handler_label(&letter.handler)
        ),
    })
}

/// `dead-letters discard`.
pub(crate) async fn discard<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    if !module
        .discard_dead_letter(key.message_id, &key.handler)
        .await?
    {
        return Err(not_found(key));
    }
    if json {
        return json_line(&serde_json::json!({
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "discarded": true,
        }));
    }
    Ok(format!(
        "discarded the dead letter of message {} (topic {}, {});\n\
         it will not be delivered to that handler again.\n",
        letter.message_id,
        letter.topic,
        handler_label(&letter.handler)
    ))
}
