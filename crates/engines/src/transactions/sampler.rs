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
//! earlier by a full scan, the cache keeps bound = floor(0.75 · rho · supp'(Q)) and the items e ∉ Q
//! with supp'(Q ∪ e) > bound then ("over" items, sensitive or not). Any other item's count was
//! <= bound and can only have fallen, so while bound <= rho · supp'(Q) still holds (supp'(Q) fell
//! by at most about a quarter) none of them can violate, and Q is re-checked by intersecting its
//! tid-list with those of its over items only. Otherwise Q gets a full check again.
use rand::Rng;

use super::support::{FxHashMap, intersection_len_with, map_interleaved, tidset_with};
use super::suppressor::{DenseAdversary, RunStats, Targets, Window};

/// Knowledge sets with at least this support are cached after a full scan (below it, a scan costs
/// about as much as the cached check).
const CACHE_MIN_SUPPORT: usize = 8;
/// A cache entry lists the items above this share of the violation threshold rho · supp'(Q).
const CACHE_SLACK: f64 = 0.75;
/// Largest number of cached knowledge sets (bounds memory on very long runs).
const MAX_CACHE_ENTRIES: usize = 1 << 21;
/// Smallest number of distinct knowledge sets worth a second thread.
const MIN_PARALLEL_CHECKS: usize = 64;

/// A knowledge set's state at its last full check.
struct Checked {
    /// floor(CACHE_SLACK · rho · supp'(Q)) at the full check (<= rho · supp'(Q) then).
    bound: u32,
    /// Items e ∉ Q with supp'(Q ∪ e) > bound (at the last check), sorted.
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
    let Scratch {
        counts,
        touched,
        tids_q,
        buffer,
    } = scratch;
    // A single item's records are its list as it is.
    let tids_q: &[u32] = match q {
        [item] => &window.released_tids[*item as usize],
        _ => {
            tidset_with(
                &window.released_tids,
                &window.released_popular,
                q,
                tids_q,
                buffer,
            );
            tids_q
        }
    };
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
    if let Some(cached) = cached.filter(|c| !window.violates(c.bound as usize, support)) {
        // Every item outside `over` still has count <= bound <= rho · supp'(Q).
        let mut over = Vec::with_capacity(cached.over.len());
        let mut violated = false;
        for &e in cached.over.iter() {
            let count =
                intersection_len_with(tids_q, &window.released_tids, &window.released_popular, e);
            if count > cached.bound as usize {
                over.push(e);
                violated = violated || (window.violates(count, support) && sensitive_for_target(e));
            }
        }
        return Verdict {
            violated,
            entry: Some(Checked {
                bound: cached.bound,
                over: over.into_boxed_slice(),
            }),
        };
    }
    let sensitive_total: usize = users
        .iter()
        .map(|&u| window.sensitive[u as usize].len())
        .sum();
    let scan_cost =
        support as f64 * window.released_total as f64 / window.released.len().max(1) as f64;
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
            let slot = &mut counts[item as usize];
            if *slot == 0 {
                touched.push(item);
            }
            *slot += 1;
        }
    }
    // The cache keeps the items above a lower bound, so that it stays valid while supp'(Q) falls
    // to about CACHE_SLACK of its present value.
    let bound = (CACHE_SLACK * window.rho * support as f64).floor() as u32;
    let mut over = Vec::new();
    let mut violated = false;
    for &item in touched.iter() {
        let count = std::mem::take(&mut counts[item as usize]) as usize;
        if count > bound as usize && q.binary_search(&item).is_err() {
            over.push(item);
            violated = violated || (window.violates(count, support) && sensitive_for_target(item));
        }
    }
    touched.clear();
    over.sort_unstable();
    Verdict {
        violated,
        entry: (support >= CACHE_MIN_SUPPORT).then(|| Checked {
            bound,
            over: over.into_boxed_slice(),
        }),
    }
}

/// Checks every knowledge set of the sample against the window, on up to `scratches.len()`
/// threads; the verdicts come back in group order.
fn check_all(
    window: &Window,
    sample: &Sample,
    cache: &FxHashMap<Box<[u32]>, Checked>,
    scratches: &mut [Scratch],
) -> Vec<Verdict> {
    map_interleaved(
        &sample.groups,
        scratches,
        sample.groups.len() / MIN_PARALLEL_CHECKS,
        |group, scratch| {
            let q = sample.knowledge(group);
            let users = &sample.users[group.users.0 as usize..group.users.1 as usize];
            check(window, q, users, cache.get(q), scratch)
        },
    )
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
        // The original records in one flat buffer for the draws (a round reads thousands of random
        // records; one offset and one slice read each instead of a vector header and its heap block).
        let mut starts: Vec<u32> = Vec::with_capacity(self.original.len() + 1);
        let mut flat: Vec<u32> = Vec::new();
        for record in &self.original {
            starts.push(flat.len() as u32);
            flat.extend_from_slice(record);
        }
        starts.push(flat.len() as u32);
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
        let mut sample = Sample::default();
        loop {
            stats.rounds += 1;
            // (1) The sample, grouped by knowledge set: (Q, its distinct targets), level by level.
            sample.clear();
            for (level_index, users) in users_by_level.iter().enumerate() {
                let level = level_index + 1;
                let first = sample.draws.len();
                for _ in 0..samples_per_level {
                    let user = users[self.rng.random_range(0..users.len())];
                    let record =
                        &flat[starts[user as usize] as usize..starts[user as usize + 1] as usize];
                    let picked = rand::seq::index::sample(&mut self.rng, record.len(), level);
                    let start = sample.items.len();
                    sample.items.extend(picked.iter().map(|at| record[at]));
                    sample.items[start..].sort_unstable();
                    sample.draws.push(Draw {
                        start: start as u32,
                        len: level as u32,
                        user,
                    });
                }
                sample.group_level(first);
            }
            // (2) R_S, read-only.
            let verdicts = check_all(self, &sample, &cache, &mut scratches);
            let mut violating: Vec<bool> = Vec::with_capacity(sample.groups.len());
            for (group, verdict) in sample.groups.iter().zip(verdicts) {
                violating.push(verdict.violated);
                if let Some(entry) = verdict.entry {
                    let q = sample.knowledge(group);
                    if let Some(slot) = cache.get_mut(q) {
                        *slot = entry;
                    } else if cache.len() < MAX_CACHE_ENTRIES {
                        cache.insert(q.into(), entry);
                    }
                }
            }
            if !violating.iter().any(|&v| v) {
                stats.final_adversaries = sample
                    .draws
                    .iter()
                    .map(|draw| DenseAdversary {
                        user: draw.user,
                        knowledge: sample.items[draw.range()].to_vec(),
                    })
                    .collect();
                return stats;
            }
            // (3) Fix them in sample order.
            for (group, _) in sample.groups.iter().zip(&violating).filter(|(_, v)| **v) {
                let users = &sample.users[group.users.0 as usize..group.users.1 as usize];
                stats.violations += self.fix_antecedent(
                    sample.knowledge(group),
                    &mut Targets::Sampled(users),
                    &[],
                    None,
                );
            }
        }
    }
}

