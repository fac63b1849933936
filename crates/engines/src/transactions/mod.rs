//! Set-valued transactions anonymized with personalized rho-uncertainty by partial suppression
//! (Nakagawa, Arai & Nakagawa, 2018).
//!
//! Each record u has items D_u and its own sensitive items E_u (which may include items u does not
//! hold). conf(Q → e) = supp(Q ∪ {e}) / supp(Q) over the released window D'. D' is safe for adversary
//! (u, Q), Q ⊆ D_u with |Q| <= m, when for every e ∈ E_u \ Q: supp(Q ∪ {e}) <= rho · supp(Q) or
//! supp(Q) = 0. Exact mode guarantees this for every such adversary; sampled mode gives
//! (eps, delta)-rho^m-uncertainty by checking n_S = ceil(ln(1/delta) / (2 eps²)) sampled adversaries per
//! level. Suppression only removes items from records: no record is added, dropped or merged.
//!
//! Adversary knowledge Q has 1..=m items, as in the paper's algorithms (ℓ = 1 .. m); the empty
//! antecedent is not an adversary. The engine has no clock: [`UtilityReport::seconds`] is 0 when
//! [`anonymize`] returns and is filled in by the caller that timed it (the CLI, the daemon).
//!
//! Layout: [`support`] counts support on vertical tid-lists (bitsets for popular items),
//! `suppressor` holds the window, the rule repair and SUPPRESSOR, `sampler` SAMPLESUPPRESSOR,
//! `restore` the final pass that puts back suppressed occurrences no adversary needs gone, `utility`
//! the utility measures; this module validates input, maps item ids to a dense range and back, and
//! assembles the [`UtilityReport`].
//!
//! Threads: sampled mode checks each round's sample on up to `available_parallelism()` threads,
//! the restore pass judges its candidates likewise, and with a second core the rules of the
//! original window are mined on their own thread while the window is suppressed; every random
//! draw stays on the calling thread, so the release depends on the seed alone (the daemon re-runs a window after a crash and
//! must get the identical release).

mod constraints;
#[cfg(test)]
mod guarantee_tests;
mod restore;
mod sampler;
pub(crate) mod support;
/// The hash map of item ids (keys hashed with a multiply-rotate of their words), also used by the
/// item-set reader of `cloakd transactions`.
pub use support::FxHashMap;
mod suppressor;
mod utility;
pub mod windowing;

pub use constraints::PersonalizedPlus;
pub use restore::MAX_RESTORE_ANTECEDENTS;
pub use suppressor::MAX_EXACT_ANTECEDENTS;
pub use utility::{MAX_FREQUENT_ITEMSETS, MAX_RULE_ITEMS, MIN_CONFIDENCE, MIN_SUPPORT_FRACTION};

use suppressor::Window;

/// Dense item identifier within one window (the caller interns item names).
pub type ItemId = u32;

/// One record of a window: its items D_u and its own sensitive items E_u (both sorted, no duplicates).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub items: Vec<ItemId>,
    pub sensitive: Vec<ItemId>,
}

/// Which guarantee to give.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    /// rho^m-uncertainty against every adversary with |Q| <= m.
    Exact,
    /// (eps, delta)-rho^m-uncertainty with sampled adversaries.
    Sampled { epsilon: f64, delta: f64 },
}

/// Parameters of one anonymization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// rho in (0, 1).
    pub rho: f64,
    /// Largest adversary knowledge |Q|, >= 1.
    pub m: u32,
    pub mode: Mode,
}

impl Mode {
    /// n_S = ceil(ln(1/delta) / (2 eps²)) sampled adversaries per level, for sampled mode.
    pub fn samples_per_level(&self) -> Option<usize> {
        match *self {
            Mode::Exact => None,
            Mode::Sampled { epsilon, delta } => Some(
                ((1.0 / delta).ln() / (2.0 * epsilon * epsilon))
                    .ceil()
                    .max(1.0) as usize,
            ),
        }
    }
}

/// The released window and how much it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Anonymized {
    /// D'_u for every input record, same order and count as the input; each a sorted subset of D_u.
    pub records: Vec<Vec<ItemId>>,
    pub report: UtilityReport,
}

