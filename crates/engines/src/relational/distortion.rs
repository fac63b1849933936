//! Distortion of a release against its original table, in the terms of Wiegand & Schallner and of
//! the algorithms they name, computed from a cell-by-cell [`Recoding`] (so one definition serves
//! Mondrian, KACA and OLA alike):
//!
//! - **modification rate**: the share of QI cells whose released value differs from the original
//!   (a cell generalized to a node with the leaf's own label, or to a one-value interval, is not
//!   modified; a suppressed cell is);
//! - **weighted hierarchical distance** (Li, Wong, Fu & Pei): a cell generalized from level p to
//!   level q of a hierarchy of height h (levels numbered from the root, 1, to the leaves, h) costs
//!   WHD(p, q) = Σ_{j=q+1..p} w_{j,j−1} / Σ_{j=2..h} w_{j,j−1}, averaged over all QI cells; with
//!   uniform weights (w = 1) and with height weights w_{j,j−1} = 1/(j−1)^β, β ≥ 1;
//! - **precision** Prec (Sweeney; OLA's metric) = 1 − the mean over QI cells of level / (h − 1)
//!   (levels counted up from the leaf, 0, to the root, h − 1);
//! - **discernibility** DM = Σ |E|² over the classes kept + |T| for each suppressed record;
//! - **non-uniform entropy** = Σ over QI cells of −log2 Pr(a | b), where a is the cell's original
//!   value, b its released region and Pr(a | b) = n(a) / n(b) is the share, among the table's rows
//!   whose original value lies in b, of those whose value is a (for full-domain generalization this
//!   is exactly El Emam et al.'s definition; for local recoding it charges every cell released as b
//!   the same, whatever the other rows were recoded to).
//!
//! Numeric attributes without a hierarchy: an interval counts by its **range share**,
//! (max − min of the interval) / (max − min of the column), for WHD (both weightings) and Prec alike;
//! a one-value interval is 0, the whole range 1. Attributes with a hierarchy count by its levels.
//! A suppressed cell counts as fully generalized: modified, WHD 1, level share 1, and released as the
//! root, Pr(a | *) = n(a) / |T|.
//!
//! Bucketization publishes the QIs exactly: modification rate, WHD, 1 − Prec and the entropy are 0
//! (the distortion is in the broken QI–sensitive association, which Uloss measures), and DM charges
//! each group's size squared, since a group is the set an individual is indistinguishable within.
//!
//! Invariants: pure (no clock, no files); every per-cell measure lies in [0, 1] (entropy in
//! [0, log2 |T|]); the measures of the identity recoding are 0 (Prec 1, DM = Σ over distinct QI
//! tuples of their count squared).
use std::collections::HashMap;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

use serde::Serialize;

use crate::relational::recoding::{Cell, Recoding};
use crate::relational::table::{QuasiAttribute, Table};

/// Weights of the hierarchy levels in the weighted hierarchical distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weights {
    /// w_{j,j−1} = 1.
    Uniform,
    /// w_{j,j−1} = 1 / (j − 1)^β (β ≥ 1): steps near the root weigh more.
    Height(f64),
}

impl Weights {
    fn weight(self, j: usize) -> f64 {
        match self {
            Weights::Uniform => 1.0,
            Weights::Height(beta) => 1.0 / ((j - 1) as f64).powf(beta),
        }
    }
}

/// WHD(p, q) of a hierarchy of height `h`, levels numbered from the root (1) to the leaves (h):
/// the cost of generalizing a cell from level p to level q <= p.
pub fn whd(p: usize, q: usize, h: usize, weights: Weights) -> f64 {
    if h < 2 || q >= p {
        return 0.0;
    }
    let num: f64 = (q + 1..=p).map(|j| weights.weight(j)).sum();
    let den: f64 = (2..=h).map(|j| weights.weight(j)).sum();
    num / den
}

/// The distortion measures of one release (see the module doc for the definitions).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Distortion {
    pub modification_rate: f64,
    pub whd_uniform: f64,
    /// β of the height weights used for `whd_height`.
    pub beta: f64,
    pub whd_height: f64,
    pub precision: f64,
    pub discernibility: f64,
    pub non_uniform_entropy: f64,
    pub suppressed_rows: u64,
}

