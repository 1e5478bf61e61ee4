//! The modules this process opens, and its bus.
//!
//! Over the local transport a process opens all three modules: its bus
//! delivers every outbox's messages, and the final check reads every
//! database, whichever modules' handlers it runs (`--modules`). Over amqp
//! it opens only the modules it runs, whose outboxes it publishes and whose
//! handlers' queues it consumes; the others' databases, if the check flags
//! find them, are opened for waiting on the flow and for the check, never
//! on its bus ([`open_elsewhere`]).

use crate::cli::{Args, ModuleName};
use crate::db::ShopDb;
use std::time::{Duration, Instant};
use tickbox::{BusHandle, ModuleBuilder, ModuleHandle};
use tokio_util::sync::CancellationToken;

/// The modules whose databases this process sees: all three over the
/// local transport; over amqp those it runs and those found with the check
/// flags (`None` for the others).
pub struct Shop<B: ShopDb> {
    pub orders: Option<ModuleHandle<B>>,
    pub warehouse: Option<ModuleHandle<B>>,
    pub notifications: Option<ModuleHandle<B>>,
    /// The modules on this process's bus: all three over the local
    /// transport (it delivers every outbox's messages), over amqp only
    /// those it runs (it publishes their outboxes, consumes their handlers'
    /// queues).
    pub on_bus: Vec<ModuleHandle<B>>,
}

impl<B: ShopDb> Shop<B> {
    /// The modules seen here, with their names.
    pub fn seen(&self) -> Vec<(&'static str, &ModuleHandle<B>)> {
        [
            ("orders", &self.orders),
            ("warehouse", &self.warehouse),
            ("notifications", &self.notifications),
        ]
        .into_iter()
        .filter_map(|(name, module)| Some((name, module.as_ref()?)))
        .collect()
    }
}

/// Starts the modules, with the handlers of those this process runs
/// (`--modules`). Over the local transport a module whose handlers run
/// elsewhere is still opened here, for its outbox and for the final check;
/// over amqp it is not (see [`open_elsewhere`]). `module` makes a module's
/// builder on the chosen backend. Starting a module creates tickbox's
/// tables in its database, then runs the module's own migrations.
pub async fn start_modules<B: ShopDb>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
) -> tickbox::Result<Shop<B>> {
    let over_amqp = args.over_amqp();
    let mut started = Vec::new();
    // The orders module last: once its tables exist, the shop is open.
    for name in [
        ModuleName::Notifications,
        ModuleName::Warehouse,
        ModuleName::Orders,
    ] {
        if over_amqp && !args.runs(name) {
            started.push(None);
            continue;
        }
        let builder = crate::configure(args, name, module(name.name()));
        started.push(Some(builder.start().await?));
    }
    let mut started = started.into_iter();
    let (notifications, warehouse, orders) = (
        started.next().flatten(),
        started.next().flatten(),
        started.next().flatten(),
    );
    // Over amqp only the modules this process runs were opened.
    let on_bus = [&orders, &warehouse, &notifications]
        .into_iter()
        .filter_map(|module| module.clone())
        .collect();
    Ok(Shop {
        orders,
        warehouse,
        notifications,
        on_bus,
    })
}

/// Over amqp, opens the databases of the modules other processes run,
/// where `elsewhere` finds them (the check flags; it waits for them to
/// appear), for waiting on the flow and the final check: never on this
/// process's bus. Without check flags it finds none.
pub async fn open_elsewhere<B: ShopDb>(
    shop: &mut Shop<B>,
    args: &Args,
    elsewhere: impl AsyncFn(&'static str) -> Result<Option<ModuleBuilder<B>>, String>,
) -> Result<(), String> {
    if !args.over_amqp() {
        return Ok(());
    }
    for name in [
        ModuleName::Notifications,
        ModuleName::Warehouse,
        ModuleName::Orders,
    ] {
        let slot = match name {
            ModuleName::Orders => &mut shop.orders,
            ModuleName::Warehouse => &mut shop.warehouse,
            ModuleName::Notifications => &mut shop.notifications,
        };
        if slot.is_some() {
            continue;
        }
        if let Some(builder) = elsewhere(name.name()).await? {
            let module = crate::configure(args, name, builder).start().await;
            *slot = Some(module.map_err(|e| e.to_string())?);
        }
    }
    Ok(())
}

/// Starts the bus `crate::bus` makes over this process's modules. A
/// failure worth retrying (the broker out of reach or restarting, a
/// database busy) is retried with backoff until `deadline` (a minute
/// without `--timeout`) or Ctrl-C; any other (the broker refusing the
/// credentials) ends the run at once.
pub async fn start_bus<B: ShopDb>(
    shop: &Shop<B>,
    args: &Args,
    deadline: Option<Instant>,
    stop: &CancellationToken,
) -> tickbox::Result<BusHandle<B>> {
    let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
    let mut delay = Duration::from_millis(200);
    loop {
        match crate::bus(shop, args).start().await {
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                tracing::warn!(%error, retry_in = ?delay, "the bus did not start; trying again");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return Err(error),
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            started => return started,
        }
    }
}

/// The RabbitMQ broker of `--transport amqp`, in the run's namespace.
#[cfg(feature = "amqp")]
pub fn broker(args: &Args) -> tickbox::Amqp {
    tickbox::Amqp::new(&args.amqp_url).namespace(&args.amqp_namespace)
}
