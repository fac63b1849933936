//! Which records of a population table each class of a sample (a table, or a release of it) stands
//! for: the population records whose quasi-identifier values the class's values equal (a table) or
//! generalize (a release: a number in a released range `lo-hi`, a leaf under a released hierarchy
//! node, anything under `*`). The journalist and marketer risk, k-map against a population table
//! and δ-presence read the resulting (sample size, population size) pairs.
//!
//! The relation is given column by column as [`Covers`]: per population code, the sample codes
//! whose value covers it. [`table_covers`] and [`release_covers`] build it; [`match_population`]
//! groups the population into its classes and, per population class, looks up every combination of
//! covering sample codes among the sample's classes. With exact values or a full-domain
//! generalization every population value has at most one covering code and the work is one lookup
//! per population class; Mondrian's overlapping ranges can give several.
//!
//! Invariants: pure (no I/O); the covers and the lookups are counted before they are allocated or
//! done, and refused past [`MAX_COVER_ENTRIES`] and [`MAX_MATCH_LOOKUPS`], naming the limit; the
//! population must contain the sample (every sample class matches at least as many population
//! records as it has), else the error names the class sizes and the rule.
use std::collections::HashMap;

use crate::relational::hierarchy::NodeId;
use crate::relational::release::ReleasedTable;
use crate::relational::table::{QuasiAttribute, Table};
use crate::risk::classes::{QuasiColumns, group, of_table};
use crate::risk::{PopulationTable, RiskError};

/// At most this many (population value, covering sample value) entries over all columns.
pub const MAX_COVER_ENTRIES: u64 = 1 << 26;
/// At most this many class lookups (per population class, the product over the columns of the
/// number of sample values covering its value).
pub const MAX_MATCH_LOOKUPS: u64 = 1 << 27;

/// Per quasi-identifier column, per population code, the sample codes covering it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Covers {
    pub columns: Vec<Vec<Vec<u32>>>,
}

fn error(message: String) -> RiskError {
    RiskError::PopulationTable(message)
}

fn same_columns(sample: &[&str], population: &[&str]) -> Result<(), RiskError> {
    if sample != population {
        return Err(error(format!(
            "its quasi-identifiers [{}] differ from the sample's [{}] (rule: the population has the same quasi-identifier columns)",
            population.join(", "),
            sample.join(", ")
        )));
    }
    Ok(())
}

