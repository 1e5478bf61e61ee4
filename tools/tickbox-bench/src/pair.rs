//! The workload through tickbox: a producer module and a consumer module on
//! fresh databases, the bus over them, and a measured run on them.

use crate::backend::BenchBackend;
use crate::cli::Args;
use crate::clock::{lock, Clock};
use crate::measure::{produce, wait_handled, RunResult, Stamp};
use crate::place::Place;
use crate::trace;
use crate::workload::{note, CurrentClock, Record, Work, HANDLER};
use crate::Res;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tickbox::{Backend, Bus, BusBuilder, BusHandle, HandlerOptions, ModuleHandle, Retention};

/// How often `--timeline` prints.
const TIMELINE_EVERY: Duration = Duration::from_millis(250);

/// A producer module and a consumer module with the [`Record`] handler, on
/// fresh databases, and their business tables.
pub(crate) struct Pair<B: Backend> {
    /// The producer module ("shop"): publishes [`Work`].
    pub(crate) shop: ModuleHandle<B>,
    /// The consumer module ("ledger"): handles it.
    pub(crate) ledger: ModuleHandle<B>,
    /// The clock the handler stamps, swapped by each run.
    pub(crate) clock: CurrentClock,
    /// A module joins one bus for good: started by the first run on the
    /// pair, kept for the next ones.
    bus: Mutex<Option<Arc<BusHandle<B>>>>,
    /// `--transport amqp`: the bus's broker settings, in a namespace of the
    /// pair's own, and the broker's URL (for the clean-up).
    #[cfg(feature = "amqp")]
    amqp: Option<(tickbox::Amqp, String)>,
}

impl<B: BenchBackend> Pair<B> {
    /// A producer and a consumer module on fresh databases, with their
    /// business tables; the producer's pool has one more connection than
    /// there are producers (the dispatcher's marks).
    pub(crate) async fn new(place: &Place, args: &Args) -> Res<Self> {
        let clock = Arc::new(RwLock::new(Clock::new(0, 0, false)));
        let mut shop = B::module(place, &place.fresh("shop"))
            .pool_size(args.concurrency + 1)
            .publishes::<Work>();
        if args.delete_delivered {
            shop = shop.retention(Retention {
                outbox: Some(Duration::ZERO),
                ..Retention::default()
            });
        }
        let shop = shop.start().await?;
        let ledger = B::module(place, &place.fresh("ledger"))
            .pool_size(args.concurrency)
            .handler_with(
                HANDLER,
                Record {
                    clock: clock.clone(),
                },
                HandlerOptions::new().batch(args.batch),
            )
            .start()
            .await?;
        for (module, sql) in [(&shop, B::CREATE_ORDERS), (&ledger, B::CREATE_EFFECTS)] {
            module
                .transaction(async move |tx| {
                    B::batch(tx.conn(), sql).await?;
                    Ok::<_, tickbox::Error>(())
                })
                .await?;
        }
        Ok(Pair {
            shop,
            ledger,
            clock,
            bus: Mutex::new(None),
            #[cfg(feature = "amqp")]
            amqp: (args.transport == crate::cli::Transport::Amqp)
                .then(|| (crate::amqp::settings(place, args), args.amqp_url.clone())),
        })
    }

    /// The pair's bus, started on first use.
    pub(crate) async fn bus(&self, args: &Args) -> Res<Arc<BusHandle<B>>> {
        if let Some(bus) = &*lock(&self.bus) {
            return Ok(bus.clone());
        }
        // Runs on one pair take turns, so no other run starts a bus meanwhile.
        let started = Arc::new(self.bus_builder(args).start().await?);
        *lock(&self.bus) = Some(started.clone());
        Ok(started)
    }

    /// The bus over the pair, with the library's defaults unless a flag
    /// says otherwise.
    fn bus_builder(&self, args: &Args) -> BusBuilder<B> {
        let builder = Bus::builder().module(&self.shop).module(&self.ledger);
        #[cfg(feature = "amqp")]
        let builder = match &self.amqp {
            Some((amqp, _)) => builder.amqp(amqp.clone()),
            None => builder,
        };
        let builder = match args.sweep_ms {
            Some(ms) => builder.scan_interval(Duration::from_millis(ms)),
            None => builder,
        };
        match args.mark_linger_ms {
            Some(ms) => builder.mark_linger(Duration::from_millis(ms)),
            None => builder,
        }
    }

    /// Stops the pair's bus, if it runs; over amqp, then deletes the
    /// queue and the exchange the bus declared.
    pub(crate) async fn stop(&self) {
        let bus = lock(&self.bus).take();
        if let Some(bus) = bus {
            bus.stop().await;
        }
        #[cfg(feature = "amqp")]
        if let Some((amqp, url)) = &self.amqp {
            crate::amqp::delete_bus_topology(amqp, url, self.ledger.name()).await;
        }
    }

    /// The messages waiting in the broker's queues, as last sampled by the
    /// bus (none without a broker).
    pub(crate) fn queued(bus: &BusHandle<B>) -> Option<u64> {
        bus.metrics()
            .broker
            .map(|broker| broker.consumers.iter().map(|c| c.queue_depth).sum())
    }

    /// Makes `clock` the one the handler stamps.
    pub(crate) fn set_clock(&self, clock: Arc<Clock>) {
        *self.clock.write().unwrap_or_else(|p| p.into_inner()) = clock;
    }

