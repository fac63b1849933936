//! Population uniqueness: how many records of the population the sample was drawn from are unique
//! on the quasi-identifiers, estimated from the sample's class-size histogram by the models ARX
//! implements (`org.deidentifier.arx.risk`): Zayatz (1991), Pitman (Hoshino 2001), the
//! slide negative binomial (SNB, Chen & Keller-McNulty 1998) and Dankar et al.'s (2012) rule that
//! chooses among them, over a sample's class-size [`Histogram`]. They live in the relational engine
//! so that OLA and Mondrian can bound a release's population uniqueness
//! ([`crate::relational::models::RiskBounds`]); the risk engine re-exports them
//! (`crate::risk::population`). Formulas, sources and edge cases: docs/risk.md.
//!
//! Invariants: a model that cannot give a number (its solver does not converge, its estimate is
//! NaN, zero, negative or larger than the population) is [`Estimate::Unavailable`] with the reason,
//! never a number; a sample without uniques has 0 population uniques under every model (ARX's
//! rule). The population size is at least the sample size (checked by the caller,
//! `crate::risk::profile` says why instead). No allocation depends on the population.
use serde::Serialize;

use crate::relational::special::{
    Evaluation, Solver, digamma, grid_starts, ln_gamma, newton_2d, trigamma,
};

/// The class-size histogram of a sample: (class size, number of classes), by ascending size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    entries: Vec<(u64, u64)>,
    records: u64,
    classes: u64,
}

impl Histogram {
    /// The histogram of classes of the given sizes (zero sizes are ignored).
    pub fn from_sizes(sizes: impl IntoIterator<Item = u64>) -> Histogram {
        let mut sizes: Vec<u64> = sizes.into_iter().filter(|&s| s > 0).collect();
        sizes.sort_unstable();
        let mut h = Histogram::default();
        for s in sizes {
            match h.entries.last_mut() {
                Some((size, count)) if *size == s => *count += 1,
                _ => h.entries.push((s, 1)),
            }
            h.records += s;
            h.classes += 1;
        }
        h
    }

    pub fn entries(&self) -> &[(u64, u64)] {
        &self.entries
    }
    pub fn records(&self) -> u64 {
        self.records
    }
    pub fn classes(&self) -> u64 {
        self.classes
    }
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
    pub fn classes_of_size(&self, size: u64) -> u64 {
        self.entries.iter().find(|e| e.0 == size).map_or(0, |e| e.1)
    }
    pub fn smallest(&self) -> u64 {
        self.entries.first().map_or(0, |e| e.0)
    }
    pub fn largest(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.0)
    }
}

/// One model's estimate, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Estimate {
    /// `uniques`: the estimated number of population uniques; `share`: uniques / population size
    /// (ARX's `getFractionOfUniqueTuples*`).
    Estimated {
        uniques: f64,
        share: f64,
    },
    Unavailable {
        unavailable: String,
    },
}

impl Estimate {
    fn unavailable(reason: &str) -> Estimate {
        Estimate::Unavailable {
            unavailable: reason.to_string(),
        }
    }

    pub fn uniques(&self) -> Option<f64> {
        match self {
            Estimate::Estimated { uniques, .. } => Some(*uniques),
            Estimate::Unavailable { .. } => None,
        }
    }
}

/// Dankar et al.'s choice and its estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dankar {
    #[serde(flatten)]
    pub estimate: Estimate,
    /// The model the rule chose (`pitman`, `zayatz`, `snb`), or `none` without sample uniques.
    pub model: &'static str,
}

/// The population uniqueness of one sample under every model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PopulationUniqueness {
    pub population_size: f64,
    pub sampling_fraction: f64,
    pub pitman: Estimate,
    pub zayatz: Estimate,
    pub snb: Estimate,
    pub dankar: Dankar,
}

