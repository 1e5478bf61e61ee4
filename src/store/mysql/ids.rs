//! How MySQL and MariaDB are given a list of ids: as one bound text value,
//! a JSON array of the ids in hex, which `JSON_TABLE` turns into rows, so
//! that a statement's text does not depend on how many ids there are and
//! each connection prepares it once. Membership through `IN (SELECT …
//! JSON_TABLE …)` uses the primary key (`FIND_IN_SET` and `JSON_CONTAINS`
//! would scan the whole index).

use uuid::Uuid;

/// A subquery yielding the ids bound as one [`json_ids`] value, to drive
/// an index lookup: `id IN ` followed by it.
macro_rules! id_rows {
    () => {
        "(SELECT UNHEX(j.h) FROM JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j)"
    };
}
pub(crate) use id_rows;

/// A test that `$column` is one of the ids bound as one [`json_ids`]
/// value, repeated for every row of a correlated subquery: the list's
/// rows are made once per statement, and the lookup is by key.
macro_rules! among {
    ($column:literal) => {
        concat!($column, " IN ", $crate::store::mysql::ids::id_rows!())
    };
}
pub(crate) use among;

/// The value of an [`id_rows!`] or an [`among!`]: the ids as a JSON array
/// of 32 hex digits each (`UNHEX` makes the 16 bytes of a `BINARY(16)`
/// back from them).
pub(crate) fn json_ids(ids: &[Uuid]) -> String {
    let hex: Vec<String> = ids
        .iter()
        .map(|id| format!("\"{}\"", id.simple()))
        .collect();
    format!("[{}]", hex.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_a_json_array_of_32_hex_digits_each() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(json_ids(&[]), "[]");
        assert_eq!(
            json_ids(&[id, id]),
            "[\"0123456789abcdef0123456789abcdef\",\"0123456789abcdef0123456789abcdef\"]"
        );
    }

    #[test]
    fn a_membership_test_reads_the_list_by_key() {
        assert_eq!(
            among!("s.id"),
            "s.id IN (SELECT UNHEX(j.h) FROM JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j)"
        );
    }
}
