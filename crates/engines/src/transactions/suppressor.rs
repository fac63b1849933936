//! SUPPRESSOR (Algorithm 1 of Nakagawa, Arai & Nakagawa 2018): personalized rho^m-uncertainty by
//! partial suppression, and the window state and rule repair that SAMPLESUPPRESSOR
//! ([`super::sampler`]) shares with it.
//!
//! A *sensitive rule* Q → {e} concerns an adversary (u, Q) with Q ⊆ D_u (u's original items) and
//! e ∈ E_u \ Q; it is violated in the released window D' when supp(Q ∪ {e}) > rho · supp(Q) (the
//! comparison is made exactly in this form, in f64, here and in the tests' checker).
//!
//! Repair (where we depart from the paper's greedy choice of d ∈ Q ∪ {e} by F(d)): a violated rule
//! is repaired by suppressing its consequent e from N_s(e) = ceil(supp(Q∪e) − rho·supp(Q)) of the
//! records holding Q ∪ {e} (at least 1, at most supp(Q∪e), raised if f64 rounding leaves the rule
//! violated). N_s(e) is never larger than the paper's N_s(q) = N_s(e) / (1 − rho) for an item of Q,
//! supp(Q) stays as it is (so the other rules of Q keep their counts), and an e gone from a record
//! stays gone for every other knowledge set of that record: when the adversary's knowledge is rare
//! (supp(Q) = 1 for most 3- to 5-item sets of long records) suppressing an item of Q repairs only
//! that one set, and the next sampled subset of the same record needs another. The records are
//! chosen (1) among those whose owner marked e sensitive, (2) the longest released records first
//! (they have the most knowledge sets that would expose e again), (3) ties by the seeded RNG.
//! Measured effect in docs/transactions.md (BMS-WebView-2: util_info 0.33 → 0.11).
//!
//! Efficiency, beyond the paper's pseudo-code: support is counted on vertical tid-lists
//! ([`super::support`]); each distinct antecedent Q is handled once per pass for all users sharing
//! it; the candidate consequents of Q are found by one horizontal scan over the released records
//! holding Q (only items e with count > rho · supp(Q) can violate, at most avg_len/rho of them), and
//! only then tested for sensitivity (exact mode: some holder u of Q in the original window has
//! e ∈ E_u, via the transposed lists {u : e ∈ E_u}; sampled mode: some sampled target u of Q has
//! e ∈ E_u). Each antecedent is driven to its fixpoint (one pass over its candidates, since only
//! consequents are suppressed) before the next one. Items held by many records also keep a bitset
//! ([`super::support::PopularSets`]) for one-word membership tests.
//!
//! Which rules must be re-checked after a suppression (exact mode): removing d from record r lowers
//! supp(Q') only for antecedents Q' with d ∈ Q' ⊆ D'_r; for every other Q' it can only lower some
//! supp(Q' ∪ {e}), i.e. make Q' safer. So a pass re-checks exactly the antecedents marked that way
//! since their last check, and the window is safe for every adversary when a pass finds none.
//!
//! Termination: a violated rule has supp(Q∪e) > rho·supp(Q) >= 0, so N_s >= 1 and at least one item
//! occurrence is removed (N_s <= supp(Q∪e) records hold Q∪e; with all of them removed the rule holds). The number of item occurrences is
//! finite and never grows, so after finitely many suppressions no rule can be violated (at worst
//! every occurrence is gone and every supp(Q) = 0). Exact mode stops after a pass without
//! violations; sampled mode after a round whose freshly sampled adversaries are all safe, so the
//! released window is safe, exactly, for every adversary of that final round (returned to callers
//! who want to check it).
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::support::{
    FxHashMap, PopularSets, TidList, for_each_subset, intersect_with, intersection_len_with,
    intersects, remove_tid, subset_count, tid_lists, tidset_into, tidset_with,
};

/// Largest number of antecedents (Σ_u Σ_{k<=m} C(|D_u|, k)) exact mode will enumerate.
pub const MAX_EXACT_ANTECEDENTS: u64 = 50_000_000;

/// The window under suppression, over dense item ids 0..item_count.
pub(crate) struct Window {
    pub(crate) rho: f64,
    /// D'_u, sorted dense item ids.
    pub(crate) released: Vec<Vec<u32>>,
    /// D_u, sorted dense item ids.
    pub(crate) original: Vec<Vec<u32>>,
    /// E_u restricted to items held by some record, sorted dense ids.
    pub(crate) sensitive: Vec<Vec<u32>>,
    pub(crate) original_tids: Vec<TidList>,
    pub(crate) released_tids: Vec<TidList>,
    /// Bitsets of the popular items of `released_tids`, kept in step with them.
    pub(crate) released_popular: PopularSets,
    pub(crate) original_total: u64,
    pub(crate) released_total: u64,
    pub(crate) suppressed: u64,
    pub(crate) rng: ChaCha8Rng,
    // Scratch space reused across checks.
    counts: Vec<u32>,
    touched: Vec<u32>,
    scratch: Vec<u32>,
    tids_q_buffer: Vec<u32>,
    holding_rule_buffer: Vec<u32>,
}

