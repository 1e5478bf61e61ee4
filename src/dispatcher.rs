//! One dispatcher per module outbox: takes committed messages (announced on
//! commit, or claimed from the table by a scan), delivers each to every
//! subscriber, and marks it delivered once each of them has handled it,
//! found it a duplicate, or given up on it as a dead letter.
//!
//! A scan runs at start, periodically (`sweep_interval`), and whenever one
//! is requested: when announcements overflowed, and on PostgreSQL when
//! another process commits messages to the outbox (its notification reaches
//! the dispatcher's listener task).

use crate::backend::{Backend, Claim};
use crate::bus::{BusCore, Route};
use crate::message::{now_us, Envelope};
use crate::module::ModuleHandle;
use crate::schema::OutboxRow;
use futures_util::future::join_all;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
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
    /// While a scan of the outbox is under way: the last id it read (nil
    /// to start from the beginning).
    scan: Option<Uuid>,
    /// A scan was requested while one was under way: start another from the
    /// beginning when it ends (rows committed meanwhile may lie behind its
    /// cursor, since ids are taken at publish time, not at commit).
    scan_again: bool,
    /// The claims of the messages in flight are due for renewal.
    renew_due: bool,
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
            scan: Some(Uuid::nil()),
            scan_again: false,
            renew_due: false,
            finished,
        };
        let retention = actix::spawn(sweep_retention_periodically(bus.clone(), source.clone()));
        // PostgreSQL: other processes' commits request a scan through a
        // listener on a connection of its own; its own task, so a
        // notification never waits for this loop.
        let listener = source.core.wakeup.clone().and_then(|wakeup| {
            let core = source.core.clone();
            B::listen(wakeup, source.core.name.clone(), move || {
                core.request_scan()
            })
            .map(actix::spawn)
        });
        let mut stopped = bus.stopped.clone();
        let renew_every = bus.config.claim_lease / 3;
        let mut next_scan = Instant::now() + bus.config.sweep_interval;
        let mut next_renewal = Instant::now() + renew_every;
        // One database statement at a time runs beside the loop, so marking,
        // scanning and renewing never hold up starting deliveries.
        let mut statement: Option<JoinHandle<Done>> = None;
        tracing::debug!(module = %source.name(), bus = %bus.id, "dispatcher started");

        while !bus.is_stopping() {
            if statement.is_none() {
                statement = state.next_statement();
            }
            let room = state.in_flight.len() < capacity;
            tokio::select! {
                biased;
                _ = stopped.changed() => {}
                done = async { statement.as_mut().expect("guarded").await }, if statement.is_some() => {
                    statement = None;
                    match done {
                        Ok(done) => state.apply(done),
                        Err(error) => tracing::error!(module = %source.name(), %error, "a dispatcher statement panicked"),
                    }
                }
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
                    if source.core.scan_requested.swap(false, Relaxed) {
                        state.request_scan();
                    }
                }
                _ = sleep_until(next_renewal) => {
                    next_renewal = Instant::now() + renew_every;
                    state.renew_due = true;
                }
                _ = sleep_until(next_scan) => {
                    next_scan = Instant::now() + bus.config.sweep_interval;
                    state.scan.get_or_insert(Uuid::nil());
                }
                _ = sleep_until(state.mark_due.unwrap_or(next_scan)), if state.mark_due.is_some() && statement.is_none() => {}
            }
        }

        // Stopping: from now on the module's commits are written unclaimed
        // (and on PostgreSQL wake other processes' buses). The running
        // statement and running deliveries may finish, within the timeout.
        source.core.set_claimant(bus.id, None);
        if let Some(running) = statement.take() {
            if let Ok(done) = running.await {
                state.apply(done);
            }
        }
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
        while !state.to_mark.is_empty() {
            let ids: Vec<Uuid> = state.to_mark.iter().take(MARK_BATCH).copied().collect();
            let done = mark(state.source.clone(), ids).await;
            let failed = matches!(done, Done::Marked(Err(_)));
            state.apply(done);
            if failed {
                break;
            }
        }
        state.release_claims().await;
        source.core.busy.store(0, Relaxed);
        retention.abort();
        if let Some(listener) = listener {
            listener.abort();
        }
        tracing::debug!(module = %source.name(), "dispatcher stopped");
    }
}

/// What a dispatcher statement did.
enum Done {
    /// These ids were marked delivered, or not (with the error).
    Marked(Result<Vec<Uuid>, (Vec<Uuid>, String)>),
    /// Rows claimed by a scan page that asked for `limit` of them.
    Claimed {
        rows: Result<Vec<OutboxRow>, String>,
        limit: i64,
    },
    /// Claims renewed.
    Renewed(Result<usize, String>),
}

/// Marks messages delivered in one statement — or deletes them, when the
/// module keeps no delivered rows (an outbox retention of zero).
async fn mark<B: Backend>(source: ModuleHandle<B>, ids: Vec<Uuid>) -> Done {
    let result = async {
        let mut conn = source.write_connection().await?;
        if source.core.retention.outbox == Some(Duration::ZERO) {
            B::delete_delivered(&mut conn, ids.clone()).await?;
        } else {
            B::mark_delivered(&mut conn, ids.clone(), now_us()).await?;
        }
        Ok::<_, crate::Error>(())
    }
    .await;
    Done::Marked(match result {
        Ok(()) => Ok(ids),
        Err(error) => Err((ids, error.to_string())),
    })
}

