//! The re-identification risk engine: pure functions over the equivalence classes of a table's (or
//! a release's) quasi-identifiers, the measures analysts decide a release by (ARX, sdcMicro):
//! sample-based prosecutor, journalist and marketer risk and sample uniqueness ([`sample`]), the
//! prosecutor risk under wildcard matching of suppressed cells ([`wildcard`]),
//! population uniqueness under the Pitman, Zayatz and SNB models and Dankar et al.'s rule
//! ([`population`]), SUDA's minimal sample uniques and scores ([`suda`]), k-map ([`kmap`]),
//! δ-presence against a population table ([`delta_presence`], the table matched by [`matching`]) and QI
//! discovery ([`discovery`]), over classes formed by [`classes`]. [`profile`] computes all of them;
//! `cloakd table risk` prints and writes it.
//! Definitions, sources, edge cases and the comparison with ARX: docs/risk.md.
//!
//! Invariants: the engine reads no files and no clock and never panics on input: every option is
//! checked first ([`RiskError`] names the option and the rule), records whose every QI is
//! suppressed are outliers and count nowhere (as ARX's risk estimates), a model that cannot give a
//! number says why instead ([`population::Estimate::Unavailable`]), and the exponential or
//! quadratic searches are bounded before they allocate ([`suda::check_size`],
//! [`discovery::check_size`], [`matching::MAX_MATCH_LOOKUPS`]).
pub mod classes;
pub mod delta_presence;
pub mod discovery;
pub mod kmap;
pub mod matching;
pub mod sample;
pub mod suda;
pub mod wildcard;

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
    /// k-map's k and significance level (`None`: not measured).
    pub k_map: Option<kmap::KMapOptions>,
    /// δ-presence's bounds (measured whenever a population table is given).
    pub presence: delta_presence::PresenceBounds,
    /// QI discovery's largest combination size (`None`: not measured).
    pub qi_discovery: Option<usize>,
}

impl Default for RiskOptions {
    fn default() -> RiskOptions {
        RiskOptions {
            threshold: 0.2,
            population: None,
            suda_max_size: None,
            suda: true,
            k_map: None,
            presence: delta_presence::PresenceBounds::default(),
            qi_discovery: None,
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
    #[error("k_map = {0}: k must be at least 1")]
    KMapK(u64),
    #[error("k_map_significance = {0}: the significance level must be in [0, 1]")]
    KMapSignificance(f64),
    #[error("delta_{name} = {value}: a δ-presence bound must be in [0, 1]")]
    PresenceBound { name: &'static str, value: f64 },
    #[error(
        "delta_min = {min} > delta_max = {max}: the lower δ-presence bound must not exceed the upper"
    )]
    PresenceBounds { min: f64, max: f64 },
    #[error(transparent)]
    Discovery(#[from] discovery::DiscoveryError),
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
    /// The prosecutor risk when a suppressed cell matches any value ([`wildcard`], ARX's
    /// `RiskModelSampleWildcard`); equal to `prosecutor` when no record is partly suppressed.
    pub prosecutor_wildcard: Measured<RecordRisk>,
    pub journalist: Measured<JournalistRisk>,
    pub marketer: Measured<MarketerRisk>,
    pub sample_uniqueness: Measured<SampleUniqueness>,
    pub population_uniqueness: Measured<PopulationUniqueness>,
    pub suda: Measured<suda::Suda>,
    /// k-map, when asked for (`--k-map`, or the job's k).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k_map: Option<KMap>,
    /// δ-presence, when a population table is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta_presence: Option<Measured<delta_presence::Presence>>,
    /// QI discovery, when asked for (`--qi-discovery`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qi_discovery: Option<Measured<discovery::Discovery>>,
}

/// k-map: exact against a population table, and under the D3 and D4 estimators.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KMap {
    pub k: u64,
    pub significance: f64,
    /// The sampling fraction π = records / population of the estimators, if there is a population.
    pub sampling_fraction: Option<f64>,
    pub population_table: Measured<kmap::KMapExact>,
    pub d3: Measured<kmap::KMapEstimate>,
    pub d4: Measured<kmap::KMapEstimate>,
}

/// A population table matched against the sample's classes ([`matching::match_population`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PopulationTable {
    /// Per sample class, its size and the number of population records it stands for.
    pub pairs: Vec<(u64, u64)>,
    /// The population's records.
    pub records: u64,
    /// Population records matching no sample class.
    pub unmatched: u64,
}

