//! catalog: ordering keys. A catalog changes its products' prices; each
//! change publishes `ProductPriceChanged` with the product id as its
//! ordering key, so every handler receives one product's changes in the
//! order they were committed — through injected failures, duplicate
//! deliveries and crashes — while other products' changes flow beside
//! them.
//!
//! Three modules, each with its own database:
//!
//! - **catalog** changes a product's price and version in a transaction
//!   that also publishes `ProductPriceChanged { product_id, price, version }`
//!   keyed by the product ([`tickbox::Tx::publish_keyed`]).
//! - **storefront** keeps a copy of every product's price and version. It
//!   applies a change only if it is newer than its copy, and counts the
//!   older ones it ignores (`stale_ignored`): with ordering keys there are
//!   none; with `--unordered` retries reorder the changes, and this version
//!   check alone keeps the copy right.
//! - **journeys** records an audit row per change, whose event id (product
//!   and version) is its primary key: even a message the inbox cannot
//!   recognise (a new message id carrying an old event) is not recorded
//!   twice.
//!
//! ```text
//! cargo run --release --example catalog
//! cargo run --release --example catalog -- --products 100 --changes 2000 --fail-rate 0.3 --duplicate-rate 0.3
//! cargo run --release --example catalog -- --unordered --fail-rate 0.3
//! cargo run --release --example catalog -- --resume          # after a crash (kill -9 at any moment)
//! cargo run --release --example catalog -- --disturb 3       # show both safeguards at work
//! cargo run --release --features postgres --example catalog -- --database-url postgres://…
//! cargo run --release --features mysql --example catalog -- --database-url mysql://root@127.0.0.1:3306
//! ```
//!
//! `--fail-rate P` makes handlers fail after their work, before COMMIT
//! (the bus retries them); `--duplicate-rate P` makes the bus deliver
//! messages twice (the inbox skips the second). Every change is recorded
//! in the catalog's own transaction, so `--resume` publishes exactly the
//! planned changes a killed run had not made. At the end the example reads
//! the three databases and checks them: every change published once,
//! applied by the storefront or ignored as stale (never with ordering
//! keys), every copy equal to the catalog's product, one journey per
//! change, nothing pending. `--json` prints the result as one JSON line on
//! stdout (logs go to stderr); the exit code is 0 only if all is well.
//!
//! SQLite (the default) keeps one file per module under `./catalog-data`;
//! `--database-url postgres://…` puts each module in its own PostgreSQL
//! schema (`catalog_catalog`, `catalog_storefront`, `catalog_journeys`; see
//! `--schema-prefix`); `--database-url mysql://…` (MariaDB ≥ 10.6 or MySQL
//! ≥ 8.0, the `mysql` feature) in its own database of the same name on that
//! server, made if missing.
//!
//! Read this file from top to bottom: the message, the handlers, the
//! modules and the bus, publishing a change, waiting for the deliveries,
//! the run. Beside it: `cli.rs` (the arguments), `plan.rs` (which changes
//! a run makes), `tables.rs` (the modules' tables and queries), `db.rs`
//! (one query for every backend), minishop's `faults.rs` (injected failures),
//! `disturb.rs` (messages that test the safeguards), `check.rs` (the final
//! check), `report.rs` (what it prints), `interrupt.rs` (Ctrl-C).

mod check;
mod cli;
mod db;
mod disturb;
/// Injected failures and retried statements: minishop's, shared.
#[path = "../minishop/faults.rs"]
mod faults;
mod interrupt;
mod plan;
mod report;
mod tables;

use cli::{Args, NewPlan, Store};
use faults::{flaky, retrying};
use plan::{Change, Plan};
use report::{Ending, Report};
use serde::{Deserialize, Serialize};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tables::Migrations;
use tickbox::{
    Backend, Bus, BusHandle, Delivery, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle,
    RetryPolicy, Tx,
};
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
// 2. The handlers.
//
// Each delivery runs in a transaction on the handler's module's database
// that already holds the inbox row (message id, handler name): the
// handler's changes and the inbox row commit together, and the same message
// delivered again is skipped. With an ordering key the bus also runs a
// product's changes through each handler one at a time, in commit order.
//
// Both handlers are generic over the backend and run their queries through
// `tables` (see `db.rs`); an application on one backend would write
// `impl Handler<Sqlite>` and run diesel on `tx.conn()`.

