//! The whole flow across processes: which handlers it needs, the runs
//! placing orders, and the counts that tell whether it is done.
//!
//! One process may run all three modules, or several processes some of them
//! each (`--modules`) over the same databases, or over a RabbitMQ broker
//! each with its own. tickbox delivers every message to every subscribed
//! handler in whichever process; what this file adds is how each process of
//! the example knows that the flow is done, and what to name when it is not.
//!
//! Over the local transport every process sees the three databases and
//! waits for the whole flow. Over amqp a process sees the databases of its
//! own modules and those found with the check flags: one that sees the
//! orders database waits for the orders it shows (confirmed, and e-mailed
//! if it sees the notifications database); one that does not waits until
//! its handlers have been idle for `--settle` after its database holds work
//! (see [`Settle`]).

use crate::cli::{Args, ModuleName};
use crate::db::ShopDb;
use crate::faults::retrying;
use crate::progress::Progress;
use crate::tables::{self, PlacingRun};
use crate::{Shop, CONFIRM_ORDER, REJECT_ORDER, RESERVE_STOCK, SEND_CONFIRMATION, TIME_OUT_ORDER};
use std::time::{Duration, Instant};
use tickbox::{BusHandle, ModuleHandle, StoreStats, Subscription};
use tokio_util::sync::CancellationToken;

/// How waiting for the work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// Done, or nothing left but what dead letters hold up.
    Finished,
    /// The deadline came first; what was still unfinished.
    TimedOut(String),
    /// Ctrl-C.
    Interrupted,
}

/// Polls until the flow is done, as far as this process can see — or the
/// bus is idle while dead letters hold up the rest; until `deadline` or
/// Ctrl-C otherwise.
///
/// Done, when the orders database is seen here (always over the local
/// transport): the bus is idle (`BusHandle::wait_idle`: nothing in memory,
/// pending in its outboxes or, over amqp, in its handlers' queues), nothing
/// is pending or scheduled in any outbox seen (a run waits for the last
/// order's timeout, `--confirm-within`), every order is confirmed (and
/// e-mailed, if the notifications database is seen), rejected or cancelled,
/// and no run is still placing orders. Without the orders database (over amqp, the warehouse or the
/// notifications alone): the bus has been idle for `--settle` on end since
/// its database holds work (`Settle`).
///
/// Without a deadline, a process running all three modules gives itself a
/// minute plus 20 ms per order; one running some of them waits as long as
/// the others take.
pub async fn wait_until_done<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    args: &Args,
    deadline: Option<Instant>,
    stop: &CancellationToken,
    progress: &mut Progress,
) -> tickbox::Result<Drain> {
    if stop.is_cancelled() {
        return Ok(Drain::Interrupted);
    }
    let over_amqp = args.over_amqp();
    let mut counts = Counts::read(shop).await?;
    let orders = counts.orders.unwrap_or(0);
    let allowance = Duration::from_secs(60) + Duration::from_millis(20) * orders as u32;
    let deadline = deadline.or_else(|| args.runs_all().then(|| Instant::now() + allowance));
    // Over amqp the process running the orders module needs no other run
    // placing orders; over the local transport one running all modules.
    let places_here = if over_amqp {
        args.runs(ModuleName::Orders)
    } else {
        args.runs_all()
    };
    let least_runs = least_placing_runs(args.placers, places_here);
    let mut settle = Settle::new(args.settle);
    let drain = loop {
        if stop.is_cancelled() {
            break Drain::Interrupted;
        }
        // The runs are read before the counts, so that every order of a run
        // seen done is in the counts, and after them, so that a run that
        // starts (and perhaps ends) meanwhile shows.
        let runs_before = match &shop.orders {
            Some(orders) => Some(placing_runs(orders).await?),
            None => None,
        };
        counts = Counts::read(shop).await?;
        let idle = bus_idle(bus, over_amqp).await? && counts.pending + counts.scheduled == 0;
        let runs = match &shop.orders {
            Some(orders) => Some(placing_runs(orders).await?),
            None => None,
        };
        let done = match (&runs_before, &runs) {
            (Some(before), Some(runs)) => {
                idle && counts.complete()
                    && placing_done(before, least_runs)
                    && runs.len() == before.len()
                    && placing_done(runs, least_runs)
            }
            _ => settle.over(counts.hold_work(), idle),
        };
        if done {
            break Drain::Finished;
        }
        if idle && dead_letters(shop).await? > 0 {
            // With `--email-policy at-most-once`, an e-mail a crash cut
            // short is one of them, as the policy means it to be; the
            // check tells whether they all are.
            tracing::warn!("stopped waiting: nothing is pending, but dead letters hold up orders");
            break Drain::Finished;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let what =
                unfinished(shop, bus, counts, runs.as_deref(), least_runs, over_amqp).await?;
            tracing::error!("timed out: {what}");
            break Drain::TimedOut(what);
        }
        if progress.due() {
            progress.draining(&counts);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            () = stop.cancelled() => {}
        }
    };
    if progress.drawn() {
        progress.draining(&counts);
    }
    progress.finish();
    Ok(drain)
}

