//! Distances between two distributions of one sensitive attribute: P (an equivalence class, or a
//! population estimate) and Q (the whole table). This is the one place these are defined
//! (docs/architecture.md#definitions).
//!
//! - Earth mover's distance (Li, Li & Venkatasubramanian, t-closeness): with the *equal* ground distance
//!   (every two values at distance 1, for categorical attributes) it is the total variation distance
//!   1/2 Σ |p_i − q_i|; with the *ordered* distance (values sorted, ground distance |i − j| / (m − 1), for
//!   numeric attributes) it is 1/(m − 1) Σ_i |Σ_{j<=i} (p_j − q_j)|.
//! - Jensen-Shannon divergence JS(P, Q) = 1/2 [KL(P, M) + KL(Q, M)], M = (P + Q)/2, natural logarithm, so
//!   0 <= JS <= ln 2 (Li & Li, KDD'09).
//!
//! Invariants: both slices have the same length and each sums to 1 (callers pass probabilities over the
//! same sorted domain); every distance is symmetric, 0 on equal inputs and never negative.

/// Total variation distance 1/2 Σ |p_i − q_i|: the EMD under the equal ground distance.
pub fn emd_equal(p: &[f64], q: &[f64]) -> f64 {
    debug_assert_eq!(p.len(), q.len());
    0.5 * p.iter().zip(q).map(|(a, b)| (a - b).abs()).sum::<f64>()
}

/// EMD under the ordered ground distance |i − j| / (m − 1) over a domain sorted ascending.
pub fn emd_ordered(p: &[f64], q: &[f64]) -> f64 {
    debug_assert_eq!(p.len(), q.len());
    let m = p.len();
    if m <= 1 {
        return 0.0;
    }
    let mut carried = 0.0;
    let mut work = 0.0;
    for (a, b) in p.iter().zip(q) {
        carried += a - b;
        work += f64::abs(carried);
    }
    work / (m - 1) as f64
}

/// Kullback-Leibler divergence KL(P, Q) = Σ p_i ln(p_i / q_i), natural log; terms with p_i = 0 are 0,
/// and it is +∞ when some p_i > 0 has q_i = 0.
pub fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    debug_assert_eq!(p.len(), q.len());
    let mut sum = 0.0;
    for (&a, &b) in p.iter().zip(q) {
        if a > 0.0 {
            if b <= 0.0 {
                return f64::INFINITY;
            }
            sum += a * (a / b).ln();
        }
    }
    sum.max(0.0)
}

/// Jensen-Shannon divergence with the natural logarithm: 1/2 [KL(P, M) + KL(Q, M)], M = (P + Q)/2.
pub fn js_divergence(p: &[f64], q: &[f64]) -> f64 {
    debug_assert_eq!(p.len(), q.len());
    let mut sum = 0.0;
    for (&a, &b) in p.iter().zip(q) {
        let m = 0.5 * (a + b);
        if a > 0.0 {
            sum += a * (a / m).ln();
        }
        if b > 0.0 {
            sum += b * (b / m).ln();
        }
    }
    (0.5 * sum).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_distributions_are_at_distance_zero() {
        let p = [0.2, 0.3, 0.5];
        assert_eq!(emd_equal(&p, &p), 0.0);
        assert_eq!(emd_ordered(&p, &p), 0.0);
        assert!(js_divergence(&p, &p).abs() < 1e-15);
    }

    #[test]
    fn disjoint_supports_reach_the_maxima() {
        let p = [1.0, 0.0];
        let q = [0.0, 1.0];
        assert!((emd_equal(&p, &q) - 1.0).abs() < 1e-12);
        assert!((emd_ordered(&p, &q) - 1.0).abs() < 1e-12);
        assert!((js_divergence(&p, &q) - std::f64::consts::LN_2).abs() < 1e-12);
        assert_eq!(kl_divergence(&p, &q), f64::INFINITY);
    }

    #[test]
    fn ordered_emd_matches_the_t_closeness_paper_example() {
        // Li, Li & Venkatasubramanian: salaries {3k..11k}, P1 = {3k,4k,5k}, Q uniform over 9 values:
        // D[P1, Q] = 0.375.
        let q = [1.0 / 9.0; 9];
        let mut p = [0.0; 9];
        p[..3].fill(1.0 / 3.0);
        assert!((emd_ordered(&p, &q) - 0.375).abs() < 1e-12);
    }
}