    /// Messages the consumer has handled (committed), in all runs.
    pub(crate) fn handled(&self) -> u64 {
        self.ledger.metrics().total(|h| h.handled)
    }
}

/// Runs `sql`, a `SELECT count(*) AS n`, in `module`'s database.
pub(crate) async fn count<B: BenchBackend>(
    module: &ModuleHandle<B>,
    sql: &'static str,
) -> Res<i64> {
    Ok(module
        .transaction(async move |tx| Ok::<_, tickbox::Error>(B::count(tx.conn(), sql).await?))
        .await?)
}

/// Prints the pair's progress every 250 ms until aborted (`--timeline`).
fn timeline<B: BenchBackend>(
    pair: &Pair<B>,
    clock: &Arc<Clock>,
    bus: &Arc<BusHandle<B>>,
    before: u64,
) -> tokio::task::JoinHandle<()> {
    let (ledger, shop, clock, bus) = (
        pair.ledger.clone(),
        pair.shop.clone(),
        clock.clone(),
        bus.clone(),
    );
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TIMELINE_EVERY).await;
            let m = ledger.metrics();
            let pending = shop.store_stats().await.map_or(-1, |s| s.outbox_pending);
            eprintln!(
                "  {:>6.2} s  produced {:>7}  handled {:>7}  marked {:>7}  pending {pending:>6}  mailbox queued {:>5} in flight {:>3}  failed {} retried {} duplicates {}{}",
                clock.t0.elapsed().as_secs_f64(),
                clock.produced.load(Relaxed),
                m.total(|h| h.handled) - before,
                bus.metrics().delivered,
                m.mailbox_queued,
                m.mailbox_in_flight,
                m.total(|h| h.failed),
                m.total(|h| h.retried),
                m.total(|h| h.duplicates_skipped),
                relay_window(&bus),
            );
        }
    })
}

/// Over a broker, the relay's publishes awaiting their confirm now and the
/// most at once, against its window (`--timeline`).
fn relay_window<B: BenchBackend>(bus: &BusHandle<B>) -> String {
    #[cfg(feature = "amqp")]
    if let Some(amqp) = bus.metrics().broker {
        let now: i64 = amqp.unconfirmed.iter().map(|r| r.unconfirmed).sum();
        return format!(
            "  unconfirmed {now:>4} (peak {} of {})",
            amqp.unconfirmed_peak, amqp.publish_window
        );
    }
    let _ = bus;
    String::new()
}

/// The workload through tickbox on an existing pair: N messages published by
/// C producers while the bus runs, until the handler has committed N times.
pub(crate) async fn run_tickbox_on<B: BenchBackend>(
    pair: &Pair<B>,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
    what: &str,
) -> Res<RunResult> {
    let bus = pair.bus(args).await?;
    let before = pair.handled();
    let clock = Clock::new(offset, args.messages, true);
    pair.set_clock(clock.clone());
    trace::set_current(Some(clock.clone()));

    let timeline = args.timeline.then(|| timeline(pair, &clock, &bus, before));
    let shop = pair.shop.clone();
    let keys = args.keys;
    let produced = produce(
        args,
        &clock,
        rate,
        (args.concurrency, Stamp::After),
        move |n| {
            let shop = shop.clone();
            async move {
                shop.transaction(async move |tx| {
                    B::insert_order(tx.conn(), n as i64, &note(n)).await?;
                    match keys {
                        Some(keys) => {
                            tx.publish_keyed(&(n % keys as u64).to_string(), &Work { n })?
                        }
                        None => tx.publish(&Work { n })?,
                    };
                    Ok::<_, tickbox::Error>(())
                })
                .await?;
                Ok(())
            }
        },
    )
    .await?;
    let seconds = wait_handled(&clock, args.messages, || pair.handled() - before).await?;
    if let Some(t) = timeline {
        t.abort();
    }
    trace::set_current(None);
    Ok(RunResult::new(what, args, &clock, seconds, produced))
}

/// Checks that the runs on the pair did what they claim: one business row
/// per message (`expected` in all), nothing left pending; then releases the
/// pair's connections.
pub(crate) async fn verify<B: BenchBackend>(pair: &Pair<B>, expected: u64) -> Res<()> {
    pair.stop().await;
    let changes = count(&pair.ledger, "SELECT count(*) AS n FROM bench_changes").await?;
    let pending = pair.shop.store_stats().await?.outbox_pending;
    let failed = pair.ledger.metrics().total(|h| h.failed);
    // Release the connections now (PostgreSQL: max_connections), not when
    // the last handle is dropped.
    pair.shop.close();
    pair.ledger.close();
    if changes as u64 != expected || pending != 0 {
        return Err(format!(
            "verification failed: {changes} changes (expected {expected}), {pending} outbox rows pending, {failed} failed deliveries"
        )
        .into());
    }
    Ok(())
}

/// The workload through tickbox on a fresh pair, verified.
pub(crate) async fn run_tickbox<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
) -> Res<RunResult> {
    let pair = Pair::<B>::new(place, args).await?;
    let result = run_tickbox_on(&pair, args, offset, rate, "tickbox").await?;
    verify(&pair, args.messages).await?;
    Ok(result)
}
