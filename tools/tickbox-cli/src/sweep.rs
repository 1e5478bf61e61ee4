//! `sweep`: the retention sweep, run once in every module seen, as the
//! application's bus runs it every minute: the inbox, the outbox and the
//! effects journal.

use crate::modules::{on_module, Modules};
use crate::output::{json_per_module, plural, to_json, window};
use crate::Failure;
use std::time::Duration;
use tickbox::{Retention, SweepReport};

/// `sweep`, with the `retention` the modules were attached with: one block
/// of text per module, or with `--json` one object per module (one object
/// alone when the command line names one module).
pub(crate) async fn sweep(
    modules: &Modules,
    retention: &Retention,
    json: bool,
) -> Result<String, Failure> {
    let mut reports = Vec::with_capacity(modules.all.len());
    for module in &modules.all {
        let report = on_module!(&module.handle, handle => handle.sweep_retention().await?);
        reports.push((module.name.as_str(), report));
    }
    if json {
        let seconds = |window: Option<Duration>| window.map(|w| w.as_secs());
        let mut objects = Vec::with_capacity(reports.len());
        for (module, report) in &reports {
            let mut value = to_json(report)?;
            if let Some(object) = value.as_object_mut() {
                object.insert("module".into(), (*module).into());
                object.insert(
                    "inbox_retention_seconds".into(),
                    seconds(retention.inbox).into(),
                );
                object.insert(
                    "outbox_retention_seconds".into(),
                    seconds(retention.outbox).into(),
                );
            }
            objects.push(value);
        }
        return json_per_module(objects, modules.single);
    }
    let blocks: Vec<String> = reports
        .iter()
        .map(|(module, report)| text(module, report, retention))
        .collect();
    Ok(blocks.join("\n"))
}

/// What one module's sweep deleted, as text.
fn text(module: &str, report: &SweepReport, retention: &Retention) -> String {
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
    format!(
        "module  {module}\ninbox   {inbox}\noutbox  {outbox}\neffects {effects}\n\
         (undelivered outbox rows, dead letters, unsettled effects and the effects of\n\
         dead-lettered messages are never swept)\n"
    )
}
