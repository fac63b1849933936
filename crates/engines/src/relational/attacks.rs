//! The attacks of Wiegand & Schallner ("Barriers to the implementation of k-anonymity", §3) as
//! measures of a release, so that every report says how far each attack gets:
//!
//! - *homogeneity*: a class whose sensitive values are all one value discloses that value to anyone
//!   who places a target in the class (the paper's Table 4). Reported: the number of such classes and
//!   the number and share of records in them. Distinct l-diversity with l >= 2 (and every l-diversity
//!   variant with l > 1) leaves none.
//! - *background knowledge*: an adversary who knows one sensitive value v the target does not have
//!   (the paper's Table 5: "Japanese rarely have heart disease") rules it out, and its best guess for a
//!   value s in the target's class E becomes `c_s / (|E| - c_v)`. Reported: the worst such posterior
//!   over every class and every pair s != v (with the prior `max_s c_s / |E|` beside it), and the
//!   classes and records where one excluded value makes the adversary certain (at most two distinct
//!   values). Under delta-disclosure with delta d (every class has `e^-d q_s < p(E,s) < e^d q_s` for
//!   the table's distribution q), the posterior is at most `e^d q_s / (1 - e^d q_v)`, maximized over
//!   the two most frequent values of q: [`delta_bound`], reported from the release's achieved delta.
//! - *unsorted matching*: two releases of one table with different generalizations, in the same row
//!   order, join by position back into the original (the paper's Table 6). Every release is put in an
//!   order drawn from the seed *and the released content* ([`order_seed`], [`permute_rows`]): two
//!   releases that differ in any released cell get independent orders even under one seed. Reported:
//!   how many rows sit at their input position (chance: 1 in expectation, whatever the size) with the
//!   exact tail probability of that many under a uniformly random order, and Spearman's rank
//!   correlation between input and release positions (chance: 0, standard deviation 1/sqrt(n-1)).
//!
//! Invariants: pure functions of the classes' sensitive counts, the table's sensitive distribution and
//! the row order (no I/O, no clock; the one random draw, [`reorder`], comes from the given seed); a posterior is in [0, 1]; the
//! accumulator's result does not depend on the order the classes are added in.
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::relational::release::{Release, ReleasedTable, release_order};

/// Homogeneity attack: classes with a single sensitive value.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Homogeneity {
    /// Classes whose records all share one sensitive value.
    pub classes: u64,
    /// Records in those classes.
    pub records: u64,
    /// records / rows of the release.
    pub share_of_records: f64,
}

/// Background-knowledge attack with one excluded value.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BackgroundKnowledge {
    /// The adversary's best posterior without knowledge: max over classes of max_s c_s / |E|.
    pub prior: f64,
    /// The worst posterior after excluding one value the target lacks: max over classes E and values
    /// s != v of c_s / (|E| - c_v).
    pub posterior: f64,
    /// Classes where excluding one value leaves a single candidate (at most two distinct values).
    pub certain_classes: u64,
    /// Records in those classes.
    pub certain_records: u64,
    /// The bound delta-disclosure puts on `posterior`, from the release's achieved delta
    /// ([`delta_bound`]); `None` when delta is unbounded (some class lacks a value of the table).
    pub delta_bound: Option<f64>,
}

/// Unsorted matching attack: how much the release order tells about the input order.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UnsortedMatching {
    pub rows: u64,
    /// Released rows at their input position (a uniformly random order has 1 in expectation).
    pub rows_at_input_position: u64,
    /// P(a uniformly random order of `rows` has at least that many rows at their input position).
    pub p_value: f64,
    /// Spearman's rank correlation of input and release positions (chance: 0 +- 1/sqrt(rows - 1)).
    pub spearman_rho: f64,
}

/// The attacks measured on one release.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Attacks {
    pub homogeneity: Homogeneity,
    pub background_knowledge: BackgroundKnowledge,
    /// Set by the engine, which knows each released row's input position; `None` for a release
    /// read back without it.
    pub unsorted_matching: Option<UnsortedMatching>,
}

/// Collects the homogeneity and background-knowledge measures class by class.
#[derive(Debug, Clone, Default)]
pub struct ClassAttacks {
    rows: u64,
    homogeneous_classes: u64,
    homogeneous_records: u64,
    prior: f64,
    posterior: f64,
    certain_classes: u64,
    certain_records: u64,
}

