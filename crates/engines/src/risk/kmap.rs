//! k-map (Sweeney; El Emam & Dankar 2008): every released record stands for at least k records of
//! the population. Exact against a population table (the population records each class stands
//! for, [`crate::risk::matching`]); without one, El Emam & Dankar's D3 (Poisson, after Pannekoek
//! 1999) and D4 (zero-truncated Poisson) estimators turn k into a sample class size k' that a class
//! must reach, as ARX's `KMap` with `CellSizeEstimator.POISSON` / `ZERO_TRUNCATED_POISSON` does.
//!
//! Invariants: pure; k ≥ 1 and the significance level in [0, 1] are checked by the caller
//! ([`crate::risk::RiskOptions::validate`]); the searches for k' stop at min(k, records), so they end
//! for any k; formulas, their source and edge cases in docs/risk.md.
use serde::Serialize;

use crate::relational::special::ln_gamma;
use crate::risk::Histogram;

/// k-map's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KMapOptions {
    pub k: u64,
    /// The estimators' significance level α (ARX's `significanceLevel`).
    pub significance: f64,
}

/// k-map measured exactly against a population table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KMapExact {
    pub satisfied: bool,
    /// The fewest population records a class stands for.
    pub smallest_population_class: u64,
    /// Classes standing for fewer than k population records.
    pub classes_violating: u64,
    /// The share of the records in those classes.
    pub records_violating: f64,
}

/// k-map estimated from the sample's class sizes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KMapEstimate {
    /// The sample class size a class needs (ARX's `derivedK`).
    pub derived_k: u64,
    /// 1 − the (truncated) Poisson probability reached when the search stopped (ARX's
    /// `type1Error`; 0 when it stopped at k).
    pub type1_error: f64,
    pub satisfied: bool,
    /// Classes smaller than `derived_k`.
    pub classes_violating: u64,
    pub records_violating: f64,
    /// The estimated population size of the smallest class: max(f, λ̂/π), λ̂ the estimator's
    /// maximum-likelihood Poisson mean for the smallest class size f.
    pub smallest_estimated_population_class: f64,
}

/// ln P(X = c) for X ~ Poisson(λ).
fn ln_pmf(lambda: f64, c: u64) -> f64 {
    if lambda == 0.0 {
        return if c == 0 { 0.0 } else { f64::NEG_INFINITY };
    }
    c as f64 * lambda.ln() - lambda - ln_gamma(c as f64 + 1.0)
}

/// D3: the smallest counter c with P(X ≤ c) ≥ 1 − α for X ~ Poisson(π k) gives k' = c + 2 (ARX's
/// loop: it counts once more after the test); at most k and the number of records. Returns
/// (k', type I error).
pub fn derived_k_poisson(k: u64, lambda: f64, significance: f64, records: u64) -> (u64, f64) {
    let threshold = 1.0 - significance;
    let stop = k.min(records.max(1));
    let mut counter: u64 = 0;
    let mut cdf = 0.0;
    let mut value = 0.0;
    while value < threshold {
        cdf += ln_pmf(lambda, counter).exp();
        value = cdf.min(1.0);
        counter += 1;
        if counter >= stop {
            value = 1.0;
            break;
        }
    }
    ((counter + 1).min(records).min(k).max(1), 1.0 - value)
}

/// D4: the smallest c with P(1 ≤ X ≤ c) / P(X ≥ 1) ≥ 1 − α for X ~ Poisson(π k) gives k' = c + 1
/// (ARX's loop); at most k and the number of records.
pub fn derived_k_zero_truncated(
    k: u64,
    lambda: f64,
    significance: f64,
    records: u64,
) -> (u64, f64) {
    let threshold = 1.0 - significance;
    let stop = k.min(records.max(1));
    let positive = -(-lambda).exp_m1();
    let mut counter: u64 = 1;
    let mut value = 0.0;
    while value < threshold {
        value += if positive > 0.0 {
            ln_pmf(lambda, counter).exp() / positive
        } else {
            1.0
        };
        counter += 1;
        if counter >= stop {
            value = 1.0;
            break;
        }
    }
    (counter.min(records).min(k).max(1), 1.0 - value)
}

