//! The outbox: a module's table of published messages, and this process's
//! side of it — what may be published, the hand-over of committed messages
//! to the bus (in memory, or by a scan of the table), who claims them, and
//! the records of who subscribes to them.
//!
//! Transactions write the rows ([`Tx`](crate::Tx), at commit); the bus's
//! dispatcher takes them from here.

pub(crate) mod clock;
pub(crate) mod subscription;
pub(crate) mod watchdog;

use crate::error::{Error, Result};
use crate::message::Envelope;
use crate::metrics::OutboxGauges;
use crate::outbox::clock::DueClock;
use crate::store::settings::WakeupChannel;
use crate::tracking::Trackers;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use uuid::Uuid;

/// Committed messages the bus has not received yet are held in memory up to
/// this many per module; past it the bus finds them in the outbox table.
const ANNOUNCE_CAPACITY: usize = 4096;

/// One module's outbox as this process sees it: shared by the module's
/// transactions (which write it and announce their messages) and the bus
/// (which takes them).
pub(crate) struct Outbox {
    /// The module whose outbox this is.
    pub(crate) module: Arc<str>,
    /// Topics this module may publish.
    pub(crate) publishes: HashSet<&'static str>,
    /// Largest encoded message the module may publish.
    pub(crate) max_payload_bytes: usize,
    /// The outbox as last read, and its delivered count.
    pub(crate) gauges: OutboxGauges,
    /// Committed messages on their way to the bus (the fast path: no polling).
    announced: mpsc::Sender<Arc<Envelope>>,
    /// The receiving end, taken by the bus when the module joins it.
    announcements: Mutex<Option<mpsc::Receiver<Arc<Envelope>>>>,
    /// Set when the bus must look in the outbox table: a committed message
    /// did not fit in the channel, or another process committed messages
    /// (PostgreSQL notification).
    scan_requested: AtomicBool,
    /// Wakes the bus after a scan is requested.
    wake: Notify,
    /// The earliest due time (µs since the Unix epoch) of the scheduled
    /// messages committed since the bus last looked; `i64::MAX` for none.
    soonest_due_us: AtomicI64,
    /// Wakes the bus when a scheduled message is committed, to set its
    /// timer.
    scheduled: Notify,
    /// PostgreSQL: the channel that wakes buses when messages no bus of the
    /// committing process will deliver are committed, and the URL a bus
    /// listens on it with. `None` on SQLite.
    pub(crate) wakeup: Option<WakeupChannel>,
    /// Messages of this outbox the bus holds in memory (in delivery or
    /// waiting for a retry).
    pub(crate) busy: AtomicUsize,
    /// The bus this module joined and its claim lease: messages are written
    /// already claimed by it, so no other process's bus delivers them while
    /// this one does. Cleared when that bus stops, so that later commits are
    /// written unclaimed (and, on PostgreSQL, wake other processes' buses)
    /// instead of waiting for a dead claim's lease.
    claimant: Mutex<Option<(Uuid, Duration)>>,
    /// The test sessions watching the module (feature `testing`).
    pub(crate) trackers: Trackers,
    /// The time its scheduled messages are due by.
    pub(crate) clock: DueClock,
}

impl Outbox {
    /// The outbox of module `module`.
    pub(crate) fn new(
        module: Arc<str>,
        publishes: HashSet<&'static str>,
        max_payload_bytes: usize,
        wakeup: Option<WakeupChannel>,
    ) -> Self {
        let (announced, announcements) = mpsc::channel(ANNOUNCE_CAPACITY);
        Outbox {
            gauges: OutboxGauges::new(&module),
            module,
            publishes,
            max_payload_bytes,
            announced,
            announcements: Mutex::new(Some(announcements)),
            scan_requested: AtomicBool::new(false),
            wake: Notify::new(),
            soonest_due_us: AtomicI64::new(i64::MAX),
            scheduled: Notify::new(),
            wakeup,
            busy: AtomicUsize::new(0),
            claimant: Mutex::new(None),
            trackers: Trackers::default(),
            clock: DueClock::default(),
        }
    }