impl ClassAttacks {
    /// Adds one class given its non-zero sensitive counts (any order).
    pub fn add(&mut self, counts: impl IntoIterator<Item = u64>) {
        let mut size = 0u64;
        let mut distinct = 0u64;
        let (mut first, mut second) = (0u64, 0u64);
        for c in counts.into_iter().filter(|&c| c > 0) {
            size += c;
            distinct += 1;
            if c > first {
                second = first;
                first = c;
            } else if c > second {
                second = c;
            }
        }
        if size == 0 {
            return;
        }
        self.rows += size;
        if distinct == 1 {
            self.homogeneous_classes += 1;
            self.homogeneous_records += size;
        }
        if distinct <= 2 {
            self.certain_classes += 1;
            self.certain_records += size;
        }
        self.prior = self.prior.max(first as f64 / size as f64);
        // Excluding v raises c_s / (size - c_v) most for s, v the two most frequent values, in either
        // role; a single-valued class has posterior 1 already.
        let posterior = if distinct == 1 {
            1.0
        } else {
            (first as f64 / (size - second) as f64).max(second as f64 / (size - first) as f64)
        };
        self.posterior = self.posterior.max(posterior);
    }

    /// The measures; `table` holds the sensitive probabilities of the whole release and `delta` its
    /// achieved delta (`None` when unbounded).
    pub fn finish(&self, table: &[f64], delta: Option<f64>) -> (Homogeneity, BackgroundKnowledge) {
        (
            Homogeneity {
                classes: self.homogeneous_classes,
                records: self.homogeneous_records,
                share_of_records: if self.rows == 0 {
                    0.0
                } else {
                    self.homogeneous_records as f64 / self.rows as f64
                },
            },
            BackgroundKnowledge {
                prior: self.prior,
                posterior: self.posterior,
                certain_classes: self.certain_classes,
                certain_records: self.certain_records,
                delta_bound: delta.map(|d| delta_bound(d, table)),
            },
        )
    }
}

/// The largest posterior c_s / (|E| - c_v) (s != v) a class can have when every class meets
/// delta-disclosure with `delta` against the table distribution `table`: from p(E,s) <= e^delta q_s
/// and p(E,v) <= e^delta q_v, the posterior is at most e^delta q_s / (1 - e^delta q_v), capped at 1;
/// the bound grows with both q_s and q_v, so the two most frequent values of q, in either role,
/// attain its maximum. A table with one value has nothing to exclude: its bound is the prior, 1.
pub fn delta_bound(delta: f64, table: &[f64]) -> f64 {
    let (mut first, mut second) = (0.0f64, 0.0f64);
    for &q in table {
        if q > first {
            second = first;
            first = q;
        } else if q > second {
            second = q;
        }
    }
    if second <= 0.0 {
        return 1.0;
    }
    let e = delta.exp();
    let one = |s: f64, v: f64| {
        let rest = 1.0 - e * v;
        if rest <= 0.0 {
            1.0
        } else {
            (e * s / rest).min(1.0)
        }
    };
    one(first, second).max(one(second, first))
}

/// P(X >= at_least) for X the number of fixed points of a uniformly random permutation of `n`:
/// P(X = k) = (1/k!) sum_{j=0}^{n-k} (-1)^j / j! (exact; terms past 1/170! vanish in f64).
pub fn fixed_points_tail(n: u64, at_least: u64) -> f64 {
    if at_least == 0 {
        return 1.0;
    }
    if at_least > n {
        return 0.0;
    }
    // P(X = k) for k in [at_least, n], summed upwards (the terms fall faster than geometrically).
    let alternating = |m: u64| {
        let mut sum = 0.0;
        let mut term = 1.0;
        for j in 0..=m.min(170) {
            if j > 0 {
                term /= -(j as f64);
            }
            sum += term;
        }
        sum
    };
    let mut inverse_factorial = 1.0;
    for i in 1..=at_least.min(171) {
        inverse_factorial /= i as f64;
    }
    let mut tail = 0.0;
    let mut k = at_least;
    while k <= n && inverse_factorial > 0.0 {
        tail += inverse_factorial * alternating(n - k);
        k += 1;
        inverse_factorial /= k as f64;
    }
    tail.clamp(0.0, 1.0)
}

/// The unsorted-matching measures of an order: `source[i]` is the input position of released row i
/// (a permutation of 0..n).
pub fn unsorted_matching(source: &[u32]) -> UnsortedMatching {
    let n = source.len() as u64;
    let at_input = source
        .iter()
        .enumerate()
        .filter(|&(i, &s)| i as u32 == s)
        .count() as u64;
    let spearman_rho = if n < 2 {
        0.0
    } else {
        let d2: f64 = source
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let d = i as f64 - s as f64;
                d * d
            })
            .sum();
        let n = n as f64;
        1.0 - 6.0 * d2 / (n * (n * n - 1.0))
    };
    UnsortedMatching {
        rows: n,
        rows_at_input_position: at_input,
        p_value: fixed_points_tail(n, at_input),
        spearman_rho,
    }
}

/// FNV-1a, 64 bits: a hash that is the same on every platform and Rust version (the order of a
/// release must be reproducible from its seed).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn field(&mut self, text: &str) {
        self.bytes(&(text.len() as u64).to_le_bytes());
        self.bytes(text.as_bytes());
    }
}

