//! One dispatcher per module outbox: takes committed messages (announced on
//! commit, or found by scanning the table), delivers each to every
//! subscriber, and marks it delivered once all of them have it.

use crate::backend::Backend;
use crate::bus::{BusCore, Route};
use crate::message::{now_us, Envelope};
use crate::module::ModuleHandle;
use futures_util::future::join_all;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, Instant};
use uuid::Uuid;

/// Delivers the outbox of one module.
pub(crate) struct Dispatcher<B: Backend> {
    bus: Arc<BusCore<B>>,
    /// The module whose outbox this is.
    source: ModuleHandle<B>,
    /// Messages announced by the module as they commit.
    announcements: mpsc::Receiver<Arc<Envelope>>,
}

/// How the delivery of one message ended.
enum Finished {
    /// Every subscriber has it: mark it delivered.
    Delivered(Uuid),
    /// Given up because the bus is stopping: it stays pending.
    Abandoned(Uuid),
}

/// Ids of messages marked delivered lately, so that a late announcement or a
/// scan that raced with the mark does not start them again.
struct RecentIds {
    order: VecDeque<Uuid>,
    set: HashSet<Uuid>,
    capacity: usize,
}

impl RecentIds {
    fn new(capacity: usize) -> Self {
        RecentIds {
            order: VecDeque::with_capacity(capacity),
            set: HashSet::with_capacity(capacity),
            capacity,
        }
    }

    fn insert(&mut self, id: Uuid) {
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(id);
        self.set.insert(id);
    }

    fn contains(&self, id: &Uuid) -> bool {
        self.set.contains(id)
    }
}

/// The dispatcher's bookkeeping, owned by its one task (no locks).
struct State<B: Backend> {
    bus: Arc<BusCore<B>>,
    source: ModuleHandle<B>,
    /// Started and not yet marked delivered.
    in_flight: HashSet<Uuid>,
    recent: RecentIds,
    /// Delivered to every subscriber, waiting for the mark.
    to_mark: Vec<Uuid>,
    /// While a scan of the outbox is under way: the last id it read.
    scan: Option<Option<Uuid>>,
    finished: mpsc::UnboundedSender<Finished>,
}

impl<B: Backend> Dispatcher<B> {
    pub(crate) fn new(
        bus: Arc<BusCore<B>>,
        source: ModuleHandle<B>,
        announcements: mpsc::Receiver<Arc<Envelope>>,
    ) -> Self {
        Dispatcher {
            bus,
            source,
            announcements,
        }
    }

    pub(crate) async fn run(self) {
        let Dispatcher {
            bus,
            source,
            mut announcements,
        } = self;
        let (finished, mut finished_rx) = mpsc::unbounded_channel();
        let capacity = bus.config.max_messages_in_memory;
        let mut state = State {
            bus: bus.clone(),
            source: source.clone(),
            in_flight: HashSet::new(),
            recent: RecentIds::new(2 * capacity + announcements.max_capacity()),
            to_mark: Vec::new(),
            scan: Some(None),
            finished,
        };
        let mut stopped = bus.stopped.clone();
        let mut next_scan = Instant::now() + bus.config.sweep_interval;
        tracing::debug!(module = %source.name(), "dispatcher started");

        while !bus.is_stopping() {
            state.mark().await;
            state.scan_page().await;
            let room = state.in_flight.len() < capacity;
            tokio::select! {
                biased;
                _ = stopped.changed() => {}
                Some(done) = finished_rx.recv() => {
                    state.finish(done);
                    while let Ok(done) = finished_rx.try_recv() {
                        state.finish(done);
                    }
                }
                Some(envelope) = announcements.recv(), if room => {
                    state.start(envelope);
                    while state.in_flight.len() < capacity {
                        match announcements.try_recv() {
                            Ok(envelope) => state.start(envelope),
                            Err(_) => break,
                        }
                    }
                }
                _ = source.core.wake.notified() => {
                    if source.core.overflowed.swap(false, Relaxed) {
                        state.scan.get_or_insert(None);
                    }
                }
                _ = sleep_until(next_scan) => {
                    next_scan = Instant::now() + bus.config.sweep_interval;
                    state.scan.get_or_insert(None);
                }
            }
        }

        // Stopping: let running deliveries finish, within the timeout.
        let deadline = Instant::now() + bus.config.stop_timeout;
        while !state.in_flight.is_empty() && state.to_mark.len() < state.in_flight.len() {
            tokio::select! {
                Some(done) = finished_rx.recv() => state.finish(done),
                _ = sleep_until(deadline) => {
                    tracing::warn!(module = %source.name(), running = state.in_flight.len(), "stop timeout: deliveries still running stay pending");
                    break;
                }
            }
        }
        state.mark().await;
        tracing::debug!(module = %source.name(), "dispatcher stopped");
    }
}

