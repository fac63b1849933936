//! Undoing suppressions that turned out unnecessary: after SUPPRESSOR or SAMPLESUPPRESSOR, each
//! suppressed occurrence (record r, item d) is tried once, in seeded random order, and put back when
//! no adversary becomes unsafe by it.
//!
//! Which rules can get worse: putting d back into r raises supp'(X) by one exactly for the itemsets
//! X ⊆ D'_r ∪ {d} with d ∈ X. So conf(Q → e) = supp'(Q ∪ e) / supp'(Q) can rise only when
//! Q ∪ {e} ⊆ D'_r ∪ {d} and d ∈ Q ∪ {e}: (a) d ∈ Q, e ∈ D'_r \ Q (both supports + 1), or
//! (b) e = d, Q ⊆ D'_r (only the numerator + 1). Every other rule keeps or lowers its confidence
//! (or is unaffected). The occurrence is put back only if every rule of kinds (a) and (b) with
//! 1 <= |Q| <= m satisfies supp'(Q ∪ e) <= rho · supp'(Q) afterwards for *every* adversary it
//! concerns — every user u with Q ⊆ D_u (original) and e ∈ E_u — whether or not that rule was safe
//! before.
//!
//! Invariant: the set of unsafe adversaries never grows (an adversary unsafe afterwards has a
//! violated rule; if that rule was checked it is safe, so its confidence did not rise and it was
//! violated before). Hence exact mode stays rho^m-uncertain for every adversary, and in sampled mode
//! every H_l can only fall while the final round's adversaries stay safe: Theorem 7's conclusion for
//! the window the final sample was drawn from carries over to the restored window.
//!
//! Candidates are judged in batches on several threads against the window as it stands; the
//! verdicts are taken in order up to the first occurrence put back, and the rest of the batch is
//! judged again on the changed window, so the pass puts back exactly what the one-at-a-time pass
//! would, whatever the thread count.
//!
//! Cost: a candidate enumerates sum_{k<m} C(|D'_r|, k) antecedents of kind (a) and
//! sum_{1<=k<=m} C(|D'_r|, k) of kind (b); candidates above [`MAX_RESTORE_ANTECEDENTS`] stay
//! suppressed (long records in sampled mode).
use rand::seq::SliceRandom;

use super::support::{
    for_each_subset, insert_tid, intersection_len_with, intersects, map_interleaved, subset_count,
    tidset_into, tidset_with,
};
use super::suppressor::Window;

/// Most antecedents one restore candidate may check.
pub const MAX_RESTORE_ANTECEDENTS: u64 = 1024;

/// Candidates judged per thread between two looks at the verdicts. Few candidates are put back
/// (about 1 in 500 on the public data sets), so a batch is rarely cut short.
const RESTORE_BATCH: usize = 64;

/// Scratch buffers of one candidate's checks.
#[derive(Default)]
struct Buffers {
    tids: Vec<u32>,
    holders: Vec<u32>,
    scratch: Vec<u32>,
    key: Vec<u32>,
}

impl Window {
    /// Tries every suppressed occurrence once, judging candidates on up to `threads` threads (the
    /// result does not depend on it); returns how many were put back.
    pub(crate) fn restore(&mut self, m: usize, threads: usize) -> u64 {
        let sensitive_holders = self.sensitive_holders();
        let mut candidates: Vec<(u32, u32)> = Vec::new();
        for (tid, (original, released)) in self.original.iter().zip(&self.released).enumerate() {
            if original.len() == released.len() {
                continue;
            }
            for &item in original {
                if released.binary_search(&item).is_err() {
                    candidates.push((tid as u32, item));
                }
            }
        }
        candidates.shuffle(&mut self.rng);
        let threads = threads.max(1);
        let mut buffers: Vec<Buffers> = (0..threads).map(|_| Buffers::default()).collect();
        let mut restored = 0;
        let mut next = 0;
        while next < candidates.len() {
            // Speculation: judge a batch against the window as it is; up to and including the first
            // candidate put back, that is the window the one-at-a-time pass would see. Later
            // verdicts are dropped and judged again, so the result is the sequential one.
            let batch = &candidates[next..(next + RESTORE_BATCH * threads).min(candidates.len())];
            let verdicts = self.judge_batch(batch, m, &sensitive_holders, &mut buffers);
            let Some(first) = verdicts.iter().position(|&v| v) else {
                next += batch.len();
                continue;
            };
            let (tid, d) = batch[first];
            let record = &mut self.released[tid as usize];
            let at = record.partition_point(|&i| i < d);
            record.insert(at, d);
            insert_tid(&mut self.released_tids[d as usize], tid);
            self.released_popular.insert(d, tid);
            self.released_total += 1;
            self.suppressed -= 1;
            restored += 1;
            next += first + 1;
        }
        restored
    }

