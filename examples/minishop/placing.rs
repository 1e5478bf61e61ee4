//! Placing the run's new orders (`--orders`, at `--order-interval`, each
//! to be confirmed within `--confirm-within` if given) with
//! [`crate::place_order`], until done or Ctrl-C, while the progress
//! keeps moving; the run is recorded in the orders database meanwhile
//! (see `flow::Placing`), so that the processes running the other modules
//! wait for its orders.

use crate::cli::Args;
use crate::db::ShopDb;
use crate::progress::Progress;
use crate::report::Figures;
use crate::{flow, tables, Shop};
use std::time::{Duration, Instant};
use tickbox::BusHandle;
use tokio_util::sync::CancellationToken;

/// Places the run's new orders, counting them in `figures`; false when
/// Ctrl-C stopped it before the last.
pub async fn place_orders<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    args: &Args,
    stop: &CancellationToken,
    progress: &mut Progress,
    figures: &mut Figures,
) -> tickbox::Result<bool> {
    if args.resume {
        tracing::info!("resuming: placing no orders, finishing pending work");
    }
    let n = figures.to_place;
    if n == 0 {
        return Ok(true);
    }
    let placing = Instant::now();
    figures.placed = place(shop, bus, n, args, stop, progress).await?;
    figures.place_seconds = placing.elapsed().as_secs_f64();
    Ok(figures.placed == n)
}

/// Places `n` orders, one transaction each, `--order-interval` apart, until done
/// or Ctrl-C; how many it placed.
async fn place<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    n: u64,
    args: &Args,
    stop: &CancellationToken,
    progress: &mut Progress,
) -> tickbox::Result<u64> {
    let started = Instant::now();
    let orders = (shop.orders.as_ref()).expect("a process placing orders runs the orders module");
    let mut run = flow::Placing::start(orders, n).await?;
    let mut placed = 0;
    let placing = async {
        while placed < n && !stop.is_cancelled() {
            // Ctrl-C does not wait for the order being placed: its
            // transaction runs in its own task and commits or not, whole.
            // The progress keeps moving while it waits for the database.
            let new = tables::NewOrder::random().confirmed_within(args.confirm_within);
            let order = crate::place_order(orders, new);
            tokio::pin!(order);
            let stopped = loop {
                tokio::select! {
                    placing = &mut order => {
                        placing?;
                        break false;
                    }
                    () = stop.cancelled() => break true,
                    () = tokio::time::sleep(progress.every()) => {
                        progress.placing(placed, n, &bus.metrics());
                    }
                }
            };
            if stopped {
                break;
            }
            placed += 1;
            run.keep_alive().await?;
            if progress.due() {
                progress.placing(placed, n, &bus.metrics());
            }
            if !args.order_interval.is_zero() && placed < n {
                tokio::select! {
                    () = tokio::time::sleep(args.order_interval) => {}
                    () = stop.cancelled() => {}
                }
            }
        }
        Ok::<_, tickbox::Error>(())
    }
    .await;
    // Recorded as ended however the placing ended; when interrupted, only
    // if the database answers soon (otherwise the run's lease ends it).
    let ended = if stop.is_cancelled() {
        tokio::time::timeout(Duration::from_secs(5), run.end())
            .await
            .unwrap_or(Ok(()))
    } else {
        run.end().await
    };
    placing.and(ended)?;
    if progress.drawn() {
        progress.placing(placed, n, &bus.metrics());
    }
    progress.finish();
    tracing::info!(
        "placed {placed}/{n} orders in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(placed)
}
