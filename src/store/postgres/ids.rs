//! How PostgreSQL is given a list of ids: as one bound `uuid[]` value,
//! written as text (`{…,…}`), so that a statement's text does not depend on
//! how many ids there are and each connection prepares it once.

use crate::store::ids::IdLists;
use crate::store::postgres::Postgres;
use uuid::Uuid;

/// A subquery yielding the ids bound as one [`uuid_array`] value, to drive
/// an index lookup: `id IN ` followed by it.
macro_rules! id_rows {
    () => {
        "(SELECT unnest(CAST(? AS uuid[])))"
    };
}
pub(crate) use id_rows;

/// A test that `$column` is one of the ids bound as one [`uuid_array`]
/// value: cheap to repeat for every row of a correlated subquery.
macro_rules! among {
    ($column:literal) => {
        concat!($column, " = ANY(CAST(? AS uuid[]))")
    };
}
pub(crate) use among;

/// Ids as a PostgreSQL array literal, `{…,…}`: the value of an
/// [`id_rows!`] or an [`among!`].
fn uuid_array(ids: &[Uuid]) -> String {
    let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    format!("{{{}}}", ids.join(","))
}

impl IdLists for Postgres {
    fn id_rows(ids: &[Uuid]) -> String {
        uuid_array(ids)
    }

    fn id_set(ids: &[Uuid]) -> String {
        uuid_array(ids)
    }
}