/// Every model on `histogram` for a population of `population` records (≥ the sample's records,
/// and the histogram is not empty: both checked by the caller).
pub fn population_uniqueness(histogram: &Histogram, population: f64) -> PopulationUniqueness {
    let n = histogram.records() as f64;
    let f = n / population;
    let share = |uniques: f64| Estimate::Estimated {
        uniques,
        share: uniques / population,
    };
    if histogram.classes_of_size(1) == 0 {
        return PopulationUniqueness {
            population_size: population,
            sampling_fraction: f,
            pitman: share(0.0),
            zayatz: share(0.0),
            snb: share(0.0),
            dankar: Dankar {
                estimate: share(0.0),
                model: "none",
            },
        };
    }
    let checked = |value: Option<f64>, reason: &str| match value {
        Some(v) if v.is_finite() && v > 0.0 && v <= population => share(v),
        Some(_) => {
            Estimate::unavailable("the estimate is not a count between 0 and the population size")
        }
        None => Estimate::unavailable(reason),
    };
    let not_converged = "the maximum-likelihood equations did not converge";
    let zayatz = checked(
        zayatz(histogram, population),
        "undefined for this histogram",
    );
    let pitman = checked(pitman(histogram, population), not_converged);
    let snb = checked(snb(histogram, f), not_converged);
    let dankar = if f <= 0.1 {
        match (&pitman, &zayatz) {
            (Estimate::Estimated { .. }, _) => Dankar {
                estimate: pitman.clone(),
                model: "pitman",
            },
            _ => Dankar {
                estimate: zayatz.clone(),
                model: "zayatz",
            },
        }
    } else {
        match (snb.uniques(), zayatz.uniques()) {
            (Some(s), Some(z)) if z < s => Dankar {
                estimate: zayatz.clone(),
                model: "zayatz",
            },
            (Some(_), _) => Dankar {
                estimate: snb.clone(),
                model: "snb",
            },
            (None, _) => Dankar {
                estimate: zayatz.clone(),
                model: "zayatz",
            },
        }
    };
    PopulationUniqueness {
        population_size: population,
        sampling_fraction: f,
        pitman,
        zayatz,
        snb,
        dankar,
    }
}

/// ln P(X = 1) for X hypergeometric: a sample of `n` drawn without replacement from `population`
/// records of which `size` share the key. P = size·n/N · Π_{j=1}^{size-1} (1 - (n-1)/(N-j)).
fn ln_hypergeometric_one(population: f64, size: u64, n: f64) -> f64 {
    let mut ln = (size as f64).ln() + n.ln() - population.ln();
    for j in 1..size {
        let ratio = (n - 1.0) / (population - j as f64);
        if ratio >= 1.0 {
            return f64::NEG_INFINITY;
        }
        ln += (-ratio).ln_1p();
    }
    ln
}

/// Zayatz: the share of sample uniques that are population uniques, P(unique in population |
/// unique in sample) = (c₁/u · P₁) / Σ_k (c_k/u · P_k), P_k = P(X = 1) for a population class of
/// size k (hypergeometric); the estimate is c₁ · that share / f. ARX caps the population at
/// 2³¹ - 1 in the hypergeometric distribution; so does this (docs/risk.md).
fn zayatz(histogram: &Histogram, population: f64) -> Option<f64> {
    let n = histogram.records() as f64;
    let capped = population.min(i32::MAX as f64).floor();
    let u = histogram.classes() as f64;
    let c1 = histogram.classes_of_size(1) as f64;
    let mut denominator = 0.0;
    for &(size, count) in histogram.entries() {
        let p = ln_hypergeometric_one(capped, size, n).exp();
        denominator += count as f64 / u * p;
    }
    let p1 = ln_hypergeometric_one(capped, 1, n).exp();
    let conditional = (c1 / u * p1) / denominator;
    let estimate = c1 * conditional / (n / population);
    estimate.is_finite().then_some(estimate)
}

/// Pitman's (Hoshino 2001) two-parameter (θ, α) Poisson-Dirichlet model fitted to the sample by
/// maximum likelihood; the number of population uniques is Γ(θ+1)/Γ(θ+α) · N^α.
fn pitman(histogram: &Histogram, population: f64) -> Option<f64> {
    let n = histogram.records() as f64;
    let u = histogram.classes() as f64;
    let c1 = histogram.classes_of_size(1) as f64;
    let c2 = match histogram.classes_of_size(2) {
        0 => 1.0,
        c => c as f64,
    };
    // Hoshino's moment start, as ARX starts.
    let c = c1 * (c1 - 1.0) / c2;
    let theta0 = (n * u * c - c1 * (n - 1.0) * (2.0 * u + c)) / (2.0 * c1 * u + c1 * c - n * c);
    let alpha0 = (theta0 * (c1 - n) + (n - 1.0) * c1) / (n * u);
    let mut starts = vec![(theta0, alpha0)];
    starts.extend(grid_starts());
    let larger: Vec<(f64, f64)> = histogram
        .entries()
        .iter()
        .filter(|(size, _)| *size != 1)
        .map(|&(size, count)| (size as f64, count as f64))
        .collect();
    let evaluate = |t: f64, a: f64| {
        // Σ_{i=1}^{u-1} 1/(θ+iα), Σ 1/(θ+iα)² in closed form through ψ and ψ₁ at θ/α.
        let r = t / a;
        let s1 = (digamma(r + u) - digamma(r + 1.0)) / a;
        let s2 = (trigamma(r + 1.0) - trigamma(r + u)) / (a * a);
        let si = ((u - 1.0) - t * s1) / a; // Σ i/(θ+iα)
        let si2 = (s1 - t * s2) / a; // Σ i/(θ+iα)²
        let sii2 = ((u - 1.0) - 2.0 * t * s1 + t * t * s2) / (a * a); // Σ i²/(θ+iα)²
        let n1 = digamma(n + t) - digamma(t + 1.0); // Σ_{i=1}^{n-1} 1/(θ+i)
        let n2 = trigamma(t + 1.0) - trigamma(n + t); // Σ 1/(θ+i)²
        let (mut k1, mut k2) = (0.0, 0.0);
        let (d0, t0) = (digamma(1.0 - a), trigamma(1.0 - a));
        for &(size, count) in &larger {
            k1 += count * (digamma(size - a) - d0); // Σ_j 1/(j-α)
            k2 += count * (t0 - trigamma(size - a)); // Σ_j 1/(j-α)²
        }
        Evaluation {
            value: [s1 - n1, si - k1],
            jacobian: [[n2 - s2, -si2], [-si2, -sii2 - k2]],
        }
    };
    let (t, a) = newton_2d(Solver::default(), &starts, evaluate, |t, _| t >= 0.0)?;
    if a == 0.0 {
        return None;
    }
    Some((ln_gamma(t + 1.0) - ln_gamma(t + a)).exp() * population.powf(a))
}

