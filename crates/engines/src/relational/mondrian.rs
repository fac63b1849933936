//! Mondrian strict multidimensional partitioning (LeFevre, DeWitt & Ramakrishnan, ICDE'06), with the
//! split test generalized from k-anonymity to any [`ModelSet`] (as Li & Li and Brickell & Shmatikov use
//! it for l-diversity, t-closeness and delta-disclosure).
//!
//! A partition is split on the quasi-identifier with the widest normalized range — numeric:
//! (max − min) / (table max − table min); categorical: leaves under the lowest common hierarchy node of
//! the partition's values / leaves of the hierarchy — ties going to the earlier column. A numeric
//! attribute is cut at the median (left: values <= median; if that leaves the right part empty, left:
//! values < the maximum); a categorical one is cut into the children of its lowest common node (two or
//! more parts). A split is accepted only when every part satisfies every requested model; otherwise
//! the next widest attribute is tried, and a partition no attribute can split is an equivalence class.
//! A release criterion that caps the number of classes (the average prosecutor risk: at most
//! ⌊a·n⌋ classes) is honoured by refusing, in the depth-first order of the splits, every split that
//! would take the number of classes past the cap; the other release criteria (population
//! uniqueness) are measured on the release and refuse it when exceeded (`crate::relational`).
//!
//! Invariants: the classes partition the rows; every class satisfies every model (the whole table is
//! checked first and the split test keeps it so); classes are separated strictly (two classes differ
//! in some attribute by disjoint intervals or disjoint hierarchy subtrees), so their generalized regions
//! are distinct. Deterministic: no randomness is used. [`partition_unless`] looks at its cancellation
//! flag before every split, so one pass over one partition is the most work done after it turns true.
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::relational::models::{ClassCounts, ModelSet, SensitiveDistribution};
use crate::relational::table::{QuasiAttribute, Table};

/// The equivalence classes found by Mondrian.
#[derive(Debug, Clone)]
pub struct Partitioning {
    /// A permutation of the row indices; each class is a contiguous range of it.
    pub rows: Vec<u32>,
    pub classes: Vec<Range<usize>>,
}

impl Partitioning {
    /// The whole table as one class (the trivial partition).
    pub fn whole_table(rows: usize) -> Partitioning {
        Partitioning {
            rows: (0..rows as u32).collect(),
            classes: std::iter::once(0..rows).collect(),
        }
    }

    /// The rows of class `c`.
    pub fn class_rows(&self, c: usize) -> &[u32] {
        &self.rows[self.classes[c].clone()]
    }
}

/// The model cannot be met even by the whole table as one class.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{model} cannot be met: the whole table as one equivalence class has {reason}")]
pub struct Unsatisfiable {
    pub model: String,
    pub reason: String,
}

/// Why [`partition_unless`] returned no partitioning.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PartitionError {
    #[error(transparent)]
    Unsatisfiable(#[from] Unsatisfiable),
    #[error("partitioning cancelled")]
    Cancelled,
}

/// Checks that the whole table satisfies every model (else no release can).
pub fn check_whole_table(
    table: &Table,
    models: &ModelSet,
    distribution: &SensitiveDistribution,
) -> Result<(), Unsatisfiable> {
    let counts: Vec<u32> = distribution.counts.iter().map(|&c| c as u32).collect();
    let whole = ClassCounts {
        size: table.rows() as u64,
        counts: &counts,
    };
    if let Some((model, reason)) = models.violation(&whole, distribution) {
        return Err(Unsatisfiable { model, reason });
    }
    match models.max_classes(table.rows() as u64) {
        Some((0, model)) => Err(Unsatisfiable {
            model,
            reason: format!(
                "1 class of {} records, an average risk above the bound",
                table.rows()
            ),
        }),
        _ => Ok(()),
    }
}

struct Scratch {
    values: Vec<u32>,
    part_of: Vec<u32>,
    reordered: Vec<u32>,
    histograms: Vec<u32>,
    sizes: Vec<u64>,
}

