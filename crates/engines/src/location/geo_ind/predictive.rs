//! The predictive mechanism's reuse test (Chatzikokolakis, Palamidessi & Stronati, "A predictive
//! differentially-private mechanism for mobility traces", PETS 2014), and what each GEO_IND request
//! asks of the privacy budget.
//!
//! The test: with `d` the distance from the true position to the user's last reported point, `l`
//! the threshold (`location.geo_ind.reuse_threshold_m`) and `N` a Laplace noise of scale
//! `1 / test_epsilon_per_km` km, the last report is reused when `d + N <= l`. The distance moves by
//! at most `d(x, x')` between two true positions, so the test's one bit is
//! `test_epsilon_per_km`-geo-indistinguishable, and it costs that much of the budget, whichever way
//! it goes. Only the bit is released (never the noise), so the floating-point weaknesses of a
//! released Laplace value (Mironov, CCS 2012) do not apply; the noise is drawn by inversion from a
//! uniform in the open interval (0, 1), so it is always finite.
//!
//! A reused answer's area of retrieval ([`reused_radius_m`]) is wide enough that a reuse is answered
//! for a true position outside it with probability at most 1 − confidence.
//!
//! Invariants: pure (the generator and every position passed in); the last report is a point the
//! provider already saw, never a true position; every plan charges the test whenever it ran.
use rand::Rng;

/// The reuse test's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictiveParams {
    /// Epsilon (per km) the test spends.
    pub test_epsilon_per_km: f64,
    /// The last report is reused when the noisy distance is at most this (m).
    pub threshold_m: f64,
}

/// What a user's last GEO_IND answer released: kept by the broker (memory only), never by the ledger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastReport {
    pub lat: f64,
    pub lon: f64,
    /// The radius of its area of retrieval (m).
    pub retrieval_radius_m: f64,
}

/// What to charge for one GEO_IND request and what to answer once charged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plan {
    /// No last report: a fresh draw, charged `epsilon`.
    Fresh { epsilon: f64 },
    /// The test passed: reuse the last report, charged the test's epsilon.
    Reuse { test_epsilon: f64 },
    /// The test failed: a fresh draw, charged the test's epsilon plus `epsilon`; if only the test's
    /// epsilon fits, that is charged (its bit shows in the refusal) and the request refused.
    TestThenFresh { test_epsilon: f64, epsilon: f64 },
}

impl Plan {
    /// What to charge first, and what if that does not fit.
    pub fn charge(&self) -> (f64, Option<f64>) {
        match *self {
            Plan::Fresh { epsilon } => (epsilon, None),
            Plan::Reuse { test_epsilon } => (test_epsilon, None),
            Plan::TestThenFresh {
                test_epsilon,
                epsilon,
            } => (test_epsilon + epsilon, Some(test_epsilon)),
        }
    }
}

/// Great-circle distance (m) on a sphere of the Earth's mean radius.
pub fn distance_m(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    const EARTH_RADIUS_M: f64 = 6_371_008.8;
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * h.sqrt().min(1.0).asin()
}

/// A Laplace noise of scale `scale` by inversion of a uniform in the open interval (0, 1).
pub fn laplace(scale: f64, rng: &mut impl Rng) -> f64 {
    let mut v: f64 = rng.random();
    while v <= 0.0 {
        v = rng.random();
    }
    if v < 0.5 {
        scale * (2.0 * v).ln()
    } else {
        -scale * (2.0 * (1.0 - v)).ln()
    }
}

/// The private test: is the last report still a valid answer for the true position?
pub fn reuse_test(
    params: PredictiveParams,
    last: &LastReport,
    lat: f64,
    lon: f64,
    rng: &mut impl Rng,
) -> bool {
    let d = distance_m(lat, lon, last.lat, last.lon);
    let scale_m = 1000.0 / params.test_epsilon_per_km;
    d + laplace(scale_m, rng) <= params.threshold_m
}

