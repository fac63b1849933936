//! The equivalence classes of full-domain generalization nodes, as the optimal lattice search
//! ([`super::ola`]) checks them: the table's rows are dictionary-encoded once into distinct QI tuples
//! (each with its count and sparse sensitive histogram), every attribute's hierarchy into one lookup
//! table per level (leaf → dense code of its ancestor) and one per pair of levels (code → code of its
//! ancestor), and a node's classes are then *rolled up* from the class table of a node below it: each
//! class of the finer table has its packed key mapped up in the attributes the node generalizes
//! further, looked up in one open-addressing hash table, and its size and histogram added to the
//! coarser class. Any node's classes are unions of the classes of any node below it, so the roll-up
//! starts from the smallest class table kept of a node below (a bounded history of checked nodes,
//! and *stepping stones*: the tables of nodes whose levels are all 0 or 1, built when nothing smaller
//! than the tuples lies below a node), else from the distinct tuples themselves.
//!
//! Invariants: a class table lists its classes by first appearance in the order of its source's
//! classes (so the order depends on the source; nothing computed from a table depends on it); a
//! class's representative is a tuple of it, its key the packed codes of its ancestors at the node; sizes add up to the table's rows; histograms
//! (when kept: `m` counts per class) add up to the sensitive column's counts. Every allocation is
//! bounded by the number of distinct tuples and, for histograms, checked against
//! [`HISTOGRAM_CELLS`] first. The entropy terms are fixed-point integers (scale
//! [`ENTROPY_SCALE`]), so a node's non-uniform entropy is the same whatever the order its classes
//! are summed in. Pure: no clock, no files.
use std::collections::HashMap;

use crate::relational::table::{QuasiAttribute, Table};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// Fixed-point scale of the entropy terms: log2 values are kept as integers × 2^32.
pub const ENTROPY_SCALE: f64 = 4_294_967_296.0;

/// The most histogram cells (4 bytes each) one class table keeps; a table with more classes × sensitive
/// values keeps none and its histograms are summed from the tuples when needed.
pub const HISTOGRAM_CELLS: usize = 1 << 22;

/// The most cells (histogram cells + 4 per class) the kept class tables hold together.
const HISTORY_CELLS: usize = 1 << 23;

/// The most class tables kept.
const HISTORY_TABLES: usize = 32;

/// The most stepping stones kept (class tables of nodes whose levels are all 0 or 1); they share
/// [`HISTORY_CELLS`] as a budget of their own.
const STONES: usize = 256;

/// Why a table cannot be encoded for the lattice search.
#[derive(Debug, Clone, PartialEq)]
pub enum EncodeError {
    /// The column (named) is numeric without a hierarchy.
    NeedsHierarchy(String),
    /// The packed key would need this many bits (more than 128).
    KeyTooWide(u32),
}

/// One attribute's hierarchy, dictionary-encoded.
pub struct Attribute {
    pub height: usize,
    /// `codes[level][leaf]`: dense index of the leaf's ancestor among the nodes of that level.
    pub codes: Vec<Vec<u32>>,
    /// `lg[level][code]`: log2 of the rows under that ancestor, fixed-point (0 for an empty one).
    pub lg: Vec<Vec<i64>>,
    /// `level_entropy[level]`: Σ over the rows of lg of their ancestor at that level.
    pub level_entropy: Vec<i128>,
    /// `up[from][to - from][code]`: the code at level `to` of the ancestor of a code at level `from`.
    up: Vec<Vec<Vec<u32>>>,
    shift: u32,
    /// The bits of the attribute's field in a packed key, as a mask.
    mask: u128,
}

/// The classes of one node.
pub struct ClassTable {
    pub node: Vec<usize>,
    /// A tuple of each class.
    pub representatives: Vec<u32>,
    /// The packed key of each class (its ancestors' codes at `node`).
    pub keys: Vec<u128>,
    pub sizes: Vec<u64>,
    /// `m` sensitive counts per class, when kept.
    pub histograms: Option<Vec<u32>>,
}

impl ClassTable {
    /// The number of classes.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether the table has no class (an empty input).
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    pub fn histogram(&self, class: usize, m: usize) -> Option<&[u32]> {
        self.histograms
            .as_ref()
            .map(|h| &h[class * m..(class + 1) * m])
    }

