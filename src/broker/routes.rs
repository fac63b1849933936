//! The broker's table of live routes: the pseudonym a request was forwarded under, and where
//! its answers go.
//!
//! The table names the routes itself. The n-th route it names is forwarded under the pseudonym
//! AES-128(key, n), with a key drawn from the operating system when the broker starts. AES is a
//! pseudorandom permutation: the pseudonyms are distinct, and to anyone without the key (a
//! provider, a client, an operator who set `location.seed`) they look like independent random
//! 128-bit values, linking nothing. Decrypted, a pseudonym gives back its route's number, and
//! so its place in a ring of slots kept in the order they were named.
//!
//! Why a ring: routes live `location.answer_ttl_ms` (60 s by default), so at 50,000 requests/s
//! the table holds millions of them.
//! - In a hash map, every insert, answer, acknowledgement and expiry of a route touches a random
//!   place in hundreds of megabytes: a cache and TLB miss on the broker's per-request path.
//! - In the ring, a route is written next to the one before it, answered and acknowledged within
//!   milliseconds while its slot is still in cache, and expired in order.
//! - The ring grows by chunks of [`CHUNK`] slots and reuses the chunk it frees, so growing moves
//!   no route. (One map doubling once paused the broker for tens of milliseconds;
//!   docs/performance.md.)
//!
//! Requests another replica relayed here carry the pseudonym that replica named. They are
//! routed by a hash map of their own, which holds only the relayed share of the traffic.
//!
//! Invariants:
//! - no pseudonym is named twice: route numbers only grow, and AES is a permutation;
//! - a pseudonym is taken as this table's own only when it decrypts to 64 zero bits and a
//!   number this table named and has not yet expired. A pseudonym named anywhere else does so
//!   with probability 2^-64;
//! - a route leaves once its expiry has passed (the table's own in the order they were named,
//!   relayed ones in the order they were last put), and [`Routes::pop_expired`] returns every
//!   route still live exactly once.
use std::collections::{HashMap, VecDeque};

use aes::Aes128;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use foldhash::fast::RandomState;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::location::Pseudonym;

/// Slots per chunk of the ring: 4,096 slots of a route of the broker's are about 350 KB.
pub const CHUNK: usize = 4096;

struct Slot<V> {
    /// When the route expires (Unix ms, the broker's clock).
    expires: i64,
    /// `None` once the route was removed (or when its request was relayed to another replica).
    route: Option<V>,
}

/// Live routes by pseudonym: the table's own in a ring, relayed ones in a map.
pub struct Routes<V> {
    cipher: Aes128,
    /// The own routes, oldest first: slot `j` of chunk `i` is route number
    /// `first + i * CHUNK + j`; the first `head` slots of the front chunk have expired.
    ring: VecDeque<Vec<Slot<V>>>,
    first: u64,
    head: usize,
    /// The number the next named route gets.
    next: u64,
    /// A freed chunk, kept for the next one the ring needs.
    spare: Option<Vec<Slot<V>>>,
    /// Routes of requests relayed from other replicas, under those replicas' pseudonyms, with
    /// their expiry; and the expiries in the order they were set (an entry whose route was put
    /// again later, with a later expiry, is passed over).
    foreign: HashMap<Pseudonym, (i64, V), RandomState>,
    foreign_expiry: VecDeque<(i64, Pseudonym)>,
}

impl<V> std::fmt::Debug for Routes<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Routes")
            .field("named", &self.next)
            .field("foreign", &self.foreign.len())
            .finish_non_exhaustive()
    }
}

impl<V> Default for Routes<V> {
    /// A table under a key drawn from the operating system.
    fn default() -> Self {
        Routes::with_key(ChaCha20Rng::from_os_rng().random())
    }
}

impl<V> Routes<V> {
    fn with_key(key: [u8; 16]) -> Self {
        Routes {
            cipher: Aes128::new(&key.into()),
            ring: VecDeque::new(),
            first: 0,
            head: 0,
            next: 0,
            spare: None,
            foreign: HashMap::with_hasher(RandomState::default()),
            foreign_expiry: VecDeque::new(),
        }
    }