/// Privacy parameters, work done and utility loss of one anonymization.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UtilityReport {
    /// Records in the window.
    pub records: usize,
    pub rho: f64,
    pub m: u32,
    pub mode: Mode,
    /// Fraction of item occurrences suppressed (paper eq. 5).
    pub util_info: f64,
    /// KL(D' ‖ D) of the item frequency distributions, natural log (paper eq. 6).
    pub util_dist: f64,
    /// Jaccard distance between the association rule sets before and after (paper eq. 12).
    pub util_mining: f64,
    /// Item occurrences suppressed.
    pub suppressed: u64,
    /// Passes over the antecedents (exact) or sampling rounds (sampled), the last one clean.
    pub rounds: u64,
    /// Wall-clock seconds, filled in by the caller (the engine has no clock): 0 from [`anonymize`].
    pub seconds: f64,
    /// Item occurrences before suppression.
    pub occurrences: u64,
    /// Violated sensitive rules fixed (one per suppression step).
    pub violations: u64,
    /// Suppressed occurrences put back at the end because no adversary became unsafe by them
    /// (already deducted from `suppressed`).
    #[serde(default)]
    pub restored: u64,
    /// Association rules mined before and after.
    pub rules_before: u64,
    pub rules_after: u64,
    /// False when rule mining hit its frequent-itemset budget ([`MAX_FREQUENT_ITEMSETS`]).
    pub mining_complete: bool,
}

/// An adversary (u, Q): the target's record index and its background knowledge Q ⊆ D_u.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adversary {
    pub record: usize,
    pub knowledge: Vec<ItemId>,
}

/// Input the engine refuses, naming the field and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnonymizeError {
    #[error("rho: {rho} is outside (0, 1)")]
    InvalidRho { rho: f64 },
    #[error("m: must be at least 1")]
    InvalidM,
    #[error("epsilon: {epsilon} is outside (0, 1)")]
    InvalidEpsilon { epsilon: f64 },
    #[error("delta: {delta} is outside (0, 1)")]
    InvalidDelta { delta: f64 },
    #[error("record {record}: items: a record needs at least one item")]
    EmptyRecord { record: usize },
    #[error("record {record}: {field}: item {item} appears twice")]
    DuplicateItem {
        record: usize,
        field: &'static str,
        item: ItemId,
    },
    #[error("record {record}: {field}: items must be sorted ascending ({item} after {previous})")]
    UnsortedItems {
        record: usize,
        field: &'static str,
        item: ItemId,
        previous: ItemId,
    },
    #[error("records: {records} records exceed the limit of {limit} per window")]
    TooManyRecords { records: usize, limit: usize },
    #[error(
        "m: exact mode would enumerate {antecedents} adversary antecedents (limit {limit}); use a smaller m or sampled mode"
    )]
    TooManyAntecedents { antecedents: u64, limit: u64 },
}

fn validate(records: &[Record], params: &Params) -> Result<(), AnonymizeError> {
    if !(params.rho > 0.0 && params.rho < 1.0) {
        return Err(AnonymizeError::InvalidRho { rho: params.rho });
    }
    if params.m < 1 {
        return Err(AnonymizeError::InvalidM);
    }
    if let Mode::Sampled { epsilon, delta } = params.mode {
        if !(epsilon > 0.0 && epsilon < 1.0) {
            return Err(AnonymizeError::InvalidEpsilon { epsilon });
        }
        if !(delta > 0.0 && delta < 1.0) {
            return Err(AnonymizeError::InvalidDelta { delta });
        }
    }
    let limit = u32::MAX as usize;
    if records.len() > limit {
        return Err(AnonymizeError::TooManyRecords {
            records: records.len(),
            limit,
        });
    }
    for (index, record) in records.iter().enumerate() {
        if record.items.is_empty() {
            return Err(AnonymizeError::EmptyRecord { record: index });
        }
        for (field, list) in [("items", &record.items), ("sensitive", &record.sensitive)] {
            for pair in list.windows(2) {
                if pair[0] == pair[1] {
                    return Err(AnonymizeError::DuplicateItem {
                        record: index,
                        field,
                        item: pair[0],
                    });
                }
                if pair[0] > pair[1] {
                    return Err(AnonymizeError::UnsortedItems {
                        record: index,
                        field,
                        item: pair[1],
                        previous: pair[0],
                    });
                }
            }
        }
    }
    Ok(())
}

/// Maps the items held by some record to 0..len preserving order, and back.
struct DenseItems {
    universe: Vec<ItemId>,
    lookup: Option<Vec<u32>>,
}

impl DenseItems {
    const ABSENT: u32 = u32::MAX;

    fn new(records: &[Record]) -> Self {
        let mut universe: Vec<ItemId> = records
            .iter()
            .flat_map(|r| r.items.iter().copied())
            .collect();
        universe.sort_unstable();
        universe.dedup();
        let max = universe.last().copied().unwrap_or(0) as usize;
        // A direct table when it is not much larger than the data; binary search otherwise.
        let lookup = (max < (1 << 24) || max < 4 * universe.len()).then(|| {
            let mut table = vec![Self::ABSENT; max + 1];
            for (dense, &item) in universe.iter().enumerate() {
                table[item as usize] = dense as u32;
            }
            table
        });
        DenseItems { universe, lookup }
    }

    fn dense(&self, item: ItemId) -> Option<u32> {
        match &self.lookup {
            Some(table) => table
                .get(item as usize)
                .copied()
                .filter(|&d| d != Self::ABSENT),
            None => self.universe.binary_search(&item).ok().map(|d| d as u32),
        }
    }

