//! The re-identification risk engine: pure functions over the equivalence classes of a table's (or
//! a release's) quasi-identifiers, the measures analysts decide a release by (ARX, sdcMicro):
//! sample-based prosecutor, journalist and marketer risk and sample uniqueness ([`sample`]),
//! population uniqueness under the Pitman, Zayatz and SNB models and Dankar et al.'s rule
//! ([`population`]), and SUDA's minimal sample uniques and scores ([`suda`]), over classes formed
//! by [`classes`]. [`profile`] computes all of them; `cloakd table risk` prints and writes it.
//! Definitions, sources, edge cases and the comparison with ARX: docs/risk.md.
//!
//! Invariants: the engine reads no files and no clock and never panics on input: every option is
//! checked first ([`RiskError`] names the option and the rule), records whose every QI is
//! suppressed are outliers and count nowhere (as ARX's risk estimates), a model that cannot give a
//! number says why instead ([`population::Estimate::Unavailable`]), and SUDA's exponential search
//! is bounded before it allocates ([`suda::check_size`]).
pub mod classes;
pub mod sample;
pub mod suda;

/// The population models and the class-size histogram live in the relational engine (its
/// risk-bounded releases measure them); re-exported here, where the risk profile uses them.
pub use crate::relational::population::{self, Histogram};
pub use crate::relational::special;

use serde::Serialize;

use classes::{QuasiColumns, group};
use population::PopulationUniqueness;
use sample::{MarketerRisk, RecordRisk, SampleUniqueness};

/// The population the sample was drawn from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Population {
    /// The number of records of the population.
    Size(f64),
    /// The sample's share of the population, in (0, 1].
    SamplingFraction(f64),
}

/// What to compute.
#[derive(Debug, Clone, PartialEq)]
pub struct RiskOptions {
    /// A record is at risk when its risk is above this (ARX's default 0.2).
    pub threshold: f64,
    pub population: Option<Population>,
    /// SUDA's largest MSU size (`None`: all quasi-identifiers); `Some(0)` is refused.
    pub suda_max_size: Option<usize>,
    /// Skip SUDA altogether.
    pub suda: bool,
}

impl Default for RiskOptions {
    fn default() -> RiskOptions {
        RiskOptions {
            threshold: 0.2,
            population: None,
            suda_max_size: None,
            suda: true,
        }
    }
}

/// Why a risk profile was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RiskError {
    #[error("threshold = {0}: the risk threshold must be a number in [0, 1]")]
    Threshold(f64),
    #[error("population = {0}: the population size must be a finite number ≥ 1")]
    PopulationSize(f64),
    #[error("sampling_fraction = {0}: the sampling fraction must be in (0, 1]")]
    SamplingFraction(f64),
    #[error("no quasi-identifiers: risk is measured on the quasi-identifiers")]
    NoQuasiIdentifiers,
    #[error(transparent)]
    Suda(#[from] suda::SudaError),
    #[error("population table: {0}")]
    PopulationTable(String),
}

/// A measure, or why it cannot be computed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Measured<T> {
    Value(T),
    Unavailable { unavailable: String },
}

impl<T> Measured<T> {
    fn unavailable(reason: impl Into<String>) -> Measured<T> {
        Measured::Unavailable {
            unavailable: reason.into(),
        }
    }
}

/// Journalist risk and what it was measured against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JournalistRisk {
    #[serde(flatten)]
    pub risk: RecordRisk,
    /// `population table`, or `sample` (no population table: the sample is its own population,
    /// as ARX, so it equals the prosecutor risk).
    pub against: &'static str,
}

/// The whole risk profile (the `risk` object of the reports).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RiskProfile {
    pub quasi_identifiers: Vec<String>,
    /// Records in classes (outliers excluded).
    pub records: u64,
    /// Records whose every quasi-identifier is suppressed.
    pub outliers: u64,
    pub classes: u64,
    pub threshold: f64,
    pub prosecutor: Measured<RecordRisk>,
    pub journalist: Measured<JournalistRisk>,
    pub marketer: Measured<MarketerRisk>,
    pub sample_uniqueness: Measured<SampleUniqueness>,
    pub population_uniqueness: Measured<PopulationUniqueness>,
    pub suda: Measured<suda::Suda>,
}

impl RiskOptions {
    pub fn validate(&self) -> Result<(), RiskError> {
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(RiskError::Threshold(self.threshold));
        }
        match self.population {
            Some(Population::Size(p)) if !(p.is_finite() && p >= 1.0) => {
                Err(RiskError::PopulationSize(p))
            }
            Some(Population::SamplingFraction(f)) if !(f > 0.0 && f <= 1.0) => {
                Err(RiskError::SamplingFraction(f))
            }
            _ => Ok(()),
        }
    }
}