/// Covers between a table and a population table of the same job: equal values (numbers by value,
/// categorical values by their hierarchy label).
pub fn table_covers(sample: &Table, population: &Table) -> Result<Covers, RiskError> {
    let names = |t: &Table| -> Vec<String> { t.quasi.iter().map(|q| q.name.clone()).collect() };
    let (s, p) = (names(sample), names(population));
    same_columns(
        &s.iter().map(String::as_str).collect::<Vec<_>>(),
        &p.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    let mut columns = Vec::with_capacity(sample.quasi.len());
    for (sq, pq) in sample.quasi.iter().zip(&population.quasi) {
        let column: Vec<Vec<u32>> = match (&sq.attribute, &pq.attribute) {
            (QuasiAttribute::Numeric(sd), QuasiAttribute::Numeric(pd)) => pd
                .values
                .iter()
                .map(|v| match sd.values.binary_search_by(|x| x.total_cmp(v)) {
                    Ok(rank) => vec![rank as u32],
                    Err(_) => Vec::new(),
                })
                .collect(),
            (QuasiAttribute::Categorical(sh), QuasiAttribute::Categorical(ph)) => {
                (0..ph.leaf_count() as u32)
                    .map(|leaf| {
                        sh.leaf(ph.label(ph.ancestor(leaf, 0)))
                            .map_or_else(Vec::new, |l| vec![l])
                    })
                    .collect()
            }
            _ => {
                return Err(error(format!(
                    "column {}: numeric in one table and categorical in the other (rule: the same job reads both)",
                    crate::text::quote(&sq.name)
                )));
            }
        };
        columns.push(column);
    }
    Ok(Covers { columns })
}

fn parse_number(text: &str) -> Option<f64> {
    let v: f64 = text.trim().parse().ok()?;
    v.is_finite().then_some(v)
}

/// A released numeric label as a closed range of values: `*`, a number, or `lo-hi` (either bound
/// may be negative).
pub fn numeric_range(text: &str) -> Option<(f64, f64)> {
    let text = text.trim();
    if text == "*" {
        return Some((f64::NEG_INFINITY, f64::INFINITY));
    }
    if let Some(v) = parse_number(text) {
        return Some((v, v));
    }
    text.char_indices()
        .filter(|&(i, c)| c == '-' && i > 0)
        .find_map(|(i, _)| Some((parse_number(&text[..i])?, parse_number(&text[i + 1..])?)))
}

/// Covers between a release (its released QI columns, `q` from [`crate::risk::classes::of_release`]
/// of `release`) and a population table of the release's job: the released labels whose range or
/// hierarchy node contains the population value.
pub fn release_covers(
    q: &QuasiColumns,
    release: &ReleasedTable,
    population: &Table,
) -> Result<Covers, RiskError> {
    let released: Vec<_> = release
        .columns
        .iter()
        .filter(|c| c.role == crate::relational::release::ReleasedRole::Quasi)
        .collect();
    let mut attributes = Vec::with_capacity(released.len());
    for c in &released {
        let p = population.quasi.iter().find(|p| p.name == c.name).ok_or_else(|| {
            error(format!(
                "it has no quasi-identifier {} (rule: the population has the same quasi-identifier columns)",
                crate::text::quote(&c.name)
            ))
        })?;
        attributes.push(&p.attribute);
    }
    if q.names.len() != released.len() {
        return Err(error(
            "the release's columns do not match its classes".into(),
        ));
    }
    // First pass: parse every label and count the entries before allocating them.
    enum Label {
        Range(usize, usize),
        Node(NodeId),
    }
    let mut parsed: Vec<Vec<Label>> = Vec::with_capacity(released.len());
    let mut entries: u64 = 0;
    for (c, attribute) in released.iter().zip(&attributes) {
        let mut labels = Vec::with_capacity(c.dictionary.len());
        let bad = |label: &str, rule: &str| {
            error(format!(
                "column {}: released value {} {rule}",
                crate::text::quote(&c.name),
                crate::text::quote(label)
            ))
        };
        match attribute {
            QuasiAttribute::Numeric(domain) => {
                for label in &c.dictionary {
                    let (lo, hi) = numeric_range(label).ok_or_else(|| {
                        bad(label, "is neither a number, a range lo-hi nor * (rule: numeric QIs are released as numbers or ranges)")
                    })?;
                    let first = domain.values.partition_point(|&v| v < lo);
                    let end = domain.values.partition_point(|&v| v <= hi).max(first);
                    entries = entries.saturating_add((end - first) as u64);
                    labels.push(Label::Range(first, end));
                }
            }
            QuasiAttribute::Categorical(h) => {
                let mut index: HashMap<&str, NodeId> = HashMap::new();
                for level in 0..h.height() {
                    for leaf in 0..h.leaf_count() as u32 {
                        let node = h.ancestor(leaf, level);
                        index.entry(h.label(node)).or_insert(node);
                    }
                }
                let root = h.ancestor(0, h.height().saturating_sub(1));
                for label in &c.dictionary {
                    let node = if label == "*" {
                        root
                    } else {
                        *index.get(label.as_str()).ok_or_else(|| {
                            bad(label, "is not a node of its hierarchy (rule: categorical QIs are released as hierarchy values or *)")
                        })?
                    };
                    entries = entries.saturating_add(h.leaves_under(node) as u64);
                    labels.push(Label::Node(node));
                }
            }
        }
        parsed.push(labels);
    }
    if entries > MAX_COVER_ENTRIES {
        return Err(error(format!(
            "{entries} (population value, released value) pairs exceed the limit of {MAX_COVER_ENTRIES} (rule: MAX_COVER_ENTRIES)"
        )));
    }
    let mut columns = Vec::with_capacity(released.len());
    for (labels, attribute) in parsed.iter().zip(&attributes) {
        let column = match attribute {
            QuasiAttribute::Numeric(domain) => {
                let mut column = vec![Vec::new(); domain.values.len()];
                for (code, label) in labels.iter().enumerate() {
                    if let Label::Range(first, end) = *label {
                        for cover in &mut column[first..end] {
                            cover.push(code as u32);
                        }
                    }
                }
                column
            }
            QuasiAttribute::Categorical(h) => {
                let mut by_node: HashMap<NodeId, Vec<u32>> = HashMap::new();
                for (code, label) in labels.iter().enumerate() {
                    if let Label::Node(node) = *label {
                        by_node.entry(node).or_default().push(code as u32);
                    }
                }
                (0..h.leaf_count() as u32)
                    .map(|leaf| {
                        let mut cover = Vec::new();
                        for level in 0..h.height() {
                            let node = h.ancestor(leaf, level);
                            if level > 0 && node == h.ancestor(leaf, level - 1) {
                                continue;
                            }
                            if let Some(codes) = by_node.get(&node) {
                                cover.extend_from_slice(codes);
                            }
                        }
                        cover
                    })
                    .collect()
            }
        };
        columns.push(column);
    }
    Ok(Covers { columns })
}

/// What a population table is matched against: the job's table itself, or a release of it (its
/// released quasi-identifiers; bucketization: its QI table).
#[derive(Debug, Clone, Copy)]
pub enum Sample<'a> {
    Table(&'a Table),
    Release(&'a ReleasedTable),
}

/// A population table of the sample's job matched against the sample's classes `q` (from
/// [`crate::risk::classes::of_table`] or [`crate::risk::classes::of_release`] of `sample`): the covers
/// of [`table_covers`] or [`release_covers`], then [`match_population`]. The one path every command
/// taking a population table goes through.
pub fn match_sample(
    q: &QuasiColumns,
    sample: Sample<'_>,
    population: &Table,
) -> Result<PopulationTable, RiskError> {
    let covers = match sample {
        Sample::Table(table) => table_covers(table, population)?,
        Sample::Release(release) => release_covers(q, release, population)?,
    };
    match_population(q, &of_table(population), &covers)
}

/// Per sample class (outliers left out), its size and the number of population records it stands
/// for, in the order of the classes' first records; with the population's records and those
/// matching no class.
pub fn match_population(
    sample: &QuasiColumns,
    population: &QuasiColumns,
    covers: &Covers,
) -> Result<PopulationTable, RiskError> {
    if covers.columns.len() != sample.len() || population.len() != sample.len() {
        return Err(error(format!(
            "{} quasi-identifiers against the sample's {} (rule: the population has the same quasi-identifier columns)",
            population.len(),
            sample.len()
        )));
    }
    for (c, column) in covers.columns.iter().enumerate() {
        if (population.domains[c] as usize) > column.len() {
            return Err(error(format!(
                "column {}: population codes past the covered domain",
                crate::text::quote(&population.names[c])
            )));
        }
    }
    // The sample's classes as a trie: level c maps (node at level c, code of column c) to a node at
    // level c + 1; the nodes of the last level are the classes.
    let width = sample.len();
    let mut levels: Vec<HashMap<u64, u32>> = vec![HashMap::new(); width];
    let mut pairs: Vec<(u64, u64)> = Vec::new();
    for r in (0..sample.rows).filter(|&r| !sample.is_outlier(r)) {
        let mut node: u32 = 0;
        for (level, codes) in levels.iter_mut().zip(&sample.codes) {
            let next = level.len() as u32;
            let slot = (u64::from(node) << 32) | u64::from(codes[r]);
            node = *level.entry(slot).or_insert(next);
        }
        if node as usize == pairs.len() {
            pairs.push((0, 0));
        }
        pairs[node as usize].0 += 1;
    }
    let all: Vec<usize> = (0..population.len()).collect();
    let grouping = group(population, &all, |_| true);
    let mut representative = vec![usize::MAX; grouping.sizes.len()];
    for (r, &class) in grouping.class_of_row.iter().enumerate() {
        if let Some(slot) = representative.get_mut(class as usize)
            && *slot == usize::MAX
        {
            *slot = r;
        }
    }
    let cover =
        |c: usize, r: usize| -> &[u32] { &covers.columns[c][population.codes[c][r] as usize] };
    // The lookups of the descent, bounded before it: at level c at most min(the product of the
    // covers above, the trie's nodes at c) nodes, each looking up every covering code.
    let mut lookups: u64 = 0;
    for &r in &representative {
        let mut reach: u64 = 1;
        for (c, level) in levels.iter().enumerate() {
            let n = cover(c, r).len() as u64;
            let nodes = if c == 0 {
                1
            } else {
                levels[c - 1].len() as u64
            };
            lookups = lookups.saturating_add(reach.min(nodes).saturating_mul(n));
            reach = reach.saturating_mul(n).min(level.len() as u64);
        }
    }
    if lookups > MAX_MATCH_LOOKUPS {
        return Err(error(format!(
            "{lookups} class lookups exceed the limit of {MAX_MATCH_LOOKUPS} (rule: MAX_MATCH_LOOKUPS; the release's ranges overlap too much)"
        )));
    }
    let mut unmatched: u64 = 0;
    let mut frontier: Vec<u32> = Vec::new();
    let mut next: Vec<u32> = Vec::new();
    for (class, &r) in representative.iter().enumerate() {
        let size = grouping.sizes[class] as u64;
        frontier.clear();
        frontier.push(0);
        for (c, level) in levels.iter().enumerate() {
            next.clear();
            for &node in &frontier {
                for &code in cover(c, r) {
                    if let Some(&child) = level.get(&((u64::from(node) << 32) | u64::from(code))) {
                        next.push(child);
                    }
                }
            }
            std::mem::swap(&mut frontier, &mut next);
            if frontier.is_empty() {
                break;
            }
        }
        if frontier.is_empty() {
            unmatched += size;
        }
        for &j in &frontier {
            pairs[j as usize].1 += size;
        }
    }
    if let Some(&(s, p)) = pairs.iter().find(|(s, p)| p < s) {
        return Err(error(format!(
            "a class of {s} sample records stands for {p} population records (rule: the population contains the sample)"
        )));
    }
    Ok(PopulationTable {
        pairs,
        records: population.rows as u64,
        unmatched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::risk::classes::test_columns as columns;
    use proptest::prelude::*;

    /// For every sample class, every population row whose every value the class's value covers.
    /// And the population rows matching no sample class.
    fn brute_force(
        sample: &[Vec<u32>],
        population: &[Vec<u32>],
        covers: &Covers,
    ) -> (Vec<(u64, u64)>, u64) {
        let mut keys: Vec<&Vec<u32>> = Vec::new();
        for row in sample {
            if !keys.contains(&row) {
                keys.push(row);
            }
        }
        let matches = |key: &Vec<u32>, p: &Vec<u32>| {
            (0..key.len()).all(|c| covers.columns[c][p[c] as usize].contains(&key[c]))
        };
        let unmatched = population
            .iter()
            .filter(|p| !keys.iter().any(|k| matches(k, p)))
            .count() as u64;
        let pairs = keys
            .iter()
            .map(|key| {
                let f = sample.iter().filter(|r| r == key).count() as u64;
                let matched = population.iter().filter(|p| matches(key, p)).count() as u64;
                (f, matched)
            })
            .collect();
        (pairs, unmatched)
    }

    #[test]
    fn numeric_labels() {
        assert_eq!(numeric_range("30-39"), Some((30.0, 39.0)));
        assert_eq!(numeric_range("-5--1"), Some((-5.0, -1.0)));
        assert_eq!(numeric_range("7"), Some((7.0, 7.0)));
        assert_eq!(numeric_range("*").map(|r| r.0), Some(f64::NEG_INFINITY));
        assert_eq!(numeric_range("x-3"), None);
    }

    #[test]
    fn refuses_a_population_that_misses_a_class() {
        let covers = Covers {
            columns: vec![vec![vec![0], vec![1]]],
        };
        let sample = columns(&[vec![0], vec![1], vec![1]], 1);
        let population = columns(&[vec![0], vec![1]], 1);
        let err = match_population(&sample, &population, &covers).unwrap_err();
        assert!(
            err.to_string()
                .contains("the population contains the sample"),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn matching_equals_the_brute_force(
            width in 1usize..4,
            sample in proptest::collection::vec(proptest::collection::vec(0u32..3, 3), 1..10),
            extra in proptest::collection::vec(proptest::collection::vec(0u32..4, 3), 0..30),
            relation in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 4), 3),
        ) {
            // Population code v (0..4) is covered by sample code s (0..3) when bit s of
            // relation[c][v] is set, and always by itself (v < 3) so the population contains the sample.
            let covers = Covers {
                columns: (0..width)
                    .map(|c| {
                        (0..4u32)
                            .map(|v| (0..3u32).filter(|&s| s == v || relation[c][v as usize] >> s & 1 == 1).collect())
                            .collect()
                    })
                    .collect(),
            };
            let sample: Vec<Vec<u32>> = sample.into_iter().map(|r| r[..width].to_vec()).collect();
            let mut population = sample.clone();
            population.extend(extra.into_iter().map(|r| r[..width].to_vec()));
            let table = match_population(&columns(&sample, width), &columns(&population, width), &covers).unwrap();
            let (mut want, unmatched) = brute_force(&sample, &population, &covers);
            prop_assert_eq!(table.unmatched, unmatched);
            prop_assert_eq!(table.records, population.len() as u64);
            let mut got = table.pairs;
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