    /// Hands messages that just committed to the bus, and tells the
    /// module's trackers. A message due after `due_now_us` (the outbox's
    /// clock at the commit) is not handed over: the bus sets its timer for
    /// it.
    pub(crate) fn announce(&self, published: Vec<Envelope>, due_now_us: i64) {
        self.gauges.published(published.len() as u64);
        let published: Vec<Arc<Envelope>> = published.into_iter().map(Arc::new).collect();
        self.trackers.published(&self.module, &published);
        let mut overflowed = false;
        let mut soonest_due = None;
        for envelope in published {
            match envelope.due_at_us.filter(|&due| due > due_now_us) {
                Some(due) => soonest_due = Some(soonest_due.map_or(due, |s: i64| s.min(due))),
                None => {
                    if self.announced.try_send(envelope).is_err() {
                        overflowed = true;
                    }
                }
            }
        }
        if let Some(due) = soonest_due {
            self.schedule(due);
        }
        if overflowed {
            self.request_scan();
        }
    }

    /// Tells the bus that scheduled messages committed, the first of them
    /// due at `due_at_us`: it sets its timer for them (they are not
    /// announced; a scan claims them once due).
    pub(crate) fn schedule(&self, due_at_us: i64) {
        self.soonest_due_us.fetch_min(due_at_us, Relaxed);
        self.scheduled.notify_one();
    }

    /// Waits until scheduled messages are committed, and returns when the
    /// first of them is due.
    pub(crate) async fn scheduled(&self) -> i64 {
        loop {
            self.scheduled.notified().await;
            let due = self.soonest_due_us.swap(i64::MAX, Relaxed);
            if due != i64::MAX {
                return due;
            }
        }
    }

    /// The bus delivering this outbox in this process, and its claim lease.
    pub(crate) fn claimant(&self) -> Option<(Uuid, Duration)> {
        *self.claimant.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `bus` delivers this outbox from now on (`Some`), or that
    /// it stopped (`None`, only if it is still `bus`).
    pub(crate) fn set_claimant(&self, bus: Uuid, lease: Option<Duration>) {
        let mut claimant = self.claimant.lock().unwrap_or_else(|p| p.into_inner());
        match lease {
            Some(lease) => *claimant = Some((bus, lease)),
            None if claimant.is_some_and(|(id, _)| id == bus) => *claimant = None,
            None => {}
        }
    }

    /// Moves the clock for due times ahead by `by`, and asks the bus to
    /// scan: what became due is delivered at once (a test session's
    /// [`advance`](crate::testing::Session::advance)).
    #[cfg(feature = "testing")]
    pub(crate) fn advance_clock(&self, by: Duration) {
        self.clock.advance(by);
        self.request_scan();
    }

    /// Asks the bus to scan the outbox table from the beginning. Requests
    /// made while it is busy collapse into one.
    pub(crate) fn request_scan(&self) {
        self.scan_requested.store(true, Relaxed);
        self.wake.notify_one();
    }

    /// Waits until a scan is requested.
    pub(crate) async fn scan_request(&self) {
        loop {
            self.wake.notified().await;
            if self.scan_requested.swap(false, Relaxed) {
                return;
            }
        }
    }

    /// Committed messages announced to the bus and not yet taken by it.
    pub(crate) fn announced_waiting(&self) -> usize {
        self.announced.max_capacity() - self.announced.capacity()
    }

    /// Messages the bus holds or has not taken yet: work under way.
    pub(crate) fn in_memory(&self) -> usize {
        self.busy.load(Relaxed) + self.announced_waiting()
    }

    /// Takes the stream of committed messages; a module joins one bus at a
    /// time.
    pub(crate) fn take_announcements(&self) -> Result<mpsc::Receiver<Arc<Envelope>>> {
        self.announcements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::AlreadyAttached(self.module.to_string()))
    }

    /// Returns the stream of committed messages when the bus it joined
    /// stops, so that the module can join another.
    pub(crate) fn give_back_announcements(&self, announcements: mpsc::Receiver<Arc<Envelope>>) {
        *self.announcements.lock().unwrap_or_else(|p| p.into_inner()) = Some(announcements);
    }
}
