//! `subscriptions list` and `subscriptions retire`: the handlers, in any
//! process, that an outbox owes its messages to.

use crate::output::{
    json_line, lag, lag_us, now_us, plural, seconds_of, table, timestamp, to_json,
};
use crate::Failure;
use tickbox::{Backend, ModuleHandle, Subscription};

/// `subscriptions [list]`.
pub(crate) async fn list<B: Backend>(
    module: &ModuleHandle<B>,
    json: bool,
) -> Result<String, Failure> {
    let mut subscriptions = module.subscriptions().await?;
    subscriptions.sort_by(|a, b| (&a.module, &a.handler).cmp(&(&b.module, &b.handler)));
    let now = now_us();
    if json {
        let mut all = Vec::with_capacity(subscriptions.len());
        for subscription in &subscriptions {
            let mut value = to_json(subscription)?;
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
        return Ok(
            "no subscriptions recorded in this outbox: no bus with a handler of its topics has run\n"
                .to_string(),
        );
    }
    let rows = subscriptions
        .iter()
        .map(|s| {
            let seen = lag(lag_us(s.seen_at_us, now));
            [
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
            "MODULE",
            "HANDLER",
            "TOPIC",
            "STATE",
            "SUBSCRIBED SINCE (UTC)",
            "OLDEST OWED",
        ],
        rows,
    );
    let alive = subscriptions.iter().filter(|s| s.is_alive(now)).count();
    let stopped = subscriptions.len() - alive;
    out.push_str(&format!(
        "\n{}: {alive} alive, {stopped} stopped\n",
        plural(subscriptions.len() as i64, "subscription")
    ));
    if subscriptions
        .iter()
        .any(|s| !s.is_alive(now) && s.oldest_pending_us.is_some())
    {
        out.push_str(
            "A stopped subscription keeps the messages it owes until a process serving it runs\n\
             again. Retire one whose handler is gone for good:\n  \
             tickbox subscriptions retire MODULE HANDLER --yes\n",
        );
    }
    Ok(out)
}

/// `subscriptions retire MODULE HANDLER --yes`.
pub(crate) async fn retire<B: Backend>(
    module: &ModuleHandle<B>,
    subscriber: &str,
    handler: &str,
    json: bool,
) -> Result<String, Failure> {
    let no_such = || {
        Failure::Failed(format!(
            "{} (`tickbox subscriptions` lists them)",
            tickbox::Error::NoSuchSubscription {
                outbox: module.name().to_string(),
                module: subscriber.to_string(),
                handler: handler.to_string(),
            }
        ))
    };
    let subscription: Subscription = module
        .subscriptions()
        .await?
        .into_iter()
        .find(|s| s.module == subscriber && s.handler == handler)
        .ok_or_else(no_such)?;
    let finished = module
        .retire_subscription(subscriber, handler)
        .await
        .map_err(|error| match error {
            tickbox::Error::NoSuchSubscription { .. } => no_such(),
            other => other.into(),
        })?;
    let topic_left = module
        .subscriptions()
        .await?
        .iter()
        .filter(|s| s.topic == subscription.topic)
        .count();
    if json {
        return json_line(&serde_json::json!({
            "module": subscription.module,
            "handler": subscription.handler,
            "topic": subscription.topic,
            "retired": true,
            "finished": finished,
            "topic_subscriptions_left": topic_left,
        }));
    }
    let mut out = format!(
        "retired the subscription of handler `{}` of module `{}` (topic {}):\n\
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
