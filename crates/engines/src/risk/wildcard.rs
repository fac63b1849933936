//! Prosecutor risk with wildcard matching (ARX's `RiskModelSampleWildcard`): a partly suppressed
//! record's `*` matches any value, so a record stands among every record it could be, not only those
//! that carry the same labels. Record r's candidates are the records s with, in every QI, equal
//! values or a `*` on either side; its risk is 1 / their number (r included).
//!
//! Invariants: records whose every QI is suppressed are outliers and count nowhere (as in every
//! other model); with no partly suppressed record the candidates of a record are its class, and the
//! result equals [`crate::risk::sample::prosecutor`]; "at risk" means strictly above the threshold.
//! The work, (wildcard patterns)² × classes × QIs, is bounded by [`MAX_WORK`] before anything
//! past the grouping is allocated.
use std::collections::HashMap;

use crate::risk::classes::{Grouping, QuasiColumns};
use crate::risk::sample::RecordRisk;

/// The largest number of (pattern pair, class, QI) steps measured; above it the measure is refused.
pub const MAX_WORK: u128 = 1 << 32;

/// Why the wildcard risk was not computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WildcardError {
    #[error("no records")]
    NoRecords,
    #[error(
        "{patterns} patterns of suppressed cells over {classes} classes and {columns} quasi-identifiers \
         need {work} matching steps, above the limit of {MAX_WORK}"
    )]
    TooMuchWork {
        patterns: usize,
        classes: usize,
        columns: usize,
        work: u128,
    },
}