/// The histogram of the classes of all quasi-identifiers (outliers left out).
pub fn histogram(q: &QuasiColumns) -> Histogram {
    let all: Vec<usize> = (0..q.len()).collect();
    let grouping = group(q, &all, |r| !q.is_outlier(r));
    Histogram::from_sizes(grouping.sizes.iter().map(|&s| s as u64))
}

/// Per sample class, its size and the size of the population class with the same values; the
/// population's columns carry the same names and the same codes for the same values.
pub fn population_pairs(
    sample: &QuasiColumns,
    population: &QuasiColumns,
) -> Result<Vec<(u64, u64)>, RiskError> {
    if sample.names != population.names {
        return Err(RiskError::PopulationTable(
            "its quasi-identifiers differ from the sample's".into(),
        ));
    }
    let key = |q: &QuasiColumns, r: usize| -> Vec<u32> { q.codes.iter().map(|c| c[r]).collect() };
    let mut sizes: std::collections::HashMap<Vec<u32>, (u64, u64)> = Default::default();
    for r in (0..sample.rows).filter(|&r| !sample.is_outlier(r)) {
        sizes.entry(key(sample, r)).or_default().0 += 1;
    }
    for r in 0..population.rows {
        if let Some(e) = sizes.get_mut(&key(population, r)) {
            e.1 += 1;
        }
    }
    let pairs: Vec<(u64, u64)> = sizes.into_values().collect();
    if let Some(&(s, p)) = pairs.iter().find(|(s, p)| p < s) {
        return Err(RiskError::PopulationTable(format!(
            "a class of {s} sample records has {p} records in the population (rule: the population contains the sample)"
        )));
    }
    Ok(pairs)
}

