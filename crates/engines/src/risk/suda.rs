//! SUDA (Elliot et al.; SUDA2, Manning, Haglin & Keane 2008): the minimal sample uniques (MSUs) of
//! every record up to a maximum size, each record's SUDA score and DIS-SUDA score, and each
//! attribute's share of the total score.
//!
//! An MSU of a record is a set of quasi-identifiers on which the record's values occur in no other
//! record, while on every proper subset they do. The search is exact and level-wise: the subsets of
//! size k are grouped one after the other; a record alone in its class on S has the MSU S exactly
//! when it is not alone on any S minus one attribute (uniqueness is monotone, so the immediate
//! subsets decide), which the bitsets of level k-1 answer. This finds the same MSUs as SUDA2's
//! recursive search (checked against a brute-force enumerator of all subsets in the tests).
//!
//! Invariants: the work and memory are checked before anything is allocated: at most
//! [`MAX_SUBSETS`] subsets and [`MAX_LEVEL_BYTES`] of uniqueness bitsets per level, else
//! [`SudaError::TooLarge`] names the sizes; the maximum size is at least 1 and at most the number of
//! quasi-identifiers. Scores are Elliot's: an MSU of size k scores Π_{i=k}^{min(M, A-1)-1} (A - i)
//! for A attributes and maximum size M; DIS-SUDA as Elliot's SUDA user guide (2004), docs/risk.md.
use serde::Serialize;

use crate::risk::classes::{QuasiColumns, group};

/// At most this many attribute subsets are searched.
pub const MAX_SUBSETS: u64 = 1 << 20;
/// At most this many bytes of uniqueness bitsets are kept for one level of the search.
pub const MAX_LEVEL_BYTES: u64 = 512 << 20;

/// Why SUDA was not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SudaError {
    #[error("suda_max_size = {0}: the maximum MSU size must be at least 1")]
    MaxSizeZero(usize),
    #[error("{0} quasi-identifiers: SUDA searches at most 63")]
    TooManyAttributes(usize),
    #[error(
        "suda_max_size = {max_size}: {subsets} attribute subsets and {level_bytes} bytes per level for {attributes} quasi-identifiers and {rows} records exceed the limits ({MAX_SUBSETS} subsets, {MAX_LEVEL_BYTES} bytes): lower the maximum size"
    )]
    TooLarge {
        max_size: usize,
        attributes: usize,
        rows: usize,
        subsets: u64,
        level_bytes: u64,
    },
}

/// One attribute's share of the total SUDA score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contribution {
    pub attribute: String,
    pub contribution: f64,
}

/// The SUDA measures of one table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suda {
    pub max_size: usize,
    /// The number of MSUs of each size, from 1 to `max_size`.
    pub msus_by_size: Vec<u64>,
    pub msus: u64,
    /// Records with at least one MSU.
    pub records_with_msu: u64,
    pub highest_score: f64,
    /// The mean score of the records with an MSU (0 without).
    pub average_score: f64,
    /// The sampling fraction of the DIS-SUDA scores.
    pub dis_fraction: f64,
    pub highest_dis_score: f64,
    pub average_dis_score: f64,
    pub attribute_contributions: Vec<Contribution>,
    /// Per record (input order; 0 for an outlier): SUDA score.
    #[serde(skip)]
    pub scores: Vec<f64>,
    /// Per record: DIS-SUDA score.
    #[serde(skip)]
    pub dis_scores: Vec<f64>,
}

fn binomial(n: u64, k: u64) -> u64 {
    let mut result: u64 = 1;
    for i in 0..k {
        result = result.saturating_mul(n - i) / (i + 1);
    }
    result
}

/// Elliot's score of an MSU of `size` among `attributes` with maximum size `max_size`.
pub fn msu_score(attributes: usize, max_size: usize, size: usize) -> f64 {
    let upper = max_size.min(attributes.saturating_sub(1));
    (size..upper).map(|i| (attributes - i) as f64).product()
}

/// Checks the search's size before any allocation.
pub fn check_size(attributes: usize, rows: usize, max_size: usize) -> Result<usize, SudaError> {
    if max_size == 0 {
        return Err(SudaError::MaxSizeZero(0));
    }
    if attributes >= 64 {
        return Err(SudaError::TooManyAttributes(attributes));
    }
    let m = max_size.min(attributes);
    let (subsets, level_bytes) = search_size(attributes, rows, m);
    if subsets > MAX_SUBSETS || level_bytes > MAX_LEVEL_BYTES {
        return Err(SudaError::TooLarge {
            max_size,
            attributes,
            rows,
            subsets,
            level_bytes,
        });
    }
    Ok(m)
}