/// Antecedents of exact mode with their dirty marks.
pub(crate) struct Antecedents {
    m: usize,
    /// Antecedents in checking order: by size, then lexicographically.
    list: Vec<Box<[u32]>>,
    ids: FxHashMap<Box<[u32]>, u32>,
    /// Still to be checked in the current pass.
    pending: Vec<bool>,
    /// Marked for the next pass.
    marked: Vec<bool>,
    next: Vec<u32>,
}

impl Antecedents {
    fn mark_containing(&mut self, record: &[u32], item: u32) {
        let others: Vec<u32> = record.iter().copied().filter(|&i| i != item).collect();
        let mut key: Vec<u32> = Vec::with_capacity(self.m);
        let mark = |id: u32, this: &mut Self| {
            let at = id as usize;
            if !this.pending[at] && !this.marked[at] {
                this.marked[at] = true;
                this.next.push(id);
            }
        };
        if let Some(&id) = self.ids.get(&[item][..]) {
            mark(id, self);
        }
        let mut found = Vec::new();
        for_each_subset(&others, self.m.saturating_sub(1), &mut |subset| {
            key.clear();
            let at = subset.partition_point(|&i| i < item);
            key.extend_from_slice(&subset[..at]);
            key.push(item);
            key.extend_from_slice(&subset[at..]);
            if let Some(&id) = self.ids.get(&key[..]) {
                found.push(id);
            }
        });
        for id in found {
            mark(id, self);
        }
    }
}

/// Who a candidate consequent must be sensitive for, for the rule to count.
pub(crate) enum Targets<'a> {
    /// Exact mode: any holder of Q in the original window (tids of the original records ⊇ Q),
    /// computed on first need.
    Holders(Option<Vec<u32>>),
    /// Sampled mode: the sampled targets u of adversaries (u, Q).
    Sampled(&'a [u32]),
}

/// One sampled adversary (u, Q), Q in dense ids.
pub(crate) struct DenseAdversary {
    pub(crate) user: u32,
    pub(crate) knowledge: Vec<u32>,
}

/// Outcome counters of one run.
pub(crate) struct RunStats {
    pub(crate) rounds: u64,
    pub(crate) violations: u64,
    pub(crate) final_adversaries: Vec<DenseAdversary>,
}

impl Window {
    pub(crate) fn new(
        original: Vec<Vec<u32>>,
        sensitive: Vec<Vec<u32>>,
        item_count: usize,
        rho: f64,
        seed: u64,
    ) -> Self {
        let original_tids = tid_lists(&original, item_count);
        let total = original.iter().map(|r| r.len() as u64).sum();
        let released_popular = PopularSets::new(&original_tids, original.len());
        Window {
            rho,
            released: original.clone(),
            original,
            sensitive,
            released_popular,
            released_tids: original_tids.clone(),
            original_tids,
            original_total: total,
            released_total: total,
            suppressed: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            counts: vec![0; item_count],
            touched: Vec::new(),
            scratch: Vec::new(),
            tids_q_buffer: Vec::new(),
            holding_rule_buffer: Vec::new(),
        }
    }

    pub(crate) fn violates(&self, with_e: usize, support_q: usize) -> bool {
        with_e as f64 > self.rho * support_q as f64
    }

    /// Sensitivity of `e` for the targets of the rule.
    fn is_sensitive(
        &mut self,
        q: &[u32],
        e: u32,
        targets: &mut Targets<'_>,
        sensitive_holders: &[TidList],
    ) -> bool {
        match targets {
            Targets::Holders(holders) => {
                let holders = holders.get_or_insert_with(|| {
                    let mut out = Vec::new();
                    tidset_into(&self.original_tids, q, &mut out, &mut self.scratch);
                    out
                });
                intersects(holders, &sensitive_holders[e as usize])
            }
            Targets::Sampled(users) => users
                .iter()
                .any(|&u| self.sensitive[u as usize].binary_search(&e).is_ok()),
        }
    }

