//! One dispatcher per module outbox: takes committed messages (announced on
//! commit, or claimed from the table by a scan), delivers each to every
//! subscriber on this bus, and finishes it once each of them has handled it,
//! found it a duplicate, or given up on it as a dead letter — marks it
//! delivered if no subscription served elsewhere still owes it, or else
//! records its own part done and hands the message over (see
//! `subscription`).
//!
//! A scan runs at start, periodically (`scan_interval`), and whenever one
//! is requested: when announcements overflowed, and on PostgreSQL when
//! another process commits messages to the outbox (its notification reaches
//! the dispatcher's listener task). A row a scan cannot decode becomes a
//! dead letter of the outbox's module; the others keep flowing.
//!
//! Scheduled messages are not announced: a scan claims them once due. The
//! dispatcher keeps one timer for the outbox, set for the soonest due time
//! it knows of — a commit of this process tells it (the outbox's
//! `schedule`), and after every scan it reads the next due message of any
//! process from the pending index (ids carry due times) — and scans when
//! it fires. A scheduled keyed message is numbered in its key as the scan
//! takes it.
//!
//! Every scan interval the dispatcher also keeps up its subscriptions
//! (says they are served, finishes what every subscription is done with,
//! learns of other processes' subscriptions) and runs the watchdog.

use crate::bus::attempts::{
    deliver_to_route, record_dead_letter, until_done, until_stopped, RouteEnd,
};
use crate::bus::core::BusCore;
#[cfg(feature = "testing")]
use crate::bus::duplicates::maybe_inject_duplicate;
use crate::bus::id_hash::{id_set, IdSet};
use crate::message::{due_by, due_by_id, now_us, Envelope};
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription::{self, Served};
use crate::outbox::watchdog::{self, Stalled};
use crate::store::backend::Backend;
use crate::store::outbox::{Claim, Owed};
use crate::store::schema::{ClaimedRow, Id, Lenient, MalformedRow, OutboxRow};
use futures_util::future::join_all;
use std::collections::VecDeque;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};
use uuid::Uuid;

/// A claim said to hold longer than this from now (or ten leases, if more)
/// is taken as corrupt: no live bus claims that far ahead.
const CLAIM_HORIZON: Duration = Duration::from_secs(24 * 3600);

/// Messages marked delivered in one statement at most.
const MARK_BATCH: usize = 512;

/// Pending rows ahead of now read after each scan: the next scheduled one
/// sets the timer; stray ones among them are claimed (see
/// [`OutboxStatements::look_ahead`]).
///
/// [`OutboxStatements::look_ahead`]: crate::store::outbox::OutboxStatements::look_ahead
const LOOK_AHEAD: i64 = 16;

/// Delivers the outbox of one module.
pub(crate) struct Dispatcher<B: Backend> {
    bus: Arc<BusCore<B>>,
    /// The module whose outbox this is.
    source: ModuleHandle<B>,
    /// Messages announced by the module as they commit.
    announcements: mpsc::Receiver<Arc<Envelope>>,
    /// The subscriptions to this outbox's topics that this bus serves.
    served: Arc<[Served]>,
    /// Whether the outbox has subscriptions this bus does not serve, as read
    /// when the bus started.
    others: bool,
}

/// How the delivery of one message ended.
enum Finished {
    /// Every subscriber on this bus is done with it: finish it.
    Delivered(Uuid),
    /// A malformed row, recorded as a dead letter and marked delivered.
    Rejected(Uuid),
    /// Given up because the bus is stopping: it stays pending.
    Abandoned(Uuid),
}

/// A scan's position: `None` before the first row, then the last id read.
type Cursor = Option<Uuid>;

/// Ids of messages marked delivered lately, so that a late announcement (of
/// a message a scan claimed and delivered first) does not start them again.
struct RecentIds {
    order: VecDeque<Uuid>,
    set: IdSet,
    capacity: usize,
}

