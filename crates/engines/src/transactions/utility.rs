//! Utility of a released window (Nakagawa et al. 2018, §4.2 eq. 5–6 and §6.2.2 eq. 12).
//!
//! - `util_info` (eq. 5): fraction of item occurrences suppressed, Σ_i (supp_D(i) − supp_D'(i)) /
//!   Σ_i supp_D(i); 0 for a window without items.
//! - `util_dist` (eq. 6): Σ_i D'(i) ln(D'(i) / D(i)), the KL divergence KL(D' ‖ D) of the released
//!   item frequency distribution from the original one, natural log, as the paper defines it (it is
//!   also the numerator of the item choice F). Zero frequencies: a term with D'(i) = 0 (item fully
//!   suppressed) contributes 0 (0 ln 0 = 0); D(i) = 0 implies D'(i) = 0, so the value is always
//!   finite. When every occurrence was suppressed D' is undefined and 0 is reported (util_info = 1
//!   tells that story).
//! - `util_mining` (eq. 12): Jaccard distance 1 − |R_D ∩ R_D'| / |R_D ∪ R_D'| between the association
//!   rule sets X → Y (X, Y non-empty, disjoint) with supp(X ∪ Y) >= minsup and conf >= minconf = 30%.
//!   minsup = 0.05% of the records, rounded up, but at least 2 records (at 1 every record's every
//!   subset is "frequent", which says nothing about mining and explodes on small windows).
//!   Itemsets are capped at [`MAX_RULE_ITEMS`] items (so antecedents have at most 3 items): the
//!   uncapped rule sets of the long-record data sets (BMS-WebView-2, retail) are combinatorial — the
//!   paper could not compute them at all. The search also stops after [`MAX_FREQUENT_ITEMSETS`]
//!   frequent itemsets per window; [`MiningOutcome::complete`] says whether it did. Both rule sets are
//!   mined the same way, so the distance compares like with like; 0 when both sets are empty.
//!
//! Mining is depth-first (Eclat-like): a prefix's extensions are counted by one horizontal scan over
//! the records holding the prefix, their tid-lists by intersecting with the items' vertical lists.
use std::collections::HashSet;

use super::support::{FxBuildHasher, FxHashMap, TidList, intersect_into};

/// minsup as a fraction of the window's records.
pub const MIN_SUPPORT_FRACTION: f64 = 0.0005;
/// minconf.
pub const MIN_CONFIDENCE: f64 = 0.3;
/// Largest itemset X ∪ Y a mined rule may have.
pub const MAX_RULE_ITEMS: usize = 4;
/// Budget of frequent itemsets per window.
pub const MAX_FREQUENT_ITEMSETS: usize = 2_000_000;

/// Fraction of item occurrences suppressed.
pub(crate) fn util_info(original_total: u64, released_total: u64) -> f64 {
    if original_total == 0 {
        return 0.0;
    }
    (original_total - released_total) as f64 / original_total as f64
}

/// KL(D' ‖ D) over item frequencies given per-item supports.
pub(crate) fn util_dist(
    original_support: impl Iterator<Item = u64>,
    released_support: impl Iterator<Item = u64>,
) -> f64 {
    let original: Vec<u64> = original_support.collect();
    let released: Vec<u64> = released_support.collect();
    let original_total: u64 = original.iter().sum();
    let released_total: u64 = released.iter().sum();
    if original_total == 0 || released_total == 0 {
        return 0.0;
    }
    original
        .iter()
        .zip(&released)
        .filter(|(_, r)| **r > 0)
        .map(|(&o, &r)| {
            let p = r as f64 / released_total as f64;
            let q = o as f64 / original_total as f64;
            p * (p / q).ln()
        })
        .sum::<f64>()
        .max(0.0)
}

/// A rule X → Y stored as the sorted itemset X ∪ Y and the bit mask of X's positions in it.
type Rule = (Box<[u32]>, u8);

/// Association rules of one window.
pub(crate) struct MiningOutcome {
    rules: HashSet<Rule, FxBuildHasher>,
    /// False when the frequent-itemset budget stopped the search early.
    pub(crate) complete: bool,
}

impl MiningOutcome {
    pub(crate) fn rule_count(&self) -> u64 {
        self.rules.len() as u64
    }
}

/// Minimum support count for a window of `records` records.
pub(crate) fn min_support_count(records: usize) -> usize {
    ((records as f64 * MIN_SUPPORT_FRACTION).ceil() as usize).max(2)
}

