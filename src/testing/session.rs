//! Tracked sessions: run application code, then wait until every message
//! it caused is done with — decided from tickbox's own bookkeeping, never
//! from a timer.

use crate::bus::handle::BusHandle;
use crate::error::outcome::{DeliveryError, Outcome};
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::outbox::Outbox;
use crate::store::backend::Backend;
use crate::testing::report::Report;
use crate::tracking::{Event, Happened, Tracker};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::Location;
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
    /// The backend of the modules it watches.
    backend: PhantomData<fn() -> B>,
    /// How long [`Session::wait`] waits.
    timeout: Duration,
    /// The outboxes of the modules it watches, whose clocks
    /// [`Session::advance`] moves.
    outboxes: Vec<Arc<Outbox>>,
}

/// What a session saw, and what it still waits for.
struct State {
    /// The handlers of the watched modules that subscribe to each topic.
    subscribers: HashMap<String, Vec<HandlerId>>,
    /// What the test allows and injects.
    rules: Mutex<Rules>,
    /// Events and the messages tracked.
    seen: Mutex<Seen>,
    /// Woken at every event.
    changed: Notify,
}

/// What a test allows and injects.
#[derive(Debug, Clone, Copy, Default)]
struct Rules {
    /// Failures do not end the session.
    allow_failures: bool,
    /// Probability of failing a handler's successful attempt.
    failure_rate: f64,
    /// Probability of delivering a handled message once more.
    duplicate_rate: f64,
}

/// The events and the tracked messages.
#[derive(Default)]
struct Seen {
    events: Vec<Event>,
    /// Each tracked message: its envelope and the handlers that still owe
    /// it an end.
    tracked: HashMap<Uuid, (Arc<Envelope>, BTreeSet<HandlerId>)>,
    /// How many tracked messages some handler still owes an end.
    owing: usize,
    /// The index in `events` of the first failure or dead letter.
    first_failure: Option<usize>,
}

impl Seen {
    /// Tracks `envelope`, owed an end by `owed`.
    fn track(&mut self, envelope: Arc<Envelope>, owed: BTreeSet<HandlerId>) {
        let id = envelope.id;
        let owing = !owed.is_empty();
        if let Some((_, before)) = self.tracked.insert(id, (envelope, owed)) {
            self.owing -= usize::from(!before.is_empty());
        }
        self.owing += usize::from(owing);
    }

    /// The event about to be recorded is a failure or a dead letter.
    fn failed(&mut self) {
        let at = self.events.len();
        self.first_failure.get_or_insert(at);
    }

    /// `handler` ended message `id`.
    fn ended(&mut self, id: Uuid, handler: &HandlerId) {
        if let Some((_, owed)) = self.tracked.get_mut(&id) {
            if owed.remove(handler) && owed.is_empty() {
                self.owing -= 1;
            }
        }
    }
}

/// The handler an event of a delivery happened in.
fn handler_of(event: &Event) -> HandlerId {
    (
        event.module.clone(),
        event.handler.clone().unwrap_or_default(),
    )
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
                seen.track(event.envelope.clone(), owed);
            }
            _ if !seen.tracked.contains_key(&id) => return,
            Happened::Handled | Happened::Duplicate => seen.ended(id, &handler_of(&event)),
            Happened::DeadLettered { .. } => {
                seen.ended(id, &handler_of(&event));
                seen.failed();
            }
            Happened::Failed { .. } => seen.failed(),
        }
        seen.events.push(event);
        drop(seen);
        self.changed.notify_waiters();
    }

    fn inject_failure(&self) -> bool {
        let rate = self.rules().failure_rate;
        rate > 0.0 && fastrand::f64() < rate
    }

    fn duplicate_rate(&self) -> f64 {
        self.rules().duplicate_rate
    }
}

impl State {
    /// The rules as they stand.
    fn rules(&self) -> Rules {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the rules.
    fn set_rules(&self, change: impl FnOnce(&mut Rules)) {
        change(&mut self.rules.lock().unwrap_or_else(|p| p.into_inner()));
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
            for entry in module.handlers().entries.iter() {
                subscribers
                    .entry(entry.handler.topic().to_string())
                    .or_default()
                    .push((module.name().to_string(), entry.name.to_string()));
            }
        }
        let state = Arc::new(State {
            subscribers,
            rules: Mutex::new(Rules::default()),
            seen: Mutex::new(Seen::default()),
            changed: Notify::new(),
        });
        let tracker: Arc<dyn Tracker> = state.clone();
        for module in modules {
            module.outbox().trackers.add(Arc::downgrade(&tracker));
        }
        Session {
            state,
            backend: PhantomData,
            timeout: DEFAULT_TIMEOUT,
            outboxes: modules.iter().map(|m| m.outbox().clone()).collect(),
        }
    }

