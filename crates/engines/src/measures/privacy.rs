//! Privacy measures of a release over its equivalence classes (docs/architecture.md#definitions), with
//! Q the release's
//! whole sensitive distribution (the adversary's prior, available even from the trivial release):
//!
//! - Ploss (Li & Li, KDD'09): max over tuples t of JS(Q, P(class of t)), natural log, in [0, ln 2].
//!   Every tuple of a class has the same P, so the max over classes is the max over tuples.
//! - A_know (Brickell & Shmatikov, KDD'08): (1/|T|) Σ_classes |class| · 1/2 Σ_s |p(T,s) − p(class,s)|,
//!   in [0, 1).
//! - A_acc: (1/|T|) Σ_classes |class| · max_s p(class,s) − max_s p(T,s), in [0, 1).
//!
//! Invariants: all three are 0 for the trivial release (one class), and computed from class
//! histograms only (no access to the original rows).
use crate::relational::distance::{emd_equal, js_divergence};

/// Probabilities of a histogram.
pub fn probabilities(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    let n = total.max(1) as f64;
    counts.iter().map(|&c| c as f64 / n).collect()
}

/// Privacy of a release's classes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrivacyLoss {
    pub ploss: f64,
    pub a_know: f64,
    pub a_acc: f64,
}

/// Ploss, A_know and A_acc of classes given as `m` sensitive counts each (`histograms.len()` a
/// multiple of `m`); Q is their sum.
pub fn privacy_loss(histograms: &[u64], m: usize) -> PrivacyLoss {
    let mut totals = vec![0u64; m];
    for (i, &c) in histograms.iter().enumerate() {
        totals[i % m] += c;
    }
    let q = probabilities(&totals);
    let n: u64 = totals.iter().sum();
    let mut ploss: f64 = 0.0;
    let mut know = 0.0;
    let mut acc = 0.0;
    for class in histograms.chunks_exact(m.max(1)) {
        let size: u64 = class.iter().sum();
        if size == 0 {
            continue;
        }
        let p = probabilities(class);
        ploss = ploss.max(js_divergence(&q, &p));
        know += size as f64 * emd_equal(&q, &p);
        acc += *class.iter().max().unwrap_or(&0) as f64;
    }
    let n = n.max(1) as f64;
    let q_max = q.iter().copied().fold(0.0, f64::max);
    PrivacyLoss {
        ploss,
        a_know: know / n,
        a_acc: (acc / n - q_max).max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::LN_2;

    #[test]
    fn trivial_release_loses_nothing() {
        let loss = privacy_loss(&[3, 1, 6], 3);
        assert_eq!(loss.ploss, 0.0);
        assert_eq!(loss.a_know, 0.0);
        assert_eq!(loss.a_acc, 0.0);
    }

    #[test]
    fn hand_computed_two_classes() {
        // Classes {a,a} and {b,b}: Q = (1/2, 1/2); each class is a point mass.
        // JS(Q, (1,0)) = 1/2 [ 1/2 ln(1/2 / 3/4) + 1/2 ln(1/2 / 1/4) + 1 ln(1 / 3/4) ]
        let js = 0.5 * (0.5 * (0.5f64 / 0.75).ln() + 0.5 * 2f64.ln() + (1.0f64 / 0.75).ln());
        let loss = privacy_loss(&[2, 0, 0, 2], 2);
        assert!((loss.ploss - js).abs() < 1e-12, "{}", loss.ploss);
        // A_know: each class at total variation 1/2 from Q.
        assert!((loss.a_know - 0.5).abs() < 1e-12);
        // A_acc: adversary always right (1) minus baseline 1/2.
        assert!((loss.a_acc - 0.5).abs() < 1e-12);
    }

    #[test]
    fn revealing_a_value_costs_between_the_adult_bounds() {
        // Li & Li: revealing "Armed-Forces" (14 of 45,222) costs ~0.692, "Craft-repair" (6020) ~0.488.
        let counts = [
            1420u64, 6020, 4808, 5408, 5984, 6008, 2046, 2970, 5540, 1480, 2316, 232, 976, 14,
        ];
        let q = probabilities(&counts);
        let reveal = |s: usize| {
            let mut p = vec![0.0; counts.len()];
            p[s] = 1.0;
            js_divergence(&q, &p)
        };
        assert!((reveal(13) - 0.692).abs() < 0.001, "{}", reveal(13));
        assert!((reveal(1) - 0.488).abs() < 0.002, "{}", reveal(1));
        assert!(reveal(13) < LN_2);
    }
}