/// Why β was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("beta = {0}: the height weights need a finite beta >= 1")]
pub struct BetaError(pub f64);

/// Checks β of the height weights.
pub fn validate_beta(beta: f64) -> Result<(), BetaError> {
    if beta.is_finite() && beta >= 1.0 {
        Ok(())
    } else {
        Err(BetaError(beta))
    }
}

/// Per attribute: how many rows hold each original code, and how many rows fall in each region.
pub struct RegionCounts {
    /// Rows per original code.
    pub of_code: Vec<u64>,
    /// Categorical: rows under each hierarchy node. Numeric: prefix sums over ranks (len + 1).
    pub cumulative: Vec<u64>,
}

impl RegionCounts {
    pub fn new(attribute: &QuasiAttribute, codes: &[u32]) -> RegionCounts {
        match attribute {
            QuasiAttribute::Numeric(d) => {
                let mut of_code = vec![0u64; d.values.len()];
                for &c in codes {
                    of_code[c as usize] += 1;
                }
                let mut cumulative = vec![0u64; of_code.len() + 1];
                for (i, &c) in of_code.iter().enumerate() {
                    cumulative[i + 1] = cumulative[i] + c;
                }
                RegionCounts {
                    of_code,
                    cumulative,
                }
            }
            QuasiAttribute::Categorical(h) => {
                let mut of_code = vec![0u64; h.leaf_count()];
                for &c in codes {
                    of_code[c as usize] += 1;
                }
                let mut nodes = 0;
                for level in 0..h.height() {
                    for leaf in 0..h.leaf_count() as u32 {
                        nodes = nodes.max(h.ancestor(leaf, level) as usize + 1);
                    }
                }
                let mut cumulative = vec![0u64; nodes];
                for (leaf, &count) in of_code.iter().enumerate() {
                    for level in 0..h.height() {
                        cumulative[h.ancestor(leaf as u32, level) as usize] += count;
                    }
                }
                RegionCounts {
                    of_code,
                    cumulative,
                }
            }
        }
    }

    /// Rows of the table whose original value lies in `cell`.
    pub fn in_region(&self, cell: Cell) -> u64 {
        match cell {
            Cell::Node(node) => self.cumulative[node as usize],
            Cell::Interval { lo, hi } => {
                self.cumulative[hi as usize + 1] - self.cumulative[lo as usize]
            }
        }
    }
}

/// What one cell costs: (modified, WHD uniform, WHD height, level share).
pub fn cell_costs(attribute: &QuasiAttribute, code: u32, cell: Cell, beta: f64) -> [f64; 4] {
    match (attribute, cell) {
        (QuasiAttribute::Categorical(h), Cell::Node(node)) => {
            let height = h.height();
            let level = h.level(node);
            let leaf = h.ancestor(code, 0);
            let modified = if h.label(node) != h.label(leaf) {
                1.0
            } else {
                0.0
            };
            let (p, q) = (height, height - level);
            [
                modified,
                whd(p, q, height, Weights::Uniform),
                whd(p, q, height, Weights::Height(beta)),
                level as f64 / (height - 1) as f64,
            ]
        }
        (QuasiAttribute::Numeric(d), Cell::Interval { lo, hi }) => {
            let span = match (d.values.first(), d.values.last()) {
                (Some(a), Some(b)) => b - a,
                _ => 0.0,
            };
            let share = if span > 0.0 {
                (d.values[hi as usize] - d.values[lo as usize]) / span
            } else {
                0.0
            };
            [f64::from(u8::from(lo != hi)), share, share, share]
        }
        _ => [1.0; 4],
    }
}

/// The root region of an attribute (where a suppressed cell is released).
pub fn root(attribute: &QuasiAttribute) -> Cell {
    match attribute {
        QuasiAttribute::Numeric(d) => Cell::Interval {
            lo: 0,
            hi: d.values.len().saturating_sub(1) as u32,
        },
        QuasiAttribute::Categorical(h) => Cell::Node(h.ancestor(0, h.height() - 1)),
    }
}