/// The storefront's handler name: half of each of its inbox rows' keys, so
/// stable across releases.
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
        // The safeguard: the copy holds this version or a newer one, so the
        // change comes late (an unordered retry, or an old message sent
        // again under a new id, which the inbox cannot recognise). Applying
        // it would put an old price back; it is ignored, and counted.
        let held_version = tables::held_version(tx.conn(), &change.product_id).await?;
        tracing::debug!(product = %change.product_id, version = change.version, held_version,
            "ignoring a change older than the copy");
        let stale = tables::StaleChange {
            message_id: delivery.envelope.id.to_string(),
            product_id: change.product_id,
            version: change.version,
            held_version,
        };
        tables::record_stale(tx.conn(), &stale).await?;
        Ok(())
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
        let journey = tables::Journey {
            event_id: tables::event_id(&change.product_id, change.version),
            product_id: change.product_id,
            version: change.version,
            price: change.price,
            message_id: delivery.envelope.id.to_string(),
            // The change's number in its product's order (1, 2, 3…), when
            // it was published with a key.
            sequence: delivery.sequence(),
        };
        if tables::record_journey(tx.conn(), &journey).await? {
            return Ok(());
        }
        // The safeguard: this event is already recorded, carried by another
        // message. The primary key kept it out; the repeat is counted.
        tracing::warn!(event_id = %journey.event_id, message_id = %journey.message_id,
            "event already recorded; ignoring the repeat");
        let repeat = tables::RepeatedEvent {
            message_id: journey.message_id,
            event_id: journey.event_id,
        };
        tables::record_repeat(tx.conn(), &repeat).await?;
        Ok(())
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

/// Starts the modules; `module` makes a module's builder on the chosen
/// backend, `migrations` are the modules' own in its dialect. Starting a
/// module creates tickbox's tables in its database, then runs the module's
/// own migrations.
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
        // Quick retries, and many: a delivery becomes a dead letter after 60
        // failed attempts in a row (about 15 s), which at --fail-rate 0.5
        // happens once in 10^18 deliveries. A failing keyed change holds
        // back only its own product's later changes meanwhile.
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
// 4. Publishing a change: the product's new price, the plan's progress, the
//    log entry and the message commit together, or none of them does.

/// Makes the plan's next change in one catalog transaction; false when
/// every change of the plan was already made.
///
/// Whatever happens, it is safe to call again: the number of the change is
/// taken inside the transaction, so a run killed before COMMIT makes that
/// change again, and one killed after moves on to the next.
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
            let message_id = if plan.keyed {
                tx.publish_keyed(&changed.product_id, &changed)?
            } else {
                tx.publish(&changed)?
            };
            let logged = tables::LoggedChange {
                message_id: message_id.to_string(),
                product_id: changed.product_id,
                version,
                price,
            };
            tables::log_change(tx.conn(), &logged).await?;
            Ok::<_, tickbox::Error>(true)
        })
    })
    .await
}

/// Records this run's plan (unless resuming), then makes every planned
/// change not made yet, of this run's plan and of any a killed run left
/// unfinished, until done or Ctrl-C; how many it made.
async fn publish_changes<B: Backend>(
    catalog: &ModuleHandle<B>,
    new_plan: Option<NewPlan>,
    stop: &CancellationToken,
) -> tickbox::Result<u64> {
    if let Some(new_plan) = new_plan {
        let plan = catalog
            .transaction(async move |tx| {
                Ok::<_, tickbox::Error>(tables::create_plan(tx.conn(), new_plan).await?)
            })
            .await?;
        tracing::info!(
            plan = plan.id,
            changes = plan.changes,
            products = plan.products,
            keyed = plan.keyed,
            seed = plan.seed as u64,
            "planned"
        );
    }
    let plans = catalog
        .read(async |tx| Ok::<_, tickbox::Error>(tables::load_plans(tx.conn()).await?))
        .await?;
    let mut made = 0;
    let mut said = Instant::now();
    for plan in plans.into_iter().filter(|p| p.published < p.changes) {
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

// ---------------------------------------------------------------------------
// 5. Waiting until every message is delivered.

/// Waits until the bus is idle (nothing in memory, nothing pending in any
/// outbox), until `timeout`, or until Ctrl-C.
async fn wait_for_deliveries<B: Backend>(
    bus: &BusHandle<B>,
    timeout: Duration,
    stop: &CancellationToken,
) -> tickbox::Result<Ending> {
    let deadline = Instant::now() + timeout;
    loop {
        tokio::select! {
            idle = bus.wait_idle(Duration::from_secs(2)) => {
                if idle? {
                    return Ok(Ending::Finished);
                }
            }
            () = stop.cancelled() => return Ok(Ending::Interrupted),
        }
        if Instant::now() >= deadline {
            return Ok(Ending::TimedOut);
        }
        let metrics = bus.metrics();
        tracing::info!(
            handled = metrics.total(|h| h.handled),
            failed_attempts = metrics.total(|h| h.failed),
            "delivering"
        );
    }
}

// ---------------------------------------------------------------------------
// 6. The run: start, publish, wait, stop the bus, disturb, check.

/// One run on the backend whose module builders `module` makes, with the
/// modules' `migrations` in its dialect: the report, or why there is none.
async fn run<B: Backend>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
    migrations: &'static Migrations,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let started = Instant::now();
    let modules = start_modules(args, module, migrations)
        .await
        .map_err(|e| e.to_string())?;
    let bus = start_bus(&modules, args).await.map_err(|e| e.to_string())?;
    if args.resume {
        tracing::info!("resuming: no new plan; finishing what is planned and pending");
    }
    // Stop the bus whatever happens in here.
    let outcome = async {
        let published = publish_changes(&modules.catalog, args.new_plan(), stop).await?;
        let ending = if stop.is_cancelled() {
            Ending::Interrupted
        } else {
            wait_for_deliveries(&bus, args.timeout, stop).await?
        };
        Ok::<_, tickbox::Error>((published, ending))
    }
    .await;
    bus.stop().await;
    let (published, ending) = outcome.map_err(|e| e.to_string())?;
    let metrics = bus.metrics();

    // Both safeguards at work, with nothing else running: see disturb.rs.
    let sent = if args.disturb > 0 && ending == Ending::Finished {
        Some(disturb::disturb(&modules, args.disturb).await?)
    } else {
        None
    };

    // The check: everything below is read from the databases.
    let found = check::Found::read(&modules)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Report::new(
        B::NAME,
        ending,
        &found,
        sent.as_ref(),
        report::ThisRun::new(published, &metrics, started.elapsed()),
    ))
}

