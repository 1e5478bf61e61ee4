//! External effects: the payments module charges a card for each order
//! through `Delivery::effect`, its effects journal. A charge is no part of
//! the handler's transaction: with a plain call, a crash after the charge
//! and before COMMIT would charge again on the retry. The journal records
//! the charge as started before the call and as succeeded, with its
//! receipt, after it: a redelivered message gets the receipt back without
//! calling. A call cut short by a crash (the provider charged, the journal
//! never heard) is made again with the same idempotency key, which the
//! provider recognises.
//!
//! The first run is a child process that aborts right after the provider's
//! first charge; this one then finishes the work. The provider is a file of
//! calls beside the databases, in a temporary directory.
//!
//! Run it with `cargo run --example external_effects`.

use diesel::{ExpressionMethods, QueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Bus, Delivery, EffectPolicy, EffectState, Handler, HandlerError, Message};
use tickbox::{Module, Sqlite, Tx};

const ORDERS: [&str; 3] = ["A-1", "A-2", "A-3"];

#[derive(Serialize, Deserialize)]
struct PaymentDue {
    order_id: String,
}
impl Message for PaymentDue {
    const TOPIC: &'static str = "orders.payment_due";
}

const PAYMENTS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/external_effects/migrations/payments");
diesel::table! {
    payments (order_id) {
        order_id -> Text,
        receipt -> Text,
    }
}

/// The card provider, outside every database: each call is a line of
/// `provider.log`. Like a real payment API, it charges once per
/// idempotency key, however often it is called with it.
fn provider_charge(key: &str, order_id: &str) -> std::io::Result<String> {
    let mut options = std::fs::File::options();
    let mut log = options.create(true).append(true).open("provider.log")?;
    writeln!(log, "{key} {order_id}")?;
    Ok(format!("receipt-{key}"))
}

struct ChargeCard {
    /// Abort the process right after the provider charges (the first run).
    crash: bool,
}
impl Handler<Sqlite> for ChargeCard {
    type Message = PaymentDue;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        due: PaymentDue,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        // The provider recognises a key for a day: within it, a charge cut
        // short is made again with its key. (`at_most_once()` would make it
        // unknown instead, and its delivery a dead letter for a person.)
        let policy = EffectPolicy::at_least_once_with_key(Duration::from_secs(24 * 3600));
        let (crash, order_id) = (self.crash, due.order_id.clone());
        let receipt: String = delivery
            .effect("charge_card", policy, async move |key: String| {
                let receipt = provider_charge(&key, &order_id)?;
                if crash {
                    std::process::abort(); // charged; the journal never hears of it
                }
                Ok::<_, HandlerError>(receipt)
            })
            .await?;
        // A failure after the charge rolls this transaction back; the retry
        // gets the receipt from the journal, and the provider sees no call.
        if delivery.attempt == 1 {
            return Err(HandlerError::msg("failing once after the charge"));
        }
        let (order, receipt) = (
            payments::order_id.eq(due.order_id),
            payments::receipt.eq(receipt),
        );
        let insert = diesel::insert_into(payments::table).values((order, receipt));
        insert.execute(tx.conn()).await?;
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The first run is a child process in the same directory: it places
    // the orders and aborts on the provider's first charge.
    let crash = std::env::args().nth(1).as_deref() == Some("--crash");
    let dir = (!crash).then(tempfile::tempdir).transpose()?;
    if let Some(dir) = &dir {
        std::env::set_current_dir(dir.path())?;
        let exe = std::env::current_exe()?;
        let first = std::process::Command::new(exe).arg("--crash").status()?;
        println!("first run: {first}, right after the provider's first charge");
    }
    let orders = Module::<Sqlite>::builder("orders", "orders.db").publishes::<PaymentDue>();
    let orders = orders.start().await?;
    let payments = Module::<Sqlite>::builder("payments", "payments.db")
        .migrations(&PAYMENTS_MIGRATIONS)
        .handler("payments.charge_card", ChargeCard { crash })
        .start()
        .await?;
    // One delivery at a time, so that the crash cuts exactly one call short;
    // a stable instance name: the second run takes back at once its claims.
    let bus = Bus::builder().module(&orders).module(&payments);
    let bus = bus.max_concurrent_deliveries(1);
    let bus = bus.instance("external_effects").start().await?;
    // One transaction: none is charged (and the run aborted) before all exist.
    let due = ORDERS.map(|o| PaymentDue { order_id: o.into() });
    let publish = async move |tx: &mut Tx<_>| due.iter().try_for_each(|d| tx.publish(d).map(drop));
    if crash {
        orders.transaction(publish).await?;
    }
    let idle = bus.wait_idle(Duration::from_secs(30)).await?;
    bus.stop().await;
    if crash {
        return Err("the first run was meant to crash".into());
    }

    // What the provider, the journal and the payments table hold now.
    let log = std::fs::read_to_string("provider.log")?;
    let keys: BTreeSet<_> = log.lines().filter_map(|l| l.split(' ').next()).collect();
    let (calls, charges) = (log.lines().count(), keys.len());
    println!("provider: {calls} calls, {charges} charges (one per key)");
    let journal = payments.effects(&[EffectState::Succeeded], 0, 100).await?;
    let per_charge: Vec<i64> = journal.iter().map(|effect| effect.calls).collect();
    let count = async |tx: &mut Tx<Sqlite>| {
        Ok::<i64, tickbox::Error>(payments::table.count().get_result(tx.conn()).await?)
    };
    let paid = payments.read(count).await?;
    println!("journal: calls per charge {per_charge:?}; payments recorded: {paid}");
    let n = ORDERS.len();
    if !idle || (calls, charges, journal.len(), paid) != (n + 1, n, n, n as i64) {
        return Err("expected one charge per order, one call repeated after the crash".into());
    }
    Ok(())
}