/// The number of subsets searched up to size `m` and the bytes of the widest level's bitsets.
fn search_size(attributes: usize, rows: usize, m: usize) -> (u64, u64) {
    let subsets: u64 = (1..=m as u64)
        .map(|k| binomial(attributes as u64, k))
        .fold(0u64, u64::saturating_add);
    let widest = (1..=m as u64)
        .map(|k| binomial(attributes as u64, k))
        .max()
        .unwrap_or(0);
    (
        subsets,
        widest.saturating_mul((rows as u64).div_ceil(64) * 8),
    )
}

/// The bytes [`suda`] may hold at once for `attributes` quasi-identifiers, `rows` records and
/// maximum size `max_size` (beside the grouping of [`crate::risk::profile_bytes`]): two levels of
/// uniqueness bitsets and two scores per record.
pub fn suda_bytes(attributes: usize, rows: usize, max_size: usize) -> u64 {
    let (_, level_bytes) = search_size(attributes, rows, max_size.min(attributes));
    level_bytes
        .saturating_mul(2)
        .saturating_add((rows as u64).saturating_mul(16))
}

/// The subsets of {0..n} of size k (n < 64), as bit masks in increasing order (Gosper's hack).
fn combinations(n: usize, k: usize) -> Vec<u64> {
    let mut out = Vec::new();
    if k == 0 || k > n || n >= 64 {
        return out;
    }
    let mut x: u64 = (1u64 << k) - 1;
    while x < 1u64 << n {
        out.push(x);
        let c = x & x.wrapping_neg();
        let r = x + c;
        x = (((r ^ x) >> 2) / c) | r;
    }
    out
}

/// Calls `found(mask, row)` for every MSU of size at most `max_size` (already checked by
/// [`check_size`]) of the records `include` accepts.
pub fn search(
    q: &QuasiColumns,
    max_size: usize,
    include: impl Fn(usize) -> bool + Copy,
    mut found: impl FnMut(u64, usize),
) {
    let words = q.rows.div_ceil(64);
    let mut previous: std::collections::HashMap<u64, Vec<u64>> = std::collections::HashMap::new();
    for k in 1..=max_size.min(q.len()) {
        let mut current = std::collections::HashMap::new();
        for mask in combinations(q.len(), k) {
            let columns: Vec<usize> = (0..q.len()).filter(|&c| (mask >> c) & 1 == 1).collect();
            let grouping = group(q, &columns, include);
            let mut unique = vec![0u64; words];
            for (row, &class) in grouping.class_of_row.iter().enumerate() {
                if class == crate::risk::classes::EXCLUDED || grouping.sizes[class as usize] != 1 {
                    continue;
                }
                unique[row / 64] |= 1 << (row % 64);
                let minimal = columns.iter().all(|&c| {
                    previous
                        .get(&(mask & !(1 << c)))
                        .is_none_or(|bits| (bits[row / 64] >> (row % 64)) & 1 == 0)
                });
                if minimal {
                    found(mask, row);
                }
            }
            current.insert(mask, unique);
        }
        previous = current;
    }
}

