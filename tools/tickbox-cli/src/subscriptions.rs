//! `subscriptions list` and `subscriptions retire`: the handlers, in any
//! process, that the outboxes of the modules seen owe their messages to.

use crate::modules::{on_module, Modules};
use crate::output::{
    json_line, lag, lag_us, now_us, plural, seconds_of, table, timestamp, to_json, with_module,
};
use crate::{Command, Failure};
use tickbox::Subscription;

/// `subscriptions [list]`: the subscriptions recorded in every outbox seen.
pub(crate) async fn list(modules: &Modules, json: bool) -> Result<String, Failure> {
    let mut subscriptions: Vec<(&str, Subscription)> = Vec::new();
    for module in &modules.all {
        let mut recorded = on_module!(&module.handle, handle => handle.subscriptions().await?);
        recorded.sort_by(|a, b| (&a.module, &a.handler).cmp(&(&b.module, &b.handler)));
        subscriptions.extend(recorded.into_iter().map(|s| (module.name.as_str(), s)));
    }
    let now = now_us();
    if json {
        let mut all = Vec::with_capacity(subscriptions.len());
        for (outbox, subscription) in &subscriptions {
            let mut value = with_module(to_json(subscription)?, "outbox", outbox);
            if let Some(object) = value.as_object_mut() {
                object.insert("alive".into(), subscription.is_alive(now).into());
                object.insert(
                    "lag_seconds".into(),
                    subscription
                        .oldest_pending_us
                        .map(|oldest| seconds_of(lag_us(oldest, now)))
                        .into(),
                );
            }
            all.push(value);
        }
        return json_line(&serde_json::Value::Array(all));
    }
    if subscriptions.is_empty() {
        return Ok(format!(
            "no subscriptions recorded in the outbox of {}: no bus with a handler of its topics \
             has run\n",
            match modules.all.as_slice() {
                [one] => format!("module `{}`", one.name),
                _ => format!("modules {}", modules.names()),
            }
        ));
    }
    let rows = subscriptions
        .iter()
        .map(|(outbox, s)| {
            let seen = lag(lag_us(s.seen_at_us, now));
            [
                outbox.to_string(),
                s.module.clone(),
                s.handler.clone(),
                s.topic.clone(),
                if s.is_alive(now) {
                    format!("alive, seen {seen} ago")
                } else {
                    format!("stopped, last seen {seen} ago")
                },
                timestamp(s.subscribed_at_us, false),
                s.oldest_pending_us.map_or_else(
                    || "-".to_string(),
                    |oldest| format!("{} ago", lag(lag_us(oldest, now))),
                ),
            ]
        })
        .collect();
    let mut out = table(
        [
            "OUTBOX",
            "MODULE",
            "HANDLER",
            "TOPIC",
            "STATE",
            "SUBSCRIBED SINCE (UTC)",
            "OLDEST OWED",
        ],
        rows,
    );
    let alive = subscriptions
        .iter()
        .filter(|(_, s)| s.is_alive(now))
        .count();
    let stopped = subscriptions.len() - alive;
    out.push_str(&format!(
        "\n{}: {alive} alive, {stopped} stopped\n",
        plural(subscriptions.len() as i64, "subscription")
    ));
    if subscriptions
        .iter()
        .any(|(_, s)| !s.is_alive(now) && s.oldest_pending_us.is_some())
    {
        out.push_str(
            "A stopped subscription keeps the messages it owes until a process serving it runs\n\
             again. Retire one whose handler is gone for good:\n  \
             tickbox subscriptions retire MODULE HANDLER --yes\n",
        );
    }
    Ok(out)
}

/// `subscriptions retire MODULE HANDLER --yes`, in the outbox that records
/// that subscription.
pub(crate) async fn retire(
    modules: &Modules,
    subscriber: &str,
    handler: &str,
    json: bool,
    command: &Command,
) -> Result<String, Failure> {
    let mut holders = Vec::new();
    for module in &modules.all {
        let recorded = on_module!(&module.handle, handle => handle.subscriptions().await?);
        let found = recorded
            .into_iter()
            .find(|s| s.module == subscriber && s.handler == handler);
        holders.extend(found.map(|subscription| (module, subscription)));
    }
    let no_such = |outbox: &str| {
        Failure::Failed(format!(
            "{} (`tickbox subscriptions` lists them)",
            tickbox::Error::NoSuchSubscription {
                outbox: outbox.to_string(),
                module: subscriber.to_string(),
                handler: handler.to_string(),
            }
        ))
    };
    let what = format!("handler `{handler}` of module `{subscriber}` subscribes to the outboxes");
    let absent = || match modules.all.as_slice() {
        [one] => no_such(&one.name),
        _ => Failure::Failed(format!(
            "no outbox among modules {} records a subscription of handler `{handler}` of \
             module `{subscriber}` (`tickbox subscriptions` lists them)",
            modules.names()
        )),
    };
    let (module, subscription) = Modules::choose(holders, &what, absent, command)?;
    let outbox = module.name.as_str();
    let (finished, topic_left) = on_module!(&module.handle, handle => {
        let finished = handle
            .retire_subscription(subscriber, handler)
            .await
            .map_err(|error| match error {
                tickbox::Error::NoSuchSubscription { .. } => no_such(outbox),
                other => other.into(),
            })?;
        let topic_left = handle
            .subscriptions()
            .await?
            .iter()
            .filter(|s| s.topic == subscription.topic)
            .count();
        (finished, topic_left)
    });
    if json {
        return json_line(&serde_json::json!({
            "outbox": outbox,
            "module": subscription.module,
            "handler": subscription.handler,
            "topic": subscription.topic,
            "retired": true,
            "finished": finished,
            "topic_subscriptions_left": topic_left,
        }));
    }
    let mut out = format!(
        "retired the subscription of handler `{}` of module `{}` (topic {}) from the outbox of \
         module `{outbox}`:\n\
         {} that only it still owed {} marked delivered; it will never receive them.\n",
        subscription.handler,
        subscription.module,
        subscription.topic,
        plural(finished as i64, "message"),
        if finished == 1 { "was" } else { "were" },
    );
    if topic_left == 0 {
        out.push_str(&format!(
            "No subscription of topic {} is left.\n",
            subscription.topic
        ));
    } else {
        out.push_str("Messages that other subscriptions still owe stay pending for them.\n");
    }
    out.push_str("A process started later with this handler subscribes it again.\n");
    Ok(out)
}