fn hash_table(hash: &mut Fnv, table: &ReleasedTable) {
    for column in &table.columns {
        hash.field(&column.name);
    }
    // The multiset of released rows, independent of their current order: a sum of per-row hashes.
    let mut rows = 0u64;
    for row in 0..table.rows {
        let mut h = Fnv::new();
        for value in table.row(row) {
            h.field(value);
        }
        rows = rows.wrapping_add(h.0);
    }
    hash.bytes(&rows.to_le_bytes());
}

/// The seed of a release's final row order: the job seed mixed with the released content (column
/// names and the multiset of released rows; for bucketization also the sensitive table), so that two
/// releases of one table that differ in any cell are ordered independently, while one job run twice
/// gives one release.
pub fn order_seed(seed: u64, release: &Release) -> u64 {
    let mut hash = Fnv::new();
    hash.bytes(&seed.to_le_bytes());
    match release {
        Release::Generalized(table) => hash_table(&mut hash, table),
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => {
            hash_table(&mut hash, quasi_table);
            for e in &sensitive_table.entries {
                hash.bytes(&e.group.to_le_bytes());
                hash.field(&e.value);
                hash.bytes(&e.count.to_le_bytes());
            }
        }
    }
    hash.0
}

/// Reorders the rows of a release: row i of the result is row `order[i]` of the input (`order` a
/// permutation of the release's rows). Bucketization's sensitive table has no row order and stays.
pub fn permute_rows(release: &mut Release, order: &[u32]) {
    let table = match release {
        Release::Generalized(table) => table,
        Release::Bucketized { quasi_table, .. } => quasi_table,
    };
    debug_assert_eq!(order.len(), table.rows);
    for column in &mut table.columns {
        column.codes = order.iter().map(|&r| column.codes[r as usize]).collect();
    }
}

/// Puts a release in its final order: a [`release_order`] drawn from a ChaCha8 seeded with
/// [`order_seed`]`(seed, release)`. Returns the order applied (row i is the former row `order[i]`).
pub fn reorder(seed: u64, release: &mut Release) -> Vec<u32> {
    let rows = match release {
        Release::Generalized(table) => table.rows,
        Release::Bucketized { quasi_table, .. } => quasi_table.rows,
    };
    let order = release_order(
        rows,
        &mut ChaCha8Rng::seed_from_u64(order_seed(seed, release)),
    );
    permute_rows(release, &order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_points_tail_matches_enumeration() {
        // Brute force over every permutation of n <= 7.
        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut out = Vec::new();
            for p in permutations(n - 1) {
                for i in 0..=p.len() {
                    let mut q = p.clone();
                    q.insert(i, n - 1);
                    out.push(q);
                }
            }
            out
        }
        for n in 1..=7usize {
            let all = permutations(n);
            for at_least in 0..=n as u64 + 1 {
                let count = all
                    .iter()
                    .filter(|p| {
                        p.iter().enumerate().filter(|&(i, &s)| i == s).count() as u64 >= at_least
                    })
                    .count();
                let expected = count as f64 / all.len() as f64;
                let got = fixed_points_tail(n as u64, at_least);
                assert!(
                    (got - expected).abs() < 1e-12,
                    "n={n} at_least={at_least}: {got} vs {expected}"
                );
            }
        }
        // Large n: P(X >= 1) -> 1 - 1/e.
        assert!((fixed_points_tail(45_222, 1) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
    }

    #[test]
    fn identity_order_is_flagged_and_reversal_has_negative_rho() {
        let identity: Vec<u32> = (0..100).collect();
        let m = unsorted_matching(&identity);
        assert_eq!(m.rows_at_input_position, 100);
        assert!(m.p_value < 1e-100);
        assert!((m.spearman_rho - 1.0).abs() < 1e-12);
        let reversed: Vec<u32> = (0..100).rev().collect();
        assert!((unsorted_matching(&reversed).spearman_rho + 1.0).abs() < 1e-12);
    }

    #[test]
    fn delta_bound_caps_at_one() {
        assert_eq!(delta_bound(0.1, &[1.0]), 1.0);
        assert_eq!(delta_bound(5.0, &[0.5, 0.5]), 1.0);
        // q = (0.5, 0.3, 0.2), delta = 0.1: max(e 0.5 / (1 - e 0.3), e 0.3 / (1 - e 0.5)).
        let e = 0.1f64.exp();
        let expected = (e * 0.5 / (1.0 - e * 0.3)).max(e * 0.3 / (1.0 - e * 0.5));
        assert!((delta_bound(0.1, &[0.2, 0.5, 0.3]) - expected).abs() < 1e-12);
    }
}