    /// Moves the clock of the watched modules ahead by `by`, for their
    /// scheduled messages: what was due within `by` from now is due at
    /// once, and the bus delivers it without waiting. A test of a
    /// 15-minute timeout publishes it, advances 15 minutes and waits for
    /// the session, in milliseconds:
    ///
    /// ```no_run
    /// # use tickbox::{Sqlite, ModuleHandle, BusHandle};
    /// # use serde::{Deserialize, Serialize};
    /// # use std::time::Duration;
    /// # #[derive(Debug, Serialize, Deserialize)] struct OrderTimedOut { order_id: i64 }
    /// # impl tickbox::Message for OrderTimedOut { const TOPIC: &'static str = "orders.timed_out"; }
    /// # async fn example(orders: ModuleHandle<Sqlite>, bus: BusHandle<Sqlite>) -> tickbox::Result<()> {
    /// use tickbox::testing::Session;
    ///
    /// let session = Session::start(&bus);
    /// orders
    ///     .transaction(async move |tx| {
    ///         tx.publish_after(Duration::from_secs(15 * 60), &OrderTimedOut { order_id: 7 })
    ///     })
    ///     .await?;
    /// session.advance(Duration::from_secs(15 * 60));
    /// let report = session.wait().await; // the timeout was handled
    /// assert_eq!(report.handled("orders.cancel_unconfirmed").len(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// The clock starts at the wall clock and only moves ahead; it decides
    /// when scheduled messages are due ([`Tx::publish_after`] counts from
    /// it), and nothing else: retries, leases and deadlines keep the wall
    /// clock. Modules outside the session keep theirs. A scheduled message
    /// is part of the flow that published it: [`Session::wait`] waits for
    /// it, so advance past it first.
    ///
    /// [`Tx::publish_after`]: crate::Tx::publish_after
    pub fn advance(&self, by: Duration) {
        for outbox in &self.outboxes {
            outbox.advance_clock(by);
        }
    }

    /// Failed attempts and dead letters do not end the session: the test is
    /// about them (retries, dead letters). They are in the report.
    pub fn allow_failures(self) -> Self {
        self.state.set_rules(|rules| rules.allow_failures = true);
        self
    }

    /// Fails each successful handler attempt with this probability, after
    /// the handler's work and before COMMIT, as a crash there would (the
    /// bus retries it). An injected failure uses up no attempt of the retry
    /// policy ([`FailureKind::Injected`](crate::FailureKind::Injected)), so
    /// injected failures alone never dead-letter a message, however high
    /// the probability. Implies [`allow_failures`](Session::allow_failures).
    pub fn inject_failures(self, probability: f64) -> Self {
        self.state
            .set_rules(|rules| rules.failure_rate = probability);
        self.allow_failures()
    }

    /// Delivers each handled message once more with this probability, as
    /// an at-least-once transport may (the inbox skips it).
    pub fn inject_duplicates(self, probability: f64) -> Self {
        self.state
            .set_rules(|rules| rules.duplicate_rate = probability);
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
            seen.track(Arc::new(envelope.clone()), owed);
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
    /// test fails with the reason. The panic message names the line of the
    /// test that called `wait`.
    #[track_caller]
    pub fn wait(&self) -> impl Future<Output = Report> + '_ {
        // An `async fn` cannot take its caller's location: it is read here,
        // when the future is made, and named in the panic message.
        let called_at = Location::caller();
        async move {
            match self.try_wait().await {
                Ok(report) => report,
                Err(unfinished) => panic!("session.wait() at {called_at}: {unfinished}"),
            }
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
    /// `timed_out`) unfinished. Cheap until there is one.
    fn ended(&self, timed_out: bool) -> Option<Result<Report, Unfinished>> {
        let allow_failures = self.state.rules().allow_failures;
        let seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
        let failure = seen.first_failure.filter(|_| !allow_failures);
        if failure.is_none() && seen.owing > 0 && !timed_out {
            return None;
        }
        let report = Report {
            events: seen.events.clone(),
        };
        if let Some(failure) = failure.map(|i| &seen.events[i]) {
            let error = match &failure.happened {
                Happened::Failed { error, .. } => error.clone(),
                Happened::DeadLettered { reason } => format!("dead-lettered: {reason}"),
                _ => String::new(),
            };
            return Some(Err(Unfinished {
                why: format!(
                    "handler `{}` of module `{}` failed on message {} (`{}`, payload {}): {error}",
                    failure.handler.as_deref().unwrap_or(""),
                    failure.module,
                    failure.envelope.id,
                    failure.envelope.topic,
                    failure.envelope.payload,
                ),
                outstanding: Vec::new(),
                report,
            }));
        }
        if seen.owing == 0 {
            return Some(Ok(report));
        }
        let outstanding = seen
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
        Some(Err(Unfinished {
            why: format!("the flow was not done after {:?}", self.timeout),
            outstanding,
            report,
        }))
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
