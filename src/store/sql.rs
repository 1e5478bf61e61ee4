//! One way to run a statement written as SQL text: [`Sql`], a fixed text
//! with a `?` where each value goes, in order, and the values beside it.
//!
//! diesel writes each backend's own placeholder for every `?` (`$1`, `$2`…
//! on PostgreSQL), and because the text is fixed, each connection prepares
//! it once and keeps it (diesel's own `sql_query` is prepared again on
//! every call). A statement whose shape diesel's typed query builder states
//! more clearly is written with it instead, in the backend's folder.

use crate::store::schema::{DbUuid, Id};
use diesel::backend::Backend as DieselBackend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Nullable, Text, Untyped};
use uuid::Uuid;

/// A value bound to a `?`.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    /// A UUID column value.
    Id(Id),
    /// A nullable UUID column value.
    OptionalId(Option<Id>),
    /// A BIGINT column value.
    Int(i64),
    /// A nullable BIGINT column value.
    OptionalInt(Option<i64>),
    /// A text value.
    Text(String),
    /// A nullable text value.
    OptionalText(Option<String>),
}

impl From<Uuid> for Bind {
    fn from(id: Uuid) -> Self {
        Bind::Id(Id(id))
    }
}

impl From<Id> for Bind {
    fn from(id: Id) -> Self {
        Bind::Id(id)
    }
}

impl From<Option<Id>> for Bind {
    fn from(id: Option<Id>) -> Self {
        Bind::OptionalId(id)
    }
}

impl From<i64> for Bind {
    fn from(value: i64) -> Self {
        Bind::Int(value)
    }
}

impl From<Option<i64>> for Bind {
    fn from(value: Option<i64>) -> Self {
        Bind::OptionalInt(value)
    }
}

impl From<&str> for Bind {
    fn from(text: &str) -> Self {
        Bind::Text(text.to_owned())
    }
}

impl From<String> for Bind {
    fn from(text: String) -> Self {
        Bind::Text(text)
    }
}

impl From<&String> for Bind {
    fn from(text: &String) -> Self {
        Bind::Text(text.clone())
    }
}

impl From<Option<&str>> for Bind {
    fn from(text: Option<&str>) -> Self {
        Bind::OptionalText(text.map(str::to_owned))
    }
}

impl From<Option<String>> for Bind {
    fn from(text: Option<String>) -> Self {
        Bind::OptionalText(text)
    }
}

/// A statement: fixed SQL text with a `?` for each value of `binds`, in
/// order. Build it with [`sql!`](crate::store::sql::sql).
#[derive(Debug, Clone)]
pub struct Sql {
    /// The text; `?` marks a value and appears nowhere else.
    pub(crate) text: &'static str,
    /// The values, one per `?`.
    pub(crate) binds: Vec<Bind>,
}

impl Sql {
    /// A statement without values.
    pub(crate) fn plain(text: &'static str) -> Sql {
        Sql {
            text,
            binds: Vec::new(),
        }
    }

    /// The statement with one more value, for a `?` its text ends its
    /// values with only in some builds (the trace context's column).
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn and_bind(mut self, value: impl Into<Bind>) -> Sql {
        self.binds.push(value.into());
        self
    }
}

/// `sql!(TEXT, a, b…)`: the statement [`Sql`] `TEXT` with the values `a`,
/// `b`… (anything a [`Bind`] is made from) for its `?`s, in order.
macro_rules! sql {
    ($text:expr $(, $bind:expr)* $(,)?) => {
        $crate::store::sql::Sql {
            text: $text,
            binds: vec![$($crate::store::sql::Bind::from($bind)),*],
        }
    };
}
pub(crate) use sql;

impl QueryId for Sql {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Sql {
    type SqlType = Untyped;
}

impl diesel::query_dsl::RunQueryDslSupport for Sql {}

impl<DB> QueryFragment<DB> for Sql
where
    DB: DieselBackend + HasSqlType<DbUuid>,
    Id: ToSql<DbUuid, DB>,
    i64: ToSql<BigInt, DB>,
    String: ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        let mut parts = self.text.split('?');
        if let Some(first) = parts.next() {
            out.push_sql(first);
        }
        let mut binds = self.binds.iter();
        for part in parts {
            match binds.next() {
                Some(Bind::Id(id)) => out.push_bind_param::<DbUuid, _>(id)?,
                Some(Bind::OptionalId(id)) => out.push_bind_param::<Nullable<DbUuid>, _>(id)?,
                Some(Bind::Int(value)) => out.push_bind_param::<BigInt, _>(value)?,
                Some(Bind::OptionalInt(value)) => {
                    out.push_bind_param::<Nullable<BigInt>, _>(value)?
                }
                Some(Bind::Text(text)) => out.push_bind_param::<Text, _>(text)?,
                Some(Bind::OptionalText(text)) => out.push_bind_param::<Nullable<Text>, _>(text)?,
                None => return Err(miscounted(self)),
            }
            out.push_sql(part);
        }
        if binds.next().is_some() {
            return Err(miscounted(self));
        }
        Ok(())
    }
}

/// A statement whose values do not match its `?`s: a defect of tickbox.
fn miscounted(sql: &Sql) -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(
        format!("{} values for the `?`s of `{}`", sql.binds.len(), sql.text).into(),
    )
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use diesel::query_builder::QueryBuilder;
    use diesel::sqlite::{Sqlite, SqliteQueryBuilder};

    fn text(sql: &Sql) -> diesel::QueryResult<String> {
        let mut builder = SqliteQueryBuilder::new();
        QueryFragment::<Sqlite>::to_sql(sql, &mut builder, &Sqlite)?;
        Ok(builder.finish())
    }

    #[test]
    fn each_question_mark_takes_the_next_value_and_the_counts_must_match() {
        let statement = sql!(
            "UPDATE t SET a = ? WHERE b = ? AND c IS ?",
            1_i64,
            "x",
            None::<i64>
        );
        assert_eq!(
            text(&statement).unwrap(),
            "UPDATE t SET a = ? WHERE b = ? AND c IS ?"
        );
        assert!(text(&sql!("SELECT ?")).is_err());
        assert!(text(&sql!("SELECT 1", 2_i64)).is_err());
    }
}
