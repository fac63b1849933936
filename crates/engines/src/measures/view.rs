//! A release as the measures see it, relative to the original table's domains: its equivalence
//! classes (sensitive histograms, for the privacy measures) and its *cells* (a QI region with an
//! estimated sensitive histogram, for the utility measures under Li & Li's uniform assumption).
//!
//! - A released QI value is a region: a numeric value `v`, a range `lo-hi` or `*` is the set of the
//!   table's distinct values inside it (every one equally likely); a categorical value is a hierarchy
//!   node (a leaf, an inner node, or `*` = the root), every leaf below it equally likely.
//! - Generalization: a class is the set of rows with equal released QI values; its cell is its region
//!   with the class's exact sensitive histogram.
//! - Bucketization: a class is a group; a cell is one exact QI tuple within one group, carrying
//!   (rows of the tuple) × the group's sensitive distribution (every sensitive value of a bucket equally
//!   likely per row).
//!
//! Invariants: histograms are over the original table's sorted sensitive domain (a released sensitive
//! value outside it is an error); the cells' histograms sum to the number of released rows, as do the
//! classes'; the whole table's distribution Q used by the privacy measures is the release's own.
use std::collections::HashMap;

use crate::relational::hierarchy::{Hierarchy, NodeId};
use crate::relational::release::{Release, ReleasedRole, ReleasedTable};
use crate::relational::table::{QuasiAttribute, Table};

/// A released QI value, relative to the table's domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Region {
    /// Indices `lo..=hi` into the numeric domain (sorted distinct values of the table).
    Interval { lo: u32, hi: u32 },
    /// A hierarchy node.
    Node(NodeId),
}

impl Region {
    /// Number of equally likely values (domain values, or hierarchy leaves) in the region.
    pub fn size(&self, attribute: &QuasiAttribute) -> u32 {
        match (*self, attribute) {
            (Region::Interval { lo, hi }, _) => hi - lo + 1,
            (Region::Node(node), QuasiAttribute::Categorical(h)) => h.leaves_under(node),
            (Region::Node(_), QuasiAttribute::Numeric(_)) => 1,
        }
    }
}

/// Why a release cannot be measured against the table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ViewError {
    #[error("column {column:?}: released value {value:?} {rule}")]
    Value {
        column: String,
        value: String,
        rule: String,
    },
    #[error(
        "release has no column {0:?} (rule: the release keeps every quasi-identifier and the sensitive attribute)"
    )]
    MissingColumn(String),
    #[error("group {group}: {rule}")]
    Group { group: String, rule: String },
    #[error("release is empty")]
    Empty,
    /// The view's histograms (one per class and per cell, a count per sensitive value) would pass
    /// the caller's limit; checked before they are allocated.
    #[error(
        "the release's {classes} classes over {domain} sensitive values need more than {max} histogram cells"
    )]
    TooLarge {
        classes: usize,
        domain: usize,
        max: usize,
    },
}

/// Resolves released labels of one categorical QI to hierarchy nodes.
fn node_index(h: &Hierarchy) -> HashMap<&str, NodeId> {
    let mut index = HashMap::new();
    for level in 0..h.height() {
        for leaf in 0..h.leaf_count() as u32 {
            let node = h.ancestor(leaf, level);
            index.entry(h.label(node)).or_insert(node);
        }
    }
    index
}

fn parse_number(text: &str) -> Option<f64> {
    let v: f64 = text.trim().parse().ok()?;
    v.is_finite().then_some(v)
}

/// Parses a numeric released value: `*`, a number, or `lo-hi` (either bound may be negative).
fn parse_range(text: &str) -> Option<(f64, f64)> {
    let text = text.trim();
    if text == "*" {
        return Some((f64::NEG_INFINITY, f64::INFINITY));
    }
    if let Some(v) = parse_number(text) {
        return Some((v, v));
    }
    for (i, c) in text.char_indices() {
        if c == '-'
            && i > 0
            && let (Some(lo), Some(hi)) = (parse_number(&text[..i]), parse_number(&text[i + 1..]))
        {
            return Some((lo, hi));
        }
    }
    None
}