/// One run on a server where each module has a named schema (PostgreSQL)
/// or database (MariaDB/MySQL), `PREFIX_MODULE` (`--schema-prefix`), on the
/// server `url` names.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn run_in_schemas<B: tickbox::Schemas>(
    args: &Args,
    url: &str,
    migrations: &'static Migrations,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let module = |name: &str| {
        tickbox::Module::<B>::builder(name, url).schema(format!("{}_{name}", args.schema_prefix))
    };
    run(args, module, migrations, stop).await
}

/// Runs the example on the databases the arguments name, prints the
/// report, and exits 0 only if the check found all well.
#[actix::main]
async fn main() -> ExitCode {
    let args = Args::parse_or_exit();
    // The example's own progress; of tickbox's logs only errors (a dead
    // letter), since every injected failure would log a warning
    // (`RUST_LOG=warn` shows them).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error,catalog=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // From here on Ctrl-C asks the run to stop; a second one quits.
    let stop = interrupt::on_ctrl_c();

    let result = match args.store() {
        Store::Sqlite(dir) => match std::fs::create_dir_all(dir) {
            Ok(()) => {
                let module = |name: &str| {
                    let file = dir.join(format!("{name}.db")).display().to_string();
                    tickbox::Module::<tickbox::Sqlite>::builder(name, file)
                };
                run(&args, module, &tables::PORTABLE_MIGRATIONS, &stop).await
            }
            Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
        },
        #[cfg(feature = "postgres")]
        Store::Postgres(url) => {
            let migrations = &tables::PORTABLE_MIGRATIONS;
            run_in_schemas::<tickbox::Postgres>(&args, url, migrations, &stop).await
        }
        #[cfg(not(feature = "postgres"))]
        Store::Postgres(_) => Err("--database-url needs the `postgres` feature: cargo run \
             --release --features postgres --example catalog -- --database-url postgres://..."
            .to_string()),
        #[cfg(feature = "mysql")]
        Store::Mysql(url) => {
            let migrations = &tables::MYSQL_MIGRATIONS;
            run_in_schemas::<tickbox::Mysql>(&args, url, migrations, &stop).await
        }
        #[cfg(not(feature = "mysql"))]
        Store::Mysql(_) => Err(
            "--database-url mysql://... needs the `mysql` feature: cargo run \
             --release --features mysql --example catalog -- --database-url mysql://..."
                .to_string(),
        ),
    };
    match result {
        Ok(report) => {
            if args.json {
                println!("{}", report.json());
            } else {
                report.print();
            }
            report.exit_code()
        }
        Err(error) => {
            eprintln!("catalog: {error}");
            if args.json {
                println!("{}", serde_json::json!({ "ok": false, "error": error }));
            }
            if stop.is_cancelled() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
