//! What a session saw, to assert on.

use crate::message::{Envelope, Message};
use crate::tracking::{Event, Happened};
use std::fmt;
use std::sync::Arc;

/// Everything a [`Session`](crate::testing::Session) saw happen to the
/// messages of its flow, in the order it happened.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The events, in order.
    pub events: Vec<Event>,
}

impl Report {
    /// The messages of type `M` the flow published, decoded, in commit
    /// order.
    #[track_caller]
    pub fn published<M: Message>(&self) -> Vec<M> {
        let mut published = Vec::new();
        // A loop, not an iterator: a closure would hide the caller's line
        // from a payload that does not decode.
        for e in &self.events {
            if e.happened == Happened::Published && e.envelope.topic == M::TOPIC {
                published.push(decode::<M>(&e.envelope));
            }
        }
        published
    }

    /// The one message of type `M` the flow published for which `matches`
    /// holds; panics, listing what was published, unless there is exactly
    /// one ("exactly one `OrderConfirmed` with order id 7").
    #[track_caller]
    pub fn published_one<M: Message + fmt::Debug>(&self, matches: impl Fn(&M) -> bool) -> M {
        let mut found: Vec<M> = self
            .published::<M>()
            .into_iter()
            .filter(|m| matches(m))
            .collect();
        if found.len() != 1 {
            panic!(
                "expected exactly one `{}` that matches, found {}: {found:?}\n{self}",
                M::TOPIC,
                found.len()
            );
        }
        found.remove(0)
    }

    /// The envelopes of every message the flow published, in commit order.
    pub fn envelopes(&self) -> Vec<Arc<Envelope>> {
        self.of(None, |h| *h == Happened::Published)
    }

    /// The messages `handler` handled (its transaction committed), in
    /// order.
    pub fn handled(&self, handler: &str) -> Vec<Arc<Envelope>> {
        self.of(Some(handler), |h| *h == Happened::Handled)
    }

    /// The messages `handler` skipped as duplicates.
    pub fn duplicates(&self, handler: &str) -> Vec<Arc<Envelope>> {
        self.of(Some(handler), |h| *h == Happened::Duplicate)
    }

    /// The failed attempts of `handler`: each message and its error.
    pub fn failures(&self, handler: &str) -> Vec<(Arc<Envelope>, String)> {
        self.events
            .iter()
            .filter(|e| e.handler.as_deref() == Some(handler))
            .filter_map(|e| match &e.happened {
                Happened::Failed { error, .. } => Some((e.envelope.clone(), error.clone())),
                _ => None,
            })
            .collect()
    }

    /// The messages given up on for `handler`, each with its reason.
    pub fn dead_letters(&self, handler: &str) -> Vec<(Arc<Envelope>, String)> {
        self.events
            .iter()
            .filter(|e| e.handler.as_deref() == Some(handler))
            .filter_map(|e| match &e.happened {
                Happened::DeadLettered { reason } => Some((e.envelope.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every failed attempt and dead letter of the flow.
    pub fn all_failures(&self) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| {
                matches!(
                    e.happened,
                    Happened::Failed { .. } | Happened::DeadLettered { .. }
                )
            })
            .collect()
    }

    /// The envelopes of the events of `handler` (any, when `None`) that
    /// `happened` picks.
    fn of(
        &self,
        handler: Option<&str>,
        happened: impl Fn(&Happened) -> bool,
    ) -> Vec<Arc<Envelope>> {
        self.events
            .iter()
            .filter(|e| handler.is_none_or(|h| e.handler.as_deref() == Some(h)))
            .filter(|e| happened(&e.happened))
            .map(|e| e.envelope.clone())
            .collect()
    }
}

/// Decodes a payload the flow published (it was encoded from an `M`).
#[track_caller]
fn decode<M: Message>(envelope: &Envelope) -> M {
    match serde_json::from_str(&envelope.payload) {
        Ok(message) => message,
        Err(e) => panic!(
            "message {} of topic `{}` does not decode: {e}",
            envelope.id, envelope.topic
        ),
    }
}

impl fmt::Display for Report {
    /// One line per event, for failure messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "what the session saw:")?;
        for e in &self.events {
            let who = match &e.handler {
                Some(handler) => format!("{}/{handler}", e.module),
                None => e.module.clone(),
            };
            let what = match &e.happened {
                Happened::Published => "published".to_string(),
                Happened::Handled => format!("handled (attempt {})", e.attempt),
                Happened::Duplicate => format!("skipped as a duplicate (attempt {})", e.attempt),
                Happened::Failed { error, .. } => {
                    format!("failed (attempt {}): {error}", e.attempt)
                }
                Happened::DeadLettered { reason } => format!("dead-lettered: {reason}"),
            };
            writeln!(
                f,
                "  {} {} {who}: {what} {}",
                e.envelope.topic, e.envelope.id, e.envelope.payload
            )?;
        }
        Ok(())
    }
}