/// The region of one released QI label.
pub fn parse_region(
    attribute: &QuasiAttribute,
    nodes: &HashMap<&str, NodeId>,
    column: &str,
    label: &str,
) -> Result<Region, ViewError> {
    let error = |rule: &str| ViewError::Value {
        column: column.to_string(),
        value: label.to_string(),
        rule: rule.to_string(),
    };
    match attribute {
        QuasiAttribute::Numeric(domain) => {
            let (lo, hi) = parse_range(label)
                .ok_or_else(|| error("is neither a number, a range lo-hi nor * (rule: numeric QIs are released as numbers or ranges)"))?;
            let first = domain.values.partition_point(|&v| v < lo);
            let end = domain.values.partition_point(|&v| v <= hi);
            if lo > hi || first >= end {
                return Err(error(
                    "contains no value of the table (rule: a released range covers the values it generalizes)",
                ));
            }
            Ok(Region::Interval {
                lo: first as u32,
                hi: (end - 1) as u32,
            })
        }
        QuasiAttribute::Categorical(h) => {
            if label == "*" {
                return Ok(Region::Node(h.ancestor(0, h.height() - 1)));
            }
            nodes.get(label).map(|&n| Region::Node(n)).ok_or_else(|| {
                error("is not a node of its hierarchy (rule: categorical QIs are released as hierarchy values or *)")
            })
        }
    }
}

/// A release measured against a table.
#[derive(Debug, Clone)]
pub struct ReleaseView {
    /// Size of the sensitive domain (m).
    pub domain: usize,
    /// Size of each equivalence class (group).
    pub class_sizes: Vec<u64>,
    /// Sensitive histogram of each class, `m` counts per class.
    pub class_histograms: Vec<u64>,
    /// Regions of each cell, one per QI of the table (in table order).
    pub cell_regions: Vec<Region>,
    /// Estimated sensitive counts of each cell, `m` per cell.
    pub cell_histograms: Vec<f64>,
    pub quasi_count: usize,
}

impl ReleaseView {
    pub fn classes(&self) -> usize {
        self.class_sizes.len()
    }

    pub fn cells(&self) -> usize {
        self.cell_regions.len() / self.quasi_count.max(1)
    }

    pub fn class_histogram(&self, c: usize) -> &[u64] {
        &self.class_histograms[c * self.domain..(c + 1) * self.domain]
    }

    pub fn cell(&self, c: usize) -> (&[Region], &[f64]) {
        (
            &self.cell_regions[c * self.quasi_count..(c + 1) * self.quasi_count],
            &self.cell_histograms[c * self.domain..(c + 1) * self.domain],
        )
    }

    /// The release's own sensitive counts over the table's domain.
    pub fn sensitive_counts(&self) -> Vec<u64> {
        let mut totals = vec![0u64; self.domain];
        for (i, &c) in self.class_histograms.iter().enumerate() {
            totals[i % self.domain] += c;
        }
        totals
    }

    pub fn rows(&self) -> u64 {
        self.class_sizes.iter().sum()
    }

    /// Bytes of the view's lists (histograms, sizes, regions), for the job's memory budget.
    pub fn histogram_bytes(&self) -> u64 {
        let counts = self.class_histograms.len() + self.cell_histograms.len();
        let regions = self.cell_regions.len() * std::mem::size_of::<Region>();
        (counts as u64 + self.class_sizes.len() as u64) * 8 + regions as u64
    }

    /// Builds the view of a release against the table's domains.
    pub fn new(table: &Table, release: &Release) -> Result<ReleaseView, ViewError> {
        Self::new_within(table, release, usize::MAX)
    }