    /// Whether each candidate of `batch` could be put back into the window as it is now, judged on
    /// up to `buffers.len()` threads (interleaved; the verdicts come back in batch order).
    fn judge_batch(
        &self,
        batch: &[(u32, u32)],
        m: usize,
        sensitive_holders: &[Vec<u32>],
        buffers: &mut [Buffers],
    ) -> Vec<bool> {
        map_interleaved(
            batch,
            buffers,
            batch.len().div_ceil(RESTORE_BATCH),
            |&(tid, d), buffers| {
                let length = self.released[tid as usize].len();
                let cost = subset_count(length, m.saturating_sub(1)) + 1 + subset_count(length, m);
                cost <= MAX_RESTORE_ANTECEDENTS
                    && self.restorable(tid, d, m, sensitive_holders, buffers)
            },
        )
    }

    /// Whether putting `d` back into record `tid` leaves every rule of kinds (a) and (b) safe.
    fn restorable(
        &self,
        tid: u32,
        d: u32,
        m: usize,
        sensitive_holders: &[Vec<u32>],
        buffers: &mut Buffers,
    ) -> bool {
        let record = &self.released[tid as usize];
        // Most candidates fail on the rarest knowledge: try the m rarest items of D'_r first.
        let mut rarest = record.clone();
        rarest.sort_unstable_by_key(|&i| (self.released_tids[i as usize].len(), i));
        rarest.truncate(m);
        rarest.sort_unstable();
        if !rarest.is_empty() && !self.consequent_stays_safe(&rarest, d, sensitive_holders, buffers)
        {
            return false;
        }
        let mut safe = true;
        // (b) Q ⊆ D'_r, e = d: supp'(Q ∪ d) + 1 against supp'(Q) (r holds Q already).
        for_each_subset(record, m, &mut |q| {
            if !safe {
                return;
            }
            if !self.consequent_stays_safe(q, d, sensitive_holders, buffers) {
                safe = false;
            }
        });
        if !safe {
            return false;
        }
        // (a) Q = S ∪ {d}, S ⊆ D'_r, |S| < m; e ∈ D'_r \ S: both supports + 1.
        let check_with = |others: &[u32], buffers: &mut Buffers| -> bool {
            buffers.key.clear();
            let at = others.partition_point(|&i| i < d);
            buffers.key.extend_from_slice(&others[..at]);
            buffers.key.push(d);
            buffers.key.extend_from_slice(&others[at..]);
            let q = std::mem::take(&mut buffers.key);
            tidset_with(
                &self.released_tids,
                &self.released_popular,
                &q,
                &mut buffers.tids,
                &mut buffers.scratch,
            );
            let support_q = buffers.tids.len() + 1;
            let mut ok = true;
            for &e in record {
                if others.binary_search(&e).is_ok() {
                    continue;
                }
                let with_e = intersection_len_with(
                    &buffers.tids,
                    &self.released_tids,
                    &self.released_popular,
                    e,
                ) + 1;
                if self.violates(with_e, support_q)
                    && self.concerns_someone(&q, e, sensitive_holders, buffers)
                {
                    ok = false;
                    break;
                }
            }
            buffers.key = q;
            ok
        };
        rarest.truncate(m.saturating_sub(1));
        if !check_with(&rarest, buffers) || !check_with(&[], buffers) {
            return false;
        }
        for_each_subset(record, m.saturating_sub(1), &mut |others| {
            if safe && !check_with(others, buffers) {
                safe = false;
            }
        });
        safe
    }

    /// Kind (b): with d put back into a record holding Q (and not d), is Q → d still safe for
    /// everyone it concerns?
    fn consequent_stays_safe(
        &self,
        q: &[u32],
        d: u32,
        sensitive_holders: &[Vec<u32>],
        buffers: &mut Buffers,
    ) -> bool {
        tidset_with(
            &self.released_tids,
            &self.released_popular,
            q,
            &mut buffers.tids,
            &mut buffers.scratch,
        );
        let support_q = buffers.tids.len();
        let with_d = intersection_len_with(
            &buffers.tids,
            &self.released_tids,
            &self.released_popular,
            d,
        ) + 1;
        !(self.violates(with_d, support_q)
            && self.concerns_someone(q, d, sensitive_holders, buffers))
    }

    /// Whether some user u with Q ⊆ D_u (original) has e ∈ E_u.
    fn concerns_someone(
        &self,
        q: &[u32],
        e: u32,
        sensitive_holders: &[Vec<u32>],
        buffers: &mut Buffers,
    ) -> bool {
        let marked = &sensitive_holders[e as usize];
        if marked.is_empty() {
            return false;
        }
        tidset_into(
            &self.original_tids,
            q,
            &mut buffers.holders,
            &mut buffers.scratch,
        );
        intersects(&buffers.holders, marked)
    }
}
