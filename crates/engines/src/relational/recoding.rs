//! A release described cell by cell against the original table: for every row and quasi-identifier,
//! the region its value was recoded to (a hierarchy node, or an interval of a numeric domain), and
//! whether the row was suppressed. Every algorithm's output is brought to this form (Mondrian's
//! classes, OLA's full-domain node with its suppressed rows, KACA's local recoding), so the
//! distortion measures ([`crate::relational::distortion`]) are defined once, for all of them, and the
//! generalized release of a recoding is written in one place ([`release_generalized`]).
//!
//! Invariants: `cells[q]` has one entry per row of the table, in input row order; a cell's region
//! always contains the row's original value (a node covering its leaf, an interval `lo..=hi` of
//! domain ranks with `lo <= code <= hi`); a suppressed row is released with every QI `*` and its
//! cells are ignored by the measures (they count as fully generalized). The release's rows are in an
//! order drawn from the seeded RNG, independent of the input order.
use std::collections::HashMap;

use rand::Rng;

use crate::relational::hierarchy::NodeId;
use crate::relational::mondrian::Partitioning;
use crate::relational::release::{Release, ReleasedColumn, ReleasedRole, ReleasedTable};
use crate::relational::table::{ColumnSlot, QuasiAttribute, Table};

/// The region one cell was recoded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cell {
    /// A node of the column's hierarchy (level 0: the value itself).
    Node(NodeId),
    /// Ranks `lo..=hi` of a numeric column's sorted distinct values.
    Interval { lo: u32, hi: u32 },
}

/// A release, cell by cell.
#[derive(Debug, Clone)]
pub struct Recoding {
    /// `cells[q][row]`.
    pub cells: Vec<Vec<Cell>>,
    /// Rows released with every QI `*`.
    pub suppressed: Vec<bool>,
}

impl Recoding {
    /// The cell of `code` itself (no generalization).
    pub fn exact(attribute: &QuasiAttribute, code: u32) -> Cell {
        match attribute {
            QuasiAttribute::Numeric(_) => Cell::Interval { lo: code, hi: code },
            QuasiAttribute::Categorical(h) => Cell::Node(h.ancestor(code, 0)),
        }
    }

    /// Every class of `partitioning` generalized to its QI region (numeric: the class's min..max,
    /// categorical: the lowest common ancestor of its values), as Mondrian's generalization releases it.
    pub fn of_partitioning(table: &Table, partitioning: &Partitioning) -> Recoding {
        let n = table.rows();
        let mut cells: Vec<Vec<Cell>> = table
            .quasi
            .iter()
            .map(|_| vec![Cell::Interval { lo: 0, hi: 0 }; n])
            .collect();
        for c in 0..partitioning.classes.len() {
            let rows = partitioning.class_rows(c);
            for (q, column) in table.quasi.iter().enumerate() {
                let cell = region(
                    &column.attribute,
                    rows.iter().map(|&r| column.codes[r as usize]),
                );
                for &r in rows {
                    cells[q][r as usize] = cell;
                }
            }
        }
        Recoding {
            cells,
            suppressed: vec![false; n],
        }
    }

    /// Every cell at its own value (bucketization publishes the exact QIs).
    pub fn identity(table: &Table) -> Recoding {
        Recoding {
            cells: table
                .quasi
                .iter()
                .map(|q| {
                    q.codes
                        .iter()
                        .map(|&c| Recoding::exact(&q.attribute, c))
                        .collect()
                })
                .collect(),
            suppressed: vec![false; table.rows()],
        }
    }

    /// Number of suppressed rows.
    pub fn suppressed_rows(&self) -> u64 {
        self.suppressed.iter().filter(|&&s| s).count() as u64
    }
}

/// The smallest region holding some codes of one attribute (they must not be empty).
pub fn region(attribute: &QuasiAttribute, codes: impl Iterator<Item = u32>) -> Cell {
    match attribute {
        QuasiAttribute::Numeric(_) => {
            let (mut lo, mut hi) = (u32::MAX, 0);
            for c in codes {
                lo = lo.min(c);
                hi = hi.max(c);
            }
            Cell::Interval { lo, hi }
        }
        QuasiAttribute::Categorical(h) => {
            Cell::Node(h.lowest_common_ancestor(codes).map_or(0, |(_, node)| node))
        }
    }
}

/// The released label of a region.
pub fn label(attribute: &QuasiAttribute, cell: Cell) -> String {
    match (attribute, cell) {
        (QuasiAttribute::Numeric(d), Cell::Interval { lo, hi }) => {
            if lo == hi {
                d.texts[lo as usize].clone()
            } else {
                format!("{}-{}", d.texts[lo as usize], d.texts[hi as usize])
            }
        }
        (QuasiAttribute::Categorical(h), Cell::Node(node)) => h.label(node).to_string(),
        _ => "*".to_string(),
    }
}

/// The generalized release of a recoding: each QI cell is its region's label (`*` for a suppressed
/// row), the other kept columns as they are, rows in a random order drawn from `rng`.
pub fn release_generalized(table: &Table, recoding: &Recoding, rng: &mut impl Rng) -> Release {
    let n = table.rows();
    let order = crate::relational::release::release_order(n, rng);
    let mut columns = Vec::with_capacity(table.layout.len());
    for &slot in &table.layout {
        match slot {
            ColumnSlot::Quasi(q) => {
                let column = &table.quasi[q];
                let mut dictionary: Vec<String> = Vec::new();
                let mut code_of: HashMap<Option<Cell>, u32, foldhash::fast::FixedState> =
                    HashMap::default();
                let codes = order
                    .iter()
                    .map(|&r| {
                        let r = r as usize;
                        let cell = (!recoding.suppressed[r]).then(|| recoding.cells[q][r]);
                        *code_of.entry(cell).or_insert_with(|| {
                            dictionary.push(match cell {
                                Some(cell) => label(&column.attribute, cell),
                                None => "*".to_string(),
                            });
                            dictionary.len() as u32 - 1
                        })
                    })
                    .collect();
                // Two regions with one label (e.g. a root labelled `*` and a suppressed cell)
                // must be one released value: merge equal labels.
                let (dictionary, codes) = merge_labels(dictionary, codes);
                columns.push(ReleasedColumn {
                    name: column.name.clone(),
                    role: ReleasedRole::Quasi,
                    dictionary,
                    codes,
                });
            }
            other => columns.extend(crate::relational::release::plain_column(
                table, other, &order,
            )),
        }
    }
    Release::Generalized(ReleasedTable { columns, rows: n })
}

fn merge_labels(dictionary: Vec<String>, codes: Vec<u32>) -> (Vec<String>, Vec<u32>) {
    let mut index: HashMap<&str, u32> = HashMap::new();
    let mut merged: Vec<String> = Vec::new();
    let remap: Vec<u32> = dictionary
        .iter()
        .map(|label| {
            *index.entry(label.as_str()).or_insert_with(|| {
                merged.push(label.clone());
                merged.len() as u32 - 1
            })
        })
        .collect();
    let codes = codes.into_iter().map(|c| remap[c as usize]).collect();
    (merged, codes)
}