/// The distortion of `recoding` against `table`, with height weights of exponent `beta`.
pub fn distortion(table: &Table, recoding: &Recoding, beta: f64) -> Distortion {
    let n = table.rows();
    let d = table.quasi.len();
    let cells = (n * d).max(1) as f64;
    let mut sums = [0.0f64; 4];
    let mut entropy = 0.0;
    for (q, column) in table.quasi.iter().enumerate() {
        let counts = RegionCounts::new(&column.attribute, &column.codes);
        let top = root(&column.attribute);
        // A cell's costs depend on its code, its region and whether it was suppressed only:
        // computed once per combination.
        let mut memo: FastMap<(u32, Cell, bool), ([f64; 4], f64)> = FastMap::default();
        for (r, &code) in column.codes.iter().enumerate() {
            let (cell, suppressed) = if recoding.suppressed[r] {
                (top, true)
            } else {
                (recoding.cells[q][r], false)
            };
            let (costs, log) = *memo.entry((code, cell, suppressed)).or_insert_with(|| {
                let costs = if suppressed {
                    [1.0; 4]
                } else {
                    cell_costs(&column.attribute, code, cell, beta)
                };
                let a = counts.of_code[code as usize] as f64;
                let b = counts.in_region(cell) as f64;
                (costs, (b / a).log2())
            });
            for (s, c) in sums.iter_mut().zip(costs) {
                *s += c;
            }
            entropy += log;
        }
    }
    let suppressed = recoding.suppressed_rows();
    let mut classes: FastMap<Vec<Cell>, u64> = FastMap::default();
    for r in 0..n {
        if !recoding.suppressed[r] {
            let key: Vec<Cell> = (0..d).map(|q| recoding.cells[q][r]).collect();
            *classes.entry(key).or_default() += 1;
        }
    }
    let discernibility =
        classes.values().map(|&s| (s * s) as f64).sum::<f64>() + suppressed as f64 * n as f64;
    Distortion {
        modification_rate: sums[0] / cells,
        whd_uniform: sums[1] / cells,
        beta,
        whd_height: sums[2] / cells,
        precision: 1.0 - sums[3] / cells,
        discernibility,
        non_uniform_entropy: entropy,
        suppressed_rows: suppressed,
    }
}

