//! Lists of ids bound as one value, so that a statement's text does not
//! depend on how many ids there are and each connection prepares it once.
//!
//! Each backend spells such a list in its statements' texts with two
//! macros of its folder's `ids.rs` — `id_rows!()`, a subquery of the ids
//! to drive an index lookup (`id IN id_rows!()`), and `among!(column)`, a
//! test that a column is one of them, cheap to repeat row by row — and
//! gives the values they take through [`IdLists`].

use uuid::Uuid;

/// The values a backend's `id_rows!()` and `among!(column)` take.
pub trait IdLists {
    /// The ids as the value of an `id_rows!()`.
    fn id_rows(ids: &[Uuid]) -> String;

    /// The ids as the value of an `among!(column)`.
    fn id_set(ids: &[Uuid]) -> String;
}

/// The ids as a JSON array of 32 hex digits each: a list the JSON
/// functions of SQLite and MySQL turn into rows.
///
/// Written into one string sized beforehand: a mark's list holds every
/// message it marks, and formatting each id into a string of its own cost
/// about 1,700 instructions per message (callgrind, SQLite, C = 1).
#[allow(dead_code)] // a build with PostgreSQL only has no use for it
pub(crate) fn json_hex_array(ids: &[Uuid]) -> String {
    let mut json = String::with_capacity(2 + ids.len() * 35);
    json.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push('"');
        json.push_str(id.simple().encode_lower(&mut Uuid::encode_buffer()));
        json.push('"');
    }
    json.push(']');
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_a_json_array_of_32_hex_digits_each() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(json_hex_array(&[]), "[]");
        assert_eq!(
            json_hex_array(&[id, id]),
            "[\"0123456789abcdef0123456789abcdef\",\"0123456789abcdef0123456789abcdef\"]"
        );
    }
}
