//! `effects list`, `done` and `retry`: the external calls handlers made
//! through the module's effects journal, and settling one nobody can vouch
//! for — after which the message's dead letter goes back in the outbox, as
//! `dead-letters replay` puts it there.

use crate::dead_letters::{requeue, requeued};
use crate::modules::{on_module, Attached, Modules};
use crate::output::{json_line, one_line, plural, table, timestamp, to_json, with_module};
use crate::{Command, DeadLetterKey, EffectKey, Failure};
use tickbox::{Backend, EffectRecord, EffectState, ModuleHandle, Settlement};

/// Characters of an effect's error shown in `effects list`.
const ERROR_WIDTH: usize = 60;

/// `effects list`: the effects of every module seen, least recently
/// changed first, a page of them.
pub(crate) async fn list(
    modules: &Modules,
    states: &[EffectState],
    offset: u64,
    limit: u64,
    json: bool,
) -> Result<String, Failure> {
    // The page of all modules together is within the first offset + limit
    // of each.
    let wanted = offset.saturating_add(limit);
    let mut effects: Vec<(&str, EffectRecord)> = Vec::new();
    for module in &modules.all {
        let found = on_module!(&module.handle, handle => handle.effects(states, 0, wanted).await?);
        effects.extend(
            found
                .into_iter()
                .map(|effect| (module.name.as_str(), effect)),
        );
    }
    effects.sort_by(|(_, a), (_, b)| {
        (a.updated_at_us, a.message_id, &a.handler, &a.effect).cmp(&(
            b.updated_at_us,
            b.message_id,
            &b.handler,
            &b.effect,
        ))
    });
    let effects: Vec<(&str, EffectRecord)> = effects
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect();
    if json {
        let mut all = Vec::with_capacity(effects.len());
        for (module, effect) in &effects {
            all.push(with_module(to_json(effect)?, "module", module));
        }
        return json_line(&serde_json::Value::Array(all));
    }
    let which = if states.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = states.iter().map(EffectState::as_str).collect();
        format!(" in state {}", names.join(" or "))
    };
    if effects.is_empty() {
        return Ok(if offset == 0 {
            format!("no effects{which}\n")
        } else {
            format!("no effects{which} from offset {offset} (try a smaller --offset)\n")
        });
    }
    let rows = effects
        .iter()
        .map(|(module, effect)| {
            [
                module.to_string(),
                effect.message_id.to_string(),
                effect.handler.clone(),
                effect.effect.clone(),
                effect.state.to_string(),
                effect.policy.clone(),
                effect.calls.to_string(),
                effect.key.clone(),
                timestamp(effect.updated_at_us, false),
                effect
                    .error
                    .as_deref()
                    .map_or_else(|| "-".to_string(), |error| one_line(error, ERROR_WIDTH)),
            ]
        })
        .collect();
    let mut out = table(
        [
            "MODULE",
            "MESSAGE ID",
            "HANDLER",
            "EFFECT",
            "STATE",
            "POLICY",
            "CALLS",
            "KEY",
            "UPDATED (UTC)",
            "ERROR",
        ],
        rows,
    );
    out.push('\n');
    let shown = effects.len() as u64;
    if offset == 0 && shown < limit {
        out.push_str(&format!("{}{which}\n", plural(shown as i64, "effect")));
    } else {
        out.push_str(&format!("effects{which} {}-{}", offset + 1, offset + shown));
        if shown == limit {
            out.push_str(&format!(
                "; next page: --offset {} --limit {limit}",
                offset + shown
            ));
        }
        out.push('\n');
    }
    if effects.iter().any(|(_, e)| e.state == EffectState::Unknown) {
        out.push_str(
            "An unknown effect waits for a person: check the external system (with its key), \
             then\n`tickbox effects done MESSAGE_ID HANDLER EFFECT --yes` if it happened, or\n\
             `tickbox effects retry MESSAGE_ID HANDLER EFFECT --yes` to call it once more.\n",
        );
    }
    Ok(out)
}

