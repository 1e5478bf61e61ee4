//! Batched handlers: deliveries waiting together commit in one transaction,
//! each exactly once, and a failing one rolls back only its batch.

use super::{fast_retries, publish};
use crate::support::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tickbox::{
    BusHandle, Delivery, Error, Handler, HandlerError, HandlerOptions, ModuleHandle, Tx,
};
use tokio::sync::watch;

/// Writes an change row per message after waiting for its gate to open, and
/// fails permanently for message number `poison`.
#[derive(Clone)]
struct Gated {
    gate: Arc<watch::Sender<bool>>,
    poison: Option<u64>,
    /// Calls that have come to the gate.
    arrived: Arc<AtomicU64>,
}

impl<B: TestBackend> Handler<B> for Gated {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        ping: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let mut gate = self.gate.subscribe();
        gate.wait_for(|open| *open).await?;
        write_change(tx, delivery).await?;
        if self.poison == Some(ping.n) {
            return Err(HandlerError::permanent(HandlerError::msg(format!(
                "message {} is poison",
                ping.n
            ))));
        }
        Ok(())
    }
}

const HANDLER: &str = "warehouse.batch";

/// `orders` publishes Ping; `warehouse` handles it with a gated handler in
/// batches of up to 16, one batch at a time (a pool of two connections: as
/// many batches at once as half the pool). The gate starts closed.
async fn gated_pair<B: TestBackend>(
    db: &TestDb,
    poison: Option<u64>,
) -> (ModuleHandle<B>, ModuleHandle<B>, Gated) {
    let handler = Gated {
        gate: Arc::new(watch::Sender::new(false)),
        poison,
        arrived: Arc::new(AtomicU64::new(0)),
    };
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(db, "warehouse")
        .pool_size(2)
        .handler_with(HANDLER, handler.clone(), HandlerOptions::new().batch(16))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&warehouse).await;
    (orders, warehouse, handler)
}

/// Publishes messages `0..count` while the gate is closed, waits until all
/// their deliveries wait in the warehouse, then opens the gate and waits for
/// the bus to finish. Message 0 goes first, alone: the warehouse's one
/// batch at a time takes it and waits at the gate, so every later message
/// waits in the queue, in the order it arrived, to be taken in batches of
/// up to 16 once the gate opens, whatever order they arrive in (over a
/// broker, not always the order published).
async fn publish_behind_the_gate<B: TestBackend>(
    orders: &ModuleHandle<B>,
    warehouse: &ModuleHandle<B>,
    gated: &Gated,
    bus: &BusHandle<B>,
    count: u64,
) {
    publish(orders, 0).await;
    eventually("message 0 waits at the gate", WAIT, || async {
        gated.arrived.load(Ordering::SeqCst) == 1
    })
    .await;
    for n in 1..count {
        publish(orders, n).await;
    }
    eventually("every delivery waits in the warehouse", WAIT, || async {
        warehouse.metrics().mailbox_in_flight == count
    })
    .await;
    gated.gate.send_replace(true);
    super::drained(bus).await;
}

async fn distinct_changes<B: TestBackend>(warehouse: &ModuleHandle<B>) -> i64 {
    count(
        warehouse,
        "SELECT count(DISTINCT message_id) AS n FROM changes",
    )
    .await
}

pub async fn waiting_messages_commit_together_in_batches_and_each_once<B: TestBackend>(db: TestDb) {
    let refused = B::module(&db, "refused")
        .handler_with(
            HANDLER,
            Gated {
                gate: Arc::new(watch::Sender::new(true)),
                poison: None,
                arrived: Arc::new(AtomicU64::new(0)),
            },
            HandlerOptions::new().batch(0),
        )
        .start()
        .await;
    assert!(
        matches!(&refused, Err(Error::Config(reason)) if reason.contains("batch")),
        "{refused:?}"
    );

    let (orders, warehouse, gated) = gated_pair::<B>(&db, None).await;
    // Every message is delivered a second time after it is handled: the
    // duplicates go through batches too and must be skipped.
    let bus = db
        .bus()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(fast_retries())
        .duplicate_rate(1.0)
        .start()
        .await
        .expect("bus starts");
    publish_behind_the_gate(&orders, &warehouse, &gated, &bus, 40).await;

    assert_eq!(
        changes(&warehouse, HANDLER).await,
        40,
        "one change per message"
    );
    assert_eq!(distinct_changes(&warehouse).await, 40);
    assert_eq!(inbox_rows(&warehouse, HANDLER).await, 40);
    let metrics = &warehouse.metrics().handlers[0];
    assert_eq!(
        (metrics.handled, metrics.duplicates_skipped, metrics.failed),
        (40, 40, 0),
        "{metrics:?}"
    );
    // Message 0 went alone; the other 39 waited and were taken in batches
    // of up to 16.
    assert!(metrics.batches >= 3, "{metrics:?}");
    assert_eq!(metrics.batch_fallbacks, 0, "{metrics:?}");
    bus.stop().await;
}

pub async fn a_failing_message_rolls_back_its_batch_and_only_it_is_dead_lettered<B: TestBackend>(
    db: TestDb,
) {
    let (orders, warehouse, gated) = gated_pair::<B>(&db, Some(7)).await;
    let bus = super::bus(&db, &[&orders, &warehouse]).await;
    publish_behind_the_gate(&orders, &warehouse, &gated, &bus, 20).await;

    assert_eq!(
        changes(&warehouse, HANDLER).await,
        19,
        "every message but the poison one, once; nothing of the rolled-back batch"
    );
    assert_eq!(distinct_changes(&warehouse).await, 19);
    assert_eq!(inbox_rows(&warehouse, HANDLER).await, 19);
    let dead = warehouse.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.contains("message 7 is poison"), "{dead:?}");
    let metrics = &warehouse.metrics().handlers[0];
    assert_eq!(
        (metrics.handled, metrics.dead_lettered),
        (19, 1),
        "{metrics:?}"
    );
    assert!(metrics.batch_fallbacks >= 1, "{metrics:?}");
    bus.stop().await;
}