/// The rows as a row-major record array `[qi_0, .., qi_{d-1}, sensitive, row]` per row, partitioned
/// in place: every pass over a partition reads memory sequentially (column lookups through a row
/// permutation would miss the cache on every access on large tables).
struct Records {
    cells: Vec<u32>,
    stride: usize,
    quasi: usize,
}

impl Records {
    fn new(table: &Table) -> Records {
        let quasi = table.quasi.len();
        let stride = quasi + 2;
        let n = table.rows();
        let mut cells = vec![0u32; n * stride];
        for (r, record) in cells.chunks_exact_mut(stride).enumerate() {
            for (q, column) in table.quasi.iter().enumerate() {
                record[q] = column.codes[r];
            }
            record[quasi] = table.sensitive.codes[r];
            record[quasi + 1] = r as u32;
        }
        Records {
            cells,
            stride,
            quasi,
        }
    }
}

/// Runs Mondrian. Fails only when the whole table violates a model.
pub fn partition(table: &Table, models: &ModelSet) -> Result<Partitioning, Unsatisfiable> {
    partition_unless(table, models, &AtomicBool::new(false)).map_err(|e| match e {
        PartitionError::Unsatisfiable(u) => u,
        PartitionError::Cancelled => unreachable!("a flag nobody sets never cancels"),
    })
}

/// [`partition`], giving up with [`PartitionError::Cancelled`] at the first split that starts after
/// `cancelled` turned true.
pub fn partition_unless(
    table: &Table,
    models: &ModelSet,
    cancelled: &AtomicBool,
) -> Result<Partitioning, PartitionError> {
    let distribution = table.sensitive_distribution();
    check_whole_table(table, models, &distribution)?;
    let n = table.rows();
    let mut records = Records::new(table);
    let mut classes = Vec::new();
    let mut pending: Vec<Range<usize>> = std::iter::once(0..n).collect();
    let mut scratch = Scratch {
        values: Vec::new(),
        part_of: Vec::new(),
        reordered: Vec::new(),
        histograms: Vec::new(),
        sizes: Vec::new(),
    };
    let spans: Vec<f64> = table
        .quasi
        .iter()
        .map(|q| match &q.attribute {
            QuasiAttribute::Numeric(d) => match (d.values.first(), d.values.last()) {
                (Some(lo), Some(hi)) => hi - lo,
                _ => 0.0,
            },
            QuasiAttribute::Categorical(h) => h.leaf_count() as f64,
        })
        .collect();
    let stride = records.stride;
    let most_classes = models.max_classes(n as u64).map_or(usize::MAX, |(m, _)| {
        usize::try_from(m).unwrap_or(usize::MAX)
    });
    let mut cuts = Vec::new();
    while let Some(range) = pending.pop() {
        if cancelled.load(Ordering::Relaxed) {
            return Err(PartitionError::Cancelled);
        }
        cuts.clear();
        let start = range.start;
        split(
            table,
            models,
            &distribution,
            &spans,
            &mut records.cells[range.start * stride..range.end * stride],
            records.quasi,
            &mut scratch,
            &mut cuts,
        );
        // After the split: the classes found, the parts pending and this part's pieces.
        let after = classes.len() + pending.len() + cuts.len() + 1;
        if cuts.is_empty() || after > most_classes {
            classes.push(range);
        } else {
            let mut lo = start;
            for &cut in cuts.iter() {
                pending.push(lo..start + cut);
                lo = start + cut;
            }
            pending.push(lo..range.end);
        }
    }
    classes.sort_by_key(|r| r.start);
    let rows = records
        .cells
        .chunks_exact(stride)
        .map(|record| record[stride - 1])
        .collect();
    Ok(Partitioning { rows, classes })
}

/// A candidate cut of one attribute.
enum Candidate {
    Numeric { q: usize, max: u32 },
    Categorical { q: usize, level: usize, node: u32 },
}