/// The module whose effects journal holds the effects of the handler of
/// `key`: the only module seen, or the only one that runs that handler.
async fn journal_of<'a>(
    modules: &'a Modules,
    key: &EffectKey,
    command: &Command,
) -> Result<&'a Attached, Failure> {
    if let [only] = modules.all.as_slice() {
        return Ok(only);
    }
    let mut holders = Vec::new();
    for module in &modules.all {
        if on_module!(&module.handle, handle => handle.runs_handler(&key.handler).await?) {
            holders.push((module, ()));
        }
    }
    let what = format!("handler `{}` runs", key.handler);
    let absent = || {
        Failure::Failed(format!(
            "no effect `{}` of handler `{}` for message {}: none of modules {} runs handler \
             `{}` (`tickbox effects list` shows the effects)",
            key.effect,
            key.handler,
            key.message_id,
            modules.names(),
            key.handler
        ))
    };
    Modules::choose(holders, &what, absent, command).map(|(module, ())| module)
}

/// `effects done` and `effects retry`: settles the effect in its module's
/// journal, then puts the message's dead letter for its handler, if there
/// is one, back in that module's outbox.
pub(crate) async fn settle(
    modules: &Modules,
    key: &EffectKey,
    settlement: Settlement,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let module = journal_of(modules, key, command).await?;
    on_module!(&module.handle, handle => {
        settle_in(handle, &module.name, key, settlement, json).await
    })
}

/// [`settle`] in the journal of module `name`.
async fn settle_in<B: Backend>(
    module: &ModuleHandle<B>,
    name: &str,
    key: &EffectKey,
    settlement: Settlement,
    json: bool,
) -> Result<String, Failure> {
    let settlement_name = match settlement {
        Settlement::Done { .. } => "done",
        Settlement::Retry => "retry",
    };
    let settled = module
        .settle_effect(key.message_id, &key.handler, &key.effect, settlement)
        .await?;
    let letter_key = DeadLetterKey {
        message_id: key.message_id,
        handler: key.handler.clone(),
    };
    let replay_failed = |failure: Failure| {
        let why = match failure {
            Failure::Failed(why) => why,
            Failure::Usage(error) => error.to_string(),
        };
        Failure::Failed(format!(
            "effect `{}` of handler `{}` for message {} is settled as {settlement_name} (now {}), \
             but its dead letter could not be put back in the outbox of module `{name}`: {why}; \
             replay it with `tickbox dead-letters replay {} {}`",
            key.effect, key.handler, key.message_id, settled.state, key.message_id, key.handler
        ))
    };
    let letter = module
        .dead_letter(key.message_id, &key.handler)
        .await
        .map_err(|error| replay_failed(error.into()))?;
    if letter.is_some() {
        let scope = format!("the database of module `{name}`");
        requeue(module, &letter_key, &scope)
            .await
            .map_err(replay_failed)?;
    }
    if json {
        return json_line(&serde_json::json!({
            "module": name,
            "settlement": settlement_name,
            "effect": to_json(&settled)?,
            "requeued": letter.is_some(),
            "topic": letter.as_ref().map(|letter| &letter.topic),
        }));
    }
    let mut out = settled_text(&settled, name);
    out.push('\n');
    match &letter {
        Some(letter) => out.push_str(&requeued(letter, name)),
        None => out.push_str(&format!(
            "message {} has no dead letter for handler `{}`, so nothing was requeued:\n\
             the settlement holds for the next delivery of the message to that handler,\n\
             if one comes (its bus may still be retrying it; a dead letter already replayed\n\
             or discarded is not delivered again).\n",
            key.message_id, key.handler
        )),
    }
    Ok(out)
}

/// What a settled effect of module `module` now is, and what the next
/// delivery does with it.
fn settled_text(effect: &EffectRecord, module: &str) -> String {
    let head = format!(
        "settled effect `{}` of handler `{}` for message {}",
        effect.effect, effect.handler, effect.message_id
    );
    match effect.state {
        EffectState::Succeeded => format!(
            "{head} as done, in module `{module}`:\nit is now succeeded, with result {}; the next delivery gets that \
             result back\nwithout calling it.\n",
            effect.result.as_deref().unwrap_or("null")
        ),
        state => format!(
            "{head} as retry, in module `{module}`:\nit is now {state}; the next delivery calls it once more (call \
             {}), with the same key\n{}, and its key's window starts again.\n",
            effect.calls + 1,
            effect.key
        ),
    }
}
