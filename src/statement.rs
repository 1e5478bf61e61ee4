//! Statements whose shape depends on the call (lists of ids, an optional
//! cursor), written once for both dialects: the text takes numbered
//! placeholders in the backend's own spelling (`?1` on SQLite, `$1` on
//! PostgreSQL, each usable several times), and the values travel beside it.
//! Each backend only binds and runs them ([`Backend::load`] and
//! [`Backend::execute`](crate::Backend)).
//!
//! [`Backend::load`]: crate::Backend

use uuid::Uuid;

/// A value bound to a placeholder.
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub enum Bind {
    /// A UUID column value.
    Id(Uuid),
    /// A BIGINT column value.
    Int(i64),
}

/// SQL text with numbered placeholders and the values bound to them.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub struct Statement {
    /// The text, placeholders spelled for one backend.
    pub(crate) sql: String,
    /// The values, in placeholder order.
    pub(crate) binds: Vec<Bind>,
}

/// A row a [`Statement`] returns, readable on every enabled backend
/// (written out so that code generic over the backend can name it).
#[doc(hidden)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub trait Row: Send + 'static + SqliteRow + PgRow {}

impl<T: Send + 'static + SqliteRow + PgRow> Row for T {}

/// Readable from SQLite (when the `sqlite` feature is on).
#[doc(hidden)]
#[allow(unreachable_pub)]
#[cfg(feature = "sqlite")]
pub trait SqliteRow: diesel::QueryableByName<diesel::sqlite::Sqlite> {}
#[cfg(feature = "sqlite")]
impl<T: diesel::QueryableByName<diesel::sqlite::Sqlite>> SqliteRow for T {}
#[doc(hidden)]
#[allow(unreachable_pub)]
#[cfg(not(feature = "sqlite"))]
pub trait SqliteRow {}
#[cfg(not(feature = "sqlite"))]
impl<T> SqliteRow for T {}

/// Readable from PostgreSQL (when the `postgres` feature is on).
#[doc(hidden)]
#[allow(unreachable_pub)]
#[cfg(feature = "postgres")]
pub trait PgRow: diesel::QueryableByName<diesel::pg::Pg> {}
#[cfg(feature = "postgres")]
impl<T: diesel::QueryableByName<diesel::pg::Pg>> PgRow for T {}
#[doc(hidden)]
#[allow(unreachable_pub)]
#[cfg(not(feature = "postgres"))]
pub trait PgRow {}
#[cfg(not(feature = "postgres"))]
impl<T> PgRow for T {}

/// Builds a [`Statement`]: each bound value gets the next placeholder.
pub(crate) struct StatementBuilder {
    /// `?` (SQLite) or `$` (PostgreSQL).
    prefix: char,
    binds: Vec<Bind>,
}

impl StatementBuilder {
    pub(crate) fn new(prefix: char) -> Self {
        StatementBuilder {
            prefix,
            binds: Vec::new(),
        }
    }

    /// Binds a value; returns its placeholder.
    pub(crate) fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("{}{}", self.prefix, self.binds.len())
    }

    /// Binds a UUID; returns its placeholder.
    pub(crate) fn id(&mut self, id: Uuid) -> String {
        self.bind(Bind::Id(id))
    }

    /// Binds an integer; returns its placeholder.
    pub(crate) fn int(&mut self, value: i64) -> String {
        self.bind(Bind::Int(value))
    }

    /// `column IN (…ids)`, or a constant false for no ids (an empty list is
    /// not valid SQL on PostgreSQL).
    pub(crate) fn in_ids(&mut self, column: &str, ids: &[Uuid]) -> String {
        if ids.is_empty() {
            return "1 = 0".to_string();
        }
        let list: Vec<String> = ids.iter().map(|id| self.id(*id)).collect();
        format!("{column} IN ({})", list.join(", "))
    }

    /// `column NOT IN (…ids)`, or a constant true for no ids.
    pub(crate) fn not_in_ids(&mut self, column: &str, ids: &[Uuid]) -> String {
        if ids.is_empty() {
            return "1 = 1".to_string();
        }
        let list: Vec<String> = ids.iter().map(|id| self.id(*id)).collect();
        format!("{column} NOT IN ({})", list.join(", "))
    }

    /// The statement with this text.
    pub(crate) fn finish(self, sql: String) -> Statement {
        Statement {
            sql,
            binds: self.binds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_bind_order_in_the_backends_spelling() {
        let mut sqlite = StatementBuilder::new('?');
        let a = sqlite.int(1);
        let list = sqlite.in_ids("id", &[Uuid::nil(), Uuid::max()]);
        assert_eq!(a, "?1");
        assert_eq!(list, "id IN (?2, ?3)");
        let mut pg = StatementBuilder::new('$');
        assert_eq!(pg.not_in_ids("s.id", &[Uuid::nil()]), "s.id NOT IN ($1)");
        assert_eq!(pg.in_ids("id", &[]), "1 = 0");
        assert_eq!(pg.not_in_ids("id", &[]), "1 = 1");
        assert_eq!(pg.finish(String::new()).binds.len(), 1);
    }
}
