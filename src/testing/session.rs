//! Tracked sessions: run application code, then wait until every message
//! it caused is done with — decided from tickbox's own bookkeeping, never
//! from a timer.

use crate::bus::handle::BusHandle;
use crate::delivery::outcome::{DeliveryError, Outcome};
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use crate::testing::report::Report;
use crate::tracking::{Event, Happened, Tracker};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use uuid::Uuid;

/// How long [`Session::wait`] waits by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A handler, as `(module, handler)`.
type HandlerId = (String, String);

/// A tracked session over the modules of a bus: every message published
/// from now on by application code (a transaction that is no handler's),
/// every message a tracked message's handlers publish, every retry and
/// dead letter, until each tracked message has been handled, skipped as a
/// duplicate or dead-lettered by every handler of the bus that subscribes to
/// it.
///
/// ```no_run
/// # use tickbox::{Sqlite, ModuleHandle, BusHandle};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Debug, Serialize, Deserialize)] struct OrderPlaced { order_id: i64 }
/// # impl tickbox::Message for OrderPlaced { const TOPIC: &'static str = "orders.order_placed"; }
/// # async fn example(orders: ModuleHandle<Sqlite>, bus: BusHandle<Sqlite>) -> tickbox::Result<()> {
/// use tickbox::testing::Session;
///
/// let session = Session::start(&bus);
/// orders
///     .transaction(async move |tx| tx.publish(&OrderPlaced { order_id: 7 }).map(drop))
///     .await?;
/// let report = session.wait().await; // every cascading message is done
/// assert_eq!(report.handled("warehouse.reserve").len(), 1);
/// # Ok(()) }
/// ```
///
/// A handler's failed attempt fails the session (at once, with the error
/// and the message) unless [`allow_failures`](Session::allow_failures)
/// says failures are what the test is about; the timeout only bounds the
/// wait, and a session still unfinished then reports what it was waiting
/// for.
pub struct Session<B: Backend> {
    /// What the session saw, shared with the modules it watches.
    state: Arc<State>,
    /// The bus's modules, for [`Session::deliver_to`].
    modules: Vec<ModuleHandle<B>>,
    /// How long [`Session::wait`] waits.
    timeout: Duration,
}

/// What a session saw, and what it still waits for.
struct State {
    /// The handlers of the watched modules that subscribe to each topic.
    subscribers: HashMap<String, Vec<HandlerId>>,
    /// Failures end the session unless allowed.
    allow_failures: Mutex<bool>,
    /// Probability of failing a handler's successful attempt.
    failure_rate: Mutex<f64>,
    /// Probability of delivering a handled message once more.
    duplicate_rate: Mutex<f64>,
    /// Events and the messages tracked.
    seen: Mutex<Seen>,
    /// Woken at every event.
    changed: Notify,
}

/// The events and the tracked messages.
#[derive(Default)]
struct Seen {
    events: Vec<Event>,
    /// Each tracked message: its envelope and the handlers that still owe
    /// it an end.
    tracked: HashMap<Uuid, (Arc<Envelope>, BTreeSet<HandlerId>)>,
}

