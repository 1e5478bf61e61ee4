//! One handler type for every backend: written once as
//! `impl<B: Backend> Handler<B>`, its diesel queries bounded as the
//! `Backend` docs say, and run here on each backend the suite runs on.

use super::{bus, publish};
use crate::support::*;
use diesel::dsl;
use diesel::prelude::*;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use tickbox::testing::Session;
use tickbox::{Backend, Delivery, Handler, HandlerError, ModuleHandle, Tx};

diesel::table! {
    tallies (message_id) {
        message_id -> Text,
        n -> BigInt,
    }
}

/// A row of `tallies`, read through `Selectable`: its select clause is
/// built for a diesel backend, `B::Diesel` in generic code.
#[derive(Debug, PartialEq, Queryable, Selectable)]
#[diesel(table_name = tallies)]
pub(crate) struct Tally {
    message_id: String,
    n: i64,
}

#[dsl::auto_type]
fn insert_tally(message_id: String, n: i64) -> _ {
    dsl::insert_into(tallies::table).values((tallies::message_id.eq(message_id), tallies::n.eq(n)))
}

#[dsl::auto_type]
fn every_tally<DB: diesel::backend::Backend>() -> _ {
    let fields: dsl::AsSelect<Tally, DB> = Tally::as_select();
    tallies::table.select(fields).order(tallies::n)
}

/// Inserts a tally of each ping, then selects every tally and fails unless
/// its own is among them: the select sees the insert, in the delivery's
/// transaction. Its bounds are written as the compiler names the types,
/// through the public `Backend`.
pub(crate) struct TallyPings;

impl<B: Backend> Handler<B> for TallyPings
where
    insert_tally: ExecuteDsl<<B as Backend>::Connection>,
    every_tally<B::Diesel>: LoadQuery<'static, <B as Backend>::Connection, Tally>,
{
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        ping: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let message_id = delivery.envelope.id.to_string();
        let n = ping.n as i64;
        insert_tally(message_id.clone(), n)
            .execute(tx.conn())
            .await?;
        let tallies: Vec<Tally> = every_tally::<B::Diesel>().load(tx.conn()).await?;
        if !tallies.contains(&Tally { message_id, n }) {
            return Err(HandlerError::msg(format!(
                "the tally of ping {n} is not among {tallies:?}"
            )));
        }
        Ok(())
    }
}

/// Every tally of `module`, read in a read-only transaction.
async fn tallies<B: Backend>(module: &ModuleHandle<B>) -> Vec<Tally>
where
    every_tally<B::Diesel>: LoadQuery<'static, B::Connection, Tally>,
{
    module
        .read(async |tx| Ok::<_, tickbox::Error>(every_tally::<B::Diesel>().load(tx.conn()).await?))
        .await
        .expect("tallies read")
}

pub async fn a_handler_written_once_runs_its_diesel_queries_on_every_backend<B: TestBackend>(
    db: TestDb,
) where
    TallyPings: Handler<B>,
    every_tally<B::Diesel>: LoadQuery<'static, B::Connection, Tally>,
{
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(&db, "warehouse")
        .handler("warehouse.tally", TallyPings)
        .start()
        .await
        .expect("warehouse starts");
    warehouse
        .transaction(async |tx| {
            let ddl =
                "CREATE TABLE tallies (message_id VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)";
            Ok::<_, tickbox::Error>(tx.conn().batch_execute(ddl).await?)
        })
        .await
        .expect("the tallies table is created");
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let session = Session::start(&bus);

    let mut published = Vec::new();
    for n in 1..=5 {
        published.push(publish(&orders, n).await);
    }
    let report = session.wait().await;
    assert_eq!(report.handled("warehouse.tally").len(), 5, "{report}");
    bus.stop().await;

    let expected: Vec<Tally> = (1..=5)
        .zip(&published)
        .map(|(n, id)| Tally {
            message_id: id.to_string(),
            n,
        })
        .collect();
    assert_eq!(tallies(&warehouse).await, expected);
}
