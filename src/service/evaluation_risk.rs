//! The risk section of `TableEvaluator`: the request's risk options checked (naming the proto field
//! and the rule) before anything is allocated, the memory the profile needs estimated for the job's
//! budget, and the risk engine's profile ([`crate::risk::RiskProfile`]) converted to the proto
//! `Risk` message under the JSON report's names.
//!
//! Invariants: no option reaches the engine unchecked; a measure the engine cannot compute carries
//! its reason in `unavailable` and zero figures, never a made-up number; SUDA is computed only when
//! the request sets `suda_max_size` (its search grows with the subsets of the quasi-identifiers),
//! its size checked against the release's quasi-identifiers and the search's limits, and its memory
//! estimated ([`suda_bytes`]), before it runs.
use crate::proto::{
    EvaluateRequest, KMap, KMapEstimate, MarketerRisk, PopulationEstimate, PopulationUniqueness,
    RecordRisk, Risk, SampleUniqueness, Suda, SudaContribution,
};
use crate::risk::population::Estimate;
use crate::risk::suda::{self, SudaError};
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
    let significance = request.k_map_significance.unwrap_or(0.01);
    if !(0.0..=1.0).contains(&significance) {
        return Err(format!(
            "k_map_significance = {significance}: it must lie in [0, 1]"
        ));
    }
    if request.k_map == Some(0) {
        return Err("k_map = 0: k must be at least 1".into());
    }
    if request.suda_max_size == Some(0) {
        return Err("suda_max_size = 0: it must be at least 1 (rule: 1 <= suda_max_size <= the release's quasi-identifiers)".into());
    }
    Ok(RiskOptions {
        threshold,
        population,
        suda: request.suda_max_size.is_some(),
        suda_max_size: request.suda_max_size.map(|m| m as usize),
        k_map: request
            .k_map
            .map(|k| crate::risk::kmap::KMapOptions { k, significance }),
        ..defaults
    })
}

/// SUDA's size checked once the release's quasi-identifiers are known, before anything is allocated:
/// at most `quasi` (a field error), within the search's limits ([`suda::check_size`]).
pub fn check_suda(options: &RiskOptions, rows: usize, quasi: usize) -> Result<(), SudaCheck> {
    let Some(max) = options.suda_max_size.filter(|_| options.suda) else {
        return Ok(());
    };
    if max > quasi {
        return Err(SudaCheck::AboveQuasi { max, quasi });
    }
    suda::check_size(quasi, rows, max)
        .map(|_| ())
        .map_err(SudaCheck::Search)
}

/// Why SUDA's size was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SudaCheck {
    #[error(
        "suda_max_size = {max}: more than the release's {quasi} quasi-identifiers (rule: 1 <= suda_max_size <= the release's quasi-identifiers)"
    )]
    AboveQuasi { max: usize, quasi: usize },
    /// Past the search's limits (subsets, bitsets per level, quasi-identifiers).
    #[error("suda_max_size: {0}")]
    Search(SudaError),
}

