//! How SQLite is given a list of ids: as one bound text value, so that a
//! statement's text does not depend on how many ids there are and each
//! connection prepares it once. SQLite has no arrays: `,HEX,HEX,` to search
//! in ([`among!`]), which needs no temporary table per row.

use uuid::Uuid;

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
pub(crate) fn hex_set(ids: &[Uuid]) -> String {
    let hex: String = ids.iter().map(|id| format!("{:X},", id.simple())).collect();
    format!(",{hex}")
}
