//! `[location.geo_ind]`'s privacy budget keys: `budget`, `budget_window_ms`, `budget_reserve_share`, the predictive
//! mechanism's reuse test (`reuse_test_epsilon_per_km`, `reuse_threshold_m`) and the ledger's group
//! commit (`ledger_queue`, `ledger_max_batch`). The keys are fields of `RawGeoInd`; this file holds
//! their typed form and the rules between them.
//!
//! Invariants after validation: `budget` is 0 (no budget kept) or finite and at least
//! `default_epsilon_per_km` (a user can afford at least one default draw); the window is at least
//! 1 s; the reserve's share of the budget in [0, 1]; the test's epsilon is finite, > 0 and at most the
//! budget; the threshold finite and > 0;
//! 1 <= ledger_max_batch <= ledger_queue <= 1,048,576.

use super::{ConfigError, invalid};
use crate::location::geo_ind::predictive::PredictiveParams;

/// The budget keys as read (fields of `RawGeoInd`).
#[derive(Debug, Clone, Copy)]
pub struct RawGeoBudget {
    pub budget: f64,
    pub budget_window_ms: u64,
    pub budget_reserve_share: f64,
    pub reuse_test_epsilon_per_km: f64,
    pub reuse_threshold_m: f64,
    pub ledger_queue: usize,
    pub ledger_max_batch: usize,
}

/// The validated budget: `None` in [`GeoBudgetConfig::of`] when `budget = 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoBudgetConfig {
    /// Epsilon (per km) a user may spend per window.
    pub budget: f64,
    pub window_ms: i64,
    /// Epsilon (per km) set aside per user with a charge that must wait for the ledger, so that
    /// the user's next answers are paid from it at once (0: every charge waits for its commit):
    /// `budget_reserve_share` of the budget.
    pub reserve: f64,
    pub predictive: PredictiveParams,
    pub ledger_queue: usize,
    pub ledger_max_batch: usize,
}

const MAX_QUEUE: usize = 1 << 20;

impl RawGeoBudget {
    /// The typed budget (`None`: `budget = 0`, no budget kept), checked against the default epsilon.
    pub(super) fn validate(
        self,
        default_epsilon_per_km: f64,
    ) -> Result<Option<GeoBudgetConfig>, ConfigError> {
        let budget = self.budget;
        if budget == 0.0 {
            return Ok(None);
        }
        if !(budget.is_finite() && budget >= default_epsilon_per_km) {
            return Err(invalid(
                "location.geo_ind.budget",
                format!(
                    "must be 0 (no budget) or a finite number at least default_epsilon_per_km = {default_epsilon_per_km} (got {budget})"
                ),
            ));
        }
        if self.budget_window_ms < 1000 || self.budget_window_ms > i64::MAX as u64 / 4 {
            return Err(invalid(
                "location.geo_ind.budget_window_ms",
                format!("must be at least 1000 ms (got {})", self.budget_window_ms),
            ));
        }
        let share = self.budget_reserve_share;
        if !(0.0..=1.0).contains(&share) {
            return Err(invalid(
                "location.geo_ind.budget_reserve_share",
                format!("must be a number in [0, 1] (got {share})"),
            ));
        }
        let reserve = share * budget;
        let test = self.reuse_test_epsilon_per_km;
        if !(test.is_finite() && test > 0.0 && test <= budget) {
            return Err(invalid(
                "location.geo_ind.reuse_test_epsilon_per_km",
                format!("must be a finite number > 0 and at most budget = {budget} (got {test})"),
            ));
        }
        let threshold = self.reuse_threshold_m;
        if !(threshold.is_finite() && threshold > 0.0) {
            return Err(invalid(
                "location.geo_ind.reuse_threshold_m",
                format!("must be a finite number > 0 (got {threshold})"),
            ));
        }
        if !(1..=MAX_QUEUE).contains(&self.ledger_queue) {
            return Err(invalid(
                "location.geo_ind.ledger_queue",
                format!("must lie in [1, {MAX_QUEUE}] (got {})", self.ledger_queue),
            ));
        }
        if !(1..=self.ledger_queue).contains(&self.ledger_max_batch) {
            return Err(invalid(
                "location.geo_ind.ledger_max_batch",
                format!(
                    "must lie in [1, ledger_queue = {}] (got {})",
                    self.ledger_queue, self.ledger_max_batch
                ),
            ));
        }
        Ok(Some(GeoBudgetConfig {
            budget,
            window_ms: self.budget_window_ms as i64,
            reserve,
            predictive: PredictiveParams {
                test_epsilon_per_km: test,
                threshold_m: threshold,
            },
            ledger_queue: self.ledger_queue,
            ledger_max_batch: self.ledger_max_batch,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawGeoBudget {
        RawGeoBudget {
            budget: 500.0,
            budget_window_ms: 3_600_000,
            budget_reserve_share: 0.2,
            reuse_test_epsilon_per_km: 1.0,
            reuse_threshold_m: 1000.0,
            ledger_queue: 65_536,
            ledger_max_batch: 1024,
        }
    }

    #[test]
    fn each_rule_names_its_key() {
        assert!(raw().validate(5.0).unwrap().is_some());
        assert_eq!(
            RawGeoBudget {
                budget: 0.0,
                ..raw()
            }
            .validate(5.0)
            .unwrap(),
            None
        );
        let cases: [(RawGeoBudget, &str); 7] = [
            (
                RawGeoBudget {
                    budget_reserve_share: 1.5,
                    ..raw()
                },
                "location.geo_ind.budget_reserve_share",
            ),
            (
                RawGeoBudget {
                    budget: 4.0,
                    ..raw()
                },
                "location.geo_ind.budget",
            ),
            (
                RawGeoBudget {
                    budget_window_ms: 10,
                    ..raw()
                },
                "location.geo_ind.budget_window_ms",
            ),
            (
                RawGeoBudget {
                    reuse_test_epsilon_per_km: f64::NAN,
                    ..raw()
                },
                "location.geo_ind.reuse_test_epsilon_per_km",
            ),
            (
                RawGeoBudget {
                    reuse_threshold_m: -1.0,
                    ..raw()
                },
                "location.geo_ind.reuse_threshold_m",
            ),
            (
                RawGeoBudget {
                    ledger_queue: 0,
                    ..raw()
                },
                "location.geo_ind.ledger_queue",
            ),
            (
                RawGeoBudget {
                    ledger_max_batch: 70_000,
                    ..raw()
                },
                "location.geo_ind.ledger_max_batch",
            ),
        ];
        for (raw, key) in cases {
            let err = raw.validate(5.0).unwrap_err().to_string();
            assert!(err.contains(key), "{err} should name {key}");
        }
    }
}