/// The confidence each area of retrieval is drawn at when answers may be reused, so that every
/// answer holds the true position with probability at least `confidence`: √confidence.
///
/// A request is answered either by a reuse, sent for a position outside its circle with probability
/// at most α_r ([`reused_radius_m`]), or by a fresh draw whose circle misses with probability α_f; a
/// position beyond the reuse radius can be failed both ways in turn, with probability at most
/// α_r + (1 − α_r)·α_f = 1 − (1 − α_r)(1 − α_f). With both at 1 − √confidence that is 1 − confidence.
pub fn per_answer_confidence(confidence: f64) -> f64 {
    confidence.sqrt()
}

/// The radius (m) of a reused answer's area of retrieval around the reused point: at least the
/// reused answer's own, and at least `l + b·ln(0.5/α)` (`l` the threshold, `b` the test's noise
/// scale, `α = 1 − confidence`; `l` when α ≥ 0.5). For a true position `D > l` away, the test passes
/// with probability `P(N ≤ l − D) = 0.5·e^(−(D − l)/b)`, so beyond this radius a reuse is answered with
/// probability at most α, whatever the position: the promise a fresh answer's radius makes.
pub fn reused_radius_m(params: PredictiveParams, last_radius_m: f64, confidence: f64) -> f64 {
    let scale_m = 1000.0 / params.test_epsilon_per_km;
    let alpha = 1.0 - confidence;
    let beyond = (0.5 / alpha).ln().max(0.0);
    (params.threshold_m + scale_m * beyond).max(last_radius_m)
}