    /// [`ReleaseView::new`], refusing with [`ViewError::TooLarge`] before its class and cell
    /// histograms (classes × domain and cells × domain counts) would pass `max_cells` counts in all.
    pub fn new_within(
        table: &Table,
        release: &Release,
        max_cells: usize,
    ) -> Result<ReleaseView, ViewError> {
        let sensitive_index: HashMap<&str, u32> = table
            .sensitive
            .domain
            .iter()
            .enumerate()
            .map(|(i, v)| (v.as_str(), i as u32))
            .collect();
        let sensitive_code = |value: &str| {
            sensitive_index
                .get(value)
                .copied()
                .ok_or_else(|| ViewError::Value {
                    column: table.sensitive.name.clone(),
                    value: value.to_string(),
                    rule: "does not occur in the original table (rule: a release publishes the table's sensitive values)".to_string(),
                })
        };
        let quasi_table = match release {
            Release::Generalized(t) => t,
            Release::Bucketized { quasi_table, .. } => quasi_table,
        };
        if quasi_table.rows == 0 {
            return Err(ViewError::Empty);
        }
        let region_codes = quasi_regions(table, quasi_table)?;
        let qn = table.quasi.len();
        let m = table.sensitive.domain.len();
        let mut view = ReleaseView {
            domain: m,
            class_sizes: Vec::new(),
            class_histograms: Vec::new(),
            cell_regions: Vec::new(),
            cell_histograms: Vec::new(),
            quasi_count: qn,
        };
        let within = |classes: usize, cells: usize| {
            let needed = classes
                .checked_add(cells)
                .and_then(|n| n.checked_mul(m.max(1)));
            match needed {
                Some(n) if n <= max_cells => Ok(()),
                _ => Err(ViewError::TooLarge {
                    classes,
                    domain: m,
                    max: max_cells,
                }),
            }
        };
        let region_of = |q: usize, row: usize| -> Region {
            let (codes, regions) = &region_codes[q];
            regions[codes[row] as usize]
        };
        match release {
            Release::Generalized(t) => {
                let sensitive = t
                    .columns
                    .iter()
                    .find(|c| matches!(c.role, ReleasedRole::Sensitive { .. }))
                    .ok_or_else(|| ViewError::MissingColumn(table.sensitive.name.clone()))?;
                let sensitive_of: Vec<u32> = sensitive
                    .dictionary
                    .iter()
                    .map(|v| sensitive_code(v))
                    .collect::<Result<_, _>>()?;
                let mut class_of_key: HashMap<Vec<u32>, usize> = HashMap::new();
                let mut key = Vec::with_capacity(qn);
                for row in 0..t.rows {
                    key.clear();
                    key.extend(region_codes.iter().map(|(codes, _)| codes[row]));
                    let class = match class_of_key.get(key.as_slice()) {
                        Some(&c) => c,
                        None => {
                            let c = view.class_sizes.len();
                            // Each class is also a cell.
                            within(c + 1, c + 1)?;
                            class_of_key.insert(key.clone(), c);
                            view.class_sizes.push(0);
                            view.class_histograms
                                .resize(view.class_histograms.len() + m, 0);
                            view.cell_regions.extend((0..qn).map(|q| region_of(q, row)));
                            c
                        }
                    };
                    view.class_sizes[class] += 1;
                    let s = sensitive_of[sensitive.codes[row] as usize] as usize;
                    view.class_histograms[class * m + s] += 1;
                }
                view.cell_histograms = view.class_histograms.iter().map(|&c| c as f64).collect();
            }
            Release::Bucketized {
                quasi_table,
                sensitive_table,
            } => {
                let group = quasi_table
                    .columns
                    .iter()
                    .find(|c| c.role == ReleasedRole::Group)
                    .ok_or_else(|| ViewError::MissingColumn(sensitive_table.group_name.clone()))?;
                let class_of_group: HashMap<&str, usize> = group
                    .dictionary
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (g.as_str(), i))
                    .collect();
                let groups = group.dictionary.len();
                within(groups, 0)?;
                view.class_sizes = vec![0; groups];
                view.class_histograms = vec![0; groups * m];
                let mut counted = vec![0u64; groups];
                for e in &sensitive_table.entries {
                    let name = e.group.to_string();
                    let c = *class_of_group.get(name.as_str()).ok_or_else(|| ViewError::Group {
                        group: name.clone(),
                        rule: "appears in the sensitive table but on no released row (rule: every group has rows)".to_string(),
                    })?;
                    let s = sensitive_code(&e.value)? as usize;
                    view.class_histograms[c * m + s] += e.count;
                    counted[c] += e.count;
                }
                let mut cell_of_key: HashMap<(Vec<u32>, u32), usize> = HashMap::new();
                let mut cell_rows: Vec<(usize, u64)> = Vec::new();
                for row in 0..quasi_table.rows {
                    let class = group.codes[row];
                    view.class_sizes[class as usize] += 1;
                    let key: Vec<u32> = region_codes.iter().map(|(codes, _)| codes[row]).collect();
                    let cell = *cell_of_key.entry((key, class)).or_insert_with(|| {
                        view.cell_regions.extend((0..qn).map(|q| region_of(q, row)));
                        cell_rows.push((class as usize, 0));
                        cell_rows.len() - 1
                    });
                    cell_rows[cell].1 += 1;
                }
                for (c, (&rows, &counted)) in view.class_sizes.iter().zip(&counted).enumerate() {
                    if rows != counted {
                        return Err(ViewError::Group {
                            group: group.dictionary[c].clone(),
                            rule: format!(
                                "{rows} rows in the QI table but {counted} sensitive values in the sensitive table (rule: a bucket's sensitive values are its rows')"
                            ),
                        });
                    }
                }
                within(groups, cell_rows.len())?;
                view.cell_histograms = Vec::with_capacity(cell_rows.len() * m);
                for &(class, rows) in &cell_rows {
                    let size = view.class_sizes[class] as f64;
                    let histogram = &view.class_histograms[class * m..(class + 1) * m];
                    view.cell_histograms
                        .extend(histogram.iter().map(|&h| rows as f64 * h as f64 / size));
                }
            }
        }
        Ok(view)
    }
}