/// The bytes SUDA up to `max_size` over `rows` rows and `quasi` quasi-identifiers may hold at once,
/// beside the profile's ([`risk_bytes`]): two levels of uniqueness bitsets, a score and a DIS score
/// per row, and one grouping (a class id per row, the class sizes and the dense table).
pub fn suda_bytes(rows: usize, quasi: usize, max_size: usize) -> u64 {
    risk_bytes(rows, 0).saturating_add(suda::suda_bytes(quasi, rows, max_size))
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

fn k_map_estimate(m: &Measured<crate::risk::kmap::KMapEstimate>) -> KMapEstimate {
    match m {
        Measured::Value(e) => KMapEstimate {
            derived_k: e.derived_k,
            type1_error: e.type1_error,
            satisfied: e.satisfied,
            classes_violating: e.classes_violating,
            records_violating: e.records_violating,
            smallest_estimated_population_class: e.smallest_estimated_population_class,
            unavailable: None,
        },
        m => KMapEstimate {
            unavailable: reason(m),
            ..KMapEstimate::default()
        },
    }
}

fn k_map_response(k: &crate::risk::KMap) -> KMap {
    KMap {
        k: k.k,
        significance: k.significance,
        sampling_fraction: k.sampling_fraction,
        d3: Some(k_map_estimate(&k.d3)),
        d4: Some(k_map_estimate(&k.d4)),
    }
}

fn suda_response(m: &Measured<suda::Suda>) -> Suda {
    match m {
        Measured::Value(s) => Suda {
            max_size: s.max_size as u64,
            msus_by_size: s.msus_by_size.clone(),
            msus: s.msus,
            records_with_msu: s.records_with_msu,
            highest_score: s.highest_score,
            average_score: s.average_score,
            dis_fraction: s.dis_fraction,
            highest_dis_score: s.highest_dis_score,
            average_dis_score: s.average_dis_score,
            attribute_contributions: s
                .attribute_contributions
                .iter()
                .map(|c| SudaContribution {
                    attribute: c.attribute.clone(),
                    contribution: c.contribution,
                })
                .collect(),
            unavailable: None,
        },
        m => Suda {
            unavailable: reason(m),
            ..Suda::default()
        },
    }
}

/// The profile as the proto `Risk` message; `suda` set when the options asked for it.
pub fn risk_response(p: &RiskProfile, options: &RiskOptions) -> Risk {
    let prosecutor = match &p.prosecutor {
        Measured::Value(r) => record(r, ""),
        m => RecordRisk {
            unavailable: reason(m),
            ..RecordRisk::default()
        },
    };
    let prosecutor_wildcard = match &p.prosecutor_wildcard {
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
        prosecutor_wildcard: Some(prosecutor_wildcard),
        journalist: Some(journalist),
        marketer: Some(marketer),
        sample_uniqueness: Some(sample_uniqueness),
        population_uniqueness: Some(population_uniqueness),
        suda: options.suda.then(|| suda_response(&p.suda)),
        k_map: p.k_map.as_ref().map(k_map_response),
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
                k_map: Some(0),
                ..Default::default()
            })
            .starts_with("k_map = 0")
        );
        assert!(
            bad(EvaluateRequest {
                k_map: Some(5),
                k_map_significance: Some(1.5),
                ..Default::default()
            })
            .starts_with("k_map_significance = 1.5")
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
        assert!(
            bad(EvaluateRequest {
                suda_max_size: Some(0),
                ..Default::default()
            })
            .starts_with("suda_max_size = 0: it must be at least 1")
        );
        let with_suda = risk_options(&EvaluateRequest {
            suda_max_size: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert!(with_suda.suda);
        assert_eq!(with_suda.suda_max_size, Some(3));
        // Its size against the release's quasi-identifiers and the search's limits.
        assert_eq!(check_suda(&ok, 100, 2), Ok(()));
        assert_eq!(check_suda(&with_suda, 100, 3), Ok(()));
        let above = check_suda(&with_suda, 100, 2).unwrap_err().to_string();
        assert!(
            above.starts_with("suda_max_size = 3: more than the release's 2 quasi-identifiers"),
            "{above}"
        );
        let wide = RiskOptions {
            suda_max_size: Some(30),
            ..with_suda
        };
        let past = check_suda(&wide, 1000, 60).unwrap_err().to_string();
        assert!(
            past.starts_with("suda_max_size: suda_max_size = 30:") && past.contains("lower"),
            "{past}"
        );
        let many = check_suda(&wide, 10, 64).unwrap_err().to_string();
        assert!(
            many.starts_with("suda_max_size: 64 quasi-identifiers"),
            "{many}"
        );
    }

    #[test]
    fn suda_bytes_count_two_levels_of_bitsets() {
        // 6 QIs up to size 3: the widest level has C(6, 3) = 20 subsets of 2 words each (100 rows).
        let levels = 2 * 20 * 2 * 8;
        assert_eq!(
            suda_bytes(100, 6, 3),
            risk_bytes(100, 0) + 100 * 16 + levels
        );
        assert!(suda_bytes(1000, 6, 6) > suda_bytes(1000, 6, 2));
    }

    #[test]
    fn suda_is_in_the_message_only_when_asked_for() {
        let q = crate::risk::classes::QuasiColumns::new(
            4,
            (0..2).map(|c| {
                (
                    format!("q{c}"),
                    [[0, 0], [0, 1], [1, 1], [1, 1]]
                        .iter()
                        .map(|r| r[c])
                        .collect(),
                    None,
                )
            }),
        )
        .unwrap();
        let without = risk_options(&EvaluateRequest::default()).unwrap();
        let p = crate::risk::profile(&q, &without, None).unwrap();
        assert_eq!(risk_response(&p, &without).suda, None);
        let with = risk_options(&EvaluateRequest {
            suda_max_size: Some(2),
            ..Default::default()
        })
        .unwrap();
        let p = crate::risk::profile(&q, &with, None).unwrap();
        let Measured::Value(engine) = &p.suda else {
            panic!("{:?}", p.suda)
        };
        let s = risk_response(&p, &with).suda.unwrap();
        assert_eq!(s.unavailable, None);
        assert_eq!(s.max_size, 2);
        assert_eq!(s.msus_by_size, engine.msus_by_size);
        assert_eq!(s.records_with_msu, engine.records_with_msu);
        assert_eq!(s.attribute_contributions.len(), 2);
        assert_eq!(s.attribute_contributions[1].attribute, "q1");
    }

    #[test]
    fn risk_bytes_grow_with_rows_and_quasi_identifiers() {
        assert_eq!(risk_bytes(0, 3), 0);
        assert!(risk_bytes(1000, 4) > risk_bytes(1000, 2));
        assert!(risk_bytes(10_000_000, 2) < risk_bytes(10_000_000, 8));
    }
}
