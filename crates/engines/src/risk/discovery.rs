//! Quasi-identifier discovery (Motwani & Xu 2007): for every combination of the quasi-identifiers
//! up to a size the caller chooses, its α-distinction (distinct value combinations / records) and
//! α-separation (the share of record pairs it tells apart: 1 − Σ C(n_i, 2) / C(n, 2) over its
//! classes of sizes n_i), ranked by separation, then distinction, then fewer attributes.
//!
//! Invariants: pure; any number of quasi-identifiers, the number of combinations Σ_{s ≤ M} C(A, s)
//! counted before anything is allocated and refused past [`MAX_COMBINATIONS`] (and past
//! [`MAX_WORK`] record-combinations), naming the limit; outliers (every QI suppressed) count nowhere,
//! as in the other models; with fewer than 2 records no pair exists and the separation is 1.
use serde::Serialize;

use crate::risk::classes::{QuasiColumns, group};

/// At most this many attribute combinations are measured.
pub const MAX_COMBINATIONS: u64 = 1 << 20;
/// At most this many (combination, record) groupings: combinations × records.
pub const MAX_WORK: u64 = 1 << 34;

/// Why discovery was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("qi_discovery = {0}: the largest combination size must be at least 1")]
    MaxSizeZero(usize),
    #[error(
        "qi_discovery = {max_size}: {combinations} combinations of {attributes} quasi-identifiers (× {rows} records) exceed the limits ({MAX_COMBINATIONS} combinations, {MAX_WORK} combination-records): lower the maximum size"
    )]
    TooLarge {
        max_size: usize,
        attributes: usize,
        rows: usize,
        combinations: u64,
    },
}

/// One combination's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Combination {
    pub attributes: Vec<String>,
    pub distinction: f64,
    pub separation: f64,
    /// Classes of size 1 on these attributes.
    pub unique_records: u64,
}

/// Every combination up to `max_size`, ranked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Discovery {
    pub max_size: usize,
    pub combinations: Vec<Combination>,
}

fn binomial(n: u64, k: u64) -> u64 {
    let mut result: u64 = 1;
    for i in 0..k.min(n) {
        result = result.saturating_mul(n - i) / (i + 1);
        if result == u64::MAX {
            break;
        }
    }
    if k > n { 0 } else { result }
}

/// The number of combinations of 1..=`max_size` of `attributes` (saturating).
pub fn combination_count(attributes: usize, max_size: usize) -> u64 {
    (1..=max_size.min(attributes) as u64)
        .map(|s| binomial(attributes as u64, s))
        .fold(0u64, u64::saturating_add)
}

/// Checks the size before anything is allocated.
pub fn check_size(attributes: usize, rows: usize, max_size: usize) -> Result<u64, DiscoveryError> {
    if max_size == 0 {
        return Err(DiscoveryError::MaxSizeZero(0));
    }
    let combinations = combination_count(attributes, max_size);
    if combinations > MAX_COMBINATIONS || combinations.saturating_mul(rows as u64) > MAX_WORK {
        return Err(DiscoveryError::TooLarge {
            max_size,
            attributes,
            rows,
            combinations,
        });
    }
    Ok(combinations)
}

/// Calls `visit` with every combination of `k` of `0..n`, in lexicographic order.
fn for_each_combination(n: usize, k: usize, mut visit: impl FnMut(&[usize])) {
    if k > n {
        return;
    }
    let mut at: Vec<usize> = (0..k).collect();
    loop {
        visit(&at);
        let Some(i) = (0..k).rev().find(|&i| at[i] < n - k + i) else {
            return;
        };
        at[i] += 1;
        for j in i + 1..k {
            at[j] = at[j - 1] + 1;
        }
    }
}

