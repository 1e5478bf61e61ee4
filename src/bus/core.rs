//! The bus's state, shared by its actor, its handle and its dispatchers.

use crate::bus::config::BusConfig;
use crate::bus::id_hash::IdMap;
use crate::bus::lanes::Lanes;
use crate::bus::route::Route;
use crate::bus::transport::Transport;
use crate::store::backend::Backend;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The bus's state, shared by its actor, its handle and its dispatchers.
pub(crate) struct BusCore<B: Backend> {
    /// This bus instance, as written in the claims it takes.
    pub(crate) id: uuid::Uuid,
    /// Topics some module on the bus declares; a message of any other topic
    /// is dead-lettered.
    pub(crate) known_topics: HashSet<String>,
    /// Subscribers of each topic.
    pub(crate) routes: HashMap<String, Arc<[Route<B>]>>,
    /// One per running handler attempt.
    pub(crate) permits: Semaphore,
    pub(crate) config: BusConfig,
    /// Cancelled to stop: every task of the bus stops on it or on a child
    /// token of it (each dispatcher's, each consumer's).
    pub(crate) stop: CancellationToken,
    pub(crate) delivered: AtomicU64,
    pub(crate) duplicates_injected: AtomicU64,
    /// The broker, when the bus runs over one.
    pub(crate) transport: Option<Arc<dyn Transport>>,
    /// Why messages being retried wait, for the watchdog's reports.
    retrying: Mutex<IdMap<String>>,
    /// Keyed messages go along each route one at a time per key.
    pub(crate) lanes: Lanes,
}

impl<B: Backend> BusCore<B> {
    /// A bus's state before it starts.
    pub(crate) fn new(
        id: uuid::Uuid,
        known_topics: HashSet<String>,
        routes: HashMap<String, Vec<Route<B>>>,
        config: BusConfig,
        transport: Option<Arc<dyn Transport>>,
    ) -> Self {
        BusCore {
            id,
            known_topics,
            routes: routes
                .into_iter()
                .map(|(topic, routes)| (topic, Arc::from(routes)))
                .collect(),
            permits: Semaphore::new(config.max_concurrent_deliveries),
            config,
            stop: CancellationToken::new(),
            delivered: AtomicU64::new(0),
            duplicates_injected: AtomicU64::new(0),
            transport,
            retrying: Mutex::new(IdMap::default()),
            lanes: Lanes::default(),
        }
    }

    /// Tells the dispatchers to stop.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Whether the bus is stopping.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Notes why message `id` waits for another attempt.
    pub(crate) fn note_retry(&self, id: uuid::Uuid, note: String) {
        self.retrying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, note);
    }

    /// Forgets the retry note of a message this bus is done with.
    pub(crate) fn forget_retry(&self, id: uuid::Uuid) {
        self.retrying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// What this bus knows of a message it holds in memory.
    pub(crate) fn retry_note(&self, id: uuid::Uuid) -> String {
        self.retrying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .unwrap_or_else(|| "a handler is still running it".to_string())
    }
}
