//! Sets and maps keyed by message ids, hashed for what ids are: a message id is a UUID
//! whose low half is random (version 7; any other version's too), so its
//! two halves mixed in one multiplication spread it as well as a keyed
//! hash does, for a fraction of SipHash's work. The dispatcher touches
//! them several times per message.
//!
//! Only tickbox's own bookkeeping uses them; the ids come from the outbox
//! table, written by modules, not from the network.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use uuid::Uuid;

/// A set of message ids.
pub(crate) type IdSet = HashSet<Uuid, BuildHasherDefault<IdHasher>>;

/// A map from message ids.
pub(crate) type IdMap<V> = HashMap<Uuid, V, BuildHasherDefault<IdHasher>>;

/// A new, empty [`IdSet`] with room for `capacity` ids.
pub(crate) fn id_set(capacity: usize) -> IdSet {
    IdSet::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}

/// Hashes the bytes of a UUID (what `Uuid`'s `Hash` writes) by folding
/// them into one word and multiplying by an odd constant (the 64-bit
/// golden ratio, as Fibonacci hashing does).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(29) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.write(&n.to_le_bytes());
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_differ_in_either_half_hash_apart() {
        let hash = |id: Uuid| {
            let mut hasher = IdHasher::default();
            std::hash::Hash::hash(&id, &mut hasher);
            hasher.finish()
        };
        let a = Uuid::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0001);
        let b = Uuid::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0002);
        let c = Uuid::from_u128(0x0123_4567_89ab_cdee_0000_0000_0000_0001);
        assert_ne!(hash(a), hash(b));
        assert_ne!(hash(a), hash(c));
        // Ids made one after the other (sharing their time) spread over
        // the table's buckets: their top bits, which hashbrown's control
        // bytes use, differ too.
        let tops: HashSet<u64> = (0..64).map(|_| hash(Uuid::now_v7()) >> 57).collect();
        assert!(tops.len() > 32, "{} distinct tops of 64", tops.len());
    }

    #[test]
    fn a_set_finds_what_it_holds() {
        let mut set = id_set(4);
        let ids: Vec<Uuid> = (0..100).map(|_| Uuid::now_v7()).collect();
        for id in &ids {
            assert!(set.insert(*id));
        }
        assert!(ids.iter().all(|id| set.contains(id)));
        assert!(!set.contains(&Uuid::now_v7()));
    }
}