/// α-distinction and α-separation of every combination of at most `max_size` quasi-identifiers.
pub fn discover(q: &QuasiColumns, max_size: usize) -> Result<Discovery, DiscoveryError> {
    let combinations = check_size(q.len(), q.rows, max_size)?;
    let include = |r: usize| !q.is_outlier(r);
    let n = (0..q.rows).filter(|&r| include(r)).count() as f64;
    let pairs = n * (n - 1.0) / 2.0;
    let mut out = Vec::with_capacity(combinations as usize);
    for size in 1..=max_size.min(q.len()) {
        for_each_combination(q.len(), size, |columns| {
            let g = group(q, columns, include);
            let together: f64 = g
                .sizes
                .iter()
                .map(|&s| s as f64 * (s as f64 - 1.0) / 2.0)
                .sum();
            out.push(Combination {
                attributes: columns.iter().map(|&c| q.names[c].clone()).collect(),
                distinction: if n > 0.0 {
                    g.sizes.len() as f64 / n
                } else {
                    0.0
                },
                separation: if pairs > 0.0 {
                    1.0 - together / pairs
                } else {
                    1.0
                },
                unique_records: g.sizes.iter().filter(|&&s| s == 1).count() as u64,
            });
        });
    }
    out.sort_by(|a, b| {
        b.separation
            .total_cmp(&a.separation)
            .then(b.distinction.total_cmp(&a.distinction))
            .then(a.attributes.len().cmp(&b.attributes.len()))
    });
    Ok(Discovery {
        max_size,
        combinations: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::risk::classes::test_columns as columns;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Distinction by counting distinct projections, separation by comparing every pair of records.
    fn brute_force(rows: &[Vec<u32>], attributes: &[usize]) -> (f64, f64) {
        let project = |r: &Vec<u32>| -> Vec<u32> { attributes.iter().map(|&a| r[a]).collect() };
        let mut distinct: HashMap<Vec<u32>, ()> = HashMap::new();
        for r in rows {
            distinct.insert(project(r), ());
        }
        let (mut separated, mut all) = (0u64, 0u64);
        for i in 0..rows.len() {
            for j in i + 1..rows.len() {
                all += 1;
                if project(&rows[i]) != project(&rows[j]) {
                    separated += 1;
                }
            }
        }
        let separation = if all == 0 {
            1.0
        } else {
            separated as f64 / all as f64
        };
        (distinct.len() as f64 / rows.len() as f64, separation)
    }

    #[test]
    fn counts_and_limits() {
        assert_eq!(combination_count(4, 2), 4 + 6);
        assert_eq!(combination_count(3, 9), 7);
        assert_eq!(combination_count(200, 200), u64::MAX);
        let err = check_size(200, 10, 5).unwrap_err();
        assert!(err.to_string().contains("qi_discovery = 5"), "{err}");
        assert!(check_size(3, 10, 0).is_err());
        // No cap on the number of QIs itself: 5,000 QIs one at a time are fine.
        assert_eq!(check_size(5000, 10, 1).unwrap(), 5000);
    }

    #[test]
    fn ranked_by_hand() {
        // q0 separates everything, q1 nothing.
        let rows = vec![vec![0, 0], vec![1, 0], vec![2, 0]];
        let d = discover(&columns(&rows, 2), 2).unwrap();
        let names: Vec<Vec<String>> = d
            .combinations
            .iter()
            .map(|c| c.attributes.clone())
            .collect();
        assert_eq!(names[0], vec!["q0".to_string()]);
        assert_eq!(names[2], vec!["q1".to_string()]);
        assert_eq!(
            (d.combinations[2].distinction, d.combinations[2].separation),
            (1.0 / 3.0, 0.0)
        );
    }

    proptest! {
        #[test]
        fn every_combination_equals_the_brute_force(
            width in 1usize..5,
            rows in proptest::collection::vec(proptest::collection::vec(0u32..3, 4), 1..14),
            max_size in 1usize..5,
        ) {
            let rows: Vec<Vec<u32>> = rows.into_iter().map(|r| r[..width].to_vec()).collect();
            let d = discover(&columns(&rows, width), max_size).unwrap();
            prop_assert_eq!(d.combinations.len() as u64, combination_count(width, max_size));
            for c in &d.combinations {
                let attributes: Vec<usize> = c.attributes.iter().map(|a| a[1..].parse().unwrap()).collect();
                let (distinction, separation) = brute_force(&rows, &attributes);
                prop_assert!((c.distinction - distinction).abs() < 1e-12);
                prop_assert!((c.separation - separation).abs() < 1e-12);
            }
            for w in d.combinations.windows(2) {
                prop_assert!(w[0].separation >= w[1].separation);
            }
        }
    }
}
