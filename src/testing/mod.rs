//! The test kit (feature `testing`): run a flow and know, without
//! sleeping, that every cascading message is done.
//!
//! tickbox runs the whole flow in one process, so it knows exactly when a
//! flow is finished: a [`Session`] watches the modules of a bus, and
//! [`Session::wait`] returns once every message the test's code published
//! — and every message their handlers published, through every retry — has
//! been handled, skipped as a duplicate or dead-lettered by every handler
//! that subscribes to it. A timeout only bounds the wait, and reports what
//! was still owed. The [`Report`] says what was published and what each
//! handler did, in order.
//!
//! - [`TestDatabases`] gives each module of a test a fresh database: an
//!   SQLite file in a temporary directory, or a PostgreSQL schema dropped at
//!   the end; its [`bus`](TestDatabases::bus) retries in milliseconds
//!   ([`fast_retries`]).
//! - A handler's failure fails the session, with the error and the message,
//!   unless the session [allows failures](Session::allow_failures);
//!   [`Session::inject_failures`] and [`Session::inject_duplicates`] disturb
//!   the flow on purpose.
//! - [`Session::advance`] moves the clock the modules' scheduled messages
//!   are due by: a 15-minute timeout is tested in milliseconds, without
//!   sleeping.
//!
//! A whole test of a flow:
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use tickbox::testing::{Session, TestDatabases};
//! use tickbox::{Delivery, Handler, HandlerError, Message, Sqlite, Tx};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct OrderPlaced { order_id: i64 }
//! impl Message for OrderPlaced { const TOPIC: &'static str = "orders.order_placed"; }
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct StockReserved { order_id: i64 }
//! impl Message for StockReserved { const TOPIC: &'static str = "warehouse.stock_reserved"; }
//!
//! struct Reserve;
//! impl Handler<Sqlite> for Reserve {
//!     type Message = OrderPlaced;
//!     async fn handle(&self, tx: &mut Tx<Sqlite>, order: OrderPlaced, _: &Delivery) -> Result<(), HandlerError> {
//!         tx.publish(&StockReserved { order_id: order.order_id })?;
//!         Ok(())
//!     }
//! }
//!
//! #[actix::test]
//! async fn placing_an_order_reserves_its_stock() {
//!     let dbs = TestDatabases::sqlite();
//!     let orders = dbs.module::<Sqlite>("orders").publishes::<OrderPlaced>().start().await.unwrap();
//!     let warehouse = dbs
//!         .module::<Sqlite>("warehouse")
//!         .publishes::<StockReserved>()
//!         .handler("warehouse.reserve", Reserve)
//!         .start()
//!         .await
//!         .unwrap();
//!     let bus = dbs.bus().module(&orders).module(&warehouse).start().await.unwrap();
//!
//!     let session = Session::start(&bus);
//!     orders.transaction(async |tx| tx.publish(&OrderPlaced { order_id: 7 }).map(drop)).await.unwrap();
//!     let report = session.wait().await;
//!
//!     report.published_one::<StockReserved>(|r| r.order_id == 7);
//!     assert_eq!(report.handled("warehouse.reserve").len(), 1);
//! }
//! ```

mod databases;
mod report;
mod session;

pub use crate::tracking::{Event, Happened};
pub use databases::{fast_retries, TestDatabases};
pub use report::Report;
pub use session::{Session, Unfinished};