    fn item(&self, dense: u32) -> ItemId {
        self.universe[dense as usize]
    }
}

/// Threads the engine's read-only checks may use: the cores this process may run on.
fn engine_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Adversary antecedents of one record of `items` items in exact mode: Σ_{l=1..m} C(items, l)
/// (saturating). Summed over a window's records it bounds the antecedents exact mode enumerates, so
/// the daemon bounds a window's cost with it before accepting a record.
pub fn antecedent_count(items: usize, m: u32) -> u64 {
    support::subset_count(items, m as usize)
}

/// Anonymizes one window by partial suppression (SUPPRESSOR in exact mode, SAMPLESUPPRESSOR in
/// sampled mode), seeded by `seed`. See [`anonymize_with_adversaries`].
pub fn anonymize(
    records: &[Record],
    params: &Params,
    seed: u64,
) -> Result<Anonymized, AnonymizeError> {
    anonymize_with_adversaries(records, params, seed).map(|(anonymized, _)| anonymized)
}

/// Like [`anonymize`], also returning, in sampled mode, the adversaries of the final round: the
/// released window is safe for every one of them (empty in exact mode, where it is safe for all).
pub fn anonymize_with_adversaries(
    records: &[Record],
    params: &Params,
    seed: u64,
) -> Result<(Anonymized, Vec<Adversary>), AnonymizeError> {
    validate(records, params)?;
    let dense = DenseItems::new(records);
    let original: Vec<Vec<u32>> = records
        .iter()
        .map(|r| r.items.iter().filter_map(|&i| dense.dense(i)).collect())
        .collect();
    let sensitive: Vec<Vec<u32>> = records
        .iter()
        .map(|r| r.sensitive.iter().filter_map(|&i| dense.dense(i)).collect())
        .collect();
    let m = params.m as usize;
    if params.mode == Mode::Exact {
        let antecedents = Window::exact_antecedent_bound(&original, m);
        if antecedents > MAX_EXACT_ANTECEDENTS {
            return Err(AnonymizeError::TooManyAntecedents {
                antecedents,
                limit: MAX_EXACT_ANTECEDENTS,
            });
        }
    }
    let threads = engine_threads();
    let item_count = dense.universe.len();
    let run = |window: &mut Window| {
        let stats = match params.mode.samples_per_level() {
            None => window.suppress_exact(m),
            Some(samples) => window.suppress_sampled(m, samples, threads),
        };
        let restored = window.restore(m, threads);
        (stats, restored)
    };
    // The rules of the original window do not depend on the suppression: with a second core they
    // are mined on their own thread from the start, filling the cores the serial steps leave idle.
    let (window, stats, restored, rules_before, rules_after) = if threads > 1 {
        std::thread::scope(|scope| {
            let mining_records = original.clone();
            let before = scope.spawn(move || {
                let tids = support::tid_lists(&mining_records, item_count);
                utility::association_rules(&mining_records, &tids)
            });
            let mut window = Window::new(original, sensitive, item_count, params.rho, seed);
            let (stats, restored) = run(&mut window);
            let after = utility::association_rules(&window.released, &window.released_tids);
            let before = before.join().expect("rule mining panicked");
            (window, stats, restored, before, after)
        })
    } else {
        let mut window = Window::new(original, sensitive, item_count, params.rho, seed);
        let (stats, restored) = run(&mut window);
        let before = utility::association_rules(&window.original, &window.original_tids);
        let after = utility::association_rules(&window.released, &window.released_tids);
        (window, stats, restored, before, after)
    };
    let report = UtilityReport {
        records: records.len(),
        rho: params.rho,
        m: params.m,
        mode: params.mode,
        util_info: utility::util_info(window.original_total, window.released_total),
        util_dist: utility::util_dist(
            window.original_tids.iter().map(|t| t.len() as u64),
            window.released_tids.iter().map(|t| t.len() as u64),
        ),
        util_mining: utility::util_mining(&rules_before, &rules_after),
        suppressed: window.suppressed,
        rounds: stats.rounds,
        seconds: 0.0,
        occurrences: window.original_total,
        violations: stats.violations,
        restored,
        rules_before: rules_before.rule_count(),
        rules_after: rules_after.rule_count(),
        mining_complete: rules_before.complete && rules_after.complete,
    };
    let released = window
        .released
        .iter()
        .map(|r| r.iter().map(|&d| dense.item(d)).collect())
        .collect();
    let adversaries = stats
        .final_adversaries
        .iter()
        .map(|a| Adversary {
            record: a.user as usize,
            knowledge: a.knowledge.iter().map(|&d| dense.item(d)).collect(),
        })
        .collect();
    Ok((
        Anonymized {
            records: released,
            report,
        },
        adversaries,
    ))
}