/// One sampled adversary of a round: its knowledge at `start..start + len` of [`Sample::items`].
struct Draw {
    start: u32,
    len: u32,
    user: u32,
}

impl Draw {
    fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A distinct knowledge set of a round (that of draw `draw`) and its distinct targets
/// `users.0..users.1` of [`Sample::users`].
struct Group {
    draw: u32,
    users: (u32, u32),
}

/// One round's sample in flat buffers reused from round to round (a round draws thousands of
/// adversaries): the knowledge sets in draw order, and their groups.
#[derive(Default)]
struct Sample {
    items: Vec<u32>,
    draws: Vec<Draw>,
    /// Draw indices of one level, sorted by (knowledge, user).
    order: Vec<u32>,
    groups: Vec<Group>,
    users: Vec<u32>,
}

impl Sample {
    fn clear(&mut self) {
        self.items.clear();
        self.draws.clear();
        self.groups.clear();
        self.users.clear();
    }

    fn knowledge(&self, group: &Group) -> &[u32] {
        &self.items[self.draws[group.draw as usize].range()]
    }

    /// Groups the draws from `first` on (one level) by knowledge set, in ascending order of it,
    /// each with its distinct targets in ascending order.
    fn group_level(&mut self, first: usize) {
        let Sample {
            items,
            draws,
            order,
            groups,
            users,
        } = self;
        order.clear();
        order.extend(first as u32..draws.len() as u32);
        let key = |at: &u32| {
            let draw = &draws[*at as usize];
            (&items[draw.range()], draw.user)
        };
        order.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
        for &at in order.iter() {
            let draw = &draws[at as usize];
            let knowledge = &items[draw.range()];
            match groups.last_mut() {
                Some(group) if &items[draws[group.draw as usize].range()] == knowledge => {
                    if users.last() != Some(&draw.user) {
                        users.push(draw.user);
                        group.users.1 += 1;
                    }
                }
                _ => {
                    users.push(draw.user);
                    groups.push(Group {
                        draw: at,
                        users: (users.len() as u32 - 1, users.len() as u32),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::super::suppressor::Window;

    /// A seeded window of `records` records over 40 items, some long; item i is sensitive for a
    /// user with probability 0.5 when i < 8, else 0.02.
    fn window(records: usize, seed: u64) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut original = Vec::new();
        let mut sensitive = Vec::new();
        for _ in 0..records {
            let len = if rng.random_bool(0.2) {
                rng.random_range(6..20)
            } else {
                rng.random_range(1..6)
            };
            let mut items: Vec<u32> = rand::seq::index::sample(&mut rng, 40, len)
                .iter()
                .map(|i| i as u32)
                .collect();
            items.sort_unstable();
            original.push(items);
            sensitive.push(
                (0..40u32)
                    .filter(|&i| rng.random_bool(if i < 8 { 0.5 } else { 0.02 }))
                    .collect(),
            );
        }
        (original, sensitive)
    }

    #[test]
    fn release_does_not_depend_on_the_thread_count() {
        let (original, sensitive) = window(3000, 11);
        let run = |threads: usize| {
            let mut w = Window::new(original.clone(), sensitive.clone(), 40, 0.5, 7);
            let stats = w.suppress_sampled(5, 200, threads);
            (w.released, stats.rounds, stats.violations)
        };
        let one = run(1);
        assert!(one.2 > 0, "the window needs suppression");
        assert_eq!(run(2), one);
        assert_eq!(run(3), one);
    }

    /// The restore pass judges candidates on several threads speculatively; what it puts back must
    /// be what the one-at-a-time pass puts back.
    #[test]
    fn restore_does_not_depend_on_the_thread_count() {
        let (original, sensitive) = window(1000, 12);
        for sampled in [false, true] {
            let run = |threads: usize| {
                let mut w = Window::new(original.clone(), sensitive.clone(), 40, 0.3, 7);
                if sampled {
                    w.suppress_sampled(2, 200, 1);
                } else {
                    w.suppress_exact(2);
                }
                let restored = w.restore(2, threads);
                (w.released, restored)
            };
            let one = run(1);
            assert!(
                one.1 > 0,
                "the pass puts something back (sampled: {sampled})"
            );
            assert_eq!(run(2), one);
            assert_eq!(run(3), one);
        }
    }
}
