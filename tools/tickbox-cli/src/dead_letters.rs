//! `dead-letters list`, `show`, `replay`, `skip` and `discard`: the
//! deliveries the bus gave up on, in every module seen, and what an
//! operator does about them.

use crate::modules::{on_module, Attached, Modules};
use crate::output::{
    indent, json_line, one_line, page_footer, pretty_json, table, timestamp, to_json, with_module,
};
use crate::{handler_label, Command, DeadLetterKey, Failure};
use tickbox::{Backend, DeadLetter, ModuleHandle};

/// Characters of a dead letter's reason shown in `dead-letters list`.
const REASON_WIDTH: usize = 60;

/// `dead-letters list`: the dead letters of every module seen, oldest
/// first, a page of them.
pub(crate) async fn list(
    modules: &Modules,
    offset: u64,
    limit: u64,
    json: bool,
) -> Result<String, Failure> {
    // The page of all modules together is within the first offset + limit
    // of each.
    let wanted = offset.saturating_add(limit);
    let mut letters: Vec<(&str, DeadLetter)> = Vec::new();
    let mut total = 0;
    for module in &modules.all {
        let (found, count) = on_module!(&module.handle, handle => {
            let found = handle.dead_letters(0, wanted).await?;
            let count = if json { 0 } else { handle.store_stats().await?.dead_letters.max(0) as u64 };
            (found, count)
        });
        letters.extend(
            found
                .into_iter()
                .map(|letter| (module.name.as_str(), letter)),
        );
        total += count;
    }
    letters.sort_by(|(_, a), (_, b)| {
        (a.dead_at_us, a.message_id, &a.handler).cmp(&(b.dead_at_us, b.message_id, &b.handler))
    });
    let letters: Vec<(&str, DeadLetter)> = letters
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect();
    if json {
        let mut all = Vec::with_capacity(letters.len());
        for (module, letter) in &letters {
            all.push(with_module(to_json(letter)?, "module", module));
        }
        return json_line(&serde_json::Value::Array(all));
    }
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
        .map(|(module, letter)| {
            [
                module.to_string(),
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
            "MODULE",
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
    out.push_str(&page_footer(
        "dead letter",
        offset,
        letters.len(),
        limit,
        total,
    ));
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

/// The module holding the dead letter of `key`, and the dead letter; fails
/// with "not found", or asks for `--module` when several modules hold one.
async fn find<'a>(
    modules: &'a Modules,
    key: &DeadLetterKey,
    command: &Command,
) -> Result<(&'a Attached, DeadLetter), Failure> {
    let mut holders = Vec::new();
    for module in &modules.all {
        let found = on_module!(&module.handle, handle => {
            handle.dead_letter(key.message_id, &key.handler).await?
        });
        holders.extend(found.map(|letter| (module, letter)));
    }
    let what = format!(
        "message {} has a dead letter for {}",
        key.message_id,
        handler_label(&key.handler)
    );
    Modules::choose(holders, &what, || not_found(key, &modules.scope()), command)
}

/// The "no such dead letter" failure, saying where the tool looked.
fn not_found(key: &DeadLetterKey, scope: &str) -> Failure {
    Failure::Failed(format!(
        "no dead letter for message {} and {} in {scope} \
         (`tickbox dead-letters list` shows them)",
        key.message_id,
        handler_label(&key.handler)
    ))
}

/// `dead-letters show`.
pub(crate) async fn show(
    modules: &Modules,
    key: &DeadLetterKey,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, letter) = find(modules, key, command).await?;
    if json {
        return json_line(&with_module(to_json(&letter)?, "module", &module.name));
    }
    let handler = if letter.handler.is_empty() {
        "- (none: no handler could be chosen, the topic is unknown)".to_string()
    } else {
        letter.handler.clone()
    };
    let mut out = format!("module           {}\n", module.name);
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
    #[cfg(feature = "opentelemetry")]
    out.push_str(&format!(
        "trace id         {}\n",
        letter.trace_context.as_ref().map_or_else(
            || "- (none: published outside any trace)".to_string(),
            |context| format!(
                "{} (published in span {})",
                context.trace_id(),
                context.span_id()
            )
        )
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
pub(crate) async fn replay(
    modules: &Modules,
    key: &DeadLetterKey,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, letter) = find(modules, key, command).await?;
    on_module!(&module.handle, handle => requeue(handle, key, &modules.scope()).await?);
    if json {
        return json_line(&serde_json::json!({
            "module": module.name,
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "requeued": true,
        }));
    }
    Ok(requeued(&letter, &module.name))
}

/// Puts a dead letter's message back in the outbox (with the messages of
/// its key parked behind it) for the application's bus: a replay that needs
/// no handler code, as `dead-letters replay` and the `effects` commands do
/// it. `scope` says where the tool looked, should the dead letter be gone.
pub(crate) async fn requeue<B: Backend>(
    module: &ModuleHandle<B>,
    key: &DeadLetterKey,
    scope: &str,
) -> Result<(), Failure> {
    module
        .requeue_dead_letter(key.message_id, &key.handler)
        .await
        .map_err(|error| match error {
            tickbox::Error::NoSuchDeadLetter { .. } => not_found(key, scope),
            other => other.into(),
        })
}

/// What `dead-letters replay` says of a dead letter it put back in the
/// outbox of module `module`.
pub(crate) fn requeued(letter: &DeadLetter, module: &str) -> String {
    let mut out = format!(
        "requeued message {} (topic {}, {}, module `{module}`):\n\
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
pub(crate) async fn skip(
    modules: &Modules,
    key: &DeadLetterKey,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, letter) = find(modules, key, command).await?;
    let skipped = on_module!(&module.handle, handle => {
        handle.skip_dead_letter(key.message_id, &key.handler).await?
    });
    if !skipped {
        return Err(not_found(key, &modules.scope()));
    }
    if json {
        return json_line(&serde_json::json!({
            "module": module.name,
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "ordering_key": letter.keyed.as_ref().map(|k| &k.key),
            "skipped": true,
        }));
    }
    Ok(match &letter.keyed {
        Some(keyed) => format!(
            "skipped message {} (topic {}, {}, key {} #{}, module `{}`):\n\
             its dead letter is gone and the handler's place in the key moved past it;\n\
             the key's messages parked behind it are back in the outbox, and the\n\
             application's bus delivers them in the key's order.\n",
            letter.message_id,
            letter.topic,
            handler_label(&letter.handler),
            keyed.key,
            keyed.sequence,
            module.name
        ),
        None => format!(
            "skipped message {} (topic {}, {}, module `{}`): it has no ordering key, so its\n\
             dead letter was simply deleted; it will not be delivered to that handler again.\n",
            letter.message_id,
            letter.topic,
            handler_label(&letter.handler),
            module.name
        ),
    })
}

/// `dead-letters discard`.
pub(crate) async fn discard(
    modules: &Modules,
    key: &DeadLetterKey,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let (module, letter) = find(modules, key, command).await?;
    let discarded = on_module!(&module.handle, handle => {
        handle.discard_dead_letter(key.message_id, &key.handler).await?
    });
    if !discarded {
        return Err(not_found(key, &modules.scope()));
    }
    if json {
        return json_line(&serde_json::json!({
            "module": module.name,
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "discarded": true,
        }));
    }
    Ok(format!(
        "discarded the dead letter of message {} (topic {}, {}, module `{}`);\n\
         it will not be delivered to that handler again.\n",
        letter.message_id,
        letter.topic,
        handler_label(&letter.handler),
        module.name
    ))
}
