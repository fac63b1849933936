//! The special functions and the solver the population models need: ln Γ (Lanczos), digamma and
//! trigamma (recurrence up to x ≥ 12, then their asymptotic series), and a two-dimensional
//! Newton-Raphson search over a list of start points.
//!
//! Invariants: every function is total: an argument outside its domain (x ≤ 0 for the gamma
//! family) gives NaN, never a panic; the solver gives `None` when no start converges within its
//! iteration budget, and never returns a non-finite point.

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, 9 terms; relative error about 1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return f64::NAN;
    }
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(π x).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, c) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The digamma function ψ(x) = d/dx ln Γ(x), for x > 0.
pub fn digamma(mut x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return f64::NAN;
    }
    let mut result = 0.0;
    while x < 12.0 {
        result -= 1.0 / x;
        x += 1.0;
    }
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    // ln x - 1/(2x) - Σ B_2k / (2k x^2k)
    let series = inv2
        * (1.0 / 12.0
            - inv2
                * (1.0 / 120.0
                    - inv2
                        * (1.0 / 252.0
                            - inv2
                                * (1.0 / 240.0 - inv2 * (1.0 / 132.0 - inv2 * 691.0 / 32760.0)))));
    result + x.ln() - 0.5 * inv - series
}

/// The trigamma function ψ₁(x) = d²/dx² ln Γ(x), for x > 0.
pub fn trigamma(mut x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return f64::NAN;
    }
    let mut result = 0.0;
    while x < 12.0 {
        result += 1.0 / (x * x);
        x += 1.0;
    }
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    // 1/x + 1/(2x²) + Σ B_2k / x^(2k+1)
    let series = inv
        + inv2 / 2.0
        + inv
            * inv2
            * (1.0 / 6.0
                - inv2
                    * (1.0 / 30.0 - inv2 * (1.0 / 42.0 - inv2 * (1.0 / 30.0 - inv2 * 5.0 / 66.0))));
    result + series
}

/// A point of the plane and the two equations' values and Jacobian there.
pub struct Evaluation {
    pub value: [f64; 2],
    /// Row i holds ∂f_i/∂x, ∂f_i/∂y.
    pub jacobian: [[f64; 2]; 2],
}

/// Settings of [`newton_2d`] (ARX's defaults: accuracy 1e-6, 1,000 iterations per start).
#[derive(Debug, Clone, Copy)]
pub struct Solver {
    /// Converged when both |f_1| and |f_2| are at most this.
    pub accuracy: f64,
    pub iterations_per_start: usize,
}

impl Default for Solver {
    fn default() -> Solver {
        Solver {
            accuracy: 1e-6,
            iterations_per_start: 1000,
        }
    }
}

/// ARX's prepared start points: the grid {0, 0.33, 0.66, 0.99}², tried after the model's own start.
pub fn grid_starts() -> Vec<(f64, f64)> {
    let steps = [0.0, 0.33, 0.66, 0.99];
    steps
        .iter()
        .flat_map(|&x| steps.iter().map(move |&y| (x, y)))
        .collect()
}

/// Solves f(x, y) = 0 by Newton-Raphson from each start in turn; a step that leaves the region
/// `admissible` or turns non-finite abandons that start. The first converged point wins.
pub fn newton_2d(
    solver: Solver,
    starts: &[(f64, f64)],
    mut evaluate: impl FnMut(f64, f64) -> Evaluation,
    admissible: impl Fn(f64, f64) -> bool,
) -> Option<(f64, f64)> {
    for &(mut x, mut y) in starts {
        for _ in 0..=solver.iterations_per_start {
            let e = evaluate(x, y);
            let [f1, f2] = e.value;
            if f1.abs() <= solver.accuracy && f2.abs() <= solver.accuracy {
                return (x.is_finite() && y.is_finite()).then_some((x, y));
            }
            let [[a, b], [c, d]] = e.jacobian;
            let det = a * d - b * c;
            // Solve J δ = f by the inverse of the 2×2 Jacobian.
            let dx = (d * f1 - b * f2) / det;
            let dy = (-c * f1 + a * f2) / det;
            x -= dx;
            y -= dy;
            if !x.is_finite() || !y.is_finite() || !admissible(x, y) {
                break;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials_and_half_integers() {
        // Γ(n) = (n-1)!
        let mut factorial = 1.0f64;
        for n in 1..30 {
            assert!((ln_gamma(n as f64) - factorial.ln()).abs() < 1e-12 * factorial.ln().max(1.0));
            factorial *= n as f64;
        }
        // Γ(1/2) = √π
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
        assert!(ln_gamma(0.0).is_nan() && ln_gamma(-1.0).is_nan());
    }

    #[test]
    fn digamma_and_trigamma_match_known_values() {
        let euler = 0.577_215_664_901_532_9;
        assert!((digamma(1.0) + euler).abs() < 1e-13);
        assert!((digamma(0.5) + euler + 2.0 * 2f64.ln()).abs() < 1e-13);
        let pi2 = std::f64::consts::PI * std::f64::consts::PI;
        assert!((trigamma(1.0) - pi2 / 6.0).abs() < 1e-13);
        assert!((trigamma(0.5) - pi2 / 2.0).abs() < 1e-12);
        // Recurrences at a large argument.
        let x = 12_345.678;
        assert!((digamma(x + 1.0) - digamma(x) - 1.0 / x).abs() < 1e-13);
        assert!((trigamma(x) - trigamma(x + 1.0) - 1.0 / (x * x)).abs() < 1e-17);
    }

    #[test]
    fn newton_finds_a_root_and_gives_up_without_one() {
        // x² + y² = 2, x = y → (1, 1) from (2, 0.5).
        let f = |x: f64, y: f64| Evaluation {
            value: [x * x + y * y - 2.0, x - y],
            jacobian: [[2.0 * x, 2.0 * y], [1.0, -1.0]],
        };
        let (x, y) = newton_2d(Solver::default(), &[(2.0, 0.5)], f, |_, _| true).unwrap();
        assert!((x - 1.0).abs() < 1e-6 && (y - 1.0).abs() < 1e-6);
        // x² + 1 = 0 has no real root.
        let g = |x: f64, y: f64| Evaluation {
            value: [x * x + 1.0, y],
            jacobian: [[2.0 * x, 0.0], [0.0, 1.0]],
        };
        assert!(newton_2d(Solver::default(), &grid_starts(), g, |_, _| true).is_none());
    }
}
