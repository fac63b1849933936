//! SAMPLESUPPRESSOR (Algorithm 2 of Nakagawa, Arai & Nakagawa 2018): (eps, delta)-rho^m-uncertainty
//! by rounds of freshly sampled adversaries.
//!
//! Each round (1) draws n_S adversaries per level l = 1..=min(m, longest record) as the paper
//! specifies (a user with >= l original items uniformly, then an l-subset of its original record
//! uniformly) from the window's seeded RNG; (2) finds R_S, the distinct knowledge sets Q of the
//! sample with a violated rule Q → e, e ∈ E_u \ Q for one of Q's sampled targets u; (3) fixes them
//! one after the other in sample order, each re-checked against the window as the earlier fixes left
//! it (the paper's line 11). A round with R_S = ∅ ends the run: the window, fixed before that round's
//! sample was drawn, is then safe for every adversary of the sample (Theorem 7's premise), and those
//! adversaries are returned.
//!
//! Step (2) only reads the window, so its distinct knowledge sets are checked on several threads
//! (interleaved, results put back in sample order): every verdict is a function of the window alone,
//! so the release does not depend on the thread count. All randomness (sample, records to suppress
//! from) is drawn by the one thread that runs steps (1) and (3).
//!
//! Incremental checking: during suppression supports only fall. For a knowledge set Q checked
//! earlier by a full scan, the cache keeps supp'(Q) and the items e ∉ Q with
//! supp'(Q ∪ e) > rho · supp'(Q) then ("over" items, sensitive or not). While supp'(Q) is unchanged
//! (the records holding Q can only have shrunk, so equal count = same records), no other item can
//! have crossed rho · supp'(Q), and Q is re-checked by intersecting its tid-list with those of its
//! over items only. A changed supp'(Q) falls back to a full check.
use rand::Rng;

use super::support::{FxHashMap, intersection_len_with, tidset_with};
use super::suppressor::{DenseAdversary, RunStats, Targets, Window};

/// Knowledge sets with at least this support are cached after a full scan (below it, a scan costs
/// about as much as the cached check).
const CACHE_MIN_SUPPORT: usize = 8;
/// Largest number of cached knowledge sets (bounds memory on very long runs).
const MAX_CACHE_ENTRIES: usize = 1 << 21;
/// Smallest number of distinct knowledge sets worth a second thread.
const MIN_PARALLEL_CHECKS: usize = 64;

/// A knowledge set's state at its last full check.
struct Checked {
    support: u32,
    /// Items e ∉ Q with supp'(Q ∪ e) > rho · supp'(Q) at that check.
    over: Box<[u32]>,
}

/// Per-thread scratch buffers of the checks.
struct Scratch {
    counts: Vec<u32>,
    touched: Vec<u32>,
    tids_q: Vec<u32>,
    buffer: Vec<u32>,
}

impl Scratch {
    fn new(items: usize) -> Self {
        Scratch {
            counts: vec![0; items],
            touched: Vec::new(),
            tids_q: Vec::new(),
            buffer: Vec::new(),
        }
    }
}

/// The verdict on one knowledge set, and a new cache entry when one was computed.
struct Verdict {
    violated: bool,
    entry: Option<Checked>,
}

/// Whether some rule Q → e with e ∈ E_u \ Q of a target u of `users` is violated in the window.
fn check(
    window: &Window,
    q: &[u32],
    users: &[u32],
    cached: Option<&Checked>,
    scratch: &mut Scratch,
) -> Verdict {
    tidset_with(
        &window.released_tids,
        &window.released_popular,
        q,
        &mut scratch.tids_q,
        &mut scratch.buffer,
    );
    let tids_q = &scratch.tids_q;
    let support = tids_q.len();
    if support == 0 {
        return Verdict {
            violated: false,
            entry: None,
        };
    }
    let sensitive_for_target = |e: u32| {
        users
            .iter()
            .any(|&u| window.sensitive[u as usize].binary_search(&e).is_ok())
    };
    if let Some(cached) = cached.filter(|c| c.support as usize == support) {
        let over: Vec<u32> = cached
            .over
            .iter()
            .copied()
            .filter(|&e| {
                window.violates(
                    intersection_len_with(
                        tids_q,
                        &window.released_tids,
                        &window.released_popular,
                        e,
                    ),
                    support,
                )
            })
            .collect();
        return Verdict {
            violated: over.iter().any(|&e| sensitive_for_target(e)),
            entry: Some(Checked {
                support: support as u32,
                over: over.into_boxed_slice(),
            }),
        };
    }
    let sensitive_total: usize = users
        .iter()
        .map(|&u| window.sensitive[u as usize].len())
        .sum();
    let scan_cost = support as f64 * window.released_total as f64
        / window.released.len().max(1) as f64;
    if support < CACHE_MIN_SUPPORT && (sensitive_total as f64) < scan_cost {
        // Test the targets' sensitive items vertically; an item whose own support is at most
        // rho · supp(Q) cannot violate.
        let violated = users.iter().any(|&u| {
            window.sensitive[u as usize].iter().any(|&e| {
                let holders = &window.released_tids[e as usize];
                window.violates(holders.len(), support)
                    && q.binary_search(&e).is_err()
                    && window.violates(
                        intersection_len_with(
                            tids_q,
                            &window.released_tids,
                            &window.released_popular,
                            e,
                        ),
                        support,
                    )
            })
        });
        return Verdict {
            violated,
            entry: None,
        };
    }
    for &tid in tids_q {
        for &item in &window.released[tid as usize] {
            let slot = &mut scratch.counts[item as usize];
            if *slot == 0 {
                scratch.touched.push(item);
            }
            *slot += 1;
        }
    }
    let mut over = Vec::new();
    for &item in &scratch.touched {
        let count = std::mem::take(&mut scratch.counts[item as usize]) as usize;
        if window.violates(count, support) && q.binary_search(&item).is_err() {
            over.push(item);
        }
    }
    scratch.touched.clear();
    over.sort_unstable();
    Verdict {
        violated: over.iter().any(|&e| sensitive_for_target(e)),
        entry: (support >= CACHE_MIN_SUPPORT).then(|| Checked {
            support: support as u32,
            over: over.into_boxed_slice(),
        }),
    }
}

