//! Sensitive constraints of the paper's "personalized+" setting (Nakagawa et al. 2018, §6.1):
//! a share of the items "tend to be sensitive"; each user marks each of those as sensitive with
//! probability 0.99 and every other item with probability 0.01, independently.
//!
//! Invariants: each returned E_u is sorted and duplicate-free and drawn from `universe`; the result
//! depends only on the inputs and the RNG. Draws are made with geometric skips, so the cost is
//! proportional to the output size, not to records × items.
use rand::Rng;

use super::ItemId;

/// Parameters of the personalized+ generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PersonalizedPlus {
    /// Fraction of the item universe that tends to be sensitive, in [0, 1].
    pub sensitive_share: f64,
    /// Probability that a user marks an item that tends to be sensitive (paper: 0.99).
    pub tendency_probability: f64,
    /// Probability that a user marks any other item (paper: 0.01).
    pub noise_probability: f64,
}

impl PersonalizedPlus {
    /// The paper's setting with the given share.
    pub fn paper(sensitive_share: f64) -> Self {
        PersonalizedPlus {
            sensitive_share,
            tendency_probability: 0.99,
            noise_probability: 0.01,
        }
    }

    /// Items of `universe` (sorted, distinct) that tend to be sensitive: round(share · |universe|)
    /// of them, uniformly at random, returned sorted.
    pub fn tending_items(&self, universe: &[ItemId], rng: &mut impl Rng) -> Vec<ItemId> {
        let share = self.sensitive_share.clamp(0.0, 1.0);
        let count = ((universe.len() as f64) * share).round() as usize;
        let mut chosen: Vec<ItemId> = rand::seq::index::sample(rng, universe.len(), count)
            .iter()
            .map(|at| universe[at])
            .collect();
        chosen.sort_unstable();
        chosen
    }

    /// E_u for `records` users over `universe` (sorted, distinct).
    pub fn generate(
        &self,
        universe: &[ItemId],
        records: usize,
        rng: &mut impl Rng,
    ) -> Vec<Vec<ItemId>> {
        let tending = self.tending_items(universe, rng);
        let others: Vec<ItemId> = universe
            .iter()
            .copied()
            .filter(|i| tending.binary_search(i).is_err())
            .collect();
        (0..records)
            .map(|_| {
                let mut marked = Vec::new();
                // Tending items: keep all but those skipped with probability 1 - tendency.
                let mut dropped =
                    geometric_positions(tending.len(), 1.0 - self.tendency_probability, rng)
                        .into_iter()
                        .peekable();
                for (at, &item) in tending.iter().enumerate() {
                    if dropped.peek() == Some(&at) {
                        dropped.next();
                    } else {
                        marked.push(item);
                    }
                }
                marked.extend(
                    geometric_positions(others.len(), self.noise_probability, rng)
                        .into_iter()
                        .map(|at| others[at]),
                );
                marked.sort_unstable();
                marked
            })
            .collect()
    }
}

/// Positions in 0..len each selected independently with probability p, ascending, drawn by
/// geometric skips.
fn geometric_positions(len: usize, p: f64, rng: &mut impl Rng) -> Vec<usize> {
    if p <= 0.0 || len == 0 {
        return Vec::new();
    }
    if p >= 1.0 {
        return (0..len).collect();
    }
    let log_q = (1.0 - p).ln();
    let mut positions = Vec::new();
    let mut at = 0usize;
    loop {
        // Number of failures before the next success: floor(ln(U) / ln(1 - p)), U in (0, 1].
        let u: f64 = 1.0 - rng.random::<f64>();
        let skip = (u.ln() / log_q).floor();
        if !skip.is_finite() || skip >= (len - at) as f64 {
            return positions;
        }
        at += skip as usize;
        positions.push(at);
        at += 1;
        if at >= len {
            return positions;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn marks_tending_items_mostly_and_others_rarely() {
        let universe: Vec<ItemId> = (0..1000).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let generator = PersonalizedPlus::paper(0.4);
        let constraints = generator.generate(&universe, 200, &mut rng);
        let total: usize = constraints.iter().map(Vec::len).sum();
        // Expected per user: 400 · 0.99 + 600 · 0.01 = 402.
        let mean = total as f64 / 200.0;
        assert!((mean - 402.0).abs() < 5.0, "mean {mean}");
        assert!(
            constraints
                .iter()
                .all(|e| e.windows(2).all(|w| w[0] < w[1]))
        );
        let mut again = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        assert_eq!(generator.generate(&universe, 200, &mut again), constraints);
    }
}