    /// Candidate consequents of `q`: items e ∉ Q, sensitive for the targets, with
    /// supp'(Q ∪ e) > rho · supp'(Q), found by counting items over the released records `tids_q`.
    fn candidate_consequents(
        &mut self,
        q: &[u32],
        tids_q: &[u32],
        targets: &mut Targets<'_>,
        sensitive_holders: &[TidList],
    ) -> Vec<u32> {
        let support_q = tids_q.len();
        if let Targets::Sampled(users) = targets {
            // Few targets and a popular Q: test the targets' sensitive items vertically instead of
            // scanning every record holding Q; an item whose own support is <= rho · supp(Q)
            // cannot violate, which prunes all but the popular ones.
            let users: &[u32] = users;
            let sensitive_total: usize = users
                .iter()
                .map(|&u| self.sensitive[u as usize].len())
                .sum();
            let scan_cost =
                support_q as f64 * self.released_total as f64 / self.released.len().max(1) as f64;
            if (sensitive_total as f64) < scan_cost {
                let mut candidates = Vec::new();
                for &u in users {
                    for &e in &self.sensitive[u as usize] {
                        let holders_e = &self.released_tids[e as usize];
                        if self.violates(holders_e.len(), support_q)
                            && q.binary_search(&e).is_err()
                            && self.violates(
                                intersection_len_with(
                                    tids_q,
                                    &self.released_tids,
                                    &self.released_popular,
                                    e,
                                ),
                                support_q,
                            )
                        {
                            candidates.push(e);
                        }
                    }
                }
                candidates.sort_unstable();
                candidates.dedup();
                return candidates;
            }
        }
        // Local buffers: lets the compiler keep them in registers through the hot loop.
        let mut counts = std::mem::take(&mut self.counts);
        let mut touched = std::mem::take(&mut self.touched);
        for &tid in tids_q {
            for &item in &self.released[tid as usize] {
                let slot = &mut counts[item as usize];
                if *slot == 0 {
                    touched.push(item);
                }
                *slot += 1;
            }
        }
        self.counts = counts;
        let mut candidates = Vec::new();
        for &item in &touched {
            let count = self.counts[item as usize] as usize;
            self.counts[item as usize] = 0;
            if self.violates(count, tids_q.len()) && q.binary_search(&item).is_err() {
                candidates.push(item);
            }
        }
        self.touched = touched;
        self.touched.clear();
        candidates.retain(|&e| self.is_sensitive(q, e, targets, sensitive_holders));
        candidates.sort_unstable();
        candidates
    }

    /// Drives antecedent `q` to a state where no rule Q → e is violated for its targets.
    /// Returns the number of violated rules it fixed.
    pub(crate) fn fix_antecedent(
        &mut self,
        q: &[u32],
        targets: &mut Targets<'_>,
        sensitive_holders: &[TidList],
        antecedents: Option<&mut Antecedents>,
    ) -> u64 {
        // Reuse the tid buffers across calls (millions of calls in sampled mode).
        let mut tids_q = std::mem::take(&mut self.tids_q_buffer);
        let mut holding_rule = std::mem::take(&mut self.holding_rule_buffer);
        let fixed = self.fix_antecedent_into(
            q,
            targets,
            sensitive_holders,
            antecedents,
            &mut tids_q,
            &mut holding_rule,
        );
        self.tids_q_buffer = tids_q;
        self.holding_rule_buffer = holding_rule;
        fixed
    }

    fn fix_antecedent_into(
        &mut self,
        q: &[u32],
        targets: &mut Targets<'_>,
        sensitive_holders: &[TidList],
        mut antecedents: Option<&mut Antecedents>,
        tids_q: &mut Vec<u32>,
        holding_rule: &mut Vec<u32>,
    ) -> u64 {
        let mut scratch = std::mem::take(&mut self.scratch);
        tidset_with(
            &self.released_tids,
            &self.released_popular,
            q,
            tids_q,
            &mut scratch,
        );
        self.scratch = scratch;
        if tids_q.is_empty() {
            return 0;
        }
        // Only consequents are suppressed: supp(Q) and the counts of the other consequents stay as
        // they are, so one pass over the candidates drives Q to its fixpoint.
        let mut fixed = 0;
        let candidates = self.candidate_consequents(q, tids_q, targets, sensitive_holders);
        for e in candidates {
            intersect_with(
                tids_q,
                &self.released_tids,
                &self.released_popular,
                e,
                holding_rule,
            );
            if !self.violates(holding_rule.len(), tids_q.len()) {
                continue;
            }
            fixed += 1;
            let count = self.suppression_number(holding_rule.len(), tids_q.len());
            for tid in self.choose_records(e, holding_rule, count) {
                self.suppress(tid, e, antecedents.as_deref_mut());
            }
        }
        fixed
    }

    /// N_s(e) = ceil(supp(Q∪e) − rho·supp(Q)), at least 1 and at most supp(Q∪e): the fewest
    /// records e must leave so that supp(Q∪e) <= rho·supp(Q) holds as [`Self::violates`] tests it.
    fn suppression_number(&self, with_e: usize, support_q: usize) -> usize {
        let excess = with_e as f64 - self.rho * support_q as f64;
        let mut count = (excess.ceil().max(1.0) as usize).min(with_e);
        while count < with_e && self.violates(with_e - count, support_q) {
            count += 1;
        }
        count
    }