/// A released QI column: its codes per row and the region of each dictionary entry.
type QuasiRegions<'a> = (&'a [u32], Vec<Region>);

/// For each QI of the table: the released column's codes and the region of each dictionary entry.
fn quasi_regions<'a>(
    table: &Table,
    released: &'a ReleasedTable,
) -> Result<Vec<QuasiRegions<'a>>, ViewError> {
    let mut out = Vec::with_capacity(table.quasi.len());
    for q in &table.quasi {
        let column = released
            .columns
            .iter()
            .find(|c| c.name == q.name && c.role == ReleasedRole::Quasi)
            .ok_or_else(|| ViewError::MissingColumn(q.name.clone()))?;
        let nodes = match &q.attribute {
            QuasiAttribute::Categorical(h) => node_index(h),
            QuasiAttribute::Numeric(_) => HashMap::new(),
        };
        let regions = column
            .dictionary
            .iter()
            .map(|label| parse_region(&q.attribute, &nodes, &q.name, label))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((column.codes.as_slice(), regions));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numeric_labels() {
        assert_eq!(parse_range("30"), Some((30.0, 30.0)));
        assert_eq!(parse_range("17-35"), Some((17.0, 35.0)));
        assert_eq!(parse_range("-5--1"), Some((-5.0, -1.0)));
        assert_eq!(parse_range("-5-3.5"), Some((-5.0, 3.5)));
        assert_eq!(parse_range("*").map(|r| r.0), Some(f64::NEG_INFINITY));
        assert_eq!(parse_range("abc"), None);
    }
}
