//! What each effect of each handler did, in atomics and through the
//! `metrics` facade (`tickbox_effects_total`).

use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// What happened to an effect on one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EffectEvent {
    /// It was called (recorded as started first).
    Started,
    /// The call returned a result, now recorded.
    Succeeded,
    /// The call returned an error, now recorded.
    Failed,
    /// It was found unfinished and may not be called again: a person must
    /// settle it.
    Unknown,
    /// Its recorded result was handed back without calling.
    Reused,
}

impl EffectEvent {
    /// Every event, each at its own index (`event as usize`).
    const ALL: [EffectEvent; 5] = [
        EffectEvent::Started,
        EffectEvent::Succeeded,
        EffectEvent::Failed,
        EffectEvent::Unknown,
        EffectEvent::Reused,
    ];

    fn label(self) -> &'static str {
        match self {
            EffectEvent::Started => "started",
            EffectEvent::Succeeded => "succeeded",
            EffectEvent::Failed => "failed",
            EffectEvent::Unknown => "unknown",
            EffectEvent::Reused => "reused",
        }
    }
}

/// The counters of one effect of one handler.
struct EffectCount {
    counts: [AtomicU64; 5],
    exported: [metrics::Counter; 5],
}

/// The effects of one module's handlers, counted as this process saw them.
pub(crate) struct EffectCounters {
    /// The module, a label of every counter.
    module: String,
    /// By handler and effect name, made when an effect is first counted.
    effects: Mutex<HashMap<(String, String), Arc<EffectCount>>>,
}

impl EffectCounters {
    pub(crate) fn new(module: &str) -> Self {
        EffectCounters {
            module: module.to_string(),
            effects: Mutex::new(HashMap::new()),
        }
    }

    /// Counts `event` for `effect` of `handler`.
    pub(crate) fn count(&self, handler: &str, effect: &str, event: EffectEvent) {
        let entry = {
            let mut effects = self.effects.lock().unwrap_or_else(|p| p.into_inner());
            effects
                .entry((handler.to_string(), effect.to_string()))
                .or_insert_with(|| Arc::new(self.register(handler, effect)))
                .clone()
        };
        entry.counts[event as usize].fetch_add(1, Relaxed);
        entry.exported[event as usize].increment(1);
    }

    fn register(&self, handler: &str, effect: &str) -> EffectCount {
        let counter = |event: EffectEvent| {
            metrics::counter!(
                "tickbox_effects_total",
                "module" => self.module.clone(),
                "handler" => handler.to_string(),
                "effect" => effect.to_string(),
                "event" => event.label()
            )
        };
        EffectCount {
            counts: Default::default(),
            exported: EffectEvent::ALL.map(counter),
        }
    }

    /// Every effect counted so far, by handler and name.
    pub(crate) fn snapshot(&self) -> Vec<EffectMetrics> {
        let effects = self.effects.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<EffectMetrics> = effects
            .iter()
            .map(|((handler, effect), count)| {
                let n = |event: EffectEvent| count.counts[event as usize].load(Relaxed);
                EffectMetrics {
                    handler: handler.clone(),
                    effect: effect.clone(),
                    started: n(EffectEvent::Started),
                    succeeded: n(EffectEvent::Succeeded),
                    failed: n(EffectEvent::Failed),
                    unknown: n(EffectEvent::Unknown),
                    reused: n(EffectEvent::Reused),
                }
            })
            .collect();
        all.sort_by(|a, b| (&a.handler, &a.effect).cmp(&(&b.handler, &b.effect)));
        all
    }
}

/// What one effect of one handler did in this process since its module
/// started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectMetrics {
    /// The handler.
    pub handler: String,
    /// The effect's name.
    pub effect: String,
    /// Calls made (each recorded as started first).
    pub started: u64,
    /// Calls that returned a result.
    pub succeeded: u64,
    /// Calls that returned an error.
    pub failed: u64,
    /// Effects that became unknown here: found unfinished and not to be
    /// called again, so a person must settle them (a delivery refused
    /// because its effect was unknown already is not counted again).
    pub unknown: u64,
    /// Deliveries that got a recorded result back instead of calling.
    pub reused: u64,
}