    fn cells(&self, m: usize) -> usize {
        8 * self.len() + self.histograms.as_ref().map_or(0, |_| self.len() * m)
    }
}

/// The dictionary-encoded table and the roll-up machinery.
pub struct Encoded {
    pub d: usize,
    pub attributes: Vec<Attribute>,
    /// Distinct QI tuples: leaves (flat, d per tuple), counts, sparse sensitive histograms.
    pub leaves: Vec<u32>,
    pub counts: Vec<u64>,
    hist_offsets: Vec<usize>,
    hist_cells: Vec<(u32, u32)>,
    pub tuple_of_row: Vec<u32>,
    /// Sensitive domain size.
    pub m: usize,
    /// Whether class tables carry histograms (some model reads them).
    histograms: bool,
    /// Σ over the rows of Σ_j lg of their leaf: the constant part of every node's entropy.
    pub leaf_entropy: i128,
    /// The distinct tuples as the class table of the bottom node.
    base: ClassTable,
    history: Vec<ClassTable>,
    /// Stepping stones, see [`Encoded::classes`].
    stones: Vec<ClassTable>,
    /// Stones built once and not kept (no smaller than the tuples, or no room).
    stones_refused: Vec<Vec<usize>>,
    scratch: Scratch,
}

/// The open-addressing hash table of packed keys: slots hold a class index (`u32::MAX` when empty),
/// `keys` the key of each class of the table built last.
#[derive(Default)]
struct Scratch {
    slots: Vec<u32>,
    keys: Vec<u128>,
    mask: usize,
    bits: u32,
}

