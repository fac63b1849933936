//! Support counting for set-valued windows: vertical tid-lists and their intersections.
//!
//! The window's records are numbered 0..n (tids). For every item the engine keeps the sorted list of
//! tids holding it (a vertical tid-list); supp(X) is the length of the intersection of the lists of
//! X's items. Set-valued benchmark data is sparse (BMS-WebView-1: 497 items, 2.5 items per record),
//! so sorted lists with galloping intersection cost O(min(|a|, |b|) · log) where dense bitsets would
//! cost n/64 words per operation regardless of support; removing a suppressed occurrence is one
//! binary search and a shift of the list. Invariants: every list is strictly ascending.
//!
//! This is the engine's one definition of support counting; the tests carry an independent
//! brute-force counter of their own.
use std::hash::{BuildHasherDefault, Hasher};

/// A sorted list of record indices (tids).
pub(crate) type TidList = Vec<u32>;

/// Small multiplicative hasher for integer keys (the std SipHash dominates runtime otherwise).
/// Deterministic: nothing in the engine depends on iteration order of a hashed container anyway.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub type FxBuildHasher = BuildHasherDefault<FxHasher>;
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuildHasher>;

/// Ratio of list lengths above which the shorter list is probed by binary search in the longer one.
const GALLOP_RATIO: usize = 16;

/// `f` applied to every item, on `workers` threads (at least 1, at most `scratches.len()`), item
/// i on worker i mod `workers` with that worker's scratch; the results come back in item order, so
/// they do not depend on the number of workers when `f` does not.
pub(crate) fn map_interleaved<T: Sync, S: Send, R: Send>(
    items: &[T],
    scratches: &mut [S],
    workers: usize,
    f: impl Fn(&T, &mut S) -> R + Sync,
) -> Vec<R> {
    let workers = workers.clamp(1, scratches.len().max(1));
    let run = |worker: usize, scratch: &mut S| -> Vec<R> {
        items
            .iter()
            .skip(worker)
            .step_by(workers)
            .map(|item| f(item, scratch))
            .collect()
    };
    if workers == 1 {
        return run(0, &mut scratches[0]);
    }
    // The calling thread is worker 0; the others are spawned for this call.
    let per_worker: Vec<Vec<R>> = std::thread::scope(|scope| {
        let run = &run;
        let (first, others) = scratches[..workers]
            .split_first_mut()
            .expect("at least one scratch");
        let handles: Vec<_> = others
            .iter_mut()
            .enumerate()
            .map(|(at, scratch)| scope.spawn(move || run(at + 1, scratch)))
            .collect();
        let mut results = vec![run(0, first)];
        results.extend(
            handles
                .into_iter()
                .map(|h| h.join().expect("an engine worker panicked")),
        );
        results
    });
    let mut iters: Vec<_> = per_worker.into_iter().map(Vec::into_iter).collect();
    (0..items.len())
        .map(|at| {
            iters[at % workers]
                .next()
                .expect("every worker returns its share")
        })
        .collect()
}

/// The vertical tid-lists of `records` (sorted item ids below `item_count`).
pub(crate) fn tid_lists(records: &[Vec<u32>], item_count: usize) -> Vec<TidList> {
    let mut sizes = vec![0usize; item_count];
    for &item in records.iter().flatten() {
        sizes[item as usize] += 1;
    }
    let mut lists: Vec<TidList> = sizes.into_iter().map(Vec::with_capacity).collect();
    for (tid, record) in records.iter().enumerate() {
        for &item in record {
            lists[item as usize].push(tid as u32);
        }
    }
    lists
}