/// Checks every knowledge set of `groups` against the window, on up to `threads` threads; the
/// verdicts come back in `groups` order.
fn check_all(
    window: &Window,
    groups: &[(Vec<u32>, Vec<u32>)],
    cache: &FxHashMap<Box<[u32]>, Checked>,
    scratches: &mut [Scratch],
) -> Vec<Verdict> {
    let threads = scratches
        .len()
        .min(groups.len() / MIN_PARALLEL_CHECKS)
        .max(1);
    let run = |worker: usize, scratch: &mut Scratch| -> Vec<Verdict> {
        groups
            .iter()
            .skip(worker)
            .step_by(threads)
            .map(|(q, users)| check(window, q, users, cache.get(&q[..]), scratch))
            .collect()
    };
    if threads == 1 {
        return run(0, &mut scratches[0]);
    }
    let per_worker: Vec<Vec<Verdict>> = std::thread::scope(|scope| {
        let handles: Vec<_> = scratches[..threads]
            .iter_mut()
            .enumerate()
            .map(|(worker, scratch)| scope.spawn(move || run(worker, scratch)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a check thread panicked"))
            .collect()
    });
    let mut iters: Vec<_> = per_worker.into_iter().map(Vec::into_iter).collect();
    (0..groups.len())
        .map(|at| {
            iters[at % threads]
                .next()
                .expect("every worker returns its share")
        })
        .collect()
}

impl Window {
    /// SAMPLESUPPRESSOR: n_S adversaries per level 1..=m, resampled each round, until a round finds
    /// every sampled adversary safe. Checks run on up to `threads` threads (>= 1); the release does
    /// not depend on it.
    pub(crate) fn suppress_sampled(
        &mut self,
        m: usize,
        samples_per_level: usize,
        threads: usize,
    ) -> RunStats {
        let max_len = self.original.iter().map(Vec::len).max().unwrap_or(0);
        let levels = m.min(max_len);
        // users_by_level[l - 1] = users with at least l original items.
        let users_by_level: Vec<Vec<u32>> = (1..=levels)
            .map(|l| {
                (0..self.original.len() as u32)
                    .filter(|&u| self.original[u as usize].len() >= l)
                    .collect()
            })
            .collect();
        let mut stats = RunStats {
            rounds: 0,
            violations: 0,
            final_adversaries: Vec::new(),
        };
        let item_count = self.released_tids.len();
        let mut scratches: Vec<Scratch> = (0..threads.max(1))
            .map(|_| Scratch::new(item_count))
            .collect();
        let mut cache: FxHashMap<Box<[u32]>, Checked> = FxHashMap::default();
        loop {
            stats.rounds += 1;
            stats.final_adversaries.clear();
            // (1) The sample, grouped by knowledge set: (Q, its distinct targets), level by level.
            let mut groups: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
            for (level_index, users) in users_by_level.iter().enumerate() {
                let level = level_index + 1;
                let mut sample: Vec<(Vec<u32>, u32)> = Vec::with_capacity(samples_per_level);
                for _ in 0..samples_per_level {
                    let user = users[self.rng.random_range(0..users.len())];
                    let record = &self.original[user as usize];
                    let mut picked =
                        rand::seq::index::sample(&mut self.rng, record.len(), level).into_vec();
                    picked.sort_unstable();
                    let knowledge: Vec<u32> = picked.iter().map(|&at| record[at]).collect();
                    sample.push((knowledge, user));
                }
                stats
                    .final_adversaries
                    .extend(sample.iter().map(|(knowledge, user)| DenseAdversary {
                        user: *user,
                        knowledge: knowledge.clone(),
                    }));
                sample.sort_unstable();
                for (knowledge, user) in sample {
                    match groups.last_mut() {
                        Some((q, users)) if *q == knowledge => {
                            if users.last() != Some(&user) {
                                users.push(user);
                            }
                        }
                        _ => groups.push((knowledge, vec![user])),
                    }
                }
            }
            // (2) R_S, read-only.
            let verdicts = check_all(self, &groups, &cache, &mut scratches);
            let mut violating: Vec<bool> = Vec::with_capacity(groups.len());
            for ((q, _), verdict) in groups.iter().zip(verdicts) {
                violating.push(verdict.violated);
                if let Some(entry) = verdict.entry
                    && (cache.len() < MAX_CACHE_ENTRIES || cache.contains_key(&q[..]))
                {
                    cache.insert(q.clone().into_boxed_slice(), entry);
                }
            }
            if !violating.iter().any(|&v| v) {
                return stats;
            }
            // (3) Fix them in sample order.
            for ((q, users), _) in groups.iter().zip(&violating).filter(|(_, v)| **v) {
                stats.violations += self.fix_antecedent(q, &mut Targets::Sampled(users), &[], None);
            }
        }
    }
}