/// Discernibility of a bucketization with the given group sizes.
pub fn bucket_discernibility(sizes: impl Iterator<Item = u64>) -> f64 {
    sizes.map(|s| (s * s) as f64).sum()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::relational::hierarchy::Hierarchy;
    use crate::relational::table::{
        ColumnRole, ColumnSchema, QuasiKind, TableSchema, Unlisted, read_csv,
    };

    #[test]
    fn paper_whd_vectors() {
        // Birthday {D/M/Y, M/Y, Y, 10Y, C/T/G/P, *}: h = 6, D/M/Y (6) to 10Y (3).
        assert!((whd(6, 3, 6, Weights::Uniform) - 0.6).abs() < 1e-12);
        assert!((whd(6, 3, 6, Weights::Height(1.0)) - 0.3431).abs() < 5e-5);
        // Gender {Male/Female, *}: WHD(2, 1) = 1 with either weights.
        assert_eq!(whd(2, 1, 2, Weights::Uniform), 1.0);
        assert_eq!(whd(2, 1, 2, Weights::Height(1.0)), 1.0);
        assert_eq!(whd(6, 6, 6, Weights::Uniform), 0.0);
        assert_eq!(whd(6, 1, 6, Weights::Height(2.0)), 1.0);
        assert!(validate_beta(0.5).is_err() && validate_beta(f64::NAN).is_err());
        assert!(validate_beta(1.0).is_ok());
    }

    /// The paper's Table 3: birthday and gender of 6 people, 12 QI cells; 3b generalizes 4 cells,
    /// 3c (domain generalization) all 12.
    pub(crate) fn table3() -> Table {
        let birthday = Hierarchy::parse(
            "birthday.csv",
            "12.03.1982;03.1982;1982;1980-1989;*\n\
             22.03.1982;03.1982;1982;1980-1989;*\n\
             15.07.1985;07.1985;1985;1980-1989;*\n\
             02.07.1985;07.1985;1985;1980-1989;*\n\
             05.05.1991;05.1991;1991;1990-1999;*\n\
             05.05.1993;05.1993;1993;1990-1999;*\n",
        )
        .unwrap();
        let gender = Hierarchy::parse("gender.csv", "Male;*\nFemale;*\n").unwrap();
        let schema = TableSchema {
            columns: vec![
                ColumnSchema::new(
                    "birthday",
                    ColumnRole::Quasi(QuasiKind::Categorical(birthday)),
                ),
                ColumnSchema::new("gender", ColumnRole::Quasi(QuasiKind::Categorical(gender))),
                ColumnSchema::new("disease", ColumnRole::Sensitive { numeric: false }),
            ],
            unlisted: Unlisted::Drop,
        };
        let csv = "birthday,gender,disease\n12.03.1982,Male,a\n22.03.1982,Male,b\n\
                   15.07.1985,Female,a\n02.07.1985,Female,c\n05.05.1991,Male,b\n05.05.1993,Male,c\n";
        read_csv(schema, csv.as_bytes(), "t3.csv", b',').unwrap()
    }

    fn recode(table: &Table, levels: &[[usize; 2]]) -> Recoding {
        let mut r = Recoding::identity(table);
        for (q, column) in table.quasi.iter().enumerate() {
            let QuasiAttribute::Categorical(h) = &column.attribute else {
                unreachable!()
            };
            for (row, l) in levels.iter().enumerate() {
                r.cells[q][row] = Cell::Node(h.ancestor(column.codes[row], l[q]));
            }
        }
        r
    }

    #[test]
    fn paper_table_3_modification_rates() {
        let t = table3();
        // 3b: local recoding to month/year for the first four rows (4 of 12 cells changed).
        let local = recode(&t, &[[1, 0], [1, 0], [1, 0], [1, 0], [0, 0], [0, 0]]);
        let d = distortion(&t, &local, 1.0);
        assert!((d.modification_rate - 4.0 / 12.0).abs() < 1e-12);
        // 3c: domain generalization, birthday to the decade and gender to *.
        let global = recode(&t, &[[3, 1]; 6]);
        let d = distortion(&t, &global, 1.0);
        assert_eq!(d.modification_rate, 1.0);
        // Birthday D/M/Y -> 10Y is WHD(5, 2) of a height-5 hierarchy (3/4), gender WHD(2, 1) = 1.
        assert!((d.whd_uniform - (0.75 + 1.0) / 2.0).abs() < 1e-12);
        assert!((d.precision - (1.0 - (0.75 + 1.0) / 2.0)).abs() < 1e-12);
        // Classes {1980-1989, *}: 4 rows, {1990-1999, *}: 2 rows.
        assert_eq!(d.discernibility, 20.0);
        // Entropy: birthday 6 × log2(4 or 2 of a decade / 1), gender 6 × log2(6/4 or 6/2).
        let expected = 4.0 * 2.0 + 2.0 * 1.0 + 4.0 * (1.5f64).log2() + 2.0 * 3f64.log2();
        assert!((d.non_uniform_entropy - expected).abs() < 1e-9);
        let identity = distortion(&t, &Recoding::identity(&t), 1.0);
        assert_eq!(identity.modification_rate, 0.0);
        assert_eq!(identity.precision, 1.0);
        assert_eq!(identity.non_uniform_entropy, 0.0);
        assert_eq!(identity.discernibility, 6.0);
    }

    #[test]
    fn suppressed_rows_cost_everything() {
        let t = table3();
        let mut r = Recoding::identity(&t);
        r.suppressed[0] = true;
        let d = distortion(&t, &r, 1.0);
        assert_eq!(d.suppressed_rows, 1);
        assert!((d.modification_rate - 2.0 / 12.0).abs() < 1e-12);
        assert_eq!(d.discernibility, 5.0 + 6.0);
        // log2(6/1) for birthday, log2(6/4) for gender.
        assert!((d.non_uniform_entropy - (6f64.log2() + 1.5f64.log2())).abs() < 1e-9);
    }
}