/// The handlers of the whole flow, each with the outbox it receives from:
/// (outbox, module, handler).
const FLOW: [(&str, &str, &str); 5] = [
    ("orders", "warehouse", RESERVE_STOCK),
    ("warehouse", "orders", CONFIRM_ORDER),
    ("warehouse", "orders", REJECT_ORDER),
    ("orders", "orders", TIME_OUT_ORDER),
    ("orders", "notifications", SEND_CONFIRMATION),
];

/// Every subscription recorded in the flow's outboxes, with its outbox.
async fn subscriptions<B: ShopDb>(
    shop: &Shop<B>,
) -> tickbox::Result<Vec<(&'static str, Subscription)>> {
    let mut all = Vec::new();
    for (outbox, module) in [("orders", &shop.orders), ("warehouse", &shop.warehouse)] {
        let Some(module) = module else { continue };
        let recorded = retrying("reading subscriptions", || module.subscriptions()).await?;
        all.extend(recorded.into_iter().map(|s| (outbox, s)));
    }
    Ok(all)
}

/// Waits until every handler of the [`FLOW`] has subscribed (each process
/// subscribes its own when its bus starts), until `deadline` or Ctrl-C. A
/// message committed while no handler subscribes to its topic is delivered
/// to none, so orders are placed only after this. Over amqp there is
/// nothing to wait for: a message no queue is bound for yet stays in the
/// outbox, published again until the handler's service has declared its
/// queue. Nor is there when this run places no order and disturbs nothing.
pub async fn await_subscriptions<B: ShopDb>(
    shop: &Shop<B>,
    args: &Args,
    deadline: Option<Instant>,
    stop: &CancellationToken,
) -> tickbox::Result<Drain> {
    if (args.orders() == 0 && !args.disturb) || args.over_amqp() {
        return Ok(Drain::Finished);
    }
    let mut said = None::<Instant>;
    loop {
        let recorded = subscriptions(shop).await?;
        let missing: Vec<String> = FLOW
            .iter()
            .filter(|(outbox, module, handler)| {
                !recorded
                    .iter()
                    .any(|(o, s)| o == outbox && s.module == *module && s.handler == *handler)
            })
            .map(|(outbox, module, handler)| {
                format!(
                    "{handler} (start `minishop --modules {module}` over the same databases) \
                     has not subscribed to the {outbox} outbox"
                )
            })
            .collect();
        if missing.is_empty() {
            return Ok(Drain::Finished);
        }
        let waiting = format!(
            "no orders placed yet, waiting for the flow's handlers: {}",
            missing.join("; ")
        );
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Drain::TimedOut(waiting));
        }
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            tracing::info!("{waiting}");
            said = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = stop.cancelled() => return Ok(Drain::Interrupted),
        }
    }
}

