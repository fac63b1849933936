//! Brute-force checker of personalized rho^m-uncertainty, written independently of the engine:
//! plain `HashSet`/`HashMap` support counting over the released records, every adversary (u, Q)
//! with Q ⊆ D_u (the ORIGINAL record), 1 <= |Q| <= m, every e ∈ E_u \ Q:
//! supp'(Q ∪ {e}) <= rho · supp'(Q) or supp'(Q) = 0. Used by the engine's unit tests
//! (`crates/engines/src/transactions/guarantee_tests.rs` includes this file) and by the integration
//! tests that check a release of `cloakd transactions`.
use std::collections::{BTreeMap, HashMap, HashSet};

// The includer brings the engine's `Record` into scope: `tests/it/support/mod.rs`
// (`cloakd::transactions::Record`) and the engine's `transactions/guarantee_tests.rs`.
use super::Record;

/// Each released record is a subset of its original (same count, same order).
pub fn check_suppression_only(original: &[Record], released: &[Vec<u32>]) -> Result<(), String> {
    if original.len() != released.len() {
        return Err(format!(
            "{} records in, {} records out",
            original.len(),
            released.len()
        ));
    }
    for (index, (before, after)) in original.iter().zip(released).enumerate() {
        let before: HashSet<u32> = before.items.iter().copied().collect();
        let mut seen = HashSet::new();
        for item in after {
            if !before.contains(item) {
                return Err(format!("record {index}: item {item} was added"));
            }
            if !seen.insert(*item) {
                return Err(format!("record {index}: item {item} released twice"));
            }
        }
    }
    Ok(())
}

/// All subsets of `items` with 1..=max_size elements (sorted, as `items` is).
fn subsets(items: &[u32], max_size: usize) -> Vec<Vec<u32>> {
    let mut all: Vec<Vec<u32>> = vec![Vec::new()];
    for &item in items {
        let extended: Vec<Vec<u32>> = all
            .iter()
            .filter(|s| s.len() < max_size)
            .map(|s| {
                let mut s = s.clone();
                s.push(item);
                s
            })
            .collect();
        all.extend(extended);
    }
    all.retain(|s| !s.is_empty());
    all
}

/// Checks the given adversaries (record index, Q) against the released window.
pub fn check_adversaries(
    original: &[Record],
    released: &[Vec<u32>],
    rho: f64,
    adversaries: &BTreeMap<Vec<u32>, Vec<usize>>,
) -> Result<(), String> {
    let released_sets: Vec<HashSet<u32>> = released
        .iter()
        .map(|r| r.iter().copied().collect())
        .collect();
    let mut postings: HashMap<u32, Vec<usize>> = HashMap::new();
    for (index, record) in released.iter().enumerate() {
        for item in record {
            postings.entry(*item).or_default().push(index);
        }
    }
    let nobody: Vec<usize> = Vec::new();
    for (q, users) in adversaries {
        // Records holding Q: those holding Q's first item that also hold the rest.
        let first = postings.get(&q[0]).unwrap_or(&nobody);
        let holders: Vec<&HashSet<u32>> = first
            .iter()
            .map(|&index| &released_sets[index])
            .filter(|r| q.iter().all(|i| r.contains(i)))
            .collect();
        let support_q = holders.len();
        if support_q == 0 {
            continue;
        }
        let mut co_occurrence: HashMap<u32, usize> = HashMap::new();
        for record in &holders {
            for item in record.iter() {
                *co_occurrence.entry(*item).or_default() += 1;
            }
        }
        for &user in users {
            for e in &original[user].sensitive {
                if q.contains(e) {
                    continue;
                }
                let support_qe = co_occurrence.get(e).copied().unwrap_or(0);
                if support_qe as f64 > rho * support_q as f64 {
                    return Err(format!(
                        "adversary (record {user}, Q = {q:?}): supp(Q ∪ {{{e}}}) = {support_qe} > rho {rho} · supp(Q) = {support_q}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every adversary with |Q| <= m, exhaustively.
pub fn check_exact(
    original: &[Record],
    released: &[Vec<u32>],
    rho: f64,
    m: usize,
) -> Result<(), String> {
    check_suppression_only(original, released)?;
    let mut adversaries: BTreeMap<Vec<u32>, Vec<usize>> = BTreeMap::new();
    for (user, record) in original.iter().enumerate() {
        for q in subsets(&record.items, m) {
            adversaries.entry(q).or_default().push(user);
        }
    }
    check_adversaries(original, released, rho, &adversaries)
}

/// Whether the released window is safe for adversary (user, Q): for every e ∈ E_user \ Q,
/// supp'(Q ∪ {e}) <= rho · supp'(Q) or supp'(Q) = 0. Plain scans over the released records.
pub fn is_safe_for(
    original: &[Record],
    released: &[Vec<u32>],
    rho: f64,
    user: usize,
    knowledge: &[u32],
) -> bool {
    let holders: Vec<HashSet<u32>> = released
        .iter()
        .filter(|r| knowledge.iter().all(|i| r.contains(i)))
        .map(|r| r.iter().copied().collect())
        .collect();
    let support_q = holders.len();
    if support_q == 0 {
        return true;
    }
    original[user]
        .sensitive
        .iter()
        .filter(|e| !knowledge.contains(e))
        .all(|e| {
            let support_qe = holders.iter().filter(|r| r.contains(e)).count();
            support_qe as f64 <= rho * support_q as f64
        })
}

/// An independent estimate of H_l for each level l = 1..=m: the share of `samples` adversaries,
/// drawn as the definition says (a user with >= l original items uniformly, then an l-subset of its
/// original record uniformly, by partial Fisher-Yates with the caller's RNG), for which the release
/// is not safe. Levels no record reaches are skipped.
pub fn sampled_unsafe_shares(
    original: &[Record],
    released: &[Vec<u32>],
    rho: f64,
    m: usize,
    samples: usize,
    rng: &mut impl rand::Rng,
) -> Vec<(usize, f64)> {
    let mut shares = Vec::new();
    for level in 1..=m {
        let users: Vec<usize> = (0..original.len())
            .filter(|&u| original[u].items.len() >= level)
            .collect();
        if users.is_empty() {
            break;
        }
        let mut unsafe_count = 0;
        for _ in 0..samples {
            let user = users[rng.random_range(0..users.len())];
            let mut items = original[user].items.clone();
            for at in 0..level {
                let pick = rng.random_range(at..items.len());
                items.swap(at, pick);
            }
            let mut knowledge = items[..level].to_vec();
            knowledge.sort_unstable();
            if !is_safe_for(original, released, rho, user, &knowledge) {
                unsafe_count += 1;
            }
        }
        shares.push((level, unsafe_count as f64 / samples as f64));
    }
    shares
}
