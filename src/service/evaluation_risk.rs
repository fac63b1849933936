//! The risk section of `TableEvaluator`: the request's risk options checked (naming the proto field
//! and the rule) before anything is allocated, the memory the profile needs estimated for the job's
//! budget, and the risk engine's profile ([`crate::risk::RiskProfile`]) converted to the proto
//! `Risk` message under the JSON report's names.
//!
//! Invariants: no option reaches the engine unchecked; a measure the engine cannot compute carries
//! its reason in `unavailable` and zero figures, never a made-up number; SUDA is not computed (as
//! `cloakd table evaluate`).
use crate::proto::{
    EvaluateRequest, MarketerRisk, PopulationEstimate, PopulationUniqueness, RecordRisk, Risk,
    SampleUniqueness,
};
use crate::risk::population::Estimate;
use crate::risk::{Measured, Population, RiskOptions, RiskProfile};

/// The request's risk options, or the field and rule that refuse them.
pub fn risk_options(request: &EvaluateRequest) -> Result<RiskOptions, String> {
    let defaults = RiskOptions::default();
    let threshold = request.risk_threshold.unwrap_or(defaults.threshold);
    if !(0.0..=1.0).contains(&threshold) {
        return Err(format!(
            "risk_threshold = {threshold}: it must lie in [0, 1]"
        ));
    }
    let population = match (request.population, request.sampling_fraction) {
        (Some(_), Some(_)) => {
            return Err(
                "population and sampling_fraction: both set (rule: at most one of the two)".into(),
            );
        }
        (Some(p), None) if !(p.is_finite() && p >= 1.0) => {
            return Err(format!("population = {p}: it must be a finite number >= 1"));
        }
        (None, Some(f)) if !(f > 0.0 && f <= 1.0) => {
            return Err(format!("sampling_fraction = {f}: it must lie in (0, 1]"));
        }
        (Some(p), None) => Some(Population::Size(p)),
        (None, Some(f)) => Some(Population::SamplingFraction(f)),
        (None, None) => None,
    };
    Ok(RiskOptions {
        threshold,
        population,
        suda: false,
        ..defaults
    })
}

/// The bytes the profile of a release of `rows` rows and `quasi` quasi-identifiers may hold at
/// once (the risk engine's estimate, [`crate::risk::profile_bytes`]).
pub use crate::risk::profile_bytes as risk_bytes;

fn reason<T>(m: &Measured<T>) -> Option<String> {
    match m {
        Measured::Value(_) => None,
        Measured::Unavailable { unavailable } => Some(unavailable.clone()),
    }
}

fn record(risk: &crate::risk::sample::RecordRisk, against: &str) -> RecordRisk {
    RecordRisk {
        highest: risk.highest,
        lowest: risk.lowest,
        average: risk.average,
        records_at_risk: risk.records_at_risk,
        against: against.to_string(),
        unavailable: None,
    }
}

fn estimate(e: &Estimate) -> PopulationEstimate {
    match e {
        Estimate::Estimated { uniques, share } => PopulationEstimate {
            uniques: *uniques,
            share: *share,
            unavailable: None,
        },
        Estimate::Unavailable { unavailable } => PopulationEstimate {
            unavailable: Some(unavailable.clone()),
            ..PopulationEstimate::default()
        },
    }
}

/// The profile as the proto `Risk` message.
pub fn risk_response(p: &RiskProfile) -> Risk {
    let prosecutor = match &p.prosecutor {
        Measured::Value(r) => record(r, ""),
        m => RecordRisk {
            unavailable: reason(m),
            ..RecordRisk::default()
        },
    };
    let journalist = match &p.journalist {
        Measured::Value(j) => record(&j.risk, j.against),
        m => RecordRisk {
            unavailable: reason(m),
            ..RecordRisk::default()
        },
    };
    let marketer = match &p.marketer {
        Measured::Value(m) => MarketerRisk {
            average: m.average,
            unavailable: None,
        },
        m => MarketerRisk {
            unavailable: reason(m),
            ..MarketerRisk::default()
        },
    };
    let sample_uniqueness = match &p.sample_uniqueness {
        Measured::Value(u) => SampleUniqueness {
            unique_records: u.unique_records,
            share: u.share,
            unavailable: None,
        },
        m => SampleUniqueness {
            unavailable: reason(m),
            ..SampleUniqueness::default()
        },
    };
    let population_uniqueness = match &p.population_uniqueness {
        Measured::Value(u) => PopulationUniqueness {
            population_size: u.population_size,
            sampling_fraction: u.sampling_fraction,
            pitman: Some(estimate(&u.pitman)),
            zayatz: Some(estimate(&u.zayatz)),
            snb: Some(estimate(&u.snb)),
            dankar: Some(estimate(&u.dankar.estimate)),
            dankar_model: u.dankar.model.to_string(),
            unavailable: None,
        },
        m => PopulationUniqueness {
            unavailable: reason(m),
            ..PopulationUniqueness::default()
        },
    };
    Risk {
        quasi_identifiers: p.quasi_identifiers.clone(),
        records: p.records,
        outliers: p.outliers,
        classes: p.classes,
        threshold: p.threshold,
        prosecutor: Some(prosecutor),
        journalist: Some(journalist),
        marketer: Some(marketer),
        sample_uniqueness: Some(sample_uniqueness),
        population_uniqueness: Some(population_uniqueness),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_naming_the_field() {
        let bad = |r: EvaluateRequest| risk_options(&r).unwrap_err();
        assert!(
            bad(EvaluateRequest {
                risk_threshold: Some(1.5),
                ..Default::default()
            })
            .starts_with("risk_threshold = 1.5")
        );
        assert!(
            bad(EvaluateRequest {
                population: Some(0.5),
                ..Default::default()
            })
            .starts_with("population = 0.5")
        );
        assert!(
            bad(EvaluateRequest {
                sampling_fraction: Some(0.0),
                ..Default::default()
            })
            .starts_with("sampling_fraction = 0")
        );
        assert!(
            bad(EvaluateRequest {
                population: Some(10.0),
                sampling_fraction: Some(0.5),
                ..Default::default()
            })
            .contains("at most one")
        );
        let ok = risk_options(&EvaluateRequest {
            sampling_fraction: Some(0.5),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.population, Some(Population::SamplingFraction(0.5)));
        assert!(!ok.suda);
    }

    #[test]
    fn risk_bytes_grow_with_rows_and_quasi_identifiers() {
        assert_eq!(risk_bytes(0, 3), 0);
        assert!(risk_bytes(1000, 4) > risk_bytes(1000, 2));
        assert!(risk_bytes(10_000_000, 2) < risk_bytes(10_000_000, 8));
    }
}
