//! catalog: ordering keys. Each price change of the catalog publishes
//! `ProductPriceChanged` keyed by its product, so every handler receives a
//! product's changes in the order they were committed — through failures,
//! duplicate deliveries and crashes — while other products' flow beside
//! them. The **storefront** keeps a copy of every product, applying only a
//! change newer than its copy; **journeys** keeps an audit row per change.
//! At the end it reads and checks the three databases: every change
//! published once, applied or ignored as stale (never, with keys), every
//! copy right, one journey per change, nothing pending; else exit code 1.
//!
//! Run it with `cargo run --release --example catalog`; `-- --help` shows
//! the rest: `--unordered` (no keys: retries reorder the changes, and the
//! version check alone keeps the copy right), failures and duplicates on
//! purpose, `--resume` after a crash, `--disturb`, PostgreSQL, MariaDB.
//! Read this file top to bottom: the message, the handlers, the modules
//! and the bus, the flow. The crash-test fixtures live in the files below.

mod check; // the final check of the three databases
mod cli; // the arguments
mod db; // one query, written once for every backend
mod disturb; // `--disturb`: messages that test the handlers' safeguards
#[path = "../minishop/faults.rs"]
mod faults; // `--fail-rate`, and statements retried: minishop's, shared
mod interrupt; // Ctrl-C
mod plan; // which changes a run makes, recorded for `--resume`
mod report; // what a run prints, and its exit code
mod safeguards; // the handlers' own checks, beyond the inbox
mod stores; // where the databases are: SQLite, PostgreSQL, MariaDB/MySQL
mod tables; // the modules' tables and queries
mod waiting; // until every message is delivered, with progress

use cli::{Args, NewPlan};
use faults::{flaky, retrying};
use plan::{Change, Plan};
use report::{Ending, Report};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tables::Migrations;
use tickbox::{Backend, Bus, BusHandle, Delivery, Handler, HandlerError, Message};
use tickbox::{ModuleBuilder, ModuleHandle, RetryPolicy, Tx};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------
// 1. The message.

/// Published by the catalog each time a product's price changes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProductPriceChanged {
    /// The product; also the message's ordering key.
    pub product_id: String,
    /// The new price, in cents.
    pub price: i64,
    /// The product's version after the change: 1 for its first change, then
    /// one more per change.
    pub version: i64,
}
impl Message for ProductPriceChanged {
    const TOPIC: &'static str = "catalog.product_price_changed";
}

// ---------------------------------------------------------------------------
// 2. The handlers. Each delivery runs in a transaction that already holds
//    the inbox row: the handler's changes and the inbox row commit together.
//    With an ordering key, a product's changes go through each handler one
//    at a time, in commit order. On one backend: `impl Handler<Sqlite>`.

/// Handler names: half of each inbox row's key, so stable across releases.
pub const APPLY_PRICE_CHANGE: &str = "storefront.apply_price_change";
/// The journeys' handler name.
pub const RECORD_JOURNEY: &str = "journeys.record_journey";

/// storefront: `ProductPriceChanged` → update the copy, unless the copy is
/// already as new.
struct ApplyPriceChange;
impl<B: Backend> Handler<B> for ApplyPriceChange {
    type Message = ProductPriceChanged;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        change: ProductPriceChanged,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        if tables::apply_if_newer(tx.conn(), &change).await? {
            return Ok(());
        }
        // The copy holds this version or a newer one: the change comes late
        // (an unordered retry, or an old change under a new message id, which
        // the inbox cannot recognise). It would put an old price back.
        safeguards::ignore_stale(tx, change, delivery).await
    }
}

/// journeys: `ProductPriceChanged` → one audit row per change.
struct RecordJourney;
impl<B: Backend> Handler<B> for RecordJourney {
    type Message = ProductPriceChanged;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        change: ProductPriceChanged,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        // With the change's number in its product's order (1, 2, 3…), when
        // it was published with a key: it must be the version.
        let journey = tables::Journey::of(change, delivery.envelope.id, delivery.sequence());
        if tables::record_journey(tx.conn(), &journey).await? {
            return Ok(());
        }
        // The event is recorded already, carried by another message: its
        // primary key kept it out, and the repeat is counted.
        safeguards::count_repeat(tx, journey).await
    }
}

// ---------------------------------------------------------------------------
// 3. The modules and the bus.

/// The three modules, started.
pub struct Modules<B: Backend> {
    /// Publishes the price changes.
    pub catalog: ModuleHandle<B>,
    /// Keeps a copy of every product.
    pub storefront: ModuleHandle<B>,
    /// Keeps the audit of every change.
    pub journeys: ModuleHandle<B>,
}

/// Starts the modules, each making tickbox's tables in its database, then
/// its own (`migrations`, in the dialect of the backend `module` is on).
async fn start_modules<B: Backend>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
    migrations: &'static Migrations,
) -> tickbox::Result<Modules<B>> {
    let fail_rate = args.fail_rate;
    // Four connections per module are plenty here (and keep a PostgreSQL
    // server's connections few when tests run several of these at once).
    let module = |name: &str| module(name).pool_size(4);
    let catalog = module("catalog")
        .migrations(&migrations.catalog)
        .publishes::<ProductPriceChanged>()
        .start()
        .await?;
    let storefront = module("storefront")
        .migrations(&migrations.storefront)
        .handler(APPLY_PRICE_CHANGE, flaky(ApplyPriceChange, fail_rate))
        .start()
        .await?;
    let journeys = module("journeys")
        .migrations(&migrations.journeys)
        .handler(RECORD_JOURNEY, flaky(RecordJourney, fail_rate))
        .start()
        .await?;
    Ok(Modules {
        catalog,
        storefront,
        journeys,
    })
}

