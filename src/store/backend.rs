//! The public face of storage: [`Backend`], sealed.

use crate::store::journal::JournalQueries;
use crate::store::ordering::Ordering;
use crate::store::queries::Queries;

/// A database backend: `Sqlite` (feature `sqlite`) or `Postgres` (feature
/// `postgres`).
///
/// Sealed: tickbox implements it for its backends, and what it needs from a
/// database (the `Store` and `Queries` it extends) is private to tickbox.
pub trait Backend: Queries + Ordering + JournalQueries {
    /// A short name for logs and metrics: `sqlite` or `postgres`.
    const NAME: &'static str;

    /// Pool size used when a module does not set one.
    const DEFAULT_POOL_SIZE: usize;
}