/// This process's run placing orders, recorded in the orders database so
/// that processes running the other modules wait for its orders. It renews
/// a lease while it places: a run killed meanwhile counts as ended once the
/// lease runs out.
pub struct Placing<'a, B: ShopDb> {
    orders: &'a ModuleHandle<B>,
    id: String,
    renewed: Instant,
}

impl<'a, B: ShopDb> Placing<'a, B> {
    pub async fn start(orders: &'a ModuleHandle<B>, planned: u64) -> tickbox::Result<Self> {
        let run = Placing {
            orders,
            id: uuid::Uuid::now_v7().to_string(),
            renewed: Instant::now(),
        };
        let planned = i64::try_from(planned).unwrap_or(i64::MAX);
        run.record(Change::Start(planned)).await?;
        Ok(run)
    }

    /// Renews the lease when a fifth of it has passed.
    pub async fn keep_alive(&mut self) -> tickbox::Result<()> {
        if self.renewed.elapsed() >= tables::RUN_LEASE / 5 {
            self.record(Change::Renew).await?;
            self.renewed = Instant::now();
        }
        Ok(())
    }

    pub async fn end(self) -> tickbox::Result<()> {
        self.record(Change::End).await
    }

    /// Changes the run's row, in a transaction of its own.
    async fn record(&self, change: Change) -> tickbox::Result<()> {
        retrying("recording the placing run", || {
            let id = self.id.clone();
            self.orders.transaction(async move |tx| {
                match change {
                    Change::Start(planned) => B::start_run(tx.conn(), &id, planned).await?,
                    Change::Renew => B::renew_run(tx.conn(), &id).await?,
                    Change::End => B::end_run(tx.conn(), &id).await?,
                }
                Ok::<_, tickbox::Error>(())
            })
        })
        .await
    }
}

#[derive(Clone, Copy)]
enum Change {
    Start(i64),
    Renew,
    End,
}

/// Every run that placed, or places, orders, read from the orders database.
pub async fn placing_runs<B: ShopDb>(orders: &ModuleHandle<B>) -> tickbox::Result<Vec<PlacingRun>> {
    retrying("reading the runs", || {
        orders.read(async |tx| Ok::<_, tickbox::Error>(B::load_runs(tx.conn()).await?))
    })
    .await
}

/// Whether the runs that place orders are done: none still placing, and
/// at least `least` of them recorded (see [`least_placing_runs`]).
pub fn placing_done(runs: &[PlacingRun], least: usize) -> bool {
    runs.iter().all(|run| !run.placing) && runs.len() >= least
}

/// How many placing runs a process waits to see recorded before the flow
/// can be done: `--placers` when given (so that a process that starts
/// late is waited for), else one for a process that places no orders
/// itself, else none.
pub fn least_placing_runs(placers: Option<usize>, places_here: bool) -> usize {
    placers.unwrap_or(usize::from(!places_here))
}

/// Cheap counts, read while waiting: `None` for what lives in a database
/// this process does not see.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub orders: Option<i64>,
    pub confirmed: Option<i64>,
    /// Orders rejected for want of stock.
    pub rejected: Option<i64>,
    /// Orders cancelled by their timeout (`--confirm-within`).
    pub cancelled: Option<i64>,
    pub reservations: Option<i64>,
    pub emails: Option<i64>,
    /// Messages of the outboxes seen here not yet delivered to every
    /// subscriber (over amqp: not yet confirmed by the broker).
    pub pending: i64,
    /// Messages of the outboxes seen here scheduled and not yet due: the
    /// orders' timeouts (`--confirm-within`).
    pub scheduled: i64,
}