/// SUDA on the records `include` accepts; `dis_fraction` is the sampling fraction of DIS-SUDA.
pub fn suda(
    q: &QuasiColumns,
    max_size: usize,
    dis_fraction: f64,
    include: impl Fn(usize) -> bool + Copy,
) -> Result<Suda, SudaError> {
    let m = check_size(q.len(), q.rows, max_size)?;
    let attributes = q.len();
    let score_of: Vec<f64> = (0..=m).map(|k| msu_score(attributes, m, k)).collect();
    let mut scores = vec![0.0; q.rows];
    let mut msus_by_size = vec![0u64; m];
    let mut by_attribute = vec![0.0; attributes];
    search(q, m, include, |mask, row| {
        let size = mask.count_ones() as usize;
        msus_by_size[size - 1] += 1;
        scores[row] += score_of[size];
        for (a, total) in by_attribute.iter_mut().enumerate() {
            if (mask >> a) & 1 == 1 {
                *total += score_of[size];
            }
        }
    });
    // Uniques and pairs on all quasi-identifiers, for DIS-SUDA.
    let all: Vec<usize> = (0..attributes).collect();
    let grouping = group(q, &all, include);
    let uniques = grouping.sizes.iter().filter(|&&s| s == 1).count() as f64;
    let pairs = 2.0 * grouping.sizes.iter().filter(|&&s| s == 2).count() as f64;
    let dis_scores = dis_suda(&scores, uniques, pairs, attributes, dis_fraction);
    let with_msu: Vec<usize> = (0..q.rows).filter(|&r| scores[r] > 0.0).collect();
    let total: f64 = with_msu.iter().map(|&r| scores[r]).sum();
    let mean = |values: &[f64]| {
        if with_msu.is_empty() {
            0.0
        } else {
            with_msu.iter().map(|&r| values[r]).sum::<f64>() / with_msu.len() as f64
        }
    };
    Ok(Suda {
        max_size: m,
        msus: msus_by_size.iter().sum(),
        msus_by_size,
        records_with_msu: with_msu.len() as u64,
        highest_score: scores.iter().copied().fold(0.0, f64::max),
        average_score: mean(&scores),
        dis_fraction,
        highest_dis_score: dis_scores.iter().copied().fold(0.0, f64::max),
        average_dis_score: mean(&dis_scores),
        attribute_contributions: q
            .names
            .iter()
            .zip(&by_attribute)
            .map(|(name, &s)| Contribution {
                attribute: name.clone(),
                contribution: if total > 0.0 { s / total } else { 0.0 },
            })
            .collect(),
        scores,
        dis_scores,
    })
}

