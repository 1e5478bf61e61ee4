//! `queues`: the RabbitMQ queues of handlers, as the broker reports them.

use crate::output::{json_line, table, to_json};
use crate::Failure;
use tickbox::Amqp;

/// `queues MODULE/HANDLER…`: the messages waiting in each handler's queue
/// and its consumers.
pub(crate) async fn queues(
    amqp: &Amqp,
    handlers: &[String],
    json: bool,
) -> Result<String, Failure> {
    let mut statuses = Vec::with_capacity(handlers.len());
    for handler in handlers {
        let (module, name) = handler
            .split_once('/')
            .ok_or_else(|| Failure::Failed(format!("`{handler}`: write MODULE/HANDLER")))?;
        statuses.push(amqp.queue_status(module, name).await?);
    }
    if json {
        return json_line(&to_json(&statuses)?);
    }
    let rows = statuses
        .into_iter()
        .map(|s| [s.queue, s.messages.to_string(), s.consumers.to_string()])
        .collect();
    Ok(format!(
        "broker {}\n{}",
        amqp.redacted_url(),
        table(["queue", "messages waiting", "consumers"], rows)
    ))
}
