//! `sweep`: the retention sweep, run once, as the application's bus runs it
//! every minute: the inbox, the outbox and the effects journal.

use crate::output::{json_line, plural, to_json, window};
use crate::Failure;
use std::time::Duration;
use tickbox::{Backend, ModuleHandle, Retention};

/// `sweep`, with the `retention` the module was attached with.
pub(crate) async fn sweep<B: Backend>(
    module: &ModuleHandle<B>,
    retention: &Retention,
    json: bool,
) -> Result<String, Failure> {
    let report = module.sweep_retention().await?;
    if json {
        let mut value = to_json(&report)?;
        if let Some(object) = value.as_object_mut() {
            let seconds = |window: Option<Duration>| window.map(|w| w.as_secs());
            object.insert(
                "inbox_retention_seconds".into(),
                seconds(retention.inbox).into(),
            );
            object.insert(
                "outbox_retention_seconds".into(),
                seconds(retention.outbox).into(),
            );
        }
        return json_line(&value);
    }
    let inbox = match retention.inbox {
        Some(kept) => format!(
            "deleted {} processed more than {} ago",
            plural(report.inbox_rows as i64, "row"),
            window(kept)
        ),
        None => "kept every row (retention: never)".to_string(),
    };
    let effects = match retention.inbox {
        Some(kept) => format!(
            "deleted {} settled more than {} ago",
            plural(report.effect_rows as i64, "row"),
            window(kept)
        ),
        None => "kept every row (retention: never)".to_string(),
    };
    let outbox = match retention.outbox {
        Some(kept) => format!(
            "deleted {} delivered more than {} ago",
            plural(report.outbox_rows as i64, "row"),
            window(kept)
        ),
        None => "kept every row (retention: never)".to_string(),
    };
    Ok(format!(
        "inbox   {inbox}\noutbox  {outbox}\neffects {effects}\n\
         (undelivered outbox rows, dead letters, unsettled effects and the effects of\n\
         dead-lettered messages are never swept)\n"
    ))
}