impl<B: Backend> State<B> {
    /// Starts delivering a message unless it is already in flight or done.
    fn start(&mut self, envelope: Arc<Envelope>) {
        if self.in_flight.contains(&envelope.id) || self.recent.contains(&envelope.id) {
            return;
        }
        self.in_flight.insert(envelope.id);
        actix::spawn(deliver_message(
            self.bus.clone(),
            envelope,
            self.finished.clone(),
        ));
    }

    fn finish(&mut self, done: Finished) {
        match done {
            Finished::Delivered(id) => self.to_mark.push(id),
            Finished::Abandoned(id) => {
                self.in_flight.remove(&id);
            }
        }
    }

    /// Marks delivered messages in one statement. On failure they stay in
    /// flight (so nothing starts them again) and the mark is tried again on
    /// the next turn.
    async fn mark(&mut self) {
        if self.to_mark.is_empty() {
            return;
        }
        let ids = self.to_mark.clone();
        let marked = match B::checkout(&self.source.core.pool).await {
            Ok(mut conn) => B::mark_delivered(&mut conn, ids, now_us())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match marked {
            Ok(_) => {
                self.bus
                    .delivered
                    .fetch_add(self.to_mark.len() as u64, Relaxed);
                for id in self.to_mark.drain(..) {
                    self.in_flight.remove(&id);
                    self.recent.insert(id);
                }
            }
            Err(error) => {
                tracing::warn!(module = %self.source.name(), %error, "marking messages delivered failed; will retry");
            }
        }
    }

    /// Reads the next page of the outbox scan, if one is under way and there
    /// is room in memory, and starts what it finds.
    async fn scan_page(&mut self) {
        let Some(after) = self.scan else { return };
        let capacity = self.bus.config.max_messages_in_memory;
        if self.in_flight.len() >= capacity {
            return;
        }
        let limit = self.bus.config.sweep_page;
        let rows = match B::checkout(&self.source.core.pool).await {
            Ok(mut conn) => B::pending(&mut conn, after, limit)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match rows {
            Ok(rows) => {
                let complete = (rows.len() as i64) < limit;
                self.scan = Some(rows.last().map(|r| r.id.0).or(after));
                for row in rows {
                    self.start(Arc::new(row.into()));
                }
                if complete {
                    self.scan = None;
                }
            }
            Err(error) => {
                tracing::warn!(module = %self.source.name(), %error, "scanning the outbox failed; will retry");
                self.scan = None;
            }
        }
    }
}

/// Delivers one message to every subscriber and reports how it ended.
async fn deliver_message<B: Backend>(
    bus: Arc<BusCore<B>>,
    envelope: Arc<Envelope>,
    finished: mpsc::UnboundedSender<Finished>,
) {
    let id = envelope.id;
    let done = match bus.routes.get(&envelope.topic).cloned() {
        Some(routes) => deliver_to_all(&bus, &routes, &envelope).await,
        None => {
            tracing::debug!(message_id = %id, topic = %envelope.topic, "no subscribers");
            true
        }
    };
    let _ = finished.send(if done {
        Finished::Delivered(id)
    } else {
        Finished::Abandoned(id)
    });
}

/// Delivers to each route until every one has handled the message or found
/// it a duplicate, retrying failures with backoff. False if the bus stopped
/// first.
async fn deliver_to_all<B: Backend>(
    bus: &BusCore<B>,
    routes: &[Route<B>],
    envelope: &Arc<Envelope>,
) -> bool {
    let mut stopped = bus.stopped.clone();
    // (route index, attempt number) of the deliveries still to succeed.
    let mut waiting: Vec<(usize, u32)> = (0..routes.len()).map(|r| (r, 1)).collect();
    loop {
        let slots = waiting.len().min(bus.config.max_concurrent_deliveries) as u32;
        let permit = tokio::select! {
            permit = bus.permits.acquire_many(slots) => permit.expect("the semaphore is never closed"),
            _ = stopped.wait_for(|s| *s) => return false,
        };
        let outcomes = join_all(waiting.iter().map(|&(r, attempt)| {
            routes[r]
                .module
                .deliver(envelope.clone(), routes[r].handler, attempt)
        }))
        .await;
        drop(permit);
        waiting = waiting
            .into_iter()
            .zip(outcomes)
            .filter_map(|((r, attempt), outcome)| outcome.err().map(|_| (r, attempt + 1)))
            .collect();
        let Some(&(_, next_attempt)) = waiting.iter().min_by_key(|(_, a)| *a) else {
            break;
        };
        if bus.is_stopping() {
            return false;
        }
        let delay = bus.config.retry.delay(next_attempt - 1);
        tokio::select! {
            _ = sleep(delay) => {}
            _ = stopped.wait_for(|s| *s) => return false,
        }
    }
    if bus.config.duplicate_rate > 0.0 && fastrand::f64() < bus.config.duplicate_rate {
        bus.duplicates_injected.fetch_add(1, Relaxed);
        join_all(
            routes
                .iter()
                .map(|route| route.module.deliver(envelope.clone(), route.handler, 1)),
        )
        .await;
    }
    true
}
