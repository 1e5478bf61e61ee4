//! How MySQL and MariaDB are given a list of ids: as one bound text value,
//! a JSON array of the ids in hex, which `JSON_TABLE` turns into rows, so
//! that a statement's text does not depend on how many ids there are and
//! each connection prepares it once. Membership through `IN (SELECT …
//! JSON_TABLE …)` uses the primary key (`FIND_IN_SET` and `JSON_CONTAINS`
//! would scan the whole index).

use crate::store::ids::{json_hex_array, IdLists};
use crate::store::mysql::Mysql;
use uuid::Uuid;

/// A subquery yielding the ids bound as one list value ([`IdLists`]), to drive
/// an index lookup: `id IN ` followed by it.
macro_rules! id_rows {
    () => {
        "(SELECT UNHEX(j.h) FROM JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j)"
    };
}
pub(crate) use id_rows;

/// A join of the ids bound as one list value ([`IdLists`]) on `$column`,
/// for an `UPDATE` or `DELETE` of the rows they name: MariaDB looks a
/// joined list's ids up by key, where an `IN` subquery in an `UPDATE` or
/// `DELETE` is run again for every row of the table (a `SELECT` does not
/// suffer this). The list's value comes first among the statement's
/// values.
macro_rules! join_ids {
    ($column:literal) => {
        concat!(
            " JOIN JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j ON ",
            $column,
            " = UNHEX(j.h) "
        )
    };
}
pub(crate) use join_ids;

/// A test that `$column` is one of the ids bound as one list value
/// ([`IdLists`]), repeated for every row of a correlated subquery: the list's
/// rows are made once per statement, and the lookup is by key.
macro_rules! among {
    ($column:literal) => {
        concat!($column, " IN ", $crate::store::mysql::ids::id_rows!())
    };
}
pub(crate) use among;

impl IdLists for Mysql {
    /// The ids as a JSON array of 32 hex digits each (`UNHEX` makes the 16
    /// bytes of a `BINARY(16)` back from them).
    fn id_rows(ids: &[Uuid]) -> String {
        json_hex_array(ids)
    }

    fn id_set(ids: &[Uuid]) -> String {
        json_hex_array(ids)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_membership_test_reads_the_list_by_key() {
        assert_eq!(
            among!("s.id"),
            "s.id IN (SELECT UNHEX(j.h) FROM JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j)"
        );
    }
}