impl Counts {
    pub async fn read<B: ShopDb>(shop: &Shop<B>) -> tickbox::Result<Counts> {
        let mut counts = Counts::default();
        if let Some(orders) = &shop.orders {
            let order_counts = retrying("reading progress", || {
                orders.read(async |tx| Ok::<_, tickbox::Error>(B::order_counts(tx.conn()).await?))
            })
            .await?;
            counts.orders = Some(order_counts.all);
            counts.confirmed = Some(order_counts.confirmed);
            counts.rejected = Some(order_counts.rejected);
            counts.cancelled = Some(order_counts.cancelled);
        }
        if let Some(warehouse) = &shop.warehouse {
            let reservations = retrying("reading progress", || {
                warehouse.read(async |tx| {
                    Ok::<_, tickbox::Error>(B::reservation_count(tx.conn()).await?)
                })
            })
            .await?;
            counts.reservations = Some(reservations);
        }
        if let Some(notifications) = &shop.notifications {
            let emails = retrying("reading progress", || {
                notifications
                    .read(async |tx| Ok::<_, tickbox::Error>(B::email_count(tx.conn()).await?))
            })
            .await?;
            counts.emails = Some(emails);
        }
        let stats = store_stats(shop).await?;
        counts.pending = stats.iter().map(|(_, s)| s.outbox_pending).sum();
        counts.scheduled = stats.iter().map(|(_, s)| s.outbox_scheduled).sum();
        Ok(counts)
    }

    /// Every order settled: confirmed (and e-mailed, if the notifications
    /// database is seen here), rejected or cancelled; false without the
    /// orders database.
    pub fn complete(&self) -> bool {
        match (self.orders, self.confirmed, self.rejected, self.cancelled) {
            (Some(orders), Some(confirmed), Some(rejected), Some(cancelled)) => {
                confirmed + rejected + cancelled == orders
                    && self.emails.is_none_or(|emails| emails >= confirmed)
            }
            _ => false,
        }
    }

    /// Whether the databases seen here hold any of the flow's work.
    pub fn hold_work(&self) -> bool {
        [self.orders, self.reservations, self.emails]
            .iter()
            .any(|n| n.unwrap_or(0) > 0)
    }
}

/// How a process that does not see the orders database knows the flow is
/// over: nothing tells it how many orders there are, so it runs until its
/// database holds work and its handlers have been idle (their queues empty,
/// nothing in flight, its outboxes drained) for the settle time on end. A
/// pause in the flow longer than that (the orders process stopped for
/// longer) ends it early; what came before is checked, what comes after
/// waits in its queues for its next run.
pub struct Settle {
    /// How long idle counts as over.
    pub after: Duration,
    /// Idle since.
    since: Option<Instant>,
}

impl Settle {
    pub fn new(after: Duration) -> Self {
        Settle { after, since: None }
    }

    /// Whether the flow is over, given whether the databases hold work and
    /// the handlers are idle now.
    pub fn over(&mut self, work: bool, idle: bool) -> bool {
        if !(work && idle) {
            self.since = None;
            return false;
        }
        self.since.get_or_insert_with(Instant::now).elapsed() >= self.after
    }
}

/// Each seen module's tickbox tables: pending outbox messages, dead
/// letters.
pub async fn store_stats<B: ShopDb>(shop: &Shop<B>) -> tickbox::Result<Vec<(String, StoreStats)>> {
    let mut stats = Vec::new();
    for (name, module) in shop.seen() {
        let module_stats = retrying("reading the outbox and dead letters", || {
            module.store_stats()
        })
        .await?;
        stats.push((name.to_string(), module_stats));
    }
    Ok(stats)
}

/// Dead letters over every module seen: deliveries the bus gave up on.
pub async fn dead_letters<B: ShopDb>(shop: &Shop<B>) -> tickbox::Result<i64> {
    let stats = store_stats(shop).await?;
    Ok(stats.iter().map(|(_, s)| s.dead_letters).sum())
}

