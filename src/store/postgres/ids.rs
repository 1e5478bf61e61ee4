//! How PostgreSQL is given a list of ids: as one bound `uuid[]` value,
//! written as text (`{…,…}`), so that a statement's text does not depend on
//! how many ids there are and each connection prepares it once.

use uuid::Uuid;

/// A test that `$column` is one of the ids bound as one [`uuid_array`]
/// value: cheap to repeat for every row of a correlated subquery.
macro_rules! among {
    ($column:literal) => {
        concat!($column, " = ANY(CAST(? AS uuid[]))")
    };
}
pub(crate) use among;

/// Ids as a PostgreSQL array literal, `{…,…}`: the value of an
/// [`among!`].
pub(crate) fn uuid_array(ids: &[Uuid]) -> String {
    let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    format!("{{{}}}", ids.join(","))
}
