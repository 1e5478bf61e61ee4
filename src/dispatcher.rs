//! One dispatcher per module outbox: takes committed messages (announced on
//! commit, or claimed from the table by a scan), delivers each to every
//! subscriber, and marks it delivered once each of them has handled it,
//! found it a duplicate, or given up on it as a dead letter.

use crate::backend::{Backend, Claim};
use crate::bus::{BusCore, Route};
use crate::message::{now_us, Envelope};
use crate::module::ModuleHandle;
use futures_util::future::join_all;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, sleep_until, Instant};
use uuid::Uuid;

/// Messages marked delivered in one statement at most.
const MARK_BATCH: usize = 512;

/// How long a finished message may wait for its mark, so that marks go out
/// in batches: one write per batch instead of one per message. Nothing waits
/// on the mark but the outbox's pending count.
const MARK_LINGER: Duration = Duration::from_millis(10);

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
    /// Every subscriber is done with it: mark it delivered.
    Delivered(Uuid),
    /// Given up because the bus is stopping: it stays pending.
    Abandoned(Uuid),
}

/// Ids of messages marked delivered lately, so that a late announcement (of
/// a message a scan claimed and delivered first) does not start them again.
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
    /// Done with by every subscriber, waiting for the mark.
    to_mark: Vec<Uuid>,
    /// When the waiting marks are due.
    mark_due: Option<Instant>,
    /// Given up on while stopping: their claims are released.
    abandoned: Vec<Uuid>,
    /// A scan of the outbox is under way.
    scanning: bool,
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
            recent: RecentIds::new(capacity + announcements.max_capacity()),
            to_mark: Vec::new(),
            mark_due: None,
            abandoned: Vec::new(),
            scanning: true,
            finished,
        };
        let retention = actix::spawn(sweep_retention_periodically(bus.clone(), source.clone()));
        let mut stopped = bus.stopped.clone();
        let renew_every = bus.config.claim_lease / 3;
        let mut next_scan = Instant::now() + bus.config.sweep_interval;
        let mut next_renewal = Instant::now() + renew_every;
        tracing::debug!(module = %source.name(), bus = %bus.id, "dispatcher started");

        while !bus.is_stopping() {
            let now = Instant::now();
            if state.to_mark.len() >= MARK_BATCH || state.mark_due.is_some_and(|due| due <= now) {
                state.mark().await;
            }
            if state.scanning {
                state.scan_page().await;
            }
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
                    state.start_announced(envelope);
                    while state.in_flight.len() < capacity {
                        match announcements.try_recv() {
                            Ok(envelope) => state.start_announced(envelope),
                            Err(_) => break,
                        }
                    }
                }
                _ = source.core.wake.notified() => {
                    if source.core.overflowed.swap(false, Relaxed) {
                        state.scanning = true;
                    }
                }
                _ = sleep_until(next_renewal) => {
                    next_renewal = Instant::now() + renew_every;
                    state.renew_claims().await;
                }
                _ = sleep_until(next_scan) => {
                    next_scan = Instant::now() + bus.config.sweep_interval;
                    state.scanning = true;
                }
                _ = sleep_until(state.mark_due.unwrap_or(next_scan)), if state.mark_due.is_some() => {}
            }
        }

        // Stopping: running deliveries may finish, within the timeout.
        let deadline = Instant::now() + bus.config.stop_timeout;
        while state.to_mark.len() + state.abandoned.len() < state.in_flight.len() {
            tokio::select! {
                Some(done) = finished_rx.recv() => state.finish(done),
                _ = sleep_until(deadline) => {
                    tracing::warn!(module = %source.name(), running = state.in_flight.len(), "stop timeout: deliveries still running stay pending");
                    break;
                }
            }
        }
        while !state.to_mark.is_empty() && state.mark().await {}
        state.release_claims().await;
        source.core.busy.store(0, Relaxed);
        retention.abort();
        tracing::debug!(module = %source.name(), "dispatcher stopped");
    }
}

impl<B: Backend> State<B> {
    /// Starts delivering an announced message unless it is already in
    /// flight or was delivered lately (a scan may have claimed it first).
    fn start_announced(&mut self, envelope: Arc<Envelope>) {
        if !self.recent.contains(&envelope.id) {
            self.start(envelope);
        }
    }

    /// Starts delivering a message unless it is already in flight.
    fn start(&mut self, envelope: Arc<Envelope>) {
        if !self.in_flight.insert(envelope.id) {
            return;
        }
        self.source.core.busy.fetch_add(1, Relaxed);
        actix::spawn(deliver_message(
            self.bus.clone(),
            self.source.clone(),
            envelope,
            self.finished.clone(),
        ));
    }