    fn pseudonym_of(&self, number: u64) -> Pseudonym {
        let mut block = u128::from(number).to_be_bytes().into();
        self.cipher.encrypt_block(&mut block);
        Pseudonym(u128::from_be_bytes(block.into()))
    }

    /// The ring slot of `pseudonym` when this table named it and it has not expired yet.
    fn own_slot(&self, pseudonym: &Pseudonym) -> Option<(usize, usize)> {
        let mut block = pseudonym.0.to_be_bytes().into();
        self.cipher.decrypt_block(&mut block);
        let plain = u128::from_be_bytes(block.into());
        let number = u64::try_from(plain).ok()?;
        if number >= self.next {
            return None;
        }
        let offset = usize::try_from(number.checked_sub(self.first)?).ok()?;
        if offset < self.head {
            return None;
        }
        Some((offset / CHUNK, offset % CHUNK))
    }

    /// Names a new route expiring at `expires` (Unix ms): a pseudonym never named before, whose
    /// slot holds nothing until [`Routes::insert`] puts the route there. A pseudonym that is
    /// named and never given a route (its request was relayed) simply expires.
    pub fn name(&mut self, expires: i64) -> Pseudonym {
        if self.ring.back().is_none_or(|chunk| chunk.len() == CHUNK) {
            let chunk = self
                .spare
                .take()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK));
            self.ring.push_back(chunk);
        }
        if let Some(chunk) = self.ring.back_mut() {
            chunk.push(Slot {
                expires,
                route: None,
            });
        }
        let pseudonym = self.pseudonym_of(self.next);
        self.next += 1;
        pseudonym
    }

    /// Puts the route of `pseudonym`: into its slot when this table named it (where it keeps the
    /// expiry it was named with), or else (a request relayed from another replica) into the map
    /// of relayed routes until `expires`. Returns the route it replaced, if any.
    pub fn insert(&mut self, pseudonym: Pseudonym, route: V, expires: i64) -> Option<V> {
        if let Some((chunk, slot)) = self.own_slot(&pseudonym) {
            return self.ring[chunk][slot].route.replace(route);
        }
        let replaced = self.foreign.insert(pseudonym, (expires, route));
        self.foreign_expiry.push_back((expires, pseudonym));
        replaced.map(|(_, route)| route)
    }

    pub fn get_mut(&mut self, pseudonym: &Pseudonym) -> Option<&mut V> {
        match self.own_slot(pseudonym) {
            Some((chunk, slot)) => self.ring[chunk][slot].route.as_mut(),
            None if self.foreign.is_empty() => None,
            None => self.foreign.get_mut(pseudonym).map(|(_, route)| route),
        }
    }

    pub fn remove(&mut self, pseudonym: &Pseudonym) -> Option<V> {
        match self.own_slot(pseudonym) {
            Some((chunk, slot)) => self.ring[chunk][slot].route.take(),
            None if self.foreign.is_empty() => None,
            None => self.foreign.remove(pseudonym).map(|(_, route)| route),
        }
    }

    fn front_slot(&self) -> Option<&Slot<V>> {
        self.ring.front().and_then(|chunk| chunk.get(self.head))
    }

    /// The earliest expiry still ahead of the table (of a route, or of a slot whose route is
    /// gone already).
    pub fn next_expiry(&self) -> Option<i64> {
        let own = self.front_slot().map(|slot| slot.expires);
        let foreign = self.foreign_expiry.front().map(|&(expires, _)| expires);
        own.into_iter().chain(foreign).min()
    }

    /// Drops the ring's front slot and returns its number and route.
    fn pop_front_slot(&mut self) -> Option<(u64, Option<V>)> {
        let chunk = self.ring.front_mut()?;
        let slot = chunk.get_mut(self.head)?;
        let route = slot.route.take();
        let number = self.first + self.head as u64;
        self.head += 1;
        if self.head == CHUNK {
            if let Some(mut done) = self.ring.pop_front() {
                done.clear();
                self.spare = Some(done);
            }
            self.first += CHUNK as u64;
            self.head = 0;
        }
        Some((number, route))
    }

    /// The next route whose expiry is at or before `now`, removed from the table, with its
    /// pseudonym; `None` when no route has expired.
    pub fn pop_expired(&mut self, now: i64) -> Option<(Pseudonym, V)> {
        loop {
            let own = self.front_slot().map(|slot| slot.expires);
            let foreign = self.foreign_expiry.front().map(|&(expires, _)| expires);
            let own_first = match (own, foreign) {
                (Some(o), Some(f)) => o <= f,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            if own_first {
                if own.is_none_or(|expires| expires > now) {
                    return None;
                }
                if let Some((number, Some(route))) = self.pop_front_slot() {
                    return Some((self.pseudonym_of(number), route));
                }
            } else {
                match self.foreign_expiry.front() {
                    Some(&(expires, pseudonym)) if expires <= now => {
                        self.foreign_expiry.pop_front();
                        let due = self
                            .foreign
                            .get(&pseudonym)
                            .is_some_and(|&(expires, _)| expires <= now);
                        if due && let Some((_, route)) = self.foreign.remove(&pseudonym) {
                            return Some((pseudonym, route));
                        }
                    }
                    _ => return None,
                }
            }
        }
    }

    /// Live routes (own and relayed).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let own: usize = self
            .ring
            .iter()
            .map(|chunk| chunk.iter().filter(|slot| slot.route.is_some()).count())
            .sum();
        own + self.foreign.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    #[derive(Debug, Clone)]
    enum Op {
        /// Name a route and put `value` on it (or leave it empty: a relayed request).
        Name {
            value: Option<u32>,
        },
        /// A route relayed from another replica, under pseudonym `key` (spread over 128 bits).
        Foreign {
            key: u8,
            value: u32,
        },
        /// Look up, change or remove the `pick`-th pseudonym seen so far.
        Get {
            pick: usize,
        },
        Remove {
            pick: usize,
        },
        /// A pseudonym nobody named.
        Stranger {
            value: u128,
        },
        /// Time passes and expired routes leave.
        Advance {
            ms: i64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop::option::of(any::<u32>()).prop_map(|value| Op::Name { value }),
            2 => (0u8..8, any::<u32>()).prop_map(|(key, value)| Op::Foreign { key, value }),
            3 => any::<usize>().prop_map(|pick| Op::Get { pick }),
            2 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
            1 => any::<u128>().prop_map(|value| Op::Stranger { value }),
            2 => (0i64..30).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    /// The model: a map, and the expiry of each route (the time to live is one constant per
    /// kind, as the broker's is between reloads).
    #[derive(Default)]
    struct Model {
        live: BTreeMap<u128, (u32, i64)>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Against a model map: every lookup, removal and expiry gives what the map gives, named
        /// pseudonyms are all distinct, and expiry returns exactly the live routes whose time
        /// has come. Small chunks are crossed often with a few thousand names (CHUNK is 4096).
        #[test]
        fn behaves_as_a_map_with_expiry(ops in prop::collection::vec(op(), 0..400), ttl_own in 0i64..40, ttl_foreign in 0i64..40) {
            let mut routes = Routes::with_key([7; 16]);
            let mut model = Model::default();
            let mut seen: Vec<Pseudonym> = Vec::new();
            let mut named = HashSet::new();
            let mut now = 1_000i64;
            for op in ops {
                match op {
                    Op::Name { value } => {
                        let expires = now + ttl_own;
                        let p = routes.name(expires);
                        prop_assert!(named.insert(p), "named twice");
                        if let Some(value) = value {
                            prop_assert_eq!(routes.insert(p, value, expires), None);
                            model.live.insert(p.0, (value, expires));
                        }
                        seen.push(p);
                    }
                    Op::Foreign { key, value } => {
                        let p = Pseudonym(u128::from(key).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1 << 127);
                        let expires = now + ttl_foreign;
                        let replaced = routes.insert(p, value, expires);
                        prop_assert_eq!(replaced, model.live.insert(p.0, (value, expires)).map(|(v, _)| v));
                        seen.push(p);
                    }
                    Op::Get { pick } if !seen.is_empty() => {
                        let p = seen[pick % seen.len()];
                        prop_assert_eq!(routes.get_mut(&p).copied(), model.live.get(&p.0).map(|&(v, _)| v));
                        if let Some(v) = routes.get_mut(&p) {
                            *v = v.wrapping_add(1);
                            if let Some(entry) = model.live.get_mut(&p.0) {
                                entry.0 = entry.0.wrapping_add(1);
                            }
                        }
                    }
                    Op::Remove { pick } if !seen.is_empty() => {
                        let p = seen[pick % seen.len()];
                        prop_assert_eq!(routes.remove(&p), model.live.remove(&p.0).map(|(v, _)| v));
                    }
                    Op::Stranger { value } => {
                        prop_assert_eq!(routes.get_mut(&Pseudonym(value)).copied(), model.live.get(&value).map(|&(v, _)| v));
                    }
                    Op::Advance { ms } => {
                        now += ms;
                        let mut expired = BTreeMap::new();
                        while let Some((p, v)) = routes.pop_expired(now) {
                            prop_assert!(expired.insert(p.0, v).is_none(), "expired twice");
                        }
                        let due: BTreeMap<u128, u32> = model
                            .live
                            .iter()
                            .filter(|(_, (_, expires))| *expires <= now)
                            .map(|(&p, &(v, _))| (p, v))
                            .collect();
                        prop_assert_eq!(&expired, &due);
                        model.live.retain(|_, (_, expires)| *expires > now);
                        // What is left expires later.
                        if let Some(next) = routes.next_expiry() {
                            prop_assert!(next > now || routes.pop_expired(now).is_none());
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(routes.len(), model.live.len());
            }
        }
    }

    /// Across many chunks: every named pseudonym is distinct and finds its own route, the ring
    /// reuses the chunk it frees, and an expired pseudonym finds nothing.
    #[test]
    fn many_chunks_in_order() {
        let mut routes = Routes::default();
        let total = 5 * CHUNK as u64 + 17;
        let mut names = Vec::new();
        let mut distinct = HashSet::new();
        for n in 0..total {
            let p = routes.name(i64::try_from(n).unwrap());
            routes.insert(p, n, 0);
            assert!(distinct.insert(p));
            names.push(p);
        }
        for (n, p) in names.iter().enumerate() {
            assert_eq!(routes.get_mut(p).copied(), Some(n as u64));
        }
        // Half expire.
        let half = total / 2;
        let mut expired = 0;
        while let Some((p, n)) = routes.pop_expired(i64::try_from(half).unwrap() - 1) {
            assert_eq!(p, names[n as usize]);
            assert_eq!(n, expired);
            expired += 1;
        }
        assert_eq!(expired, half);
        assert!(routes.ring.len() <= 4, "freed chunks are dropped");
        assert_eq!(routes.get_mut(&names[0]), None);
        assert_eq!(routes.get_mut(&names[half as usize]).copied(), Some(half));
        assert_eq!(routes.next_expiry(), Some(i64::try_from(half).unwrap()));
        // Naming goes on past the spare chunk.
        for _ in 0..CHUNK {
            let p = routes.name(i64::MAX);
            assert!(distinct.insert(p));
        }
    }

    /// The pseudonyms of consecutive routes share no visible structure: their bits are balanced
    /// and a pseudonym differs from the next one in about half of its bits.
    #[test]
    fn pseudonyms_look_random() {
        let mut routes: Routes<()> = Routes::default();
        let names: Vec<u128> = (0..4096).map(|_| routes.name(0).0).collect();
        let ones: u32 = names.iter().map(|p| p.count_ones()).sum();
        let mean = f64::from(ones) / names.len() as f64;
        assert!((mean - 64.0).abs() < 1.0, "mean ones per pseudonym {mean}");
        let flips: u32 = names.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).sum();
        let mean = f64::from(flips) / (names.len() - 1) as f64;
        assert!(
            (mean - 64.0).abs() < 1.0,
            "mean bits changed between neighbours {mean}"
        );
        // Two tables (two broker starts) name different pseudonyms.
        let mut other: Routes<()> = Routes::default();
        assert_ne!(other.name(0).0, names[0]);
    }
}