impl RiskOptions {
    /// With a population table: its records are the population's size, for the models that need
    /// one, unless a size or a sampling fraction was given.
    pub fn with_population_table(mut self, table: &PopulationTable) -> RiskOptions {
        if self.population.is_none() {
            self.population = Some(Population::Size(table.records as f64));
        }
        self
    }

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
        }?;
        if let Some(k) = self.k_map {
            if k.k == 0 {
                return Err(RiskError::KMapK(k.k));
            }
            if !(0.0..=1.0).contains(&k.significance) {
                return Err(RiskError::KMapSignificance(k.significance));
            }
        }
        for (name, bound) in [("min", self.presence.min), ("max", self.presence.max)] {
            if let Some(value) = bound
                && !(0.0..=1.0).contains(&value)
            {
                return Err(RiskError::PresenceBound { name, value });
            }
        }
        if let (Some(min), Some(max)) = (self.presence.min, self.presence.max)
            && min > max
        {
            return Err(RiskError::PresenceBounds { min, max });
        }
        if self.qi_discovery == Some(0) {
            return Err(discovery::DiscoveryError::MaxSizeZero(0).into());
        }
        Ok(())
    }
}

/// The classes of all quasi-identifiers (outliers left out).
pub fn classes_of(q: &QuasiColumns) -> classes::Grouping {
    let all: Vec<usize> = (0..q.len()).collect();
    group(q, &all, |r| !q.is_outlier(r))
}

/// The bytes the profile (without SUDA, [`suda::suda_bytes`]) of `rows` rows and `quasi`
/// quasi-identifiers may hold at once: a copy of the codes, a class id per row, the grouping's dense
/// table (at most [`classes::DENSE_LIMIT`] cells, and no more than rows × (rows + 1)) and the class
/// sizes. What a caller with a memory budget reserves before it builds the columns.
pub fn profile_bytes(rows: usize, quasi: usize) -> u64 {
    let rows = rows as u64;
    let dense = rows
        .saturating_mul(rows.saturating_add(1))
        .min(classes::DENSE_LIMIT as u64);
    rows.saturating_mul(4 * quasi as u64 + 4 + 16)
        .saturating_add(dense.saturating_mul(4))
}

/// The histogram of the classes of all quasi-identifiers (outliers left out).
pub fn histogram(q: &QuasiColumns) -> Histogram {
    histogram_of(&classes_of(q))
}

fn histogram_of(grouping: &classes::Grouping) -> Histogram {
    Histogram::from_sizes(grouping.sizes.iter().map(|&s| s as u64))
}

/// A population table whose columns carry the same names and the same codes for the same values
/// as the sample's, matched by equal codes ([`matching::match_population`] with identity covers).
pub fn population_pairs(
    sample: &QuasiColumns,
    population: &QuasiColumns,
) -> Result<PopulationTable, RiskError> {
    if sample.names != population.names {
        return Err(RiskError::PopulationTable(
            "its quasi-identifiers differ from the sample's".into(),
        ));
    }
    let covers = matching::Covers {
        columns: (0..sample.len())
            .map(|c| {
                let domain = sample.domains[c].max(population.domains[c]);
                (0..domain).map(|v| vec![v]).collect()
            })
            .collect(),
    };
    matching::match_population(sample, population, &covers)
}