/// The prosecutor risk of `q`'s records under wildcard matching; `grouping` is `q`'s classes on all
/// its columns, outliers excluded ([`crate::risk::classes_of`]).
pub fn prosecutor(
    q: &QuasiColumns,
    grouping: &Grouping,
    threshold: f64,
) -> Result<RecordRisk, WildcardError> {
    let classes = grouping.sizes.len();
    if classes == 0 {
        return Err(WildcardError::NoRecords);
    }
    // One representative row per class.
    let mut first = vec![usize::MAX; classes];
    for (row, &class) in grouping.class_of_row.iter().enumerate() {
        if class != crate::risk::classes::EXCLUDED && first[class as usize] == usize::MAX {
            first[class as usize] = row;
        }
    }
    let suppressed = |row: usize, c: usize| Some(q.codes[c][row]) == q.wildcard[c];
    // The classes of each pattern of suppressed columns, patterns in first-seen order.
    let mut patterns: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
    let mut index: HashMap<Vec<bool>, usize> = HashMap::new();
    for (class, &row) in first.iter().enumerate() {
        let pattern: Vec<bool> = (0..q.len()).map(|c| suppressed(row, c)).collect();
        let slot = *index.entry(pattern.clone()).or_insert_with(|| {
            patterns.push((pattern, Vec::new()));
            patterns.len() - 1
        });
        patterns[slot].1.push(class);
    }
    let work = (patterns.len() as u128)
        .saturating_mul(patterns.len() as u128)
        .saturating_mul(classes as u128)
        .saturating_mul(q.len().max(1) as u128);
    if work > MAX_WORK {
        return Err(WildcardError::TooMuchWork {
            patterns: patterns.len(),
            classes,
            columns: q.len(),
            work,
        });
    }
    // candidates[g]: the records every record of class g could be. Two classes match when they
    // agree on every column neither suppresses; per pair of patterns, the classes of the second are
    // summed by their values on those columns, and each class of the first looks its values up.
    let mut candidates = vec![0u64; classes];
    if patterns.len() == 1 {
        // Distinct classes with the same suppressed columns differ on another: each matches itself.
        for (g, c) in candidates.iter_mut().enumerate() {
            *c = u64::from(grouping.sizes[g]);
        }
    }
    let pairs = if patterns.len() == 1 {
        &[][..]
    } else {
        &patterns[..]
    };
    let mut sums: HashMap<Vec<u32>, u64> = HashMap::new();
    let key = |row: usize, columns: &[usize]| -> Vec<u32> {
        columns.iter().map(|&c| q.codes[c][row]).collect()
    };
    for (a, a_classes) in pairs {
        for (b, b_classes) in pairs {
            let columns: Vec<usize> = (0..q.len()).filter(|&c| !a[c] && !b[c]).collect();
            sums.clear();
            for &h in b_classes {
                *sums.entry(key(first[h], &columns)).or_default() += u64::from(grouping.sizes[h]);
            }
            for &g in a_classes {
                candidates[g] += sums.get(&key(first[g], &columns)).copied().unwrap_or(0);
            }
        }
    }
    let mut records = 0u64;
    let mut at_risk = 0u64;
    let mut expected = 0.0;
    let (mut smallest, mut largest) = (u64::MAX, 0u64);
    for (g, &m) in candidates.iter().enumerate() {
        let f = u64::from(grouping.sizes[g]);
        records += f;
        expected += f as f64 / m as f64;
        if 1.0 / m as f64 > threshold {
            at_risk += f;
        }
        smallest = smallest.min(m);
        largest = largest.max(m);
    }
    let n = records as f64;
    Ok(RecordRisk {
        highest: 1.0 / smallest as f64,
        lowest: 1.0 / largest as f64,
        average: expected / n,
        records_at_risk: at_risk as f64 / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn measure(q: &QuasiColumns, threshold: f64) -> Result<RecordRisk, WildcardError> {
        prosecutor(q, &crate::risk::classes_of(q), threshold)
    }

    /// Columns of `rows`, code 0 the wildcard of every column.
    fn columns(rows: &[Vec<u32>]) -> QuasiColumns {
        let width = rows.first().map_or(0, Vec::len);
        QuasiColumns::new(
            rows.len(),
            (0..width).map(|c| {
                (
                    format!("q{c}"),
                    rows.iter().map(|r| r[c]).collect(),
                    Some(0),
                )
            }),
        )
        .unwrap()
    }

    /// The definition, record by record: r's candidates are the non-outliers s matching it in every
    /// column, `*` matching anything.
    fn brute_force(rows: &[Vec<u32>], threshold: f64) -> Option<RecordRisk> {
        let outlier = |r: &Vec<u32>| !r.is_empty() && r.iter().all(|&v| v == 0);
        let kept: Vec<&Vec<u32>> = rows.iter().filter(|r| !outlier(r)).collect();
        if kept.is_empty() {
            return None;
        }
        let risks: Vec<f64> = kept
            .iter()
            .map(|r| {
                let m = kept
                    .iter()
                    .filter(|s| {
                        r.iter()
                            .zip(s.iter())
                            .all(|(&a, &b)| a == b || a == 0 || b == 0)
                    })
                    .count();
                1.0 / m as f64
            })
            .collect();
        let n = risks.len() as f64;
        Some(RecordRisk {
            highest: risks.iter().copied().fold(0.0, f64::max),
            lowest: risks.iter().copied().fold(f64::INFINITY, f64::min),
            average: risks.iter().sum::<f64>() / n,
            records_at_risk: risks.iter().filter(|&&r| r > threshold).count() as f64 / n,
        })
    }

    #[test]
    fn by_hand() {
        // (1, 1) ×2, (1, *), (2, 2), (*, *) an outlier. (1, *) matches the two (1, 1): 3 candidates;
        // each (1, 1) matches itself twice and (1, *): 3; (2, 2) matches only itself: 1.
        let rows = vec![vec![1, 1], vec![1, 1], vec![1, 0], vec![2, 2], vec![0, 0]];
        let r = measure(&columns(&rows), 0.5).unwrap();
        assert_eq!(r.highest, 1.0);
        assert_eq!(r.lowest, 1.0 / 3.0);
        assert!((r.average - (3.0 / 3.0 + 1.0) / 4.0).abs() < 1e-15);
        assert_eq!(r.records_at_risk, 0.25);
        assert_eq!(
            measure(&columns(&[vec![0, 0]]), 0.2),
            Err(WildcardError::NoRecords)
        );
    }

    proptest! {
        #[test]
        fn equals_the_definition_record_by_record(
            rows in (1usize..5).prop_flat_map(|width| {
                prop::collection::vec(prop::collection::vec(0u32..4, width), 0..40)
            }),
            threshold in 0.0f64..1.0,
        ) {
            let q = columns(&rows);
            match (measure(&q, threshold), brute_force(&rows, threshold)) {
                (Ok(fast), Some(slow)) => {
                    prop_assert!((fast.highest - slow.highest).abs() < 1e-12);
                    prop_assert!((fast.lowest - slow.lowest).abs() < 1e-12);
                    prop_assert!((fast.average - slow.average).abs() < 1e-12);
                    prop_assert!((fast.records_at_risk - slow.records_at_risk).abs() < 1e-12);
                }
                (Err(WildcardError::NoRecords), None) => {}
                (fast, slow) => prop_assert!(false, "{fast:?} against {slow:?}"),
            }
        }

        #[test]
        fn without_partly_suppressed_records_it_is_the_prosecutor_risk(
            rows in prop::collection::vec(prop::collection::vec(1u32..4, 3), 1..40),
            threshold in 0.0f64..1.0,
        ) {
            let q = columns(&rows);
            let sizes = crate::risk::histogram(&q);
            let classic = crate::risk::sample::prosecutor(&sizes, threshold);
            let wild = measure(&q, threshold).unwrap();
            prop_assert_eq!(wild.highest, classic.highest);
            prop_assert_eq!(wild.lowest, classic.lowest);
            prop_assert!((wild.average - classic.average).abs() < 1e-12);
            prop_assert_eq!(wild.records_at_risk, classic.records_at_risk);
        }
    }
}
