//! Aggregate query answering (Li & Li, KDD'09 §5.2, after Xiao & Tao's Anatomy): COUNT queries
//! `SELECT COUNT(*) WHERE A1 ∈ V1 AND ... AND Aqd ∈ Vqd AND S ∈ VS`, with qd distinct QIs chosen at
//! random and, for each, a random fraction `sel` of its values (a contiguous run of the sorted
//! distinct values of a numeric QI; a random subset of the hierarchy's leaves of a categorical one),
//! and a random fraction `sel` of the sensitive values (at least one). The measure is the mean relative
//! error |estimate − actual| / actual over the queries, the estimate taken from the release under the
//! uniform assumption (the fraction of a cell's region inside the predicate, times the cell's estimated
//! count of the selected sensitive values).
//!
//! Invariants: the workload depends only on the table and the seed; only queries with a non-zero
//! actual count are kept (drawing at most 100 × the requested number); the original table as its own
//! release answers every query exactly.
use std::sync::atomic::{AtomicBool, Ordering};

use rand::Rng;
use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;

use crate::measures::view::{Region, ReleaseView};
use crate::relational::table::{QuasiAttribute, Table};

/// The values a query selects from one QI.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// Numeric domain indices lo..=hi.
    Range { lo: u32, hi: u32 },
    /// Selected hierarchy leaves (a mask over the leaves).
    Leaves(Vec<bool>),
}

/// One COUNT query.
#[derive(Debug, Clone, PartialEq)]
pub struct CountQuery {
    pub predicates: Vec<(usize, Selection)>,
    /// Mask over the sensitive domain.
    pub sensitive: Vec<bool>,
}

/// Queries drawn or measured between two looks at the cancellation flag.
const CANCEL_CHECK_EVERY: usize = 64;

/// Queries with their actual answers on the original table.
#[derive(Debug, Clone)]
pub struct QueryWorkload {
    pub queries: Vec<CountQuery>,
    pub actual: Vec<f64>,
    pub qd: usize,
    pub sel: f64,
}

fn selected(selection: &Selection, code: u32) -> bool {
    match selection {
        Selection::Range { lo, hi } => (*lo..=*hi).contains(&code),
        Selection::Leaves(mask) => mask[code as usize],
    }
}

impl QueryWorkload {
    /// Draws `count` queries with a non-zero answer (fewer if 100 × `count` draws do not find them).
    pub fn generate(table: &Table, count: usize, qd: usize, sel: f64, seed: u64) -> QueryWorkload {
        let never = AtomicBool::new(false);
        Self::generate_unless(table, count, qd, sel, seed, &never)
            .expect("generation that cannot be cancelled completes")
    }

