//! Statements whose shape depends on the call (lists of ids, an optional
//! cursor), written once for both dialects: the text takes numbered
//! placeholders in the backend's own spelling (`?1` on SQLite, `$1` on
//! PostgreSQL, each usable several times), and the values travel beside it.
//! Each backend only binds and runs them ([`Backend::load`] and
//! [`Backend::execute`](crate::Backend)).
//!
//! [`Backend::load`]: crate::Backend

use crate::store::schema::{DbUuid, Id};
use diesel::backend::Backend as DieselBackend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Text, Untyped};
use uuid::Uuid;

/// How a backend spells what a [`Statement`] needs beyond plain SQL: lists
/// of ids passed as one text value, so that the statement's text does not
/// depend on how many ids there are and is prepared once per connection.
#[derive(Debug, Clone, Copy)]

pub struct Dialect {
    /// A test that `column` is one of the ids in the text parameter `param`:
    /// cheap to repeat for every row of a correlated subquery (no temporary
    /// table).
    pub(crate) id_among: fn(column: &str, param: &str) -> String,
    /// The ids as that parameter's value.
    pub(crate) id_among_text: fn(ids: &[Uuid]) -> String,
}

/// A value bound to a placeholder.
#[derive(Debug, Clone)]

pub(crate) enum Bind {
    /// A UUID column value.
    Id(Id),
    /// A BIGINT column value.
    Int(i64),
    /// A text value (a list of ids, spelled by the [`Dialect`]).
    Text(String),
}

/// Marks a placeholder in a statement's text: the bind's index between two
/// of these. Never part of SQL.
const MARK: char = '\u{1}';

/// SQL text with placeholders and the values bound to them: a diesel query
/// of its own, which the connection prepares once and keeps (diesel's
/// `sql_query` is prepared again on every call).
#[derive(Debug, Clone)]

pub struct Statement {
    /// The text, placeholders marked.
    pub(crate) sql: String,
    /// The values, by placeholder index.
    pub(crate) binds: Vec<Bind>,
}

impl QueryId for Statement {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Statement {
    type SqlType = Untyped;
}

impl diesel::query_dsl::RunQueryDslSupport for Statement {}

impl<DB> QueryFragment<DB> for Statement
where
    DB: DieselBackend + HasSqlType<DbUuid>,
    Id: ToSql<DbUuid, DB>,
    i64: ToSql<BigInt, DB>,
    String: ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        let mut parts = self.sql.split(MARK);
        if let Some(first) = parts.next() {
            out.push_sql(first);
        }
        // After the first part they alternate: an index, then SQL.
        while let (Some(index), Some(sql)) = (parts.next(), parts.next()) {
            let index: usize = index.parse().map_err(|_| {
                diesel::result::Error::QueryBuilderError("a malformed placeholder".into())
            })?;
            match &self.binds[index] {
                Bind::Id(id) => out.push_bind_param::<DbUuid, _>(id)?,
                Bind::Int(value) => out.push_bind_param::<BigInt, _>(value)?,
                Bind::Text(text) => out.push_bind_param::<Text, _>(text)?,
            }
            out.push_sql(sql);
        }
        Ok(())
    }
}

/// Builds a [`Statement`]: each bound value gets a placeholder, which may
/// appear in the text more than once.
pub(crate) struct StatementBuilder {
    dialect: Dialect,
    binds: Vec<Bind>,
}

impl StatementBuilder {
    pub(crate) fn new(dialect: Dialect) -> Self {
        StatementBuilder {
            dialect,
            binds: Vec::new(),
        }
    }

    /// Binds a value; returns its placeholder.
    pub(crate) fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("{MARK}{}{MARK}", self.binds.len() - 1)
    }

    /// Binds a UUID; returns its placeholder.
    pub(crate) fn id(&mut self, id: Uuid) -> String {
        self.bind(Bind::Id(Id(id)))
    }

    /// Binds an integer; returns its placeholder.
    pub(crate) fn int(&mut self, value: i64) -> String {
        self.bind(Bind::Int(value))
    }

    /// Binds a text; returns its placeholder.
    pub(crate) fn text(&mut self, value: &str) -> String {
        self.bind(Bind::Text(value.to_string()))
    }

    /// Whether `column` is one of `ids`, as a test to repeat row by row.
    pub(crate) fn among(&mut self, column: &str, ids: &[Uuid]) -> String {
        let param = self.bind(Bind::Text((self.dialect.id_among_text)(ids)));
        (self.dialect.id_among)(column, &param)
    }

    /// Whether `column` is none of `ids`, likewise.
    pub(crate) fn not_among(&mut self, column: &str, ids: &[Uuid]) -> String {
        format!("NOT ({})", self.among(column, ids))
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

    const TEST: Dialect = Dialect {
        id_among: |column, param| format!("{column} AMONG {param}"),
        id_among_text: |ids| format!("{}", ids.len()),
    };

    #[test]
    fn placeholders_are_marked_in_bind_order_and_lists_are_one_value() {
        let mut b = StatementBuilder::new(TEST);
        let a = b.int(1);
        let list = b.among("id", &[Uuid::nil(), Uuid::max()]);
        let none = b.not_among("s.id", &[]);
        assert_eq!(a, "\u{1}0\u{1}");
        assert_eq!(list, "id AMONG \u{1}1\u{1}");
        assert_eq!(none, "NOT (s.id AMONG \u{1}2\u{1})");
        let statement = b.finish(format!("{a} {list} {a}"));
        assert!(matches!(statement.binds[1], Bind::Text(ref t) if t == "2"));
        assert!(matches!(statement.binds[2], Bind::Text(ref t) if t == "0"));
    }
}