/// Tries to split `part` (records of `quasi + 2` cells); on success reorders it and pushes the
/// interior cut offsets (in records) into `cuts`.
#[allow(clippy::too_many_arguments)]
fn split(
    table: &Table,
    models: &ModelSet,
    distribution: &SensitiveDistribution,
    spans: &[f64],
    part: &mut [u32],
    quasi: usize,
    scratch: &mut Scratch,
    cuts: &mut Vec<usize>,
) {
    let stride = quasi + 2;
    let len = part.len() / stride;
    if len < 2 {
        return;
    }
    let mut candidates: Vec<(f64, Candidate)> = Vec::with_capacity(quasi);
    for (q, column) in table.quasi.iter().enumerate() {
        let codes = part.iter().skip(q).step_by(stride).copied();
        match &column.attribute {
            QuasiAttribute::Numeric(domain) => {
                let (mut min, mut max) = (u32::MAX, 0);
                for c in codes {
                    min = min.min(c);
                    max = max.max(c);
                }
                if min < max && spans[q] > 0.0 {
                    let width =
                        (domain.values[max as usize] - domain.values[min as usize]) / spans[q];
                    candidates.push((width, Candidate::Numeric { q, max }));
                }
            }
            QuasiAttribute::Categorical(h) => {
                if let Some((level, node)) = h.lowest_common_ancestor(codes)
                    && level > 0
                {
                    let width = h.leaves_under(node) as f64 / spans[q];
                    candidates.push((width, Candidate::Categorical { q, level, node }));
                }
            }
        }
    }
    // Widest first; the sort is stable, so ties keep column order.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
    let m = distribution.counts.len();
    for (_, candidate) in candidates {
        // Assign each record of the part to a sub-part.
        let parts = match candidate {
            Candidate::Numeric { q, max } => {
                scratch.values.clear();
                scratch
                    .values
                    .extend(part.iter().skip(q).step_by(stride).copied());
                let mid = (scratch.values.len() - 1) / 2;
                let (_, &mut median, _) = scratch.values.select_nth_unstable(mid);
                let threshold = if median < max {
                    median
                } else {
                    // Everything from the median up equals the maximum: cut below it.
                    scratch
                        .values
                        .iter()
                        .copied()
                        .filter(|&v| v < max)
                        .max()
                        .unwrap_or(max)
                };
                scratch.part_of.clear();
                scratch.part_of.extend(
                    part.iter()
                        .skip(q)
                        .step_by(stride)
                        .map(|&c| u32::from(c > threshold)),
                );
                2
            }
            Candidate::Categorical { q, level, node } => {
                let QuasiAttribute::Categorical(h) = &table.quasi[q].attribute else {
                    continue;
                };
                scratch.part_of.clear();
                scratch.part_of.extend(
                    part.iter()
                        .skip(q)
                        .step_by(stride)
                        .map(|&leaf| h.child_rank(h.ancestor(leaf, level - 1))),
                );
                h.child_count(node) as usize
            }
        };
        scratch.histograms.clear();
        scratch.histograms.resize(parts * m, 0);
        scratch.sizes.clear();
        scratch.sizes.resize(parts, 0);
        for (record, &p) in part.chunks_exact(stride).zip(&scratch.part_of) {
            let p = p as usize;
            scratch.histograms[p * m + record[quasi] as usize] += 1;
            scratch.sizes[p] += 1;
        }
        let admitted = (0..parts).all(|p| {
            scratch.sizes[p] == 0
                || models.admits(
                    &ClassCounts {
                        size: scratch.sizes[p],
                        counts: &scratch.histograms[p * m..(p + 1) * m],
                    },
                    distribution,
                )
        });
        if !admitted {
            continue;
        }
        // Counting sort of the part's records by sub-part.
        let mut offsets = vec![0usize; parts + 1];
        for p in 0..parts {
            offsets[p + 1] = offsets[p] + scratch.sizes[p] as usize;
        }
        cuts.extend(
            offsets[1..parts]
                .iter()
                .copied()
                .filter(|&o| o > 0 && o < len),
        );
        cuts.dedup();
        scratch.reordered.clear();
        scratch.reordered.resize(part.len(), 0);
        let mut next = offsets;
        for (record, &p) in part.chunks_exact(stride).zip(&scratch.part_of) {
            let p = p as usize;
            let at = next[p] * stride;
            scratch.reordered[at..at + stride].copy_from_slice(record);
            next[p] += 1;
        }
        part.copy_from_slice(&scratch.reordered);
        return;
    }
}
