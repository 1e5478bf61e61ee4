//! The public face of storage: [`Backend`], sealed.

use crate::store::catalog::CatalogStatements;
use crate::store::contract::Store;
use crate::store::dead_letters::DeadLetterStatements;
use crate::store::inbox::InboxStatements;
use crate::store::journal::JournalStatements;
use crate::store::ordering::OrderingStatements;
use crate::store::outbox::OutboxStatements;
use crate::store::retention::RetentionStatements;
use crate::store::scratch::ScratchDatabases;
use crate::store::subscriptions::SubscriptionStatements;
use diesel_async::AsyncConnection;

/// A database backend: `Sqlite` (feature `sqlite`) or `Postgres` (feature
/// `postgres`).
///
/// Sealed: tickbox implements it for its backends, and what it needs from a
/// database (the `Store` and the statement traits it extends) is private to
/// tickbox.
///
/// # One handler for every backend
///
/// A handler, or any function taking a [`Tx`](crate::Tx), can be written
/// once for every backend: `impl<B: Backend> Handler<B> for MyHandler`.
/// Its queries run on [`Tx::conn`](crate::Tx::conn), a
/// `&mut B::Connection`, whose diesel backend is `B::Diesel`. diesel checks
/// a query against a backend's SQL types and dialect, so generic code
/// says, in its `where` clause, which queries it runs: name each query's
/// type with diesel's [`auto_type`](diesel::dsl::auto_type) and bound it
/// with diesel-async's
/// [`ExecuteDsl`](diesel_async::methods::ExecuteDsl) (for `execute`) or
/// [`LoadQuery`](diesel_async::methods::LoadQuery) (for `load`,
/// `get_result`, `first`…):
///
/// ```
/// use diesel::dsl;
/// use diesel::prelude::*;
/// use diesel_async::methods::{ExecuteDsl, LoadQuery};
/// use diesel_async::RunQueryDsl;
/// use serde::{Deserialize, Serialize};
/// use tickbox::{Backend, Delivery, Handler, HandlerError, Message, Tx};
///
/// diesel::table! {
///     notes (id) {
///         id -> BigInt,
///         body -> Text,
///     }
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct NoteTaken { id: i64, body: String }
/// impl Message for NoteTaken { const TOPIC: &'static str = "notes.taken"; }
///
/// #[dsl::auto_type]
/// fn insert_note(id: i64, body: String) -> _ {
///     dsl::insert_into(notes::table).values((notes::id.eq(id), notes::body.eq(body)))
/// }
///
/// #[dsl::auto_type]
/// fn note_count() -> _ {
///     notes::table.count()
/// }
///
/// struct KeepNote;
///
/// impl<B: Backend> Handler<B> for KeepNote
/// where
///     insert_note: ExecuteDsl<B::Connection>,
///     note_count: LoadQuery<'static, B::Connection, i64>,
/// {
///     type Message = NoteTaken;
///
///     async fn handle(
///         &self,
///         tx: &mut Tx<B>,
///         note: NoteTaken,
///         _delivery: &Delivery,
///     ) -> Result<(), HandlerError> {
///         insert_note(note.id, note.body).execute(tx.conn()).await?;
///         let notes: i64 = note_count().get_result(tx.conn()).await?;
///         tracing::debug!(notes, "note kept");
///         Ok(())
///     }
/// }
/// ```
///
/// Without such a bound, the compiler asks for diesel's own internals
/// instead (for an insert, "the trait `DieselReserveSpecialization` is not
/// implemented for `<B as Backend>::Diesel`"): bound the query, not the
/// backend.
///
/// Code that stays generic asks for the handler in turn, and the bounds
/// are checked where a module of a given backend registers it: a query that
/// backend cannot run is a compile error there, naming the query and the
/// backend's connection. Nothing in the bounds names a backend, so the
/// handler serves every backend tickbox has:
///
/// ```
/// # use tickbox::{Backend, Handler, ModuleBuilder};
/// # struct KeepNote;
/// fn archive<B: Backend>(module: ModuleBuilder<B>) -> ModuleBuilder<B>
/// where
///     KeepNote: Handler<B>,
/// {
///     module.handler("archive.keep_note", KeepNote)
/// }
/// ```
///
/// An application with many queries, run from many places, gathers them
/// in a trait of its own over `Backend`, with one blanket implementation
/// that carries their bounds (`impl<B: Backend> ShopDb for B where …`):
/// the rest of its code then asks only for that trait (the `minishop`
/// example's `db.rs`). What truly differs between backends (a row lock
/// one of them has no syntax for) is a trait of its own too, implemented
/// for each backend.
///
/// A query built for a diesel backend, such as a `Selectable` struct's
/// `as_select()`, takes [`Backend::Diesel`]:
/// `dsl::AsSelect<Note, B::Diesel>`.
pub trait Backend:
    Store<Conn = <Self as Backend>::Connection>
    + OutboxStatements
    + SubscriptionStatements
    + InboxStatements
    + OrderingStatements
    + JournalStatements
    + DeadLetterStatements
    + RetentionStatements
    + CatalogStatements
    + ScratchDatabases
{
    /// A short name for logs and metrics: `sqlite` or `postgres`.
    const NAME: &'static str;

    /// Pool size used when a module does not set one.
    const DEFAULT_POOL_SIZE: usize;

    /// The diesel-async connection handlers and transactions receive
    /// ([`Tx::conn`](crate::Tx::conn)): `SqliteConnection` or
    /// `AsyncPgConnection`.
    type Connection: AsyncConnection<Backend = Self::Diesel> + Send + 'static;

    /// The diesel backend queries on [`Backend::Connection`] are built for:
    /// `diesel::sqlite::Sqlite` or `diesel::pg::Pg`.
    type Diesel: diesel::backend::Backend;
}

/// A backend whose server keeps tables in named namespaces, one of which a
/// module can take for its own: a PostgreSQL schema. See
/// [`ModuleBuilder::schema`](crate::ModuleBuilder::schema).
pub trait Schemas: Backend {}