/// Whether the bus has nothing left to do (`BusHandle::wait_idle`). Over a
/// broker, idle means idle for half a second on end, so it waits up to a
/// second; a broker out of reach meanwhile is not idle.
pub async fn bus_idle<B: ShopDb>(bus: &BusHandle<B>, over_broker: bool) -> tickbox::Result<bool> {
    if !over_broker {
        return retrying("checking the bus", || bus.wait_idle(Duration::ZERO)).await;
    }
    match bus.wait_idle(Duration::from_secs(1)).await {
        Err(error) if error.is_transient() => {
            tracing::debug!(%error, "checking the bus failed; not idle");
            Ok(false)
        }
        idle => idle,
    }
}

/// What keeps the flow from being done, for a run that gave up waiting.
/// `runs` are the runs placing orders, when the orders database is seen.
pub async fn unfinished<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    counts: Counts,
    runs: Option<&[PlacingRun]>,
    least_runs: usize,
    over_broker: bool,
) -> tickbox::Result<String> {
    let shown = |n: Option<i64>| n.map_or("-".to_string(), |n| n.to_string());
    let Counts {
        orders,
        confirmed,
        rejected,
        cancelled,
        reservations,
        emails,
        pending,
        scheduled,
    } = counts;
    let mut parts = vec![match (orders, confirmed) {
        (Some(orders), Some(confirmed)) => format!(
            "{confirmed}/{orders} orders confirmed, {} rejected, {} cancelled, {} e-mails, \
             {pending} messages pending",
            shown(rejected),
            shown(cancelled),
            shown(emails)
        ),
        _ => format!(
            "{} reservations, {} e-mails, {pending} messages pending",
            shown(reservations),
            shown(emails)
        ),
    }];
    if scheduled > 0 {
        parts.push(format!("{scheduled} timeouts not yet due"));
    }
    if let Some(runs) = runs {
        if runs.is_empty() && least_runs > 0 {
            parts.push(
                "no run has placed orders yet (start `minishop --modules orders --orders N` over \
                 the same databases)"
                    .into(),
            );
        } else if runs.len() < least_runs {
            parts.push(format!(
                "{} of the {least_runs} runs placing orders (--placers) have started",
                runs.len()
            ));
        }
        let open: Vec<_> = runs.iter().filter(|run| run.placing).collect();
        if !open.is_empty() {
            parts.push(format!(
                "{} runs still placing orders ({} planned)",
                open.len(),
                open.iter().map(|run| run.planned).sum::<i64>()
            ));
        }
    } else if !counts.hold_work() {
        parts.push(
            "no message has come yet (start `minishop --transport amqp --modules orders \
             --orders N` over the same broker and namespace)"
                .into(),
        );
    }
    if over_broker {
        #[cfg(feature = "amqp")]
        if let Some(broker) = bus.metrics().broker {
            for c in broker.consumers {
                if c.queue_depth + c.in_flight > 0 {
                    parts.push(format!(
                        "queue {} holds {} messages, {} in flight",
                        c.queue, c.queue_depth, c.in_flight
                    ));
                }
            }
        }
        if pending > 0 {
            parts.push(
                "outbox messages not yet taken by the broker: no queue is bound to their topic \
                 until the process running its handler has started once (or the broker is out \
                 of reach)"
                    .into(),
            );
        }
        return Ok(parts.join("; "));
    }
    let _ = bus;
    let now = tables::now_us();
    for (outbox, s) in subscriptions(shop).await? {
        if let (false, Some(oldest)) = (s.is_alive(now), s.oldest_pending_us) {
            parts.push(format!(
                "handler {} of module {} owes messages of the {outbox} outbox (the oldest {} s old) \
                 and no running process serves it (start `minishop --modules {}`)",
                s.handler,
                s.module,
                now.saturating_sub(oldest) / 1_000_000,
                s.module
            ));
        }
    }
    Ok(parts.join("; "))
}