/// The risk profile of `q`; `population_pairs` (from [`population_pairs`]) for the journalist and
/// marketer against a population table.
pub fn profile(
    q: &QuasiColumns,
    options: &RiskOptions,
    population_table: Option<&[(u64, u64)]>,
) -> Result<RiskProfile, RiskError> {
    options.validate()?;
    if q.is_empty() {
        return Err(RiskError::NoQuasiIdentifiers);
    }
    if options.suda {
        suda::check_size(q.len(), q.rows, options.suda_max_size.unwrap_or(q.len()))?;
    }
    let h = histogram(q);
    let outliers = q.rows as u64 - h.records();
    let mut p = RiskProfile {
        quasi_identifiers: q.names.clone(),
        records: h.records(),
        outliers,
        classes: h.classes(),
        threshold: options.threshold,
        prosecutor: Measured::unavailable("no records"),
        journalist: Measured::unavailable("no records"),
        marketer: Measured::unavailable("no records"),
        sample_uniqueness: Measured::unavailable("no records"),
        population_uniqueness: Measured::unavailable("no records"),
        suda: Measured::unavailable("not requested"),
    };
    if h.is_empty() {
        p.suda = Measured::unavailable("no records");
        return Ok(p);
    }
    p.prosecutor = Measured::Value(sample::prosecutor(&h, options.threshold));
    let own: Vec<(u64, u64)>;
    let (pairs, against) = match population_table {
        Some(pairs) => (pairs, "population table"),
        None => {
            own = h
                .entries()
                .iter()
                .flat_map(|&(s, c)| std::iter::repeat_n((s, s), c as usize))
                .collect();
            (own.as_slice(), "sample")
        }
    };
    p.journalist = Measured::Value(JournalistRisk {
        risk: sample::journalist(pairs, options.threshold),
        against,
    });
    p.marketer = Measured::Value(sample::marketer(pairs));
    p.sample_uniqueness = Measured::Value(sample::sample_uniqueness(&h));
    let n = h.records() as f64;
    let population = options.population.map(|pop| match pop {
        Population::Size(size) => size,
        Population::SamplingFraction(f) => (n / f).round(),
    });
    p.population_uniqueness = match population {
        None => Measured::unavailable(
            "no population size (give the population size or the sampling fraction)",
        ),
        Some(size) if size < n => Measured::unavailable(format!(
            "the population ({size}) is smaller than the sample ({n} records)"
        )),
        Some(size) => Measured::Value(population::population_uniqueness(&h, size)),
    };
    if options.suda {
        let max = options.suda_max_size.unwrap_or(q.len());
        // DIS-SUDA's sampling fraction: the population's, else sdcMicro's default 0.01.
        let fraction = population.map_or(0.01, |size| n / size).min(1.0);
        p.suda = Measured::Value(suda::suda(q, max, fraction, |r| !q.is_outlier(r))?);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(rows: &[[u32; 2]]) -> QuasiColumns {
        QuasiColumns::new(
            rows.len(),
            (0..2).map(|c| {
                (
                    format!("q{c}"),
                    rows.iter().map(|r| r[c]).collect(),
                    Some(9),
                )
            }),
        )
        .unwrap()
    }

    #[test]
    fn histogram_by_hand() {
        let h = Histogram::from_sizes([3, 1, 1, 0, 2]);
        assert_eq!(h.entries(), &[(1, 2), (2, 1), (3, 1)]);
        assert_eq!(
            (h.records(), h.classes(), h.smallest(), h.largest()),
            (7, 4, 1, 3)
        );
        assert_eq!(h.classes_of_size(2), 1);
        assert_eq!(h.classes_of_size(5), 0);
    }

    #[test]
    fn profile_of_a_small_table() {
        // Classes: (0,0)×2, (0,1)×1, (1,1)×1, and one outlier (9,9).
        let q = columns(&[[0, 0], [0, 0], [0, 1], [1, 1], [9, 9]]);
        let options = RiskOptions {
            population: Some(Population::Size(100.0)),
            ..RiskOptions::default()
        };
        let p = profile(&q, &options, None).unwrap();
        assert_eq!((p.records, p.outliers, p.classes), (4, 1, 3));
        let Measured::Value(pr) = &p.prosecutor else {
            panic!("prosecutor")
        };
        assert_eq!(pr.average, 0.75);
        let Measured::Value(j) = &p.journalist else {
            panic!("journalist")
        };
        assert_eq!(&j.risk, pr);
        assert_eq!(j.against, "sample");
        let Measured::Value(u) = &p.sample_uniqueness else {
            panic!("uniqueness")
        };
        assert_eq!(u.unique_records, 2);
        assert!(matches!(p.population_uniqueness, Measured::Value(_)));
        let Measured::Value(s) = &p.suda else {
            panic!("suda")
        };
        // (0,1): q0=0 ×3, q1=1 ×2 → {q0,q1}; (1,1): q0=1 once → {q0}.
        assert_eq!(s.msus_by_size, vec![1, 1]);
        assert_eq!(s.records_with_msu, 2);
    }

    #[test]
    fn refuses_bad_options_and_explains_missing_models() {
        let q = columns(&[[0, 0], [0, 1]]);
        let bad = |o: RiskOptions| profile(&q, &o, None).unwrap_err().to_string();
        assert!(
            bad(RiskOptions {
                threshold: 1.5,
                ..Default::default()
            })
            .contains("threshold")
        );
        assert!(
            bad(RiskOptions {
                population: Some(Population::SamplingFraction(0.0)),
                ..Default::default()
            })
            .contains("sampling_fraction")
        );
        assert!(
            bad(RiskOptions {
                suda_max_size: Some(0),
                ..Default::default()
            })
            .contains("suda_max_size")
        );
        let small = profile(
            &q,
            &RiskOptions {
                population: Some(Population::Size(1.0)),
                ..Default::default()
            },
            None,
        )
        .unwrap();
        assert!(matches!(
            small.population_uniqueness,
            Measured::Unavailable { ref unavailable } if unavailable.contains("smaller than the sample")
        ));
        // Every record suppressed: nothing to measure, and the reports say so.
        let all = columns(&[[9, 9], [9, 9]]);
        let p = profile(&all, &RiskOptions::default(), None).unwrap();
        assert!(matches!(p.prosecutor, Measured::Unavailable { .. }));
        assert_eq!(p.outliers, 2);
    }

    #[test]
    fn journalist_against_a_population_table() {
        let sample = columns(&[[0, 0], [0, 1]]);
        let population = columns(&[[0, 0], [0, 0], [0, 1], [0, 1], [0, 1], [1, 1]]);
        let pairs = population_pairs(&sample, &population).unwrap();
        let p = profile(&sample, &RiskOptions::default(), Some(&pairs)).unwrap();
        let Measured::Value(j) = &p.journalist else {
            panic!("journalist")
        };
        assert_eq!(j.against, "population table");
        assert_eq!(j.risk.highest, 0.5);
        // A population missing a sample class is refused.
        let err = population_pairs(&population, &sample).unwrap_err();
        assert!(
            err.to_string()
                .contains("the population contains the sample")
        );
    }
}
