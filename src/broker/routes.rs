//! The broker's table of live routes (pseudonym -> where its answers go), split into
//! [`SHARDS`] hash maps by the pseudonym's low bits.
//!
//! Why: routes live `answer_ttl_ms` (60 s by default), so at 50,000 requests/s the table holds
//! millions of entries, and a single `HashMap` doubling moves all of them at once while the broker,
//! which serves every client, waits. Measured through gRPC at 50,000/s (daemon and simulator
//! pinned to one core each): broker overhead p99 37-42 ms and max 115-123 ms with one map, and
//! 8.6-9.3 ms with the same map presized (an experiment, which showed its resizes were the pauses);
//! each shard here resizes on its own, moving 1/[`SHARDS`] of the routes. Pseudonyms are uniform random 128-bit values, so the shards fill evenly.
//!
//! The maps hash with foldhash rather than SipHash: their keys are pseudonyms the broker drew
//! itself from its own random generator (never a value a client chose), so there is no flooding to
//! defend against, and an insert or lookup is in the broker's per-request path.
use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::location::Pseudonym;

/// Number of shards (a power of two).
pub const SHARDS: usize = 256;

/// A map from pseudonym to `V`, in [`SHARDS`] independently growing parts.
#[derive(Debug)]
pub struct Routes<V> {
    shards: Vec<HashMap<Pseudonym, V, RandomState>>,
}

impl<V> Default for Routes<V> {
    fn default() -> Self {
        Routes {
            shards: (0..SHARDS)
                .map(|_| HashMap::with_hasher(RandomState::default()))
                .collect(),
        }
    }
}

impl<V> Routes<V> {
    fn shard(pseudonym: &Pseudonym) -> usize {
        (pseudonym.0 as usize) & (SHARDS - 1)
    }

    pub fn insert(&mut self, pseudonym: Pseudonym, value: V) -> Option<V> {
        self.shards[Self::shard(&pseudonym)].insert(pseudonym, value)
    }

    pub fn get_mut(&mut self, pseudonym: &Pseudonym) -> Option<&mut V> {
        self.shards[Self::shard(pseudonym)].get_mut(pseudonym)
    }

    pub fn remove(&mut self, pseudonym: &Pseudonym) -> Option<V> {
        self.shards[Self::shard(pseudonym)].remove(pseudonym)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The sharded table behaves as one map under any sequence of inserts and removals.
        #[test]
        fn behaves_as_one_map(ops in prop::collection::vec((any::<bool>(), 0u128..64, any::<u32>()), 0..300)) {
            let mut routes = Routes::default();
            let mut model = HashMap::new();
            for (insert, key, value) in ops {
                // Spread the small keys over the shards and over the high bits.
                let pseudonym = Pseudonym(key.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
                if insert {
                    prop_assert_eq!(routes.insert(pseudonym, value), model.insert(pseudonym, value));
                } else {
                    prop_assert_eq!(routes.remove(&pseudonym), model.remove(&pseudonym));
                }
                prop_assert_eq!(routes.get_mut(&pseudonym).copied(), model.get(&pseudonym).copied());
            }
            for (key, value) in &model {
                prop_assert_eq!(routes.get_mut(key).copied(), Some(*value));
                if let Some(v) = routes.get_mut(key) {
                    *v = v.wrapping_add(1);
                }
                prop_assert_eq!(routes.get_mut(key).copied(), Some(value.wrapping_add(1)));
            }
        }
    }
}