/// The risk profile of `q`; a population table (from [`population_pairs`] or
/// [`matching::match_population`]) for the journalist and marketer, exact k-map and δ-presence.
pub fn profile(
    q: &QuasiColumns,
    options: &RiskOptions,
    population_table: Option<&PopulationTable>,
) -> Result<RiskProfile, RiskError> {
    options.validate()?;
    if q.is_empty() {
        return Err(RiskError::NoQuasiIdentifiers);
    }
    if options.suda {
        suda::check_size(q.len(), q.rows, options.suda_max_size.unwrap_or(q.len()))?;
    }
    if let Some(max) = options.qi_discovery {
        discovery::check_size(q.len(), q.rows, max)?;
    }
    let grouping = classes_of(q);
    let h = histogram_of(&grouping);
    let outliers = q.rows as u64 - h.records();
    let mut p = RiskProfile {
        quasi_identifiers: q.names.clone(),
        records: h.records(),
        outliers,
        classes: h.classes(),
        threshold: options.threshold,
        prosecutor: Measured::unavailable("no records"),
        prosecutor_wildcard: Measured::unavailable("no records"),
        journalist: Measured::unavailable("no records"),
        marketer: Measured::unavailable("no records"),
        sample_uniqueness: Measured::unavailable("no records"),
        population_uniqueness: Measured::unavailable("no records"),
        suda: Measured::unavailable("not requested"),
        k_map: None,
        delta_presence: None,
        qi_discovery: None,
    };
    if let Some(max) = options.qi_discovery {
        p.qi_discovery = Some(if h.is_empty() {
            Measured::unavailable("no records")
        } else {
            Measured::Value(discovery::discover(q, max)?)
        });
    }
    if h.is_empty() {
        p.suda = Measured::unavailable("no records");
        if let Some(k) = options.k_map {
            p.k_map = Some(KMap {
                k: k.k,
                significance: k.significance,
                sampling_fraction: None,
                population_table: Measured::unavailable("no records"),
                d3: Measured::unavailable("no records"),
                d4: Measured::unavailable("no records"),
            });
        }
        if population_table.is_some() {
            p.delta_presence = Some(Measured::unavailable("no records"));
        }
        return Ok(p);
    }
    p.prosecutor = Measured::Value(sample::prosecutor(&h, options.threshold));
    p.prosecutor_wildcard = match wildcard::prosecutor(q, &grouping, options.threshold) {
        Ok(risk) => Measured::Value(risk),
        Err(e) => Measured::unavailable(e.to_string()),
    };
    drop(grouping);
    let own: Vec<(u64, u64)>;
    let (pairs, against) = match population_table {
        Some(table) => (table.pairs.as_slice(), "population table"),
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
    if let Some(k) = options.k_map {
        let fraction = population.filter(|&size| size >= n).map(|size| n / size);
        let estimate = |zero_truncated: bool| match fraction {
            Some(f) => Measured::Value(kmap::estimate(&h, k, f, zero_truncated)),
            None if population.is_some() => Measured::unavailable(format!(
                "the population ({}) is smaller than the sample ({n} records)",
                population.unwrap_or(0.0)
            )),
            None => Measured::unavailable(
                "no population size (give the population size, the sampling fraction or a population table)",
            ),
        };
        p.k_map = Some(KMap {
            k: k.k,
            significance: k.significance,
            sampling_fraction: fraction,
            population_table: match population_table {
                Some(table) => Measured::Value(kmap::exact(&table.pairs, k.k)),
                None => Measured::unavailable("no population table"),
            },
            d3: estimate(false),
            d4: estimate(true),
        });
    }
    if let Some(table) = population_table {
        p.delta_presence = Some(
            match delta_presence::presence(&table.pairs, table.unmatched, options.presence) {
                Some(v) => Measured::Value(v),
                None => Measured::unavailable("no records"),
            },
        );
    }
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
        let table = population_pairs(&sample, &population).unwrap();
        let p = profile(&sample, &RiskOptions::default(), Some(&table)).unwrap();
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

    proptest::proptest! {
        /// k-map against a population table and δ-presence recomputed row by row: a record's class
        /// size and population class size by counting equal rows.
        #[test]
        fn population_table_models_equal_a_row_by_row_count(
            sample in proptest::collection::vec([0u32..3, 0u32..3], 1..12),
            extra in proptest::collection::vec([0u32..4, 0u32..3], 0..20),
            k in 1u64..6,
        ) {
            let mut population = sample.clone();
            population.extend(extra);
            let table = population_pairs(&columns(&sample), &columns(&population)).unwrap();
            let options = RiskOptions {
                suda: false,
                k_map: Some(kmap::KMapOptions { k, significance: 0.01 }),
                ..RiskOptions::default()
            };
            let p = profile(&columns(&sample), &options, Some(&table)).unwrap();
            let count = |rows: &[[u32; 2]], r: &[u32; 2]| rows.iter().filter(|x| *x == r).count() as u64;
            let n = sample.len() as f64;
            let deltas: Vec<f64> = sample
                .iter()
                .map(|r| count(&sample, r) as f64 / count(&population, r) as f64)
                .collect();
            let Some(Measured::Value(d)) = &p.delta_presence else { panic!("presence") };
            proptest::prop_assert_eq!(d.delta_min, deltas.iter().copied().fold(f64::INFINITY, f64::min));
            proptest::prop_assert_eq!(d.delta_max, deltas.iter().copied().fold(0.0, f64::max));
            proptest::prop_assert!((d.delta_average - deltas.iter().sum::<f64>() / n).abs() < 1e-12);
            let unmatched = population.iter().filter(|r| count(&sample, r) == 0).count() as u64;
            proptest::prop_assert_eq!(d.population_unmatched, unmatched);
            let Some(KMap { population_table: Measured::Value(e), .. }) = &p.k_map else { panic!("k-map") };
            let below = sample.iter().filter(|r| count(&population, r) < k).count() as f64;
            proptest::prop_assert!((e.records_violating - below / n).abs() < 1e-12);
            proptest::prop_assert_eq!(e.satisfied, below == 0.0);
            let smallest = sample.iter().map(|r| count(&population, r)).min().unwrap();
            proptest::prop_assert_eq!(e.smallest_population_class, smallest);
        }
    }
}
