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
//! release answers every query exactly. The fast paths compute exactly what the definitions
//! [`actual_count`] and [`estimated_count`] do, in the same floating-point order: actual answers are
//! counted over the table's distinct rows grouped by sensitive value (whole numbers, any order), and
//! a release's estimates take each predicate's overlap once per distinct region of the view's cells
//! ([`CellRegions`]) instead of once per cell, then visit the cells in order as the definition does.
use std::collections::HashMap;
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
        let rows = DistinctRows::new(table);
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
            let answer = rows.count(&query);
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
        let cells = CellRegions::new(view);
        let mut scratch = Scratch::default();
        let mut sum = 0.0;
        for (i, (query, &actual)) in self.queries.iter().zip(&self.actual).enumerate() {
            if i.is_multiple_of(CANCEL_CHECK_EVERY) && cancelled.load(Ordering::Relaxed) {
                return None;
            }
            let estimate = cells.estimate(table, view, query, &mut scratch);
            sum += (estimate - actual).abs() / actual;
        }
        Some(sum / self.queries.len() as f64)
    }
}

/// The table's rows grouped by sensitive value, each distinct QI tuple once with its number of rows
/// (Adult: 45,222 rows, about a third as many distinct tuples), so a query's actual answer reads only
/// the tuples of the sensitive values it selects.
struct DistinctRows {
    quasi: usize,
    /// Per sensitive value: the QI codes of its distinct tuples, `quasi` per tuple.
    codes: Vec<Vec<u32>>,
    /// Per sensitive value: the rows of each of its distinct tuples.
    counts: Vec<Vec<u64>>,
}

impl DistinctRows {
    fn new(table: &Table) -> DistinctRows {
        let quasi = table.quasi.len();
        let m = table.sensitive.domain.len();
        let mut index: Vec<HashMap<Vec<u32>, usize>> = vec![HashMap::new(); m];
        let mut codes = vec![Vec::new(); m];
        let mut counts: Vec<Vec<u64>> = vec![Vec::new(); m];
        let mut key = Vec::with_capacity(quasi);
        for row in 0..table.rows() {
            let s = table.sensitive.codes[row] as usize;
            key.clear();
            key.extend(table.quasi.iter().map(|q| q.codes[row]));
            match index[s].get(key.as_slice()) {
                Some(&i) => counts[s][i] += 1,
                None => {
                    index[s].insert(key.clone(), counts[s].len());
                    codes[s].extend_from_slice(&key);
                    counts[s].push(1);
                }
            }
        }
        DistinctRows {
            quasi,
            codes,
            counts,
        }
    }

    /// [`actual_count`] of the query.
    fn count(&self, query: &CountQuery) -> u64 {
        let mut total = 0;
        for (s, _) in query.sensitive.iter().enumerate().filter(|&(_, &on)| on) {
            let tuples = self.codes[s].chunks_exact(self.quasi.max(1));
            for (tuple, &rows) in tuples.zip(&self.counts[s]) {
                if query
                    .predicates
                    .iter()
                    .all(|(q, selection)| selected(selection, tuple[*q]))
                {
                    total += rows;
                }
            }
        }
        total
    }
}

/// The query's answer on the original table (the definition; the workload counts it over
/// [`DistinctRows`]).
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

/// A view's cells as the queries read them: per QI, the distinct regions the cells release and the
/// index of each cell's region among them. A release has far fewer distinct regions per QI (tens to
/// hundreds) than cells (up to one per distinct QI tuple and group), and a predicate's overlap depends
/// only on the region.
struct CellRegions {
    /// Per QI: its distinct regions.
    distinct: Vec<Vec<Region>>,
    /// Per QI: the index into `distinct` of each cell's region.
    of_cell: Vec<Vec<u32>>,
}

/// What [`CellRegions::estimate`] reuses from one query to the next.
#[derive(Default)]
struct Scratch {
    /// Per predicate: the overlap of each distinct region of its QI.
    overlaps: Vec<Vec<f64>>,
    /// The selected sensitive values, ascending.
    sensitive: Vec<usize>,
}

impl CellRegions {
    fn new(view: &ReleaseView) -> CellRegions {
        let qn = view.quasi_count;
        let cells = view.cells();
        let mut index: Vec<HashMap<Region, u32>> = vec![HashMap::new(); qn];
        let mut distinct: Vec<Vec<Region>> = vec![Vec::new(); qn];
        let mut of_cell: Vec<Vec<u32>> = vec![Vec::with_capacity(cells); qn];
        for c in 0..cells {
            let (regions, _) = view.cell(c);
            for (q, &region) in regions.iter().enumerate() {
                let id = *index[q].entry(region).or_insert_with(|| {
                    distinct[q].push(region);
                    (distinct[q].len() - 1) as u32
                });
                of_cell[q].push(id);
            }
        }
        CellRegions { distinct, of_cell }
    }

    /// [`estimated_count`] of the query, the same floating-point operations in the same order.
    fn estimate(
        &self,
        table: &Table,
        view: &ReleaseView,
        query: &CountQuery,
        scratch: &mut Scratch,
    ) -> f64 {
        let predicates = query.predicates.len();
        if scratch.overlaps.len() < predicates {
            scratch.overlaps.resize_with(predicates, Vec::new);
        }
        for ((q, selection), overlaps) in query.predicates.iter().zip(&mut scratch.overlaps) {
            let attribute = &table.quasi[*q].attribute;
            overlaps.clear();
            overlaps.extend(
                self.distinct[*q]
                    .iter()
                    .map(|&region| overlap(attribute, region, selection)),
            );
        }
        scratch.sensitive.clear();
        scratch.sensitive.extend(
            query
                .sensitive
                .iter()
                .enumerate()
                .filter(|&(_, &on)| on)
                .map(|(s, _)| s),
        );
        let overlaps = &scratch.overlaps[..predicates];
        let m = view.domain;
        let mut total = 0.0;
        'cells: for c in 0..view.cells() {
            let mut weight = 1.0;
            for ((q, _), overlaps) in query.predicates.iter().zip(overlaps) {
                weight *= overlaps[self.of_cell[*q][c] as usize];
                if weight == 0.0 {
                    continue 'cells;
                }
            }
            let histogram = &view.cell_histograms[c * m..(c + 1) * m];
            let count: f64 = scratch.sensitive.iter().map(|&s| &histogram[s]).sum();
            total += weight * count;
        }
        total
    }
}

/// The query's answer estimated from the release (the definition; the workload computes it with
/// [`CellRegions`]).
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
