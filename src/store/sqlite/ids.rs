//! How SQLite is given a list of ids: as one bound text value, so that a
//! statement's text does not depend on how many ids there are and each
//! connection prepares it once. SQLite has no arrays: a JSON array of the
//! ids in hex to look up ([`id_rows!`]), and `,HEX,HEX,` to search in
//! ([`among!`]), which needs no temporary table per row.

use crate::store::ids::{json_hex_array, IdLists};
use crate::store::sqlite::Sqlite;
use uuid::Uuid;

/// A subquery yielding the ids bound as one
/// [`json_hex_array`](crate::store::ids::json_hex_array) value, in a column
/// `id`, to drive an index lookup: `id IN ` followed by it, or joined.
macro_rules! id_rows {
    () => {
        "(SELECT unhex(value) AS id FROM json_each(?))"
    };
}
pub(crate) use id_rows;

/// A test that `$column` is one of the ids bound as one [`hex_set`] value:
/// cheap to repeat for every row of a correlated subquery.
macro_rules! among {
    ($column:literal) => {
        concat!("instr(?, ',' || hex(", $column, ") || ',') > 0")
    };
}
pub(crate) use among;

/// The value of an [`among!`]: the ids in upper-case hex (as `hex()`
/// writes a blob), each followed by a comma, after a leading one.
fn hex_set(ids: &[Uuid]) -> String {
    let mut set = String::with_capacity(1 + ids.len() * 33);
    set.push(',');
    for id in ids {
        set.push_str(id.simple().encode_upper(&mut Uuid::encode_buffer()));
        set.push(',');
    }
    set
}

impl IdLists for Sqlite {
    fn id_rows(ids: &[Uuid]) -> String {
        json_hex_array(ids)
    }

    fn id_set(ids: &[Uuid]) -> String {
        hex_set(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_each_id_in_upper_case_hex_between_commas() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(hex_set(&[]), ",");
        assert_eq!(
            hex_set(&[id, Uuid::nil()]),
            ",0123456789ABCDEF0123456789ABCDEF,00000000000000000000000000000000,"
        );
    }
}