/// The slide negative binomial model: the number of non-empty population classes K estimated
/// from the histogram, then (α, β) solved from the expected numbers of sample classes of size 1
/// and 2; the estimate is K·β^α. The equations are ARX's (`ModelSNB`), see docs/risk.md.
fn snb(histogram: &Histogram, f: f64) -> Option<f64> {
    let u = histogram.classes() as f64;
    let c1 = histogram.classes_of_size(1) as f64;
    let c2 = histogram.classes_of_size(2) as f64;
    let (mut v1, mut v2, mut v3, mut v4) = (0.0, 0.0, 0.0, 0.0);
    for &(size, count) in histogram.entries() {
        let (i, c) = (size as f64, count as f64);
        let tail = (1.0 - f).powf(i) * c;
        v1 += i * f * f * (1.0 - f * f).powf(i - 1.0) * c;
        // As ARX: the 1 is subtracted once per histogram entry (docs/risk.md).
        v2 += tail * (1.0 + f).powf(i) - 1.0;
        v3 += tail;
        v4 += i * f * (1.0 - f).powf(i - 1.0) * c;
    }
    let k = u + c1 * (v1 / v2) * (v3 / v4) * (v3 / v4);
    let equations = |a: f64, b: f64| {
        let d = (1.0 - f) * (1.0 - b);
        [
            k * f * (b / (1.0 - d)).powf(a) * (a * d / (1.0 - d) + 1.0) - c1,
            k * a * b.powf(a) * f * f * (1.0 - b) / 2.0
                * (1.0 - d).powf(a + 2.0)
                * (2.0 - (1.0 - a) * d)
                - c2,
        ]
    };
    // Central differences for the Jacobian.
    let evaluate = |a: f64, b: f64| {
        let ha = 1e-7 * a.abs().max(1.0);
        let hb = 1e-7 * b.abs().max(1.0);
        let (pa, ma) = (equations(a + ha, b), equations(a - ha, b));
        let (pb, mb) = (equations(a, b + hb), equations(a, b - hb));
        Evaluation {
            value: equations(a, b),
            jacobian: [
                [(pa[0] - ma[0]) / (2.0 * ha), (pb[0] - mb[0]) / (2.0 * hb)],
                [(pa[1] - ma[1]) / (2.0 * ha), (pb[1] - mb[1]) / (2.0 * hb)],
            ],
        }
    };
    let mut starts = vec![(1.0, 1.0)];
    starts.extend(grid_starts());
    let (a, b) = newton_2d(Solver::default(), &starts, evaluate, |_, _| true)?;
    let estimate = k * b.powf(a);
    estimate.is_finite().then_some(estimate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(sizes: &[(u64, u64)]) -> Histogram {
        Histogram::from_sizes(
            sizes
                .iter()
                .flat_map(|&(s, c)| std::iter::repeat_n(s, c as usize)),
        )
    }

    #[test]
    fn hypergeometric_probability_of_one_matches_the_binomial_coefficients() {
        // N = 10, K = 3, n = 4: C(3,1) C(7,3) / C(10,4) = 3·35/210 = 0.5
        assert!((ln_hypergeometric_one(10.0, 3, 4.0).exp() - 0.5).abs() < 1e-15);
        // K = 1: n/N
        assert!((ln_hypergeometric_one(10.0, 1, 4.0).exp() - 0.4).abs() < 1e-15);
        // A full sample leaves no class of size ≥ 2 with exactly one sampled record.
        assert_eq!(ln_hypergeometric_one(4.0, 2, 4.0).exp(), 0.0);
    }

    #[test]
    fn zayatz_by_hand() {
        // 2 uniques and one class of 2 out of N = 10: u = 3, n = 4, f = 0.4.
        // P1 = 0.4, P2 = 2·4/10·(1 - 3/9) = 0.5333…; conditional = (2/3·0.4)/(2/3·0.4 + 1/3·0.5333…)
        let h = histogram(&[(1, 2), (2, 1)]);
        let p2 = 2.0 * 4.0 / 10.0 * (1.0 - 3.0 / 9.0);
        let conditional = (2.0 / 3.0 * 0.4) / (2.0 / 3.0 * 0.4 + 1.0 / 3.0 * p2);
        let expected = 2.0 * conditional / 0.4;
        let got = zayatz(&h, 10.0).unwrap();
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
    }

    #[test]
    fn no_sample_uniques_means_no_population_uniques() {
        let p = population_uniqueness(&histogram(&[(2, 3), (5, 1)]), 1000.0);
        for e in [&p.pitman, &p.zayatz, &p.snb, &p.dankar.estimate] {
            assert_eq!(e.uniques(), Some(0.0));
        }
        assert_eq!(p.dankar.model, "none");
    }

    #[test]
    fn pitman_solves_its_likelihood_equations() {
        // The estimate at the solution satisfies both score equations, checked against the sums
        // written out term by term.
        let h = histogram(&[(1, 40), (2, 10), (3, 5), (5, 2), (9, 1)]);
        let population = 5000.0;
        let got = pitman(&h, population).expect("converges");
        assert!(got > 0.0 && got < population);
        // Recover (θ, α) by solving again and check the iterative sums at the root.
        let uniques_for =
            |t: f64, a: f64| (ln_gamma(t + 1.0) - ln_gamma(t + a)).exp() * population.powf(a);
        // Brute-force scan for the root of the iterative equations near the solution.
        let score = |t: f64, a: f64| {
            let o1: f64 = (1..h.classes()).map(|i| 1.0 / (t + i as f64 * a)).sum();
            let o2: f64 = (1..h.records()).map(|i| 1.0 / (t + i as f64)).sum();
            let o3: f64 = (1..h.classes())
                .map(|i| i as f64 / (t + i as f64 * a))
                .sum();
            let o4: f64 = h
                .entries()
                .iter()
                .map(|&(s, c)| c as f64 * (1..s).map(|j| 1.0 / (j as f64 - a)).sum::<f64>())
                .sum();
            (o1 - o2, o3 - o4)
        };
        let (t, a) = newton_2d(
            Solver {
                accuracy: 1e-10,
                iterations_per_start: 1000,
            },
            &[(1.0, 0.5)],
            |t, a| {
                let h1 = 1e-6;
                let (f, g) = score(t, a);
                let (ft, gt) = score(t + h1, a);
                let (fa, ga) = score(t, a + h1);
                Evaluation {
                    value: [f, g],
                    jacobian: [
                        [(ft - f) / h1, (fa - f) / h1],
                        [(gt - g) / h1, (ga - g) / h1],
                    ],
                }
            },
            |t, _| t >= 0.0,
        )
        .expect("the iterative equations converge too");
        let reference = uniques_for(t, a);
        assert!(
            (got - reference).abs() / reference < 1e-4,
            "{got} vs {reference}"
        );
    }

    #[test]
    fn dankar_picks_pitman_for_small_fractions_and_the_smaller_of_snb_and_zayatz_otherwise() {
        let h = histogram(&[(1, 40), (2, 10), (3, 5), (5, 2), (9, 1)]);
        let small = population_uniqueness(&h, 10_000.0);
        assert!(small.sampling_fraction <= 0.1);
        if small.pitman.uniques().is_some() {
            assert_eq!(small.dankar.model, "pitman");
            assert_eq!(small.dankar.estimate, small.pitman);
        }
        let large = population_uniqueness(&h, 200.0);
        assert!(large.sampling_fraction > 0.1);
        match (large.snb.uniques(), large.zayatz.uniques()) {
            (Some(s), Some(z)) => {
                assert_eq!(large.dankar.estimate.uniques(), Some(s.min(z)))
            }
            _ => assert_eq!(large.dankar.model, "zayatz"),
        }
    }
}