/// The maximum-likelihood mean of a zero-truncated Poisson count f: λ/(1 − e^{−λ}) = f (0 for f = 1).
pub fn zero_truncated_mean(f: u64) -> f64 {
    let f = f as f64;
    if f <= 1.0 {
        return 0.0;
    }
    // λ/(1 − e^{−λ}) increases from 1 (λ → 0) and lies in (λ, λ + 1]: bisect on [f − 1, f].
    let (mut lo, mut hi) = (f - 1.0, f);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        let mean = if mid > 0.0 {
            mid / -(-mid).exp_m1()
        } else {
            1.0
        };
        if mean < f {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// k-map estimated from the class sizes with the sampling fraction π = records / population.
pub fn estimate(
    histogram: &Histogram,
    options: KMapOptions,
    fraction: f64,
    zero_truncated: bool,
) -> KMapEstimate {
    let n = histogram.records();
    let lambda = fraction * options.k as f64;
    let (derived_k, type1_error) = if zero_truncated {
        derived_k_zero_truncated(options.k, lambda, options.significance, n)
    } else {
        derived_k_poisson(options.k, lambda, options.significance, n)
    };
    let (classes, records) = histogram
        .entries()
        .iter()
        .filter(|&&(size, _)| size < derived_k)
        .fold((0, 0), |(c, r), &(size, count)| {
            (c + count, r + size * count)
        });
    let f = histogram.smallest();
    let mean = if zero_truncated {
        zero_truncated_mean(f)
    } else {
        f as f64
    };
    KMapEstimate {
        derived_k,
        type1_error,
        satisfied: classes == 0,
        classes_violating: classes,
        records_violating: records as f64 / n as f64,
        smallest_estimated_population_class: (mean / fraction).max(f as f64),
    }
}

/// k-map against a population table: `pairs` holds, per class, its sample and population sizes.
pub fn exact(pairs: &[(u64, u64)], k: u64) -> KMapExact {
    let n: u64 = pairs.iter().map(|p| p.0).sum();
    let violating: Vec<&(u64, u64)> = pairs.iter().filter(|p| p.1 < k).collect();
    let records: u64 = violating.iter().map(|p| p.0).sum();
    KMapExact {
        satisfied: violating.is_empty(),
        smallest_population_class: pairs.iter().map(|p| p.1).min().unwrap_or(0),
        classes_violating: violating.len() as u64,
        records_violating: if n == 0 {
            0.0
        } else {
            records as f64 / n as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// P(X ≤ c) by the recurrence p(c) = p(c − 1) λ / c, for small λ only.
    fn naive_cdf(lambda: f64, c: u64) -> f64 {
        let mut p = (-lambda).exp();
        let mut sum = p;
        for i in 1..=c {
            p *= lambda / i as f64;
            sum += p;
        }
        sum
    }

    /// k' by scanning every candidate: D3 the first c whose CDF reaches 1 − α, plus 2; D4 the first
    /// c whose truncated CDF reaches it, plus 1; both at most k and n.
    fn naive_derived(k: u64, lambda: f64, alpha: f64, n: u64, truncated: bool) -> u64 {
        let start = u64::from(truncated);
        let found = (start..k + 2).find(|&c| {
            let p = if truncated {
                (naive_cdf(lambda, c) - (-lambda).exp()) / (1.0 - (-lambda).exp())
            } else {
                naive_cdf(lambda, c)
            };
            p >= 1.0 - alpha
        });
        let derived = match found {
            Some(c) if c + 1 + u64::from(!truncated) <= k => c + 1 + u64::from(!truncated),
            _ => k,
        };
        derived.min(n).min(k).max(1)
    }

    #[test]
    fn derived_k_by_hand() {
        // λ = 0.01 · 5 = 0.05: P(X = 0) = 0.951 < 0.99, P(X ≤ 1) = 0.9988 ≥ 0.99: c = 1, D3 k' = 3.
        assert_eq!(derived_k_poisson(5, 0.05, 0.01, 1000).0, 3);
        // D4: P(X = 1 | X ≥ 1) = 0.05 e^{-0.05} / (1 − e^{-0.05}) = 0.9750 < 0.99; with X = 2, 0.9996:
        // c = 2, k' = 3.
        assert_eq!(derived_k_zero_truncated(5, 0.05, 0.01, 1000).0, 3);
        // A whole population (π = 1, λ = k): the search reaches k and k' = k, type I error 0.
        assert_eq!(derived_k_poisson(10, 10.0, 0.01, 1000), (10, 0.0));
        // Never above the number of records.
        assert_eq!(derived_k_poisson(10, 10.0, 0.01, 4).0, 4);
        // Huge k ends (the search stops at the records).
        assert_eq!(derived_k_zero_truncated(u64::MAX, 1e12, 0.01, 100).0, 100);
    }

    #[test]
    fn zero_truncated_mean_solves_its_equation() {
        assert_eq!(zero_truncated_mean(1), 0.0);
        for f in [2u64, 3, 10, 1000] {
            let l = zero_truncated_mean(f);
            assert!((l / -(-l).exp_m1() - f as f64).abs() < 1e-9, "{f}: {l}");
        }
    }

    #[test]
    fn exact_by_hand() {
        let e = exact(&[(1, 2), (2, 10), (3, 4)], 5);
        assert!(!e.satisfied);
        assert_eq!((e.smallest_population_class, e.classes_violating), (2, 2));
        assert!((e.records_violating - 4.0 / 6.0).abs() < 1e-15);
        assert!(exact(&[(1, 5)], 5).satisfied);
    }

    proptest! {
        #[test]
        fn estimators_equal_a_naive_scan(
            k in 1u64..40,
            fraction in 0.001f64..1.0,
            alpha in 0.0f64..0.5,
            sizes in proptest::collection::vec(1u64..30, 1..20),
            truncated in any::<bool>(),
        ) {
            let h = Histogram::from_sizes(sizes.iter().copied());
            let n = h.records();
            let lambda = fraction * k as f64;
            let want = naive_derived(k, lambda, alpha, n, truncated);
            let e = estimate(&h, KMapOptions { k, significance: alpha }, fraction, truncated);
            prop_assert_eq!(e.derived_k, want);
            // The violating classes recounted from the sizes.
            let bad: Vec<u64> = sizes.iter().copied().filter(|&s| s < want).collect();
            prop_assert_eq!(e.classes_violating, bad.len() as u64);
            prop_assert_eq!(e.satisfied, bad.is_empty());
            let share = bad.iter().sum::<u64>() as f64 / n as f64;
            prop_assert!((e.records_violating - share).abs() < 1e-12);
        }
    }
}
