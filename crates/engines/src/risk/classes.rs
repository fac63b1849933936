//! The quasi-identifier columns the risk models read, and their equivalence classes: records that
//! agree on every chosen column. Built from a loaded table (its QI codes) or from a release (its
//! released QI values, dictionary-encoded, where a generalized interval or hierarchy node is a
//! value like any other); a cell suppressed to `*` carries the column's wildcard code.
//!
//! Invariants: a record whose every QI is suppressed is an outlier and belongs to no class (ARX's
//! `isOutlier`: removed records do not count); grouping is exact (successive refinement by one
//! column at a time, keyed by the previous class id and the column's code), its memory O(rows +
//! classes × a column's domain) bounded by [`DENSE_LIMIT`], past which a hash map keys the pairs.
use std::collections::HashMap;

use crate::relational::release::{ReleasedRole, ReleasedTable};
use crate::relational::table::Table;

/// Above this many (class, code) pairs a refinement keys them in a hash map instead of a table.
pub const DENSE_LIMIT: usize = 1 << 22;

/// Dictionary-encoded quasi-identifier columns of one table or release.
#[derive(Debug, Clone, Default)]
pub struct QuasiColumns {
    pub names: Vec<String>,
    /// Per column, one code per record.
    pub codes: Vec<Vec<u32>>,
    /// Per column, the code of a suppressed cell (`*`), if the column has one.
    pub wildcard: Vec<Option<u32>>,
    /// Per column, one more than its largest code.
    pub domains: Vec<u32>,
    pub rows: usize,
}

impl QuasiColumns {
    /// Columns from `(name, codes, wildcard)`; every column has `rows` codes (checked).
    pub fn new(
        rows: usize,
        columns: impl IntoIterator<Item = (String, Vec<u32>, Option<u32>)>,
    ) -> Result<QuasiColumns, String> {
        let mut out = QuasiColumns {
            rows,
            ..QuasiColumns::default()
        };
        for (name, codes, wildcard) in columns {
            if codes.len() != rows {
                return Err(format!(
                    "column {}: {} codes for {rows} rows",
                    crate::text::quote(&name),
                    codes.len()
                ));
            }
            out.domains
                .push(codes.iter().max().map_or(0, |&m| m.saturating_add(1)));
            out.names.push(name);
            out.codes.push(codes);
            out.wildcard.push(wildcard);
        }
        Ok(out)
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Whether every QI of `row` is suppressed.
    pub fn is_outlier(&self, row: usize) -> bool {
        !self.codes.is_empty()
            && self
                .codes
                .iter()
                .zip(&self.wildcard)
                .all(|(codes, w)| Some(codes[row]) == *w)
    }
}

/// The quasi-identifiers of a loaded table, in column order (no cell is suppressed).
pub fn of_table(table: &Table) -> QuasiColumns {
    let columns = table
        .quasi
        .iter()
        .map(|c| (c.name.clone(), c.codes.clone(), None));
    QuasiColumns::new(table.rows(), columns).unwrap_or_default()
}

/// The released quasi-identifiers of a release (generalized or trivial, or bucketization's QI
/// table), in released column order; a released `*` is the column's wildcard.
pub fn of_release(release: &ReleasedTable) -> QuasiColumns {
    let columns = release
        .columns
        .iter()
        .filter(|c| c.role == ReleasedRole::Quasi)
        .map(|c| {
            let wildcard = c.dictionary.iter().position(|v| v == "*").map(|p| p as u32);
            (c.name.clone(), c.codes.clone(), wildcard)
        });
    QuasiColumns::new(release.rows, columns).unwrap_or_default()
}

/// Records grouped on some columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouping {
    /// Per record, its class, or `u32::MAX` for an excluded record.
    pub class_of_row: Vec<u32>,
    /// Per class, its number of records.
    pub sizes: Vec<u32>,
}

/// A no-record marker in [`Grouping::class_of_row`].
pub const EXCLUDED: u32 = u32::MAX;