impl Tracker for State {
    fn seen(&self, event: Event) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let id = event.envelope.id;
        match &event.happened {
            Happened::Published => {
                let caused_by_flow = match event.envelope.causation_id {
                    None => true,
                    Some(cause) => seen.tracked.contains_key(&cause),
                };
                if !caused_by_flow {
                    return;
                }
                let owed = self
                    .subscribers
                    .get(&event.envelope.topic)
                    .map(|handlers| handlers.iter().cloned().collect())
                    .unwrap_or_default();
                seen.tracked.insert(id, (event.envelope.clone(), owed));
            }
            Happened::Handled | Happened::Duplicate | Happened::DeadLettered { .. } => {
                let Some((_, owed)) = seen.tracked.get_mut(&id) else {
                    return;
                };
                let handler = (
                    event.module.clone(),
                    event.handler.clone().unwrap_or_default(),
                );
                owed.remove(&handler);
            }
            Happened::Failed { .. } => {
                if !seen.tracked.contains_key(&id) {
                    return;
                }
            }
        }
        seen.events.push(event);
        drop(seen);
        self.changed.notify_waiters();
    }

    fn inject_failure(&self) -> bool {
        let rate = *self.failure_rate.lock().unwrap_or_else(|p| p.into_inner());
        rate > 0.0 && fastrand::f64() < rate
    }

    fn duplicate_rate(&self) -> f64 {
        *self
            .duplicate_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Backend> Session<B> {
    /// Starts tracking what happens on the modules of `bus`.
    pub fn start(bus: &BusHandle<B>) -> Self {
        Self::over(bus.modules())
    }

    /// Starts tracking what happens on `modules` (which need not be on a
    /// bus: [`Session::deliver_to`] delivers straight to a handler).
    pub fn over(modules: &[ModuleHandle<B>]) -> Self {
        let mut subscribers: HashMap<String, Vec<HandlerId>> = HashMap::new();
        for module in modules {
            for entry in &module.core.handlers.entries {
                subscribers
                    .entry(entry.handler.topic().to_string())
                    .or_default()
                    .push((module.name().to_string(), entry.name.to_string()));
            }
        }
        let state = Arc::new(State {
            subscribers,
            allow_failures: Mutex::new(false),
            failure_rate: Mutex::new(0.0),
            duplicate_rate: Mutex::new(0.0),
            seen: Mutex::new(Seen::default()),
            changed: Notify::new(),
        });
        let tracker: Arc<dyn Tracker> = state.clone();
        for module in modules {
            module.core.outbox.trackers.add(Arc::downgrade(&tracker));
        }
        Session {
            state,
            modules: modules.to_vec(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Failed attempts and dead letters do not end the session: the test is
    /// about them (retries, dead letters). They are in the report.
    pub fn allow_failures(self) -> Self {
        *self
            .state
            .allow_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = true;
        self
    }

    /// Fails each successful handler attempt with this probability, after
    /// the handler's work and before COMMIT, as a crash there would (the
    /// bus retries it). Implies [`allow_failures`](Session::allow_failures).
    pub fn inject_failures(self, probability: f64) -> Self {
        *self
            .state
            .failure_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = probability;
        self.allow_failures()
    }

    /// Delivers each handled message once more with this probability, as
    /// an at-least-once transport may (the inbox skips it).
    pub fn inject_duplicates(self, probability: f64) -> Self {
        *self
            .state
            .duplicate_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = probability;
        self
    }

    /// How long [`Session::wait`] waits before it reports what is
    /// unfinished (30 s by default).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Delivers `envelope` straight to `handler` of `module` (through the
    /// inbox guard, not the bus; see
    /// [`ModuleHandle::deliver_to`](crate::ModuleHandle::deliver_to)), as
    /// part of the session's flow: what the handler publishes is tracked.
    pub async fn deliver_to(
        &self,
        module: &ModuleHandle<B>,
        envelope: Envelope,
        handler: &str,
    ) -> Result<Outcome, DeliveryError> {
        {
            let mut seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
            let owed = BTreeSet::from([(module.name().to_string(), handler.to_string())]);
            seen.tracked
                .insert(envelope.id, (Arc::new(envelope.clone()), owed));
        }
        module.deliver_to(envelope, handler).await
    }

    /// What the session has seen so far.
    pub fn report(&self) -> Report {
        let seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
        Report {
            events: seen.events.clone(),
        }
    }

    /// Waits until every tracked message is done with by every handler
    /// that owes it an end, and returns what happened; panics with what is
    /// unfinished, or with the first failure (unless allowed), so that the
    /// test fails with the reason.
    pub async fn wait(&self) -> Report {
        match self.try_wait().await {
            Ok(report) => report,
            Err(unfinished) => panic!("{unfinished}"),
        }
    }

    /// Like [`Session::wait`], returning what went wrong instead of
    /// panicking.
    pub async fn try_wait(&self) -> Result<Report, Unfinished> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let changed = self.state.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(ended) = self.ended(false) {
                return ended;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.ended(true).unwrap_or_else(|| unreachable!());
            }
        }
    }

    /// The session's end if it has one: finished, failed, or (when
    /// `timed_out`) unfinished.
    fn ended(&self, timed_out: bool) -> Option<Result<Report, Unfinished>> {
        let allow_failures = *self
            .state
            .allow_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
        let report = Report {
            events: seen.events.clone(),
        };
        if !allow_failures {
            if let Some(failure) = report.all_failures().first() {
                let failure = (*failure).clone();
                return Some(Err(Unfinished {
                    why: format!(
                        "handler `{}` of module `{}` failed on message {} (`{}`, payload {}): {}",
                        failure.handler.as_deref().unwrap_or(""),
                        failure.module,
                        failure.envelope.id,
                        failure.envelope.topic,
                        failure.envelope.payload,
                        match &failure.happened {
                            Happened::Failed { error, .. } => error.clone(),
                            Happened::DeadLettered { reason } => format!("dead-lettered: {reason}"),
                            _ => String::new(),
                        }
                    ),
                    outstanding: Vec::new(),
                    report,
                }));
            }
        }
        let outstanding: Vec<String> = seen
            .tracked
            .values()
            .filter(|(_, owed)| !owed.is_empty())
            .map(|(envelope, owed)| {
                let owed: Vec<String> = owed.iter().map(|(m, h)| format!("{m}/{h}")).collect();
                format!(
                    "{} `{}` {}: waiting for {}",
                    envelope.id,
                    envelope.topic,
                    envelope.payload,
                    owed.join(", ")
                )
            })
            .collect();
        if outstanding.is_empty() {
            return Some(Ok(report));
        }
        timed_out.then(|| {
            Err(Unfinished {
                why: format!("the flow was not done after {:?}", self.timeout),
                outstanding,
                report,
            })
        })
    }

    /// The modules the session watches.
    pub fn modules(&self) -> &[ModuleHandle<B>] {
        &self.modules
    }
}

/// Why a session did not finish: a failure it was not told to allow, or
/// messages still owed an end when its timeout passed.
#[derive(Clone)]
pub struct Unfinished {
    /// What went wrong.
    pub why: String,
    /// The messages still owed an end, and by which handlers.
    pub outstanding: Vec<String>,
    /// What the session saw.
    pub report: Report,
}

impl fmt::Display for Unfinished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.why)?;
        if !self.outstanding.is_empty() {
            writeln!(f, "still owed an end:")?;
            for line in &self.outstanding {
                writeln!(f, "  {line}")?;
            }
        }
        write!(f, "{}", self.report)
    }
}

impl fmt::Debug for Unfinished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Unfinished {}