/// DIS-SUDA (Elliot, SUDA user guide 2004): each record's probability of being a population unique,
/// from its SUDA score, the numbers of records in classes of size 1 (`uniques`) and 2 (`pairs`)
/// and the sampling fraction. A record without an MSU scores 0.
pub fn dis_suda(
    scores: &[f64],
    uniques: f64,
    pairs: f64,
    attributes: usize,
    fraction: f64,
) -> Vec<f64> {
    let q = 1.0 + (8.0 - attributes as f64) / 20.0;
    let dis = uniques * fraction / (uniques * fraction + pairs * (1.0 - fraction));
    let weights: f64 = scores
        .iter()
        .filter(|&&s| s > 0.0)
        .map(|&s| s.powf(-q))
        .sum();
    let adjustment = (uniques / dis - uniques) / weights;
    scores
        .iter()
        .map(|&s| {
            if s > 0.0 && adjustment.is_finite() {
                1.0 / (1.0 + s.powf(-q) * adjustment)
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(rows: &[Vec<u32>]) -> QuasiColumns {
        let width = rows.first().map_or(0, Vec::len);
        QuasiColumns::new(
            rows.len(),
            (0..width).map(|c| (format!("a{c}"), rows.iter().map(|r| r[c]).collect(), None)),
        )
        .unwrap()
    }

    /// All subsets: unique on S and on no non-empty proper subset of S.
    fn brute_force(rows: &[Vec<u32>], max_size: usize) -> Vec<(u64, usize)> {
        let width = rows.first().map_or(0, Vec::len);
        let unique = |mask: u64, r: usize| {
            rows.iter()
                .filter(|other| (0..width).all(|c| (mask >> c) & 1 == 0 || other[c] == rows[r][c]))
                .count()
                == 1
        };
        let mut out = Vec::new();
        for mask in 1u64..(1 << width) {
            if mask.count_ones() as usize > max_size {
                continue;
            }
            for r in 0..rows.len() {
                let mut sub = (mask - 1) & mask;
                let mut minimal = unique(mask, r);
                while minimal && sub != 0 {
                    minimal = !unique(sub, r);
                    sub = (sub - 1) & mask;
                }
                if minimal {
                    out.push((mask, r));
                }
            }
        }
        out.sort();
        out
    }

    fn found(rows: &[Vec<u32>], max_size: usize) -> Vec<(u64, usize)> {
        let q = table(rows);
        let mut out = Vec::new();
        search(&q, max_size, |_| true, |m, r| out.push((m, r)));
        out.sort();
        out
    }

    #[test]
    fn msus_by_hand() {
        // a0 a1 a2
        //  0  0  0   unique on {a2}
        //  0  1  1   unique on {a0,a1}: (0,1) once; {a1,a2}: (1,1) twice → no
        //  1  1  1   unique on {a0} (1 once)... a0=1 appears once → MSU {a0}
        //  0  0  1
        let rows = vec![vec![0, 0, 0], vec![0, 1, 1], vec![1, 1, 1], vec![0, 0, 1]];
        let msus = found(&rows, 3);
        assert_eq!(msus, brute_force(&rows, 3));
        assert!(msus.contains(&(0b100, 0)));
        assert!(msus.contains(&(0b001, 2)));
        assert!(msus.contains(&(0b011, 1)));
        // Row 3 (0,0,1) has no unique combination of size 1; {a1, a2} = (0, 1) is unique.
        assert!(msus.contains(&(0b110, 3)));
        // Limited to size 1, only the singletons remain.
        assert_eq!(found(&rows, 1), vec![(0b001, 2), (0b100, 0)]);
    }

    #[test]
    fn scores_by_hand() {
        // 4 attributes, M = 4: upper = min(4, 3) = 3; size 1: 3·2 = 6, size 2: 2, size 3: 1, 4: 1.
        assert_eq!(msu_score(4, 4, 1), 6.0);
        assert_eq!(msu_score(4, 4, 2), 2.0);
        assert_eq!(msu_score(4, 4, 3), 1.0);
        assert_eq!(msu_score(4, 4, 4), 1.0);
        // M = 2: size 1 scores 3, size 2 scores 1.
        assert_eq!(msu_score(4, 2, 1), 3.0);
        assert_eq!(msu_score(4, 2, 2), 1.0);
    }

    #[test]
    fn suda_summary_and_dis_by_hand() {
        let rows = vec![vec![0, 0, 0], vec![0, 1, 1], vec![1, 1, 1], vec![0, 0, 1]];
        let s = suda(&table(&rows), 3, 0.1, |_| true).unwrap();
        // 3 attributes, M = 3: upper 2; size 1 scores 2, size 2 scores 1.
        assert_eq!(s.msus_by_size.iter().sum::<u64>(), s.msus);
        assert_eq!(s.records_with_msu, 4);
        let brute = brute_force(&rows, 3);
        for r in 0..4 {
            let expected: f64 = brute
                .iter()
                .filter(|m| m.1 == r)
                .map(|m| msu_score(3, 3, m.0.count_ones() as usize))
                .sum();
            assert_eq!(s.scores[r], expected, "row {r}");
        }
        // DIS: all 4 records unique on all attributes, no pairs: dis = 1, adjustment 0 → 1.
        assert!(s.dis_scores.iter().all(|&d| d == 1.0));
        let contributions: f64 = s
            .attribute_contributions
            .iter()
            .map(|c| c.contribution)
            .sum();
        assert!(contributions >= 1.0);
    }

    #[test]
    fn dis_suda_by_hand() {
        // scores 2 and 1 (and a 0), 2 uniques, 4 records in pairs, 8 attributes (q = 1), f = 0.5.
        // dis = 2·0.5 / (2·0.5 + 4·0.5) = 1/3; adjustment = (2·3 - 2) / (1/2 + 1) = 8/3.
        let d = dis_suda(&[2.0, 1.0, 0.0], 2.0, 4.0, 8, 0.5);
        assert!((d[0] - 1.0 / (1.0 + 0.5 * 8.0 / 3.0)).abs() < 1e-15);
        assert!((d[1] - 1.0 / (1.0 + 8.0 / 3.0)).abs() < 1e-15);
        assert_eq!(d[2], 0.0);
    }

    #[test]
    fn refuses_searches_past_the_limits_before_allocating() {
        assert_eq!(check_size(5, 10, 0), Err(SudaError::MaxSizeZero(0)));
        assert_eq!(check_size(5, 10, 9), Ok(5));
        let err = check_size(60, 1_000_000, 10).unwrap_err();
        assert!(matches!(err, SudaError::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("suda_max_size = 10"));
    }

    #[test]
    fn combinations_are_all_k_subsets() {
        assert_eq!(combinations(4, 2).len(), 6);
        assert_eq!(combinations(4, 4), vec![0b1111]);
        assert_eq!(combinations(3, 1), vec![0b001, 0b010, 0b100]);
        assert!(combinations(2, 3).is_empty());
    }

    proptest! {
        #[test]
        fn level_wise_search_finds_exactly_the_brute_force_msus(
            width in 1usize..5,
            rows in proptest::collection::vec(proptest::collection::vec(0u32..3, 4), 1..14),
            max_size in 1usize..5,
        ) {
            let rows: Vec<Vec<u32>> = rows.into_iter().map(|r| r[..width].to_vec()).collect();
            prop_assert_eq!(found(&rows, max_size), brute_force(&rows, max_size.min(width)));
        }
    }
}