/// Starts the bus over the three modules. It begins with a scan of the
/// outboxes, which finds whatever a killed run left pending.
async fn start_bus<B: Backend>(modules: &Modules<B>, args: &Args) -> tickbox::Result<BusHandle<B>> {
    Bus::builder()
        .module(&modules.catalog)
        .module(&modules.storefront)
        .module(&modules.journeys)
        .duplicate_rate(args.duplicate_rate)
        // Quick retries, and many: 60 failed attempts in a row (about 15 s)
        // make a dead letter, once in 10^18 deliveries at --fail-rate 0.5.
        // A failing keyed change holds back only its product's later ones.
        .retry_policy(RetryPolicy {
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(250),
            max_attempts: Some(60),
            ..RetryPolicy::default()
        })
        // A killed run's claims on outbox rows keep the next run's bus away
        // until they expire: short, so that --resume takes over soon.
        .claim_lease(Duration::from_secs(2))
        .start()
        .await
}

// ---------------------------------------------------------------------------
// 4. The flow: each change published in a transaction with the product's
//    new price; the wait for the deliveries; the check.

/// Makes the plan's next change in one catalog transaction; false when
/// every change of the plan was already made. The change's number is taken
/// inside the transaction, so a run killed before COMMIT makes it again,
/// and one killed after moves on to the next.
async fn make_next_change<B: Backend>(
    catalog: &ModuleHandle<B>,
    plan: Plan,
) -> tickbox::Result<bool> {
    retrying("a price change", || {
        catalog.transaction(async move |tx| {
            let Some(number) = tables::take_next_change(tx.conn(), plan.id).await? else {
                return Ok(false);
            };
            let Change { product_id, price } = plan.change(number);
            let version = tables::change_price(tx.conn(), &product_id, price).await?;
            let changed = ProductPriceChanged {
                product_id,
                price,
                version,
            };
            // The product is the ordering key: each handler receives this
            // product's changes in the order their transactions commit.
            let message_id = match plan.keyed {
                true => tx.publish_keyed(&changed.product_id, &changed)?,
                false => tx.publish(&changed)?,
            };
            let logged = tables::LoggedChange::of(message_id, &changed);
            tables::log_change(tx.conn(), &logged).await?;
            Ok::<_, tickbox::Error>(true)
        })
    })
    .await
}

/// Makes every planned change not made yet, of this run's plan (unless
/// `--resume`) and of any a killed run left unfinished, until done or
/// Ctrl-C; how many it made.
async fn publish_changes<B: Backend>(
    catalog: &ModuleHandle<B>,
    new_plan: Option<NewPlan>,
    stop: &CancellationToken,
) -> tickbox::Result<u64> {
    let mut made = 0;
    let mut said = Instant::now();
    for plan in plan::unfinished(catalog, new_plan).await? {
        while !stop.is_cancelled() && make_next_change(catalog, plan).await? {
            made += 1;
            if said.elapsed() >= Duration::from_secs(2) {
                said = Instant::now();
                tracing::info!(plan = plan.id, "{made} changes published");
            }
        }
    }
    Ok(made)
}

/// One run on the backend whose builders `module` makes (`stores.rs`): the
/// report, or why there is none.
async fn run<B: Backend>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
    migrations: &'static Migrations,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let (started, text) = (Instant::now(), |e: tickbox::Error| e.to_string());
    let modules = start_modules(args, module, migrations)
        .await
        .map_err(text)?;
    let bus = start_bus(&modules, args).await.map_err(text)?;
    // Stop the bus whatever happens in here.
    let outcome = async {
        let published = publish_changes(&modules.catalog, args.new_plan(), stop).await?;
        let ending = match stop.is_cancelled() {
            true => Ending::Interrupted,
            false => waiting::for_deliveries(&bus, args.timeout, stop).await?,
        };
        Ok::<_, tickbox::Error>((published, ending))
    }
    .await;
    bus.stop().await;
    let (published, ending) = outcome.map_err(text)?;
    let metrics = bus.metrics();
    // Both safeguards at work, with nothing else running: see disturb.rs.
    let sent = match args.disturb > 0 && ending == Ending::Finished {
        true => Some(disturb::disturb(&modules, args.disturb).await?),
        false => None,
    };
    // The check: everything in the report is read from the databases.
    let found = check::Found::read(&modules).await.map_err(text)?;
    let this_run = report::ThisRun::new(published, &metrics, started.elapsed());
    Ok(Report::new(
        B::NAME,
        ending,
        &found,
        sent.as_ref(),
        this_run,
    ))
}

#[actix::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse_or_exit();
    report::init_logging();
    // From here on Ctrl-C asks the run to stop; a second one quits.
    let stop = interrupt::on_ctrl_c();
    let result = stores::run(&args, &stop).await; // `run`, on the databases the arguments name
    report::finish(result, args.json, stop.is_cancelled())
}