/// `out` = a ∩ b (both sorted).
pub(crate) fn intersect_into(a: &[u32], b: &[u32], out: &mut Vec<u32>) {
    out.clear();
    let (small, big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if small.is_empty() {
        return;
    }
    if big.len() / small.len() >= GALLOP_RATIO {
        let mut rest = big;
        for &x in small {
            let at = rest.partition_point(|&y| y < x);
            rest = &rest[at..];
            match rest.first() {
                None => return,
                Some(&y) if y == x => {
                    out.push(x);
                    rest = &rest[1..];
                }
                Some(_) => {}
            }
        }
        return;
    }
    // Branch-free merge: every step writes its candidate and advances the output only on a match
    // (the outcome of each comparison is unpredictable, so branches would mispredict half the time).
    out.resize(small.len(), 0);
    let (mut i, mut j, mut k) = (0, 0, 0);
    while i < small.len() && j < big.len() {
        let (x, y) = (small[i], big[j]);
        out[k] = x;
        k += usize::from(x == y);
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    out.truncate(k);
}

/// Keeps the tids of `tids` that are in `bits`, without a branch per tid.
#[inline]
fn retain_in(tids: &mut Vec<u32>, bits: &[u64]) {
    let mut kept = 0;
    for at in 0..tids.len() {
        let tid = tids[at];
        tids[kept] = tid;
        kept += usize::from(has(bits, tid));
    }
    tids.truncate(kept);
}

/// |a ∩ b| (both sorted), galloping through the longer list.
pub(crate) fn intersection_len(a: &[u32], b: &[u32]) -> usize {
    let (small, mut big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut count = 0;
    for &x in small {
        let at = big.partition_point(|&y| y < x);
        big = &big[at..];
        match big.first() {
            None => break,
            Some(&y) if y == x => count += 1,
            Some(_) => {}
        }
    }
    count
}

/// Whether a ∩ b is non-empty (both sorted); stops at the first common tid.
pub(crate) fn intersects(a: &[u32], b: &[u32]) -> bool {
    let (small, big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if small.is_empty() {
        return false;
    }
    if big.len() / small.len() >= GALLOP_RATIO {
        return small.iter().any(|x| big.binary_search(x).is_ok());
    }
    let (mut i, mut j) = (0, 0);
    while i < small.len() && j < big.len() {
        let (x, y) = (small[i], big[j]);
        if x < y {
            i += 1;
        } else if y < x {
            j += 1;
        } else {
            return true;
        }
    }
    false
}

/// `out` = tids of the records holding every item of `itemset` (non-empty), intersecting the
/// vertical lists from the shortest up. `scratch` is reused between calls.
pub(crate) fn tidset_into(
    lists: &[TidList],
    itemset: &[u32],
    out: &mut Vec<u32>,
    scratch: &mut Vec<u32>,
) {
    tidset_of(lists, None, itemset, out, scratch);
}

/// Bitsets over the tids for the items held by many records, beside their tid-lists: a membership
/// test is then one word instead of a merge or a binary search. An item gets a bitset when its list
/// has at least max(64, records / 512) tids at construction (so at most 512 · occurrences / records
/// bitsets of records / 64 words each, 64 bytes per occurrence at most); the caller keeps both
/// forms in step
/// ([`PopularSets::remove`], [`PopularSets::insert`]).
pub(crate) struct PopularSets {
    sets: Vec<Option<Box<[u64]>>>,
}

impl PopularSets {
    pub(crate) fn new(lists: &[TidList], records: usize) -> Self {
        let threshold = (records / 512).max(64);
        let words = records.div_ceil(64);
        let sets = lists
            .iter()
            .map(|list| {
                (list.len() >= threshold).then(|| {
                    let mut bits = vec![0u64; words].into_boxed_slice();
                    for &tid in list {
                        bits[tid as usize >> 6] |= 1 << (tid & 63);
                    }
                    bits
                })
            })
            .collect();
        PopularSets { sets }
    }

    #[inline]
    pub(crate) fn get(&self, item: u32) -> Option<&[u64]> {
        self.sets[item as usize].as_deref()
    }

    pub(crate) fn remove(&mut self, item: u32, tid: u32) {
        if let Some(bits) = self.sets[item as usize].as_deref_mut() {
            bits[tid as usize >> 6] &= !(1 << (tid & 63));
        }
    }

    pub(crate) fn insert(&mut self, item: u32, tid: u32) {
        if let Some(bits) = self.sets[item as usize].as_deref_mut() {
            bits[tid as usize >> 6] |= 1 << (tid & 63);
        }
    }
}

#[inline]
fn has(bits: &[u64], tid: u32) -> bool {
    bits[tid as usize >> 6] >> (tid & 63) & 1 == 1
}

/// [`tidset_into`] using the bitsets of popular items: the shortest list is filtered by the
/// bitsets of the others where they exist, merged with their lists otherwise.
pub(crate) fn tidset_with(
    lists: &[TidList],
    popular: &PopularSets,
    itemset: &[u32],
    out: &mut Vec<u32>,
    scratch: &mut Vec<u32>,
) {
    tidset_of(lists, Some(popular), itemset, out, scratch);
}

fn tidset_of(
    lists: &[TidList],
    popular: Option<&PopularSets>,
    itemset: &[u32],
    out: &mut Vec<u32>,
    scratch: &mut Vec<u32>,
) {
    out.clear();
    let mut order: smallvec_free::Order = smallvec_free::Order::new(itemset, lists);
    let Some(first) = order.next() else {
        return;
    };
    let first = &lists[first as usize];
    // The first step reads the shortest list straight into `out` (no copy of it first).
    match order.next() {
        None => out.extend_from_slice(first),
        Some(second) => match popular.and_then(|p| p.get(second)) {
            Some(bits) => out.extend(first.iter().copied().filter(|&tid| has(bits, tid))),
            None => intersect_into(first, &lists[second as usize], out),
        },
    }
    for item in order {
        if out.is_empty() {
            return;
        }
        match popular.and_then(|p| p.get(item)) {
            Some(bits) => retain_in(out, bits),
            None => {
                intersect_into(out, &lists[item as usize], scratch);
                std::mem::swap(out, scratch);
            }
        }
    }
}

/// |tids ∩ list of `item`| using the item's bitset when it has one.
pub(crate) fn intersection_len_with(
    tids: &[u32],
    lists: &[TidList],
    popular: &PopularSets,
    item: u32,
) -> usize {
    match popular.get(item) {
        Some(bits) => tids.iter().filter(|&&tid| has(bits, tid)).count(),
        None => intersection_len(tids, &lists[item as usize]),
    }
}

/// `out` = tids ∩ list of `item`, using the item's bitset when it has one.
pub(crate) fn intersect_with(
    tids: &[u32],
    lists: &[TidList],
    popular: &PopularSets,
    item: u32,
    out: &mut Vec<u32>,
) {
    match popular.get(item) {
        Some(bits) => {
            out.clear();
            out.extend(tids.iter().copied().filter(|&tid| has(bits, tid)));
        }
        None => intersect_into(tids, &lists[item as usize], out),
    }
}

/// Items of an itemset in ascending order of their list length (ties by item id), without heap
/// allocation for the short itemsets the engine uses.
mod smallvec_free {
    use super::TidList;

    pub(crate) struct Order {
        items: [u32; 16],
        spill: Vec<u32>,
        len: usize,
        next: usize,
    }

    impl Order {
        pub(crate) fn new(itemset: &[u32], lists: &[TidList]) -> Self {
            let key = |i: &u32| (lists[*i as usize].len(), *i);
            let mut order = Order {
                items: [0; 16],
                spill: Vec::new(),
                len: itemset.len(),
                next: 0,
            };
            if itemset.len() <= 16 {
                order.items[..itemset.len()].copy_from_slice(itemset);
                order.items[..itemset.len()].sort_unstable_by_key(key);
            } else {
                order.spill = itemset.to_vec();
                order.spill.sort_unstable_by_key(key);
            }
            order
        }
    }

    impl Iterator for Order {
        type Item = u32;
        fn next(&mut self) -> Option<u32> {
            if self.next >= self.len {
                return None;
            }
            let item = if self.spill.is_empty() {
                self.items[self.next]
            } else {
                self.spill[self.next]
            };
            self.next += 1;
            Some(item)
        }
    }
}

/// Removes `tid` from a sorted list; returns whether it was there.
pub(crate) fn remove_tid(list: &mut TidList, tid: u32) -> bool {
    match list.binary_search(&tid) {
        Ok(at) => {
            list.remove(at);
            true
        }
        Err(_) => false,
    }
}

/// Inserts `tid` into a sorted list (no-op when present); returns whether it was added.
pub(crate) fn insert_tid(list: &mut TidList, tid: u32) -> bool {
    match list.binary_search(&tid) {
        Ok(_) => false,
        Err(at) => {
            list.insert(at, tid);
            true
        }
    }
}

/// Calls `visit` with every non-empty subset of `items` (sorted) of size <= `max_size`, each as a
/// sorted slice, in depth-first lexicographic order.
pub(crate) fn for_each_subset(items: &[u32], max_size: usize, visit: &mut impl FnMut(&[u32])) {
    fn descend(
        items: &[u32],
        start: usize,
        max_size: usize,
        buffer: &mut Vec<u32>,
        visit: &mut impl FnMut(&[u32]),
    ) {
        for at in start..items.len() {
            buffer.push(items[at]);
            visit(buffer);
            if buffer.len() < max_size {
                descend(items, at + 1, max_size, buffer, visit);
            }
            buffer.pop();
        }
    }
    if max_size == 0 {
        return;
    }
    let mut buffer = Vec::with_capacity(max_size);
    descend(items, 0, max_size, &mut buffer, visit);
}

/// Number of non-empty subsets of size <= `max_size` of a set of `len` items, saturating.
pub(crate) fn subset_count(len: usize, max_size: usize) -> u64 {
    let mut total: u64 = 0;
    let mut binomial: u64 = 1;
    for k in 1..=max_size.min(len) {
        // C(len, k) = C(len, k-1) * (len - k + 1) / k, exact in u128.
        binomial = u64::try_from(u128::from(binomial) * (len - k + 1) as u128 / k as u128)
            .unwrap_or(u64::MAX);
        total = total.saturating_add(binomial);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersections_agree_with_naive() {
        let a: Vec<u32> = (0..200).filter(|x| x % 3 == 0).collect();
        let b: Vec<u32> = (0..200).filter(|x| x % 5 == 0).collect();
        let c: Vec<u32> = vec![15, 45, 199];
        for (x, y) in [(&a, &b), (&a, &c), (&c, &b), (&b, &c)] {
            let naive: Vec<u32> = x.iter().copied().filter(|v| y.contains(v)).collect();
            let mut out = Vec::new();
            intersect_into(x, y, &mut out);
            assert_eq!(out, naive);
            assert_eq!(intersects(x, y), !naive.is_empty());
            assert_eq!(intersection_len(x, y), naive.len());
        }
    }

    #[test]
    fn subsets_are_enumerated_once() {
        let mut seen = Vec::new();
        for_each_subset(&[1, 2, 3, 4], 2, &mut |s| seen.push(s.to_vec()));
        assert_eq!(seen.len(), 4 + 6);
        assert_eq!(subset_count(4, 2), 10);
        assert_eq!(subset_count(5, 3), 25);
        assert!(seen.iter().all(|s| s.windows(2).all(|w| w[0] < w[1])));
    }
}