impl<B: Backend> State<B> {
    /// The statement to run next, if one is due: a mark first, then a scan
    /// page while there is room in memory, then a renewal.
    fn next_statement(&mut self) -> Option<JoinHandle<Done>> {
        let source = self.source.clone();
        let full_batch = self.to_mark.len() >= MARK_BATCH;
        if full_batch || self.mark_due.is_some_and(|due| due <= Instant::now()) {
            // The ids stay in `to_mark` (and in flight) until the mark
            // returns, so nothing starts them again meanwhile.
            let ids: Vec<Uuid> = self.to_mark.iter().take(MARK_BATCH).copied().collect();
            self.mark_due = None;
            return Some(tokio::spawn(mark(source, ids)));
        }
        let room = self
            .bus
            .config
            .max_messages_in_memory
            .saturating_sub(self.in_flight.len()) as i64;
        if let Some(after) = self.scan.filter(|_| room > 0) {
            let now = now_us();
            let claim = Claim {
                bus: self.bus.id,
                now_us: now,
                until_us: now + self.bus.config.claim_lease.as_micros() as i64,
                after,
                limit: room.min(self.bus.config.sweep_page),
            };
            return Some(tokio::spawn(async move {
                let rows = async {
                    let mut conn = source.write_connection().await?;
                    Ok::<_, crate::Error>(B::claim(&mut conn, claim).await?)
                }
                .await
                .map_err(|e| e.to_string());
                Done::Claimed {
                    rows,
                    limit: claim.limit,
                }
            }));
        }
        if std::mem::take(&mut self.renew_due) && !self.in_flight.is_empty() {
            let ids: Vec<Uuid> = self.in_flight.iter().copied().collect();
            let (bus, lease) = (self.bus.id, self.bus.config.claim_lease);
            return Some(tokio::spawn(async move {
                let renewed = async {
                    let mut conn = source.write_connection().await?;
                    let now = now_us();
                    let until = now + lease.as_micros() as i64;
                    Ok::<_, crate::Error>(B::renew_claims(&mut conn, ids, bus, now, until).await?)
                }
                .await;
                Done::Renewed(renewed.map_err(|e| e.to_string()))
            }));
        }
        None
    }

    /// Takes in what a statement did.
    fn apply(&mut self, done: Done) {
        let module = self.source.name().to_string();
        match done {
            Done::Marked(Ok(ids)) => {
                let count = ids.len();
                self.bus.delivered.fetch_add(count as u64, Relaxed);
                self.source.core.outbox.delivered(count as u64);
                self.to_mark.drain(..count);
                for id in ids {
                    self.in_flight.remove(&id);
                    self.source.core.busy.fetch_sub(1, Relaxed);
                    self.recent.insert(id);
                }
                if !self.to_mark.is_empty() {
                    self.mark_due = Some(Instant::now());
                }
            }
            Done::Marked(Err((_, error))) => {
                tracing::warn!(%module, %error, "marking messages delivered failed; will retry");
                self.mark_due = Some(Instant::now() + Duration::from_millis(100));
            }
            Done::Claimed {
                rows: Ok(rows),
                limit,
            } => {
                self.scan = match rows.last() {
                    Some(last) if rows.len() as i64 == limit => Some(last.id.0),
                    _ if std::mem::take(&mut self.scan_again) => Some(Uuid::nil()),
                    _ => None,
                };
                for row in rows {
                    self.start(Arc::new(row.into()));
                }
            }
            Done::Claimed {
                rows: Err(error), ..
            } => {
                tracing::warn!(%module, %error, "scanning the outbox failed; will retry");
                self.scan = None;
                self.scan_again = false;
            }
            Done::Renewed(Ok(_)) => {}
            Done::Renewed(Err(error)) => {
                tracing::warn!(%module, %error, "renewing claims failed; will retry");
            }
        }
    }

    /// Scans the outbox from the beginning: now, or after the scan under way.
    fn request_scan(&mut self) {
        match self.scan {
            None => self.scan = Some(Uuid::nil()),
            Some(_) => self.scan_again = true,
        }
    }

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

    /// Gives up this bus's claims on the outbox's undelivered rows (the
    /// abandoned deliveries, the messages not yet taken), so the next bus, in
    /// this process or another, takes them at once.
    async fn release_claims(&mut self) {
        if let Ok(mut conn) = self.source.write_connection().await {
            if let Err(error) = B::release_claims(&mut conn, self.bus.id).await {
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
        // finish. A first attempt to a batched handler needs no slot: it
        // waits in the handler's batch queue, whose transactions the module
        // bounds itself.
        let slot = if attempt == 1 && route.is_batched() {
            None
        } else {
            match until_stopped(bus, bus.permits.acquire()).await {
                Some(slot) => Some(slot),
                None => return RouteEnd::Stopped,
            }
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