/// Groups the records on `columns` (indices into `q`), leaving out the rows `include` rejects.
pub fn group(q: &QuasiColumns, columns: &[usize], include: impl Fn(usize) -> bool) -> Grouping {
    let mut ids: Vec<u32> = (0..q.rows)
        .map(|r| if include(r) { 0 } else { EXCLUDED })
        .collect();
    let mut count: usize = usize::from(ids.iter().any(|&i| i != EXCLUDED));
    let mut dense: Vec<u32> = Vec::new();
    let mut sparse: HashMap<u64, u32> = HashMap::new();
    for &c in columns {
        let codes = &q.codes[c];
        let domain = q.domains[c].max(1) as usize;
        let mut next: u32 = 0;
        match count
            .checked_mul(domain)
            .filter(|&cells| cells <= DENSE_LIMIT)
        {
            Some(cells) => {
                dense.clear();
                dense.resize(cells, EXCLUDED);
                for (id, &code) in ids.iter_mut().zip(codes) {
                    if *id == EXCLUDED {
                        continue;
                    }
                    let slot = &mut dense[*id as usize * domain + code as usize];
                    if *slot == EXCLUDED {
                        *slot = next;
                        next += 1;
                    }
                    *id = *slot;
                }
            }
            None => {
                sparse.clear();
                for (id, &code) in ids.iter_mut().zip(codes) {
                    if *id == EXCLUDED {
                        continue;
                    }
                    let key = ((*id as u64) << 32) | code as u64;
                    let value = *sparse.entry(key).or_insert_with(|| {
                        next += 1;
                        next - 1
                    });
                    *id = value;
                }
            }
        }
        count = next as usize;
    }
    let mut sizes = vec![0u32; count];
    for &id in &ids {
        if id != EXCLUDED {
            sizes[id as usize] += 1;
        }
    }
    Grouping {
        class_of_row: ids,
        sizes,
    }
}

/// Quasi-identifier columns `q0`, `q1`, ... of `width` codes per row, no wildcard: the random tables
/// of the risk models' property tests.
#[cfg(test)]
pub(crate) fn test_columns(rows: &[Vec<u32>], width: usize) -> QuasiColumns {
    QuasiColumns::new(
        rows.len(),
        (0..width).map(|c| (format!("q{c}"), rows.iter().map(|r| r[c]).collect(), None)),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(rows: &[[u32; 2]], wildcard: [Option<u32>; 2]) -> QuasiColumns {
        QuasiColumns::new(
            rows.len(),
            (0..2).map(|c| {
                (
                    format!("q{c}"),
                    rows.iter().map(|r| r[c]).collect(),
                    wildcard[c],
                )
            }),
        )
        .unwrap()
    }

    #[test]
    fn groups_on_all_and_on_some_columns() {
        let q = columns(&[[0, 1], [0, 1], [0, 2], [1, 1]], [None, None]);
        let all = group(&q, &[0, 1], |_| true);
        let mut sizes = all.sizes.clone();
        sizes.sort();
        assert_eq!(sizes, vec![1, 1, 2]);
        assert_eq!(all.class_of_row[0], all.class_of_row[1]);
        assert_ne!(all.class_of_row[0], all.class_of_row[2]);
        let first = group(&q, &[0], |_| true);
        assert_eq!(first.sizes.len(), 2);
        let none = group(&q, &[], |_| true);
        assert_eq!(none.sizes, vec![4]);
    }

    #[test]
    fn fully_suppressed_records_are_outliers() {
        let q = columns(&[[9, 9], [9, 1], [0, 1], [9, 9]], [Some(9), Some(9)]);
        assert!(q.is_outlier(0) && !q.is_outlier(1) && !q.is_outlier(2) && q.is_outlier(3));
        let g = group(&q, &[0, 1], |r| !q.is_outlier(r));
        assert_eq!(g.class_of_row[0], EXCLUDED);
        assert_eq!(g.sizes.iter().sum::<u32>(), 2);
    }

    #[test]
    fn rejects_a_column_of_the_wrong_length() {
        let err = QuasiColumns::new(2, [("a".to_string(), vec![0], None)]).unwrap_err();
        assert!(err.contains("1 codes for 2 rows"), "{err}");
    }
}