    /// The `count` records of `holding_rule` (records holding Q ∪ e) to suppress e from: first
    /// those whose owner marked e sensitive (e would otherwise stay exposed to that owner's other,
    /// rarer knowledge sets), then the longest released records (the most knowledge sets), ties
    /// broken by the seeded RNG.
    fn choose_records(&mut self, e: u32, holding_rule: &[u32], count: usize) -> Vec<u32> {
        let mut keyed: Vec<(bool, std::cmp::Reverse<usize>, u64, u32)> = holding_rule
            .iter()
            .map(|&tid| {
                (
                    self.sensitive[tid as usize].binary_search(&e).is_err(),
                    std::cmp::Reverse(self.released[tid as usize].len()),
                    self.rng.random::<u64>(),
                    tid,
                )
            })
            .collect();
        if count < keyed.len() {
            keyed.select_nth_unstable(count);
            keyed.truncate(count);
        }
        keyed.into_iter().map(|(_, _, _, tid)| tid).collect()
    }

    /// Removes item `d` from record `tid` of the released window.
    fn suppress(&mut self, tid: u32, d: u32, antecedents: Option<&mut Antecedents>) {
        if let Some(antecedents) = antecedents {
            antecedents.mark_containing(&self.released[tid as usize], d);
        }
        let record = &mut self.released[tid as usize];
        if let Ok(at) = record.binary_search(&d) {
            record.remove(at);
            remove_tid(&mut self.released_tids[d as usize], tid);
            self.released_popular.remove(d, tid);
            self.released_total -= 1;
            self.suppressed += 1;
        }
    }

    /// Transposed sensitive constraint: for each item, the sorted users u with the item in E_u.
    pub(crate) fn sensitive_holders(&self) -> Vec<TidList> {
        // Sized first: tens of millions of entries on the public data sets.
        let mut sizes = vec![0usize; self.original_tids.len()];
        for &item in self.sensitive.iter().flatten() {
            sizes[item as usize] += 1;
        }
        let mut holders: Vec<TidList> = sizes.into_iter().map(Vec::with_capacity).collect();
        for (user, items) in self.sensitive.iter().enumerate() {
            for &item in items {
                holders[item as usize].push(user as u32);
            }
        }
        holders
    }

    /// SUPPRESSOR restricted to |Q| <= m: personalized rho^m-uncertainty for every adversary.
    pub(crate) fn suppress_exact(&mut self, m: usize) -> RunStats {
        let sensitive_holders = self.sensitive_holders();
        let mut keys: Vec<Box<[u32]>> = Vec::new();
        {
            let mut seen: FxHashMap<Box<[u32]>, ()> = FxHashMap::default();
            for record in &self.original {
                for_each_subset(record, m, &mut |subset| {
                    if !seen.contains_key(subset) {
                        seen.insert(subset.into(), ());
                    }
                });
            }
            keys.extend(seen.into_keys());
        }
        keys.sort_unstable_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let ids: FxHashMap<Box<[u32]>, u32> = keys
            .iter()
            .enumerate()
            .map(|(id, key)| (key.clone(), id as u32))
            .collect();
        let count = keys.len();
        let mut antecedents = Antecedents {
            m,
            list: keys,
            ids,
            pending: vec![false; count],
            marked: vec![false; count],
            next: (0..count as u32).collect(),
        };
        for id in &antecedents.next {
            antecedents.marked[*id as usize] = true;
        }
        let mut stats = RunStats {
            rounds: 0,
            violations: 0,
            final_adversaries: Vec::new(),
        };
        while !antecedents.next.is_empty() {
            stats.rounds += 1;
            let mut pass = std::mem::take(&mut antecedents.next);
            pass.sort_unstable();
            for &id in &pass {
                antecedents.marked[id as usize] = false;
                antecedents.pending[id as usize] = true;
            }
            for &id in &pass {
                antecedents.pending[id as usize] = false;
                let q = antecedents.list[id as usize].clone();
                stats.violations += self.fix_antecedent(
                    &q,
                    &mut Targets::Holders(None),
                    &sensitive_holders,
                    Some(&mut antecedents),
                );
            }
        }
        stats
    }

    /// Exact mode's antecedent count, for the size limit.
    pub(crate) fn exact_antecedent_bound(original: &[Vec<u32>], m: usize) -> u64 {
        original
            .iter()
            .map(|record| subset_count(record.len(), m))
            .fold(0u64, u64::saturating_add)
    }
}