impl RecentIds {
    fn new(capacity: usize) -> Self {
        RecentIds {
            order: VecDeque::with_capacity(capacity),
            set: id_set(capacity),
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
    in_flight: IdSet,
    recent: RecentIds,
    /// Done with by every subscriber, waiting for the mark.
    to_mark: Vec<Uuid>,
    /// When the waiting marks are due.
    mark_due: Option<Instant>,
    /// Given up on while stopping: their claims are released.
    abandoned: Vec<Uuid>,
    /// While a scan of the outbox is under way: where it has got to.
    scan: Option<Cursor>,
    /// A scan was requested while one was under way: start another from the
    /// beginning when it ends (rows committed meanwhile may lie behind its
    /// cursor, since ids are taken at publish time, not at commit).
    scan_again: bool,
    /// The claims of the messages in flight are due for renewal.
    renew_due: bool,
    /// A scan ended: read when the next scheduled message is due.
    look_ahead: bool,
    /// When the soonest scheduled message known of is due: a scan then.
    next_due: Option<Instant>,
    /// Stray rows ahead of now to claim, up to this id.
    stray: Option<Uuid>,
    /// Stray rows claimed since the last periodic scan: not tried again
    /// before the next (one another bus holds would be tried in a loop).
    strays_tried: IdSet,
    /// The subscriptions' upkeep and the watchdog are due.
    upkeep_due: bool,
    /// The subscriptions this bus serves here.
    served: Arc<[Served]>,
    /// Their ids.
    served_ids: Arc<[Uuid]>,
    /// Whether other processes' subscriptions may owe this outbox's
    /// messages: then finished messages may have done rows to forget.
    others: bool,
    /// The stalled message last warned about, and when.
    warned: Option<(Uuid, Instant)>,
    finished: mpsc::UnboundedSender<Finished>,
}

impl<B: Backend> Dispatcher<B> {
    pub(crate) fn new(
        bus: Arc<BusCore<B>>,
        source: ModuleHandle<B>,
        announcements: mpsc::Receiver<Arc<Envelope>>,
        served: Vec<Served>,
        others: bool,
    ) -> Self {
        Dispatcher {
            bus,
            source,
            announcements,
            served: served.into(),
            others,
        }
    }

    pub(crate) async fn run(self) {
        let Dispatcher {
            bus,
            source,
            mut announcements,
            served,
            others,
        } = self;
        let (finished, mut finished_rx) = mpsc::unbounded_channel();
        let capacity = bus.config.max_messages_in_memory;
        let mut state = State {
            bus: bus.clone(),
            source: source.clone(),
            in_flight: id_set(capacity),
            recent: RecentIds::new(capacity + announcements.max_capacity()),
            to_mark: Vec::new(),
            mark_due: None,
            abandoned: Vec::new(),
            scan: Some(None),
            scan_again: false,
            renew_due: false,
            look_ahead: false,
            next_due: None,
            stray: None,
            strays_tried: id_set(0),
            upkeep_due: false,
            served_ids: served.iter().map(|s| s.id).collect(),
            served,
            others,
            warned: None,
            finished,
        };
        let retention = tokio::spawn(sweep_retention_periodically(bus.clone(), source.clone()));
        // PostgreSQL: other processes' commits request a scan through a
        // listener on a connection of its own; its own task, so a
        // notification never waits for this loop.
        let outbox = source.outbox().clone();
        let listener = outbox.wakeup.clone().and_then(|wakeup| {
            let woken = outbox.clone();
            B::listen(wakeup, outbox.module.clone(), move || woken.request_scan()).map(tokio::spawn)
        });
        let stop = bus.stop.clone();
        let renew_every = bus.config.claim_lease / 3;
        // Four timers, each registered once and moved only when its
        // deadline moves: a timer made anew in every turn of the loop was
        // registered with the runtime and taken out again several times per
        // message.
        let scan_timer = sleep_until(Instant::now() + bus.config.scan_interval);
        let renewal_timer = sleep_until(Instant::now() + renew_every);
        let mark_timer = sleep_until(Instant::now() + bus.config.scan_interval);
        let due_timer = sleep_until(Instant::now() + bus.config.scan_interval);
        tokio::pin!(scan_timer, renewal_timer, mark_timer, due_timer);
        // Likewise the three waits for a signal, made anew only once they
        // have ended: made in every turn, each registered itself as a
        // waiter (under a lock) and took itself out again (under another)
        // several times per message.
        let stopped = stop.cancelled();
        let scan_request = outbox.scan_request();
        let scheduled = outbox.scheduled();
        tokio::pin!(stopped, scan_request, scheduled);
        // The deadlines `mark_timer` and `due_timer` are set to, while set.
        let mut mark_armed: Option<Instant> = None;
        let mut due_armed: Option<Instant> = None;
        // One database statement at a time runs beside the loop, so marking,
        // scanning and renewing never hold up starting deliveries.
        let mut statement: Option<JoinHandle<Done>> = None;
        tracing::debug!(module = %source.name(), bus = %bus.id, "dispatcher started");

        while !bus.is_stopping() {
            if statement.is_none() {
                statement = state.next_statement();
            }
            let room = state.in_flight.len() < capacity;
            arm(mark_timer.as_mut(), &mut mark_armed, state.mark_due);
            arm(due_timer.as_mut(), &mut due_armed, state.next_due);
            tokio::select! {
                biased;
                () = &mut stopped => {}
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
                () = &mut scan_request => {
                    scan_request.set(outbox.scan_request());
                    state.request_scan();
                }
                due = &mut scheduled => {
                    scheduled.set(outbox.scheduled());
                    state.due_at(due);
                }
                () = &mut due_timer, if state.next_due.is_some() => {
                    state.next_due = None;
                    state.request_scan();
                }
                () = &mut renewal_timer => {
                    renewal_timer.as_mut().reset(Instant::now() + renew_every);
                    state.renew_due = true;
                }
                () = &mut scan_timer => {
                    scan_timer.as_mut().reset(Instant::now() + bus.config.scan_interval);
                    state.upkeep_due = true;
                    state.strays_tried.clear();
                    state.scan.get_or_insert(None);
                }
                () = &mut mark_timer, if state.mark_due.is_some() && statement.is_none() => {}
            }
        }

        // Stopping: from now on the module's commits are written unclaimed
        // (and on PostgreSQL wake other processes' buses). The running
        // statement and running deliveries may finish, within the timeout.
        outbox.set_claimant(bus.id, None);
        // The whole stop fits in the stop timeout, however dead the
        // connections: deliveries get three quarters of it, and what is left
        // goes to marking what finished and giving up the claims. What does
        // not make it stays pending, for the next start or another process.
        let stop_by = Instant::now() + bus.config.stop_timeout;
        let deliveries_by = stop_by - bus.config.stop_timeout / 4;
        if let Some(mut running) = statement.take() {
            match tokio::time::timeout_at(deliveries_by, &mut running).await {
                Ok(Ok(done)) => state.apply(done),
                Ok(Err(_)) => {}
                Err(_) => running.abort(),
            }
        }
        while state.to_mark.len() + state.abandoned.len() < state.in_flight.len() {
            tokio::select! {
                Some(done) = finished_rx.recv() => state.finish(done),
                _ = sleep_until(deliveries_by) => {
                    tracing::warn!(module = %source.name(), running = state.in_flight.len(), "stop timeout: deliveries still running stay pending");
                    break;
                }
            }
        }
        let wrapped_up = tokio::time::timeout_at(stop_by, async {
            while !state.to_mark.is_empty() {
                let ids: Vec<Uuid> = state.to_mark.iter().take(MARK_BATCH).copied().collect();
                let done = state.mark(ids).await;
                let failed = matches!(done, Done::Marked(Err(_)));
                state.apply(done);
                if failed {
                    break;
                }
            }
            state.release_claims().await;
            state.stop_serving().await;
        })
        .await;
        if wrapped_up.is_err() {
            tracing::warn!(
                module = %source.name(),
                "stop timeout: marking and releasing claims did not finish; the messages stay pending and the claims expire by themselves"
            );
        }
        outbox.busy.store(0, Relaxed);
        retention.abort();
        if let Some(listener) = listener {
            listener.abort();
        }
        // The module may join another bus: what was announced and not
        // taken stays pending in the outbox for that bus's first scan.
        while announcements.try_recv().is_ok() {}
        outbox.give_back_announcements(announcements);
        tracing::debug!(module = %source.name(), "dispatcher stopped");
    }
}

/// What a dispatcher statement did.
enum Done {
    /// These ids were finished or handed over, or not (with the error).
    Marked(Result<Marked, (Vec<Uuid>, String)>),
    /// Rows claimed by a scan page that asked for `limit` of them, or
    /// (`stray`) stray rows ahead of now.
    Claimed {
        rows: Result<Vec<ClaimedRow>, String>,
        limit: i64,
        stray: bool,
    },
    /// Claims renewed.
    Renewed(Result<usize, String>),
    /// The first pending rows ahead of now, and their due times.
    LookedAhead(Result<Vec<(Uuid, Option<i64>)>, String>),
    /// The subscriptions kept up and the watchdog's look.
    Upkept(Result<Upkeep, String>),
}

/// Messages this bus is done with, out of memory now.
struct Marked {
    ids: Vec<Uuid>,
    /// How many of them were finished (marked delivered or deleted); the
    /// rest were handed over to the subscriptions other processes serve.
    finished: usize,
}

/// What the periodic upkeep found.
struct Upkeep {
    /// Whether the outbox has subscriptions this bus does not serve.
    others: bool,
    stalled: Stalled,
}

/// Moves `timer` to `wanted` when that changed since it was `armed` (a
/// timer left alone stays registered; `None` leaves it where it was, its
/// `select!` branch being off).
fn arm(
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
    armed: &mut Option<Instant>,
    wanted: Option<Instant>,
) {
    if *armed != wanted {
        if let Some(at) = wanted {
            timer.reset(at);
        }
        *armed = wanted;
    }
}

/// Finishes messages every subscriber on this bus is done with: marks them
/// delivered — or deletes them, when the module keeps no delivered rows (an
/// outbox retention of zero) — unless a subscription served elsewhere still
/// owes them. Those are handed over: this bus's subscriptions are recorded
/// done with them and its claims released (on PostgreSQL waking the other
/// processes' buses at once).
async fn mark<B: Backend>(
    source: ModuleHandle<B>,
    ids: Vec<Uuid>,
    bus: Uuid,
    served: Arc<[Uuid]>,
    others: bool,
) -> Done {
    let delete = source.retention().outbox == Some(Duration::ZERO);
    let wakeup = source.outbox().wakeup.clone();
    let marked = ids.clone();
    let result = source
        .db()
        .write_call("marking messages delivered", async move |conn| {
            let ids = marked;
            let changed = B::finish_delivered(conn, &ids, &served, now_us(), delete).await?;
            // The common case: every message finished. Otherwise, those
            // still pending are owed elsewhere (the others were finished, or
            // were already gone).
            let rest: Vec<Uuid> = if changed >= ids.len() {
                Vec::new()
            } else {
                B::still_pending(conn, &ids).await?
            };
            if others {
                let finished: Vec<Uuid> = ids
                    .iter()
                    .filter(|id| !rest.contains(id))
                    .copied()
                    .collect();
                B::forget_done(conn, &finished).await?;
            }
            if !rest.is_empty() {
                B::hand_over(conn, &rest, &served, bus).await?;
                if let Some(wakeup) = &wakeup {
                    B::notify(conn, &wakeup.channel).await?;
                }
            }
            Ok::<_, crate::error::Error>(ids.len() - rest.len())
        })
        .await;
    Done::Marked(match result {
        Ok(finished) => Ok(Marked { ids, finished }),
        Err(error) => Err((ids, error.to_string())),
    })
}

/// Says the subscriptions are served, finishes what every subscription is
/// done with, learns whether other processes' subscriptions exist, and looks
/// for stalled messages.
async fn upkeep<B: Backend>(
    source: ModuleHandle<B>,
    served: Arc<[Served]>,
    alive_for: Duration,
    stalled_after: Duration,
) -> Done {
    let result = async {
        let now = now_us();
        let others = subscription::record(
            source.db(),
            &served,
            now,
            now.saturating_add(alive_for.as_micros() as i64),
            false,
        )
        .await?;
        let delete = source.retention().outbox == Some(Duration::ZERO);
        let completed = source
            .db()
            .write_call(
                "finishing what every subscription is done with",
                async |conn| {
                    let completed =
                        B::finish_completed(conn, Owed::PartlyDone, now, delete).await?;
                    if others || completed > 0 {
                        B::clear_done(conn).await?;
                    }
                    Ok(completed)
                },
            )
            .await?;
        if completed > 0 {
            source.outbox().gauges.delivered(completed as u64);
        }
        let stalled = source
            .db()
            .call("looking for stalled messages", async |conn| {
                watchdog::look::<B>(conn, now, stalled_after).await
            })
            .await?;
        Ok::<_, crate::error::Error>(Upkeep { others, stalled })
    }
    .await;
    Done::Upkept(result.map_err(|e| e.to_string()))
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
            return Some(tokio::spawn(mark(
                source,
                ids,
                self.bus.id,
                self.served_ids.clone(),
                self.others,
            )));
        }
        if std::mem::take(&mut self.upkeep_due) {
            let config = &self.bus.config;
            return Some(tokio::spawn(upkeep(
                source,
                self.served.clone(),
                config.scan_interval.saturating_mul(3),
                config.stalled_after,
            )));
        }
        let room = self
            .bus
            .config
            .max_messages_in_memory
            .saturating_sub(self.in_flight.len()) as i64;
        let stray = if self.scan.is_none() && room > 0 {
            self.stray.take()
        } else {
            None
        };
        let due_now = self.source.outbox().clock.now_us();
        let page = match (self.scan.filter(|_| room > 0), stray) {
            (Some(after), _) => Some((after, None)),
            (None, Some(upto)) => Some((Some(due_by(due_now)), Some(upto))),
            (None, None) => None,
        };
        if let Some((after, stray)) = page {
            let now = now_us();
            let claim = Claim {
                bus: self.bus.id,
                now_us: now,
                until_us: now + self.bus.config.claim_lease.as_micros() as i64,
                beyond_us: now
                    + CLAIM_HORIZON
                        .max(self.bus.config.claim_lease * 10)
                        .as_micros() as i64,
                after,
                upto: stray.unwrap_or_else(|| due_by(due_now)),
                due_now_us: due_now,
                limit: room.min(self.bus.config.sweep_page),
                served: self.served_ids.clone(),
            };
            let stray = stray.is_some();
            let limit = claim.limit;
            return Some(tokio::spawn(async move {
                let rows = source
                    .db()
                    .write_call("claiming outbox rows", async move |conn| {
                        Ok(B::claim_owed(conn, &claim).await?)
                    })
                    .await
                    .map_err(|e| e.to_string());
                let rows = match rows {
                    Ok(rows) => Ok(number_due(&source, rows).await),
                    Err(error) => Err(error),
                };
                Done::Claimed { rows, limit, stray }
            }));
        }
        if std::mem::take(&mut self.look_ahead) {
            return Some(tokio::spawn(async move {
                let next = source
                    .db()
                    .call("looking for the next scheduled message", async |conn| {
                        Ok(B::look_ahead(conn, due_by(due_now), LOOK_AHEAD).await?)
                    })
                    .await;
                Done::LookedAhead(next.map_err(|e| e.to_string()))
            }));
        }
        if std::mem::take(&mut self.renew_due) && !self.in_flight.is_empty() {
            let ids: Vec<Uuid> = self.in_flight.iter().copied().collect();
            let (bus, lease) = (self.bus.id, self.bus.config.claim_lease);
            return Some(tokio::spawn(async move {
                let renewed = source
                    .db()
                    .write_call("renewing claims", async move |conn| {
                        let now = now_us();
                        let until = now + lease.as_micros() as i64;
                        Ok(B::renew_claims(conn, &ids, bus, now, until).await?)
                    })
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
            Done::Marked(Ok(Marked { ids, finished })) => {
                let count = ids.len();
                self.bus.delivered.fetch_add(finished as u64, Relaxed);
                self.source.outbox().gauges.delivered(finished as u64);
                self.to_mark.drain(..count);
                for id in ids {
                    self.in_flight.remove(&id);
                    self.source.outbox().busy.fetch_sub(1, Relaxed);
                    self.recent.insert(id);
                }
                // Those that finished while this mark ran are due a linger
                // after the first of them (`finish` set it): marks go out
                // at most one linger apart however busy the outbox is.
                // Those left over from a full batch go at once.
                if !self.to_mark.is_empty() {
                    self.mark_due.get_or_insert_with(Instant::now);
                }
            }
            Done::Marked(Err((_, error))) => {
                tracing::warn!(%module, %error, "marking messages delivered failed; will retry");
                self.mark_due = Some(Instant::now() + Duration::from_millis(100));
            }
            Done::Claimed {
                rows: Ok(mut rows),
                limit,
                stray,
            } => {
                let last = rows
                    .iter()
                    .filter_map(|row| row.id.0.as_ref().ok())
                    .map(|id| id.0)
                    .max();
                if !stray {
                    self.scan = match last {
                        Some(last) if rows.len() as i64 == limit => Some(Some(last)),
                        _ if std::mem::take(&mut self.scan_again) => Some(None),
                        _ => None,
                    };
                }
                self.look_ahead |= self.scan.is_none();
                // RETURNING does not promise an order. A key's messages
                // start in the key's order (its lanes take them as they
                // come), which the order of their ids need not be.
                rows.sort_by_key(|row| {
                    let sequence = row.key_seq.0.as_ref().ok().copied().flatten();
                    (sequence, row.id.0.as_ref().map(|id| id.0).ok())
                });
                for row in rows {
                    match row.decode() {
                        Ok(envelope) => self.start(Arc::new(envelope)),
                        Err(malformed) => self.reject(*malformed),
                    }
                }
            }
            Done::Claimed {
                rows: Err(error),
                stray: true,
                ..
            } => {
                tracing::warn!(%module, %error, "claiming stray rows ahead of now failed; the next periodic scan tries again");
            }
            Done::Claimed {
                rows: Err(error), ..
            } => {
                tracing::warn!(%module, %error, "scanning the outbox failed; will retry");
                self.scan = None;
                self.scan_again = false;
            }
            Done::Upkept(Ok(Upkeep { others, stalled })) => {
                self.others = others;
                self.source.outbox().gauges.stalled(stalled.count);
                if let Some(message) = stalled.oldest {
                    let repeat = self.bus.config.stalled_after;
                    let warned_lately = self
                        .warned
                        .is_some_and(|(id, at)| id == message.id && at.elapsed() < repeat);
                    if !warned_lately {
                        self.warned = Some((message.id, Instant::now()));
                        let here = self
                            .in_flight
                            .contains(&message.id)
                            .then(|| self.bus.retry_note(message.id));
                        let blocked_by = message.blocked_by(self.bus.id, now_us(), here);
                        tracing::warn!(
                            %module,
                            message_id = %message.id,
                            stalled = stalled.count,
                            %blocked_by,
                            "a message has been pending for longer than {:?}",
                            self.bus.config.stalled_after
                        );
                    }
                }
            }
            Done::Upkept(Err(error)) => {
                tracing::warn!(%module, %error, "keeping up the subscriptions failed; will retry");
            }
            Done::LookedAhead(Ok(ahead)) => {
                let now = self.source.outbox().clock.now_us();
                let mut timer_set = false;
                for (id, due) in ahead {
                    match due {
                        // The next scheduled message: due when its time has
                        // come and a scan bounded by now reads its id.
                        Some(due) if due > now => {
                            if !timer_set {
                                self.due_at(due.max(due_by_id(id)));
                                timer_set = true;
                            }
                        }
                        // A stray row: claimed past the bound, once per
                        // periodic scan.
                        _ => {
                            if self.strays_tried.insert(id) {
                                self.stray = Some(self.stray.map_or(id, |s| s.max(id)));
                            }
                        }
                    }
                }
            }
            Done::LookedAhead(Err(error)) => {
                tracing::warn!(%module, %error, "looking for the next scheduled message failed; the next scan looks again");
            }
            Done::Renewed(Ok(_)) => {}
            Done::Renewed(Err(error)) => {
                tracing::warn!(%module, %error, "renewing claims failed; will retry");
            }
        }
    }

    /// Sets the timer for a scheduled message due at `due_us` (µs since the
    /// Unix epoch), unless it is already set sooner.
    fn due_at(&mut self, due_us: i64) {
        let now = self.source.outbox().clock.now_us();
        let wait = Duration::from_micros(due_us.saturating_sub(now).max(0) as u64);
        let due = Instant::now() + wait;
        if self.next_due.is_none_or(|next| due < next) {
            self.next_due = Some(due);
        }
    }

    /// Scans the outbox from the beginning: now, or after the scan under way.
    fn request_scan(&mut self) {
        match self.scan {
            None => self.scan = Some(None),
            Some(_) => self.scan_again = true,
        }
    }

    /// Takes a row a scan could not decode out of circulation: records it
    /// as a dead letter of the outbox's module and marks it delivered, for
    /// every subscriber (none could read it either). A row whose id cannot
    /// be read cannot be marked: it is reported, every time a scan meets it.
    fn reject(&mut self, malformed: MalformedRow) {
        let Some(id) = malformed.id else {
            tracing::error!(
                module = %self.source.name(),
                reason = %malformed.reason,
                "an outbox row whose id cannot be read is skipped; repair or delete it by hand"
            );
            return;
        };
        if !self.in_flight.insert(id) {
            return;
        }
        self.source.outbox().busy.fetch_add(1, Relaxed);
        tokio::spawn(reject_row(
            self.bus.clone(),
            self.source.clone(),
            malformed,
            self.finished.clone(),
        ));
    }

    /// Finishes or hands over messages now (while stopping).
    async fn mark(&self, ids: Vec<Uuid>) -> Done {
        mark(
            self.source.clone(),
            ids,
            self.bus.id,
            self.served_ids.clone(),
            self.others,
        )
        .await
    }

    /// Records that this bus no longer serves its subscriptions here: they
    /// keep their messages until served again or retired.
    async fn stop_serving(&self) {
        if self.served_ids.is_empty() {
            return;
        }
        let served = self.served_ids.clone();
        let stopped = self
            .source
            .db()
            .write_call(
                "recording that the subscriptions stopped",
                async move |conn| Ok(B::stop_serving(conn, &served, now_us()).await?),
            )
            .await;
        if let Err(error) = stopped {
            tracing::warn!(module = %self.source.name(), %error, "recording that the subscriptions stopped failed");
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
        self.source.outbox().busy.fetch_add(1, Relaxed);
        // Boxed: a task moves its future whole, several times over its life
        // (into the task, then each change of stage), and this one is large.
        tokio::spawn(Box::pin(deliver_message(
            self.bus.clone(),
            self.source.clone(),
            envelope,
            self.finished.clone(),
        )));
    }

    fn finish(&mut self, done: Finished) {
        match done {
            Finished::Delivered(id) => {
                self.to_mark.push(id);
                let linger = self.bus.config.mark_linger;
                self.mark_due.get_or_insert_with(|| Instant::now() + linger);
            }
            Finished::Rejected(id) => {
                self.in_flight.remove(&id);
                self.source.outbox().busy.fetch_sub(1, Relaxed);
                self.recent.insert(id);
            }
            Finished::Abandoned(id) => self.abandoned.push(id),
        }
    }

    /// Gives up this bus's claims on the outbox's undelivered rows (the
    /// abandoned deliveries, the messages not yet taken), so the next bus, in
    /// this process or another, takes them at once.
    async fn release_claims(&mut self) {
        let bus = self.bus.id;
        let released = self
            .source
            .db()
            .write_call("releasing claims", async move |conn| {
                Ok(B::release_claims(conn, bus).await?)
            })
            .await;
        if let Err(error) = released {
            tracing::warn!(module = %self.source.name(), %error, "releasing claims failed; they expire by themselves");
        }
    }
}

/// Gives the scheduled keyed messages among a scan's claimed rows their
/// place in their keys, now that they are due, in one transaction of the
/// module (see [`OutboxStatements::number_due`]). If that fails, they are
/// left out of this scan (still claimed by this bus, they are taken again
/// by the next).
///
/// [`OutboxStatements::number_due`]: crate::store::outbox::OutboxStatements::number_due
async fn number_due<B: Backend>(
    source: &ModuleHandle<B>,
    mut rows: Vec<ClaimedRow>,
) -> Vec<ClaimedRow> {
    let unnumbered = |row: &ClaimedRow| {
        matches!(row.ordering_key.0, Ok(Some(_))) && matches!(row.key_seq.0, Ok(None))
    };
    let now = now_us();
    let numbering: Vec<OutboxRow> = rows
        .iter()
        .filter(|row| unnumbered(row))
        .filter_map(|row| {
            Some(OutboxRow {
                id: Id(row.id.0.as_ref().ok()?.0),
                topic: String::from_utf8(row.topic.0.as_ref().ok()?.clone()).ok()?,
                payload: String::new(),
                correlation_id: Id(Uuid::nil()),
                causation_id: None,
                created_at_us: now,
                claimed_by: None,
                claimed_until_us: None,
                ordering_key: row.ordering_key.0.as_ref().ok()?.clone(),
                key_seq: None,
                key_publisher: None,
                key_previous_at_us: None,
                due_at_us: None,
                #[cfg(feature = "opentelemetry")]
                trace_context: None,
            })
        })
        .collect();
    if numbering.is_empty() {
        return rows;
    }
    let numbered = source
        .transaction(async move |tx| {
            Ok::<_, crate::error::Error>(B::number_due(tx.conn(), numbering).await?)
        })
        .await;
    match numbered {
        Ok(numbered) => {
            for row in rows.iter_mut().filter(|row| unnumbered(row)) {
                let id = row.id.0.as_ref().ok().map(|id| id.0);
                if let Some(place) = numbered.iter().find(|n| Some(n.id.0) == id) {
                    row.key_seq = Lenient(Ok(place.key_seq));
                    row.key_previous_at_us = Lenient(Ok(place.key_previous_at_us));
                }
            }
        }
        Err(error) => {
            tracing::warn!(module = %source.name(), %error, "numbering scheduled keyed messages that are due failed; the next scan takes them again");
            rows.retain(|row| !unnumbered(row));
        }
    }
    rows
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
            let ends = match &*routes {
                // One route, the usual case: awaited in place, without the
                // allocation join_all makes for its routes' futures.
                [route] => vec![deliver_to_route(&bus, route, &source, &envelope).await],
                routes => {
                    join_all(
                        routes
                            .iter()
                            .map(|route| deliver_to_route(&bus, route, &source, &envelope)),
                    )
                    .await
                }
            };
            let done = !ends.contains(&RouteEnd::Stopped);
            #[cfg(feature = "testing")]
            if done {
                let handled: Vec<_> = routes
                    .iter()
                    .zip(&ends)
                    .filter(|(_, end)| **end == RouteEnd::Handled)
                    .map(|(route, _)| route)
                    .collect();
                maybe_inject_duplicate(&bus, handled, &source, &envelope).await;
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
            record_dead_letter(&bus, &source, &envelope, "", 0, &reason, None).await
        }
    };
    bus.forget_retry(id);
    // Lateness counts from the due time, or from the commit when that came
    // after it (a time already past when published).
    if let Some(due) = envelope.due_at_us.filter(|_| done) {
        let due = due.max(envelope.created_at_us);
        let now = source.outbox().clock.now_us();
        let late = now.saturating_sub(due).max(0) as u64;
        source
            .outbox()
            .gauges
            .delivered_late(Duration::from_micros(late));
    }
    let _ = finished.send(if done {
        Finished::Delivered(id)
    } else {
        Finished::Abandoned(id)
    });
}

/// Records a malformed row as a dead letter of its outbox's module and
/// marks it delivered, retrying while the database fails.
async fn reject_row<B: Backend>(
    bus: Arc<BusCore<B>>,
    source: ModuleHandle<B>,
    malformed: MalformedRow,
    finished: mpsc::UnboundedSender<Finished>,
) {
    let id = malformed.envelope.id;
    let done = record_dead_letter(
        &bus,
        &source,
        &malformed.envelope,
        "",
        0,
        &malformed.reason,
        None,
    )
    .await
        && until_done(&bus, &source, "marking a malformed row delivered", || {
            source
                .db()
                .write_call("marking a malformed row delivered", async move |conn| {
                    B::mark_delivered(conn, id, now_us()).await?;
                    Ok(())
                })
        })
        .await;
    let _ = finished.send(if done {
        Finished::Rejected(id)
    } else {
        Finished::Abandoned(id)
    });
}

/// Runs the module's retention sweep every retention interval while the
/// bus runs, starting one interval after the bus (after its first scan has
/// redelivered what a crash left behind).
async fn sweep_retention_periodically<B: Backend>(bus: Arc<BusCore<B>>, module: ModuleHandle<B>) {
    let retention = module.retention();
    if retention.inbox.is_none() && retention.outbox.is_none() {
        return;
    }
    loop {
        if until_stopped(&bus.stop, sleep(retention.interval))
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