/// The plan of one GEO_IND request at `epsilon` per km from (`lat`, `lon`).
pub fn plan(
    params: PredictiveParams,
    last: Option<&LastReport>,
    lat: f64,
    lon: f64,
    epsilon: f64,
    rng: &mut impl Rng,
) -> Plan {
    match last {
        None => Plan::Fresh { epsilon },
        Some(last) if reuse_test(params, last, lat, lon, rng) => Plan::Reuse {
            test_epsilon: params.test_epsilon_per_km,
        },
        Some(_) => Plan::TestThenFresh {
            test_epsilon: params.test_epsilon_per_km,
            epsilon,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    const PARAMS: PredictiveParams = PredictiveParams {
        test_epsilon_per_km: 2.0,
        threshold_m: 1_000.0,
    };

    #[test]
    fn the_laplace_noise_has_its_scale_and_no_sign_bias() {
        // Seeded: mean |N| is the scale; with 200,000 draws its standard error is scale / 447, so
        // a 2 % band is over 8 standard errors wide (false alarm far below 1e-9).
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let n = 200_000;
        let draws: Vec<f64> = (0..n).map(|_| laplace(500.0, &mut rng)).collect();
        let mean_abs = draws.iter().map(|x| x.abs()).sum::<f64>() / n as f64;
        let positive = draws.iter().filter(|x| **x > 0.0).count() as f64 / n as f64;
        assert!((mean_abs - 500.0).abs() < 10.0, "{mean_abs}");
        assert!((positive - 0.5).abs() < 0.01, "{positive}");
        assert!(draws.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn the_test_reuses_a_near_report_and_not_a_far_one() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let last = LastReport {
            lat: 53.14,
            lon: 8.21,
            retrieval_radius_m: 800.0,
        };
        // 1 km is about 0.009 degrees of latitude.
        let near = (0..1000)
            .filter(|_| reuse_test(PARAMS, &last, 53.14, 8.21, &mut rng))
            .count();
        let far = (0..1000)
            .filter(|_| reuse_test(PARAMS, &last, 53.14 + 0.09, 8.21, &mut rng))
            .count();
        // P(reuse at d = 0) = 1 - e^(-2)/2 ~ 0.93; at d = 10 km, e^(-18)/2.
        assert!(near > 880, "{near}");
        assert_eq!(far, 0);
    }

    #[test]
    fn every_plan_that_ran_the_test_charges_it() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        assert_eq!(
            plan(PARAMS, None, 0.0, 0.0, 5.0, &mut rng).charge(),
            (5.0, None)
        );
        let last = LastReport {
            lat: 0.0,
            lon: 0.0,
            retrieval_radius_m: 10.0,
        };
        assert_eq!(
            plan(PARAMS, Some(&last), 0.0, 0.0, 5.0, &mut rng)
                .charge()
                .0,
            2.0
        );
        assert_eq!(
            plan(PARAMS, Some(&last), 45.0, 0.0, 5.0, &mut rng).charge(),
            (7.0, Some(2.0))
        );
    }

    #[test]
    fn distances_are_great_circle_metres() {
        let d = distance_m(0.0, 0.0, 1.0, 0.0);
        assert!((d - 111_195.0).abs() < 5.0, "{d}");
    }

    #[test]
    fn a_position_beyond_the_reuse_radius_keeps_the_confidence_over_both_answers() {
        for confidence in [0.5, 0.9, 0.95, 0.99] {
            let each = per_answer_confidence(confidence);
            let (alpha_r, alpha_f) = (1.0 - each, 1.0 - each);
            let worst = alpha_r + (1.0 - alpha_r) * alpha_f;
            assert!((worst - (1.0 - confidence)).abs() < 1e-12, "{confidence}");
        }
    }

    #[test]
    fn a_reused_radius_by_hand() {
        let p = PredictiveParams {
            test_epsilon_per_km: 1.0,
            threshold_m: 1_000.0,
        };
        // The defaults: 1 km + 1 km · ln(0.5 / 0.05) = 3.30 km.
        let r = reused_radius_m(p, 950.0, 0.95);
        assert!((r - (1_000.0 + 1_000.0 * 10f64.ln())).abs() < 1e-9, "{r}");
        // Never below the reused answer's own radius; the threshold itself when α ≥ 0.5.
        assert_eq!(reused_radius_m(p, 5_000.0, 0.95), 5_000.0);
        assert_eq!(reused_radius_m(p, 0.0, 0.4), 1_000.0);
    }

    /// A true position exactly the reused radius away passes the test with probability α: measured
    /// over 200,000 seeded tests per setting, within 4.5 standard deviations of α (false alarm about
    /// 7e-6 per setting); nearer positions pass more often, farther ones less (the bound is exact).
    #[test]
    fn beyond_the_reused_radius_a_reuse_is_as_rare_as_a_miss() {
        let mut rng = ChaCha20Rng::seed_from_u64(17);
        let metres_per_degree = 6_371_008.8 * std::f64::consts::PI / 180.0;
        for (test_epsilon_per_km, threshold_m, confidence) in [
            (1.0, 1_000.0, 0.95),
            (2.0, 300.0, 0.9),
            (0.5, 2_000.0, 0.99),
        ] {
            let params = PredictiveParams {
                test_epsilon_per_km,
                threshold_m,
            };
            let r = reused_radius_m(params, 0.0, confidence);
            let last = LastReport {
                lat: 53.0,
                lon: 8.0,
                retrieval_radius_m: 0.0,
            };
            let share_at = |distance: f64, rng: &mut ChaCha20Rng| {
                let n = 200_000;
                let lat = 53.0 + distance / metres_per_degree;
                let passed = (0..n)
                    .filter(|_| reuse_test(params, &last, lat, 8.0, rng))
                    .count();
                passed as f64 / n as f64
            };
            let alpha = 1.0 - confidence;
            let sigma = (alpha * (1.0 - alpha) / 200_000.0).sqrt();
            let at = share_at(r, &mut rng);
            assert!(
                (at - alpha).abs() < 4.5 * sigma,
                "{params:?}: {at} at {r} m"
            );
            assert!(share_at(r * 1.5, &mut rng) < alpha);
            assert!(share_at(r * 0.8, &mut rng) > alpha);
        }
    }
}
