//! A whole run on one backend: the modules and the bus started, the
//! orders placed ([`crate::place_order`]), the wait until every message has
//! done its work, the bus stopped, the databases checked.

use crate::cli::Args;
use crate::db::ShopDb;
use crate::flow::{self, Drain};
use crate::report::{self, Report};
use crate::shop::{self, start_bus, start_modules};
use crate::{disturb, placing, progress};
use std::time::Instant;
use tickbox::ModuleBuilder;
use tokio_util::sync::CancellationToken;

/// The run, on the backend whose builders `module` makes (`stores.rs`).
pub async fn run<B: ShopDb>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
    elsewhere: impl AsyncFn(&'static str) -> Result<Option<ModuleBuilder<B>>, String>,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let (started, text) = (Instant::now(), |e: tickbox::Error| e.to_string());
    let mut shop = start_modules(args, module).await.map_err(text)?;
    shop::open_elsewhere(&mut shop, args, elsewhere).await?;
    let deadline = args.timeout.map(|timeout| started + timeout);
    let bus = start_bus(&shop, args, deadline, stop).await.map_err(text)?;
    let mut figures = report::Figures::new(args, started);
    let progress = &mut progress::Progress::new();
    // Whatever happens in here, the bus is stopped after it.
    let drain = async {
        // A message committed while no handler subscribes reaches none.
        let subscribed = flow::await_subscriptions(&shop, args, deadline, stop).await?;
        if subscribed != Drain::Finished {
            return Ok(subscribed);
        }
        if !placing::place_orders(&shop, &bus, args, stop, progress, &mut figures).await? {
            return Ok(Drain::Interrupted);
        }
        let targets = disturb::Targets::place_if_asked(&shop, args).await?;
        let drain = flow::wait_until_done(&shop, &bus, args, deadline, stop, progress).await?;
        let Some(targets) = targets.filter(|_| drain == Drain::Finished) else {
            return Ok(drain);
        };
        // `--disturb`, once the flow is done: messages that do not fit it.
        figures.disturbed = Some(disturb::deliver(&shop, &targets).await?);
        flow::wait_until_done(&shop, &bus, args, deadline, stop, progress).await
    }
    .await;
    progress.finish();
    if matches!(drain, Ok(Drain::Interrupted)) {
        tracing::info!("stopping the bus: running deliveries finish, the rest stays pending");
    }
    bus.stop().await;
    // The check reads the databases seen here, the bus stopped.
    let drain = drain.map_err(text)?;
    let report = Report::read(&shop, &bus, args, figures, drain).await;
    report.map_err(text)
}