    fn finish(&mut self, done: Finished) {
        match done {
            Finished::Delivered(id) => {
                self.to_mark.push(id);
                self.mark_due
                    .get_or_insert_with(|| Instant::now() + MARK_LINGER);
            }
            Finished::Abandoned(id) => self.abandoned.push(id),
        }
    }

    /// Marks finished messages delivered, up to a batch in one statement.
    /// On failure they stay in flight (so nothing starts them again) and the
    /// mark is tried again a little later; false then.
    async fn mark(&mut self) -> bool {
        if self.to_mark.is_empty() {
            self.mark_due = None;
            return true;
        }
        let ids: Vec<Uuid> = self.to_mark.iter().take(MARK_BATCH).copied().collect();
        let count = ids.len();
        let marked = match self.source.write_connection().await {
            Ok(mut conn) => B::mark_delivered(&mut conn, ids, now_us())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match marked {
            Ok(_) => {
                self.bus.delivered.fetch_add(count as u64, Relaxed);
                self.source.core.outbox.delivered(count as u64);
                for id in self.to_mark.drain(..count) {
                    self.in_flight.remove(&id);
                    self.source.core.busy.fetch_sub(1, Relaxed);
                    self.recent.insert(id);
                }
                self.mark_due = (!self.to_mark.is_empty()).then(Instant::now);
                true
            }
            Err(error) => {
                tracing::warn!(module = %self.source.name(), %error, "marking messages delivered failed; will retry");
                self.mark_due = Some(Instant::now() + Duration::from_millis(100));
                false
            }
        }
    }

    /// Claims the next page of the outbox scan, if there is room in memory,
    /// and starts what it finds. Rows are claimed only once they are older
    /// than a lease (or than the bus), so a message still on its
    /// publisher's fast path is left to it.
    async fn scan_page(&mut self) {
        let capacity = self.bus.config.max_messages_in_memory;
        let room = capacity.saturating_sub(self.in_flight.len()) as i64;
        if room == 0 {
            return;
        }
        let now = now_us();
        let lease = self.bus.config.claim_lease.as_micros() as i64;
        let claim = Claim {
            bus: self.bus.id,
            now_us: now,
            until_us: now + lease,
            created_before_us: self.bus.started_us.max(now - lease),
            limit: room.min(self.bus.config.sweep_page),
        };
        let rows = match self.source.write_connection().await {
            Ok(mut conn) => B::claim(&mut conn, claim).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match rows {
            Ok(rows) => {
                self.scanning = rows.len() as i64 == claim.limit;
                for row in rows {
                    self.start(Arc::new(row.into()));
                }
            }
            Err(error) => {
                tracing::warn!(module = %self.source.name(), %error, "scanning the outbox failed; will retry");
                self.scanning = false;
            }
        }
    }

    /// Keeps this bus's claims on its running deliveries alive (and claims
    /// the ones that came by the fast path), so no other process's bus takes
    /// them over.
    async fn renew_claims(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let ids = self.in_flight.iter().copied().collect();
        let now = now_us();
        let until = now + self.bus.config.claim_lease.as_micros() as i64;
        let renewed = match self.source.write_connection().await {
            Ok(mut conn) => B::renew_claims(&mut conn, ids, self.bus.id, now, until)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = renewed {
            tracing::warn!(module = %self.source.name(), %error, "renewing claims failed; will retry");
        }
    }

    /// Gives up the claims of deliveries abandoned at stop, so the next bus
    /// (in this process or another) takes them at once.
    async fn release_claims(&mut self) {
        let ids: Vec<Uuid> = self
            .in_flight
            .iter()
            .filter(|id| !self.to_mark.contains(id))
            .copied()
            .collect();
        if ids.is_empty() {
            return;
        }
        if let Ok(mut conn) = self.source.write_connection().await {
            if let Err(error) = B::release_claims(&mut conn, ids, self.bus.id).await {
                tracing::warn!(module = %self.source.name(), %error, "releasing claims failed; they expire by themselves");
            }
        }
    }
}

/// Delivers one message to every subscriber and reports how it ended.
async fn deliver_message<B: Backend>(
    bus: Arc<BusCore<B>>,
    source: ModuleHandle<B>,
    envelope: Arc<Envelope>,
    finished: mpsc::UnboundedSender<Finished>,
) {
    let id = envelope.id;
    let done = match bus.routes.get(&envelope.topic).cloned() {
        Some(routes) => {
            let ends = join_all(
                routes
                    .iter()
                    .map(|route| deliver_to_route(&bus, route, &envelope)),
            )
            .await;
            let done = !ends.contains(&RouteEnd::Stopped);
            if done
                && bus.config.duplicate_rate > 0.0
                && fastrand::f64() < bus.config.duplicate_rate
            {
                let handled: Vec<&Route<B>> = routes
                    .iter()
                    .zip(&ends)
                    .filter(|(_, end)| **end == RouteEnd::Handled)
                    .map(|(route, _)| route)
                    .collect();
                if !handled.is_empty() {
                    inject_duplicate(&bus, handled, &envelope).await;
                }
            }
            done
        }
        None if bus.known_topics.contains(&envelope.topic) => {
            tracing::debug!(message_id = %id, topic = %envelope.topic, "no subscribers");
            true
        }
        None => {
            let reason = format!(
                "unknown topic `{}`: no module on the bus declares it, so no handler can decode it",
                envelope.topic
            );
            bury(&bus, &source, &envelope, "", 0, &reason).await
        }
    };
    let _ = finished.send(if done {
        Finished::Delivered(id)
    } else {
        Finished::Abandoned(id)
    });
}

/// How delivering a message to one handler ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteEnd {
    /// Handled, or found a duplicate.
    Handled,
    /// Given up on and recorded as a dead letter.
    Buried,
    /// The bus stopped first.
    Stopped,
}

/// Delivers to one handler until it has handled the message or found it a
/// duplicate, retrying failures with backoff, or gives up and records a dead
/// letter.
async fn deliver_to_route<B: Backend>(
    bus: &BusCore<B>,
    route: &Route<B>,
    envelope: &Arc<Envelope>,
) -> RouteEnd {
    let policy = route.retry(&bus.config);
    let mut attempt = 0;
    let mut failures = 0;
    loop {
        attempt += 1;
        // Waiting for a slot stops with the bus; a running attempt is let
        // finish.
        let Some(slot) = until_stopped(bus, bus.permits.acquire()).await else {
            return RouteEnd::Stopped;
        };
        let outcome = route
            .module
            .deliver(envelope.clone(), route.handler, attempt)
            .await;
        drop(slot);
        let error = match outcome {
            Ok(_) => return RouteEnd::Handled,
            Err(error) => error,
        };
        if error.counts_as_attempt() {
            failures += 1;
        }
        let exhausted = policy.max_attempts.is_some_and(|max| failures >= max);
        if !error.is_retryable() || exhausted {
            let reason = format!("after {attempt} attempt(s): {error}");
            let buried = bury(bus, &route.module, envelope, route.name(), attempt, &reason).await;
            return if buried {
                RouteEnd::Buried
            } else {
                RouteEnd::Stopped
            };
        }
        if until_stopped(bus, sleep(policy.delay(attempt)))
            .await
            .is_none()
        {
            return RouteEnd::Stopped;
        }
    }
}

/// Records a dead letter, retrying while the database fails. False if the
/// bus stopped first.
async fn bury<B: Backend>(
    bus: &BusCore<B>,
    module: &ModuleHandle<B>,
    envelope: &Envelope,
    handler: &str,
    attempts: u32,
    reason: &str,
) -> bool {
    let mut tries = 0;
    loop {
        tries += 1;
        match module.bury(envelope, handler, attempts, reason).await {
            Ok(()) => return true,
            Err(error) => {
                tracing::warn!(module = %module.name(), handler, %error, "recording a dead letter failed; will retry");
            }
        }
        let delay = bus.config.retry.delay(tries);
        if until_stopped(bus, sleep(delay)).await.is_none() {
            return false;
        }
    }
}

/// For demonstrations: delivers the message once more to the handlers that
/// handled it.
async fn inject_duplicate<B: Backend>(
    bus: &BusCore<B>,
    routes: Vec<&Route<B>>,
    envelope: &Arc<Envelope>,
) {
    bus.duplicates_injected.fetch_add(1, Relaxed);
    join_all(
        routes
            .into_iter()
            .map(|route| route.module.deliver(envelope.clone(), route.handler, 1)),
    )
    .await;
}

/// Runs `work` unless the bus stops first.
async fn until_stopped<B: Backend, T>(
    bus: &BusCore<B>,
    work: impl Future<Output = T>,
) -> Option<T> {
    let mut stopped: watch::Receiver<bool> = bus.stopped.clone();
    tokio::select! {
        value = work => Some(value),
        _ = stopped.wait_for(|stop| *stop) => None,
    }
}

/// Runs the module's retention sweep every retention interval while the
/// bus runs, starting one interval after the bus (after its first scan has
/// redelivered what a crash left behind).
async fn sweep_retention_periodically<B: Backend>(bus: Arc<BusCore<B>>, module: ModuleHandle<B>) {
    let retention = &module.core.retention;
    if retention.inbox.is_none() && retention.outbox.is_none() {
        return;
    }
    loop {
        if until_stopped(&bus, sleep(retention.interval))
            .await
            .is_none()
        {
            return;
        }
        if let Err(error) = module.sweep_retention().await {
            tracing::warn!(module = %module.name(), %error, "retention sweep failed; will retry");
        }
    }
}