impl Scratch {
    fn slot(&self, key: u128) -> usize {
        let folded = (key as u64) ^ ((key >> 64) as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// Empties the table, sized for up to `classes` classes.
    fn reset(&mut self, classes: usize) {
        let capacity = (classes.max(8) * 2).next_power_of_two();
        self.bits = capacity.trailing_zeros();
        self.mask = capacity - 1;
        self.slots.clear();
        self.slots.resize(capacity, u32::MAX);
        self.keys.clear();
    }

    /// The class of `key`, inserting it as class `keys.len()` when new (and saying so).
    fn find_or_insert(&mut self, key: u128) -> (u32, bool) {
        let mut slot = self.slot(key);
        loop {
            let class = self.slots[slot];
            if class == u32::MAX {
                let class = self.keys.len() as u32;
                self.slots[slot] = class;
                self.keys.push(key);
                return (class, true);
            }
            if self.keys[class as usize] == key {
                return (class, false);
            }
            slot = (slot + 1) & self.mask;
        }
    }

    /// The class of `key` (`u32::MAX` when absent), `keys` being those of the table built last.
    fn find(&self, keys: &[u128], key: u128) -> u32 {
        let mut slot = self.slot(key);
        loop {
            let class = self.slots[slot];
            if class == u32::MAX || keys[class as usize] == key {
                return class;
            }
            slot = (slot + 1) & self.mask;
        }
    }
}

/// Where a roll-up starts.
#[derive(Clone, Copy)]
enum Source {
    Base,
    History(usize),
    Stone(usize),
}

/// The packed keys of one node: each attribute's leaf → code table at the node's level, and its shift.
struct Keyer<'a> {
    tables: Vec<(&'a [u32], u32)>,
}

impl<'a> Keyer<'a> {
    fn new(attributes: &'a [Attribute], node: &[usize]) -> Keyer<'a> {
        Keyer {
            tables: attributes
                .iter()
                .zip(node)
                .map(|(a, &level)| (a.codes[level].as_slice(), a.shift))
                .collect(),
        }
    }

    fn key(&self, leaves: &[u32]) -> u128 {
        let mut key = 0u128;
        for (&(codes, shift), &leaf) in self.tables.iter().zip(leaves) {
            key |= (codes[leaf as usize] as u128) << shift;
        }
        key
    }
}

impl Encoded {
    pub fn new(table: &Table, histograms: bool) -> Result<Encoded, EncodeError> {
        let n = table.rows();
        let d = table.quasi.len();
        let mut attributes = Vec::with_capacity(d);
        let mut shift = 0u32;
        for q in &table.quasi {
            let QuasiAttribute::Categorical(h) = &q.attribute else {
                return Err(EncodeError::NeedsHierarchy(q.name.clone()));
            };
            let leaves = h.leaf_count();
            let mut of_leaf = vec![0u64; leaves];
            for &c in &q.codes {
                of_leaf[c as usize] += 1;
            }
            let mut codes = Vec::with_capacity(h.height());
            let mut lg = Vec::with_capacity(h.height());
            let mut level_entropy = Vec::with_capacity(h.height());
            for level in 0..h.height() {
                let mut dense: HashMap<u32, u32> = HashMap::new();
                let mut under: Vec<u64> = Vec::new();
                let level_codes: Vec<u32> = (0..leaves as u32)
                    .map(|leaf| {
                        let node = h.ancestor(leaf, level);
                        let next = dense.len() as u32;
                        let code = *dense.entry(node).or_insert(next);
                        if code as usize == under.len() {
                            under.push(0);
                        }
                        under[code as usize] += of_leaf[leaf as usize];
                        code
                    })
                    .collect();
                let level_lg: Vec<i64> = under
                    .iter()
                    .map(|&u| {
                        if u == 0 {
                            0
                        } else {
                            ((u as f64).log2() * ENTROPY_SCALE).round() as i64
                        }
                    })
                    .collect();
                level_entropy.push(
                    level_codes
                        .iter()
                        .zip(&of_leaf)
                        .map(|(&code, &rows)| rows as i128 * level_lg[code as usize] as i128)
                        .sum(),
                );
                codes.push(level_codes);
                lg.push(level_lg);
            }
            let bits = u32::BITS - (leaves.max(2) as u32 - 1).leading_zeros();
            let up = (0..h.height())
                .map(|from| {
                    (from..h.height())
                        .map(|to| {
                            let mut table = vec![0u32; lg[from].len()];
                            for leaf in 0..leaves {
                                table[codes[from][leaf] as usize] = codes[to][leaf];
                            }
                            table
                        })
                        .collect()
                })
                .collect();
            attributes.push(Attribute {
                height: h.height(),
                codes,
                lg,
                level_entropy,
                up,
                shift,
                mask: (1u128 << bits) - 1,
            });
            shift += bits;
        }
        if shift > 128 {
            return Err(EncodeError::KeyTooWide(shift));
        }
        let leaf_entropy = attributes.iter().map(|a| a.level_entropy[0]).sum();
        // Distinct QI tuples with counts and sensitive histograms.
        let mut tuple_of_key: FastMap<u128, u32> =
            FastMap::with_capacity_and_hasher(n.min(1 << 20), Default::default());
        let mut leaves: Vec<u32> = Vec::new();
        let mut counts: Vec<u64> = Vec::new();
        let mut tuple_of_row = Vec::with_capacity(n);
        for r in 0..n {
            let mut key = 0u128;
            for (q, a) in table.quasi.iter().zip(&attributes) {
                key |= (q.codes[r] as u128) << a.shift;
            }
            let next = counts.len() as u32;
            let t = *tuple_of_key.entry(key).or_insert(next);
            if t == next {
                counts.push(0);
                leaves.extend(table.quasi.iter().map(|q| q.codes[r]));
            }
            counts[t as usize] += 1;
            tuple_of_row.push(t);
        }
        // The sensitive values of each tuple's rows, grouped by tuple (a counting sort), then
        // sorted within the tuple and run-length encoded.
        let mut hist_offsets = Vec::with_capacity(counts.len() + 1);
        let mut start = 0usize;
        for &c in &counts {
            hist_offsets.push(start);
            start += c as usize;
        }
        let mut next = hist_offsets.clone();
        let mut values = vec![0u32; n];
        for (r, &t) in tuple_of_row.iter().enumerate() {
            values[next[t as usize]] = table.sensitive.codes[r];
            next[t as usize] += 1;
        }
        let mut hist_cells: Vec<(u32, u32)> = Vec::new();
        for t in 0..counts.len() {
            let end = hist_offsets.get(t + 1).copied().unwrap_or(n);
            let group = &mut values[hist_offsets[t]..end];
            group.sort_unstable();
            let first = hist_cells.len();
            hist_offsets[t] = first;
            for &s in group.iter() {
                let fresh = hist_cells.len() == first;
                match hist_cells.last_mut() {
                    Some(cell) if !fresh && cell.0 == s => cell.1 += 1,
                    _ => hist_cells.push((s, 1)),
                }
            }
        }
        hist_offsets.push(hist_cells.len());
        let m = table.sensitive.domain.len();
        let tuples = counts.len();
        let mut encoded = Encoded {
            d,
            attributes,
            leaves,
            counts: counts.clone(),
            hist_offsets,
            hist_cells,
            tuple_of_row,
            m,
            histograms,
            leaf_entropy,
            base: ClassTable {
                node: vec![0; d],
                representatives: (0..tuples as u32).collect(),
                keys: Vec::new(),
                sizes: counts,
                histograms: None,
            },
            history: Vec::new(),
            stones: Vec::new(),
            stones_refused: Vec::new(),
            scratch: Scratch::default(),
        };
        let bottom = Keyer::new(&encoded.attributes, &vec![0; d]);
        let keys = (0..tuples)
            .map(|t| bottom.key(&encoded.leaves[t * d..(t + 1) * d]))
            .collect();
        encoded.base.keys = keys;
        if histograms && tuples.saturating_mul(m) <= HISTOGRAM_CELLS {
            let mut h = vec![0u32; tuples * m];
            for t in 0..tuples {
                for &(s, k) in encoded.sparse_histogram(t) {
                    h[t * m + s as usize] += k;
                }
            }
            encoded.base.histograms = Some(h);
        }
        Ok(encoded)
    }

    /// Tuple `t`'s sensitive counts, sparse.
    pub fn sparse_histogram(&self, t: usize) -> &[(u32, u32)] {
        &self.hist_cells[self.hist_offsets[t]..self.hist_offsets[t + 1]]
    }

    /// The number of distinct tuples.
    pub fn tuples(&self) -> usize {
        self.counts.len()
    }

    /// The classes of `node`, rolled up from the smallest kept table of a node below it (a checked
    /// node's, or a stepping stone's), else from the distinct tuples. When nothing smaller than the
    /// tuples lies below `node`, its stepping stone (every level capped at 1) is built first and kept:
    /// one pass over the tuples then serves every later node with the same generalized attributes.
    /// The table is not kept: hand it to [`Encoded::keep`] when done.
    pub fn classes(&mut self, node: &[usize]) -> ClassTable {
        let mut source = self.source_of(node);
        if matches!(source, Source::Base) {
            let stone: Vec<usize> = node.iter().map(|&l| l.min(1)).collect();
            if stone != node
                && stone.iter().any(|&l| l > 0)
                && self.stones.len() < STONES
                && !self.stones_refused.contains(&stone)
            {
                let from = self.source_of(&stone);
                let table = self.roll_up(&stone, from);
                let cells: usize = self.stones.iter().map(|t| t.cells(self.m)).sum();
                if table.len() >= self.tuples() || cells + table.cells(self.m) > HISTORY_CELLS {
                    // Not worth keeping (or no room): never built again.
                    self.stones_refused.push(stone);
                } else {
                    self.stones.push(table);
                    source = Source::Stone(self.stones.len() - 1);
                }
            }
        }
        self.roll_up(node, source)
    }

    /// The smallest kept table of a node at or below `node`.
    fn source_of(&self, node: &[usize]) -> Source {
        let history = self
            .history
            .iter()
            .enumerate()
            .map(|(i, t)| (Source::History(i), t));
        let stones = self
            .stones
            .iter()
            .enumerate()
            .map(|(i, t)| (Source::Stone(i), t));
        // Of equally small tables the first wins: the history before the stones.
        history
            .chain(stones)
            .filter(|(_, table)| leq(&table.node, node))
            .min_by_key(|(_, table)| table.len())
            .map_or(Source::Base, |(source, _)| source)
    }

    /// The classes of `node`, rolled up from `source` (a table of a node at or below it).
    fn roll_up(&mut self, node: &[usize], source: Source) -> ClassTable {
        let source = match source {
            Source::Base => &self.base,
            Source::History(i) => &self.history[i],
            Source::Stone(i) => &self.stones[i],
        };
        debug_assert!(leq(&source.node, node));
        let (attributes, all_leaves, d, m) = (&self.attributes, &self.leaves, self.d, self.m);
        let keyer = Keyer::new(attributes, node);
        // The attributes generalized further than in the source: their fields are mapped up.
        let mut unchanged = u128::MAX;
        let changed: Vec<(u32, u128, &[u32])> = attributes
            .iter()
            .zip(&source.node)
            .zip(node)
            .filter(|((_, from), to)| from != to)
            .map(|((a, &from), &to)| {
                unchanged &= !(a.mask << a.shift);
                (a.shift, a.mask, a.up[from][to - from].as_slice())
            })
            .collect();
        let scratch = &mut self.scratch;
        scratch.reset(source.len());
        let mut representatives = Vec::new();
        let mut sizes: Vec<u64> = Vec::new();
        let keep_classes = self.histograms;
        let mut class_of_source = Vec::with_capacity(if keep_classes { source.len() } else { 0 });
        for ((&from, &rep), &size) in source
            .keys
            .iter()
            .zip(&source.representatives)
            .zip(&source.sizes)
        {
            let mut key = from & unchanged;
            for &(shift, mask, up) in &changed {
                key |= (up[((from >> shift) & mask) as usize] as u128) << shift;
            }
            let (class, fresh) = scratch.find_or_insert(key);
            if fresh {
                representatives.push(rep);
                sizes.push(0);
            }
            sizes[class as usize] += size;
            if keep_classes {
                class_of_source.push(class);
            }
        }
        let classes = sizes.len();
        let histograms =
            (self.histograms && classes.saturating_mul(m) <= HISTOGRAM_CELLS).then(|| {
                let mut h = vec![0u32; classes * m];
                match &source.histograms {
                    Some(from) => {
                        for (i, &class) in class_of_source.iter().enumerate() {
                            let to = &mut h[class as usize * m..(class as usize + 1) * m];
                            for (a, &b) in to.iter_mut().zip(&from[i * m..(i + 1) * m]) {
                                *a += b;
                            }
                        }
                    }
                    None => {
                        for t in 0..self.counts.len() {
                            let leaves = &all_leaves[t * d..(t + 1) * d];
                            let class = scratch.find(&scratch.keys, keyer.key(leaves)) as usize;
                            let cells =
                                &self.hist_cells[self.hist_offsets[t]..self.hist_offsets[t + 1]];
                            for &(s, k) in cells {
                                h[class * m + s as usize] += k;
                            }
                        }
                    }
                }
                h
            });
        ClassTable {
            node: node.to_vec(),
            representatives,
            keys: std::mem::take(&mut scratch.keys),
            sizes,
            histograms,
        }
    }

    /// The class of every distinct tuple in `table`, which must be the table built last.
    pub fn class_of_tuples(&self, table: &ClassTable) -> Vec<u32> {
        let keyer = Keyer::new(&self.attributes, &table.node);
        (0..self.tuples())
            .map(|t| {
                let leaves = &self.leaves[t * self.d..(t + 1) * self.d];
                self.scratch.find(&table.keys, keyer.key(leaves))
            })
            .collect()
    }

    /// Keeps `table` as a source for later roll-ups (the oldest ones go first).
    pub fn keep(&mut self, table: ClassTable) {
        let cells = table.cells(self.m);
        if cells > HISTORY_CELLS || table.len() >= self.tuples() {
            return;
        }
        let mut total: usize = self.history.iter().map(|t| t.cells(self.m)).sum();
        while !self.history.is_empty()
            && (self.history.len() >= HISTORY_TABLES || total + cells > HISTORY_CELLS)
        {
            total -= self.history[0].cells(self.m);
            self.history.remove(0);
        }
        self.history.push(table);
    }

    /// Σ_j lg of every row's ancestor at `node`, minus the leaves' part: the node's non-uniform entropy
    /// with nothing suppressed (fixed-point).
    pub fn entropy_unsuppressed(&self, node: &[usize]) -> i128 {
        self.attributes
            .iter()
            .zip(node)
            .map(|(a, &l)| a.level_entropy[l])
            .sum::<i128>()
            - self.leaf_entropy
    }

    /// Σ_j lg of the ancestor of `representative` at `node` (fixed-point); at the top when `top`.
    pub fn class_entropy(&self, representative: u32, node: &[usize], top: bool) -> i64 {
        let leaves = &self.leaves[representative as usize * self.d..][..self.d];
        self.attributes
            .iter()
            .zip(leaves)
            .zip(node)
            .map(|((a, &leaf), &level)| {
                let level = if top { a.height - 1 } else { level };
                a.lg[level][a.codes[level][leaf as usize] as usize]
            })
            .sum()
    }
}

/// `a <= b` in the lattice (every level).
pub fn leq(a: &[usize], b: &[usize]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y)
}