    /// [`QueryWorkload::generate`], giving up (`None`) soon after `cancelled` turns true.
    pub fn generate_unless(
        table: &Table,
        count: usize,
        qd: usize,
        sel: f64,
        seed: u64,
        cancelled: &AtomicBool,
    ) -> Option<QueryWorkload> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let qd = qd.clamp(1, table.quasi.len());
        let m = table.sensitive.domain.len();
        // Grown as queries are found: `count` is the caller's number, not an allocation size.
        let mut queries = Vec::new();
        let mut actual = Vec::new();
        let mut draws = 0usize;
        while queries.len() < count && draws < count.saturating_mul(100) {
            if draws.is_multiple_of(CANCEL_CHECK_EVERY) && cancelled.load(Ordering::Relaxed) {
                return None;
            }
            draws += 1;
            let attributes = sample(&mut rng, table.quasi.len(), qd).into_vec();
            let predicates: Vec<(usize, Selection)> = attributes
                .into_iter()
                .map(|q| {
                    let selection = match &table.quasi[q].attribute {
                        QuasiAttribute::Numeric(domain) => {
                            let d = domain.values.len();
                            let width = ((sel * d as f64).ceil() as usize).clamp(1, d);
                            let lo = rng.random_range(0..=d - width);
                            Selection::Range {
                                lo: lo as u32,
                                hi: (lo + width - 1) as u32,
                            }
                        }
                        QuasiAttribute::Categorical(h) => {
                            let d = h.leaf_count();
                            let width = ((sel * d as f64).ceil() as usize).clamp(1, d);
                            let mut mask = vec![false; d];
                            for i in sample(&mut rng, d, width) {
                                mask[i] = true;
                            }
                            Selection::Leaves(mask)
                        }
                    };
                    (q, selection)
                })
                .collect();
            let width = ((sel * m as f64).ceil() as usize).clamp(1, m);
            let mut sensitive = vec![false; m];
            for i in sample(&mut rng, m, width) {
                sensitive[i] = true;
            }
            let query = CountQuery {
                predicates,
                sensitive,
            };
            let answer = actual_count(table, &query);
            if answer > 0 {
                queries.push(query);
                actual.push(answer as f64);
            }
        }
        Some(QueryWorkload {
            queries,
            actual,
            qd,
            sel,
        })
    }

    /// Mean relative error of the release's estimates; 0 for an empty workload.
    pub fn relative_error(&self, table: &Table, view: &ReleaseView) -> f64 {
        let never = AtomicBool::new(false);
        self.relative_error_unless(table, view, &never)
            .expect("a measurement that cannot be cancelled completes")
    }

    /// [`QueryWorkload::relative_error`], giving up (`None`) soon after `cancelled` turns true.
    pub fn relative_error_unless(
        &self,
        table: &Table,
        view: &ReleaseView,
        cancelled: &AtomicBool,
    ) -> Option<f64> {
        if self.queries.is_empty() {
            return Some(0.0);
        }
        let mut sum = 0.0;
        for (i, (query, &actual)) in self.queries.iter().zip(&self.actual).enumerate() {
            if i.is_multiple_of(CANCEL_CHECK_EVERY) && cancelled.load(Ordering::Relaxed) {
                return None;
            }
            let estimate = estimated_count(table, view, query);
            sum += (estimate - actual).abs() / actual;
        }
        Some(sum / self.queries.len() as f64)
    }
}

/// The query's answer on the original table.
pub fn actual_count(table: &Table, query: &CountQuery) -> u64 {
    (0..table.rows())
        .filter(|&r| {
            query.sensitive[table.sensitive.codes[r] as usize]
                && query
                    .predicates
                    .iter()
                    .all(|(q, s)| selected(s, table.quasi[*q].codes[r]))
        })
        .count() as u64
}

/// The share of a region's equally likely values that a selection keeps.
fn overlap(attribute: &QuasiAttribute, region: Region, selection: &Selection) -> f64 {
    match (region, selection) {
        (Region::Interval { lo, hi }, Selection::Range { lo: a, hi: b }) => {
            let from = lo.max(*a);
            let to = hi.min(*b);
            if from > to {
                0.0
            } else {
                (to - from + 1) as f64 / (hi - lo + 1) as f64
            }
        }
        (Region::Node(node), Selection::Leaves(mask)) => {
            let QuasiAttribute::Categorical(h) = attribute else {
                return 0.0;
            };
            let inside = mask
                .iter()
                .enumerate()
                .filter(|&(leaf, &on)| on && h.covers(node, leaf as u32))
                .count();
            inside as f64 / h.leaves_under(node).max(1) as f64
        }
        _ => 0.0,
    }
}

/// The query's answer estimated from the release.
pub fn estimated_count(table: &Table, view: &ReleaseView, query: &CountQuery) -> f64 {
    let mut total = 0.0;
    'cells: for c in 0..view.cells() {
        let (regions, histogram) = view.cell(c);
        let mut weight = 1.0;
        for (q, selection) in &query.predicates {
            weight *= overlap(&table.quasi[*q].attribute, regions[*q], selection);
            if weight == 0.0 {
                continue 'cells;
            }
        }
        let count: f64 = histogram
            .iter()
            .zip(&query.sensitive)
            .filter(|&(_, &on)| on)
            .map(|(h, _)| h)
            .sum();
        total += weight * count;
    }
    total
}