/// Mines the association rules of a window given horizontally (`records`, sorted item ids) and
/// vertically (`tids`, per item).
pub(crate) fn association_rules(records: &[Vec<u32>], tids: &[TidList]) -> MiningOutcome {
    let min_support = min_support_count(records.len());
    let mut frequent: FxHashMap<Box<[u32]>, u32> = FxHashMap::default();
    let mut complete = true;
    let mut counts = vec![0u32; tids.len()];
    let mut touched: Vec<u32> = Vec::new();
    // Depth-first over prefixes: (prefix itemset, its tids).
    let mut stack: Vec<(Vec<u32>, TidList)> = Vec::new();
    for (item, list) in tids.iter().enumerate() {
        if list.len() >= min_support {
            stack.push((vec![item as u32], list.clone()));
        }
    }
    stack.reverse();
    let mut buffer = Vec::new();
    while let Some((prefix, prefix_tids)) = stack.pop() {
        frequent.insert(prefix.clone().into_boxed_slice(), prefix_tids.len() as u32);
        if frequent.len() >= MAX_FREQUENT_ITEMSETS {
            complete = false;
            break;
        }
        if prefix.len() >= MAX_RULE_ITEMS {
            continue;
        }
        let last = prefix[prefix.len() - 1];
        for &tid in &prefix_tids {
            let record = &records[tid as usize];
            let from = record.partition_point(|&i| i <= last);
            for &item in &record[from..] {
                let slot = &mut counts[item as usize];
                if *slot == 0 {
                    touched.push(item);
                }
                *slot += 1;
            }
        }
        touched.sort_unstable();
        let mut extensions = Vec::new();
        for &item in &touched {
            if counts[item as usize] as usize >= min_support {
                extensions.push(item);
            }
            counts[item as usize] = 0;
        }
        touched.clear();
        for &item in extensions.iter().rev() {
            intersect_into(&prefix_tids, &tids[item as usize], &mut buffer);
            let mut extended = prefix.clone();
            extended.push(item);
            stack.push((extended, std::mem::take(&mut buffer)));
        }
    }
    let mut rules: HashSet<Rule, FxBuildHasher> = HashSet::default();
    for (itemset, &support) in &frequent {
        let size = itemset.len();
        if size < 2 {
            continue;
        }
        let mut antecedent = Vec::with_capacity(size);
        for mask in 1u8..((1u8 << size) - 1) {
            antecedent.clear();
            antecedent.extend(
                (0..size)
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| itemset[b]),
            );
            // Every subset of a frequent itemset is frequent; a truncated search may lack it.
            let Some(&antecedent_support) = frequent.get(&antecedent[..]) else {
                continue;
            };
            if f64::from(support) >= MIN_CONFIDENCE * f64::from(antecedent_support) {
                rules.insert((itemset.clone(), mask));
            }
        }
    }
    MiningOutcome { rules, complete }
}

/// Jaccard distance between two rule sets (0 when both are empty).
pub(crate) fn util_mining(before: &MiningOutcome, after: &MiningOutcome) -> f64 {
    let common = before
        .rules
        .iter()
        .filter(|rule| after.rules.contains(*rule))
        .count();
    let union = before.rules.len() + after.rules.len() - common;
    if union == 0 {
        return 0.0;
    }
    1.0 - common as f64 / union as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vertical(records: &[Vec<u32>], items: usize) -> Vec<TidList> {
        let mut tids = vec![Vec::new(); items];
        for (tid, record) in records.iter().enumerate() {
            for &i in record {
                tids[i as usize].push(tid as u32);
            }
        }
        tids
    }

    #[test]
    fn rules_match_hand_count() {
        // {0,1} in 3 of 4 records, {0} in 4, {1} in 3: 0→1 conf .75, 1→0 conf 1; {2} once (< minsup 2).
        let records = vec![vec![0, 1], vec![0, 1], vec![0, 1, 2], vec![0]];
        let mined = association_rules(&records, &vertical(&records, 3));
        assert!(mined.complete);
        assert_eq!(mined.rule_count(), 2);
        let suppressed = vec![vec![0, 1], vec![0], vec![0, 2], vec![0]];
        let after = association_rules(&suppressed, &vertical(&suppressed, 3));
        // {0,1} has support 1 < 2: no rules left.
        assert_eq!(after.rule_count(), 0);
        assert_eq!(util_mining(&mined, &after), 1.0);
        assert_eq!(util_mining(&mined, &mined), 0.0);
    }

    #[test]
    fn info_and_dist() {
        assert_eq!(util_info(10, 7), 0.3);
        assert_eq!(util_dist([2u64, 2].into_iter(), [1u64, 1].into_iter()), 0.0);
        let d = util_dist([2u64, 2].into_iter(), [2u64, 0].into_iter());
        assert!((d - 2f64.ln()).abs() < 1e-12);
    }
}
