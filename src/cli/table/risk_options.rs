//! The risk options every command that measures a release's re-identification risk takes, written
//! once: `cloakd table risk`, `table evaluate` and `table anonymize --report` flatten
//! [`RiskOptionArgs`], so the flags have the same names, defaults and validation everywhere
//! (docs/risk.md). Only what the options default to differs, by [`Defaults`]: `table risk` measures
//! every model unless told not to; the reports measure SUDA and k-map only when asked, so a report
//! without risk flags is the one the workbench writes.
//!
//! Invariants: every option is checked, naming its flag and the rule, before a table is read (SUDA's
//! size against the job's quasi-identifiers too); the population table is read like the job's table
//! and matched by [`crate::risk::matching::match_sample`], the one path of every command.
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};

use super::input::load_table;
use crate::relational::job::JobSpec;
use crate::relational::table::Table;
use crate::risk::classes::QuasiColumns;
use crate::risk::delta_presence::PresenceBounds;
use crate::risk::kmap::KMapOptions;
use crate::risk::matching::{Sample, match_sample};
use crate::risk::suda::SudaError;
use crate::risk::{Population, PopulationTable, RiskError, RiskOptions};

/// k-map's significance level when `--k-map-significance` is not given.
pub const DEFAULT_K_MAP_SIGNIFICANCE: f64 = 0.01;

/// The risk options' flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RiskOptionArgs {
    /// The population's size, for population uniqueness, DIS-SUDA and k-map's estimators.
    #[arg(long, value_name = "N", conflicts_with = "sampling_fraction")]
    pub population: Option<f64>,
    /// The sample's share of the population, in (0, 1] (population = records / F).
    #[arg(long, value_name = "F")]
    pub sampling_fraction: Option<f64>,
    /// The population as a CSV with the table's quasi-identifier columns (read like the table): the
    /// journalist and marketer risk, k-map and δ-presence are measured against it.
    #[arg(long, value_name = "CSV")]
    pub population_table: Option<PathBuf>,
    /// SUDA's largest MSU size, at most the quasi-identifiers (`table risk`: default all of them;
    /// `evaluate` and `anonymize --report`: SUDA only with this flag).
    #[arg(long, value_name = "M")]
    pub suda_max_size: Option<usize>,
    /// Skip SUDA (`evaluate` and `anonymize --report` skip it unless --suda-max-size is given).
    #[arg(long, conflicts_with = "suda_max_size")]
    pub no_suda: bool,
    /// k-map's k (`table risk`: default the job's k, if any; `evaluate` and `anonymize --report`:
    /// k-map only with this flag).
    #[arg(long, value_name = "K")]
    pub k_map: Option<u64>,
    /// The significance level of k-map's D3 and D4 estimators [default: 0.01].
    #[arg(long, value_name = "A")]
    pub k_map_significance: Option<f64>,
    /// δ-presence's lower bound (needs --population-table).
    #[arg(long, value_name = "D", requires = "population_table")]
    pub delta_min: Option<f64>,
    /// δ-presence's upper bound (needs --population-table).
    #[arg(long, value_name = "D", requires = "population_table")]
    pub delta_max: Option<f64>,
    /// α-distinction and α-separation of every QI combination of at most this many QIs.
    #[arg(long, value_name = "MAX_SIZE")]
    pub qi_discovery: Option<usize>,
    /// A record is at risk when its risk is above this [default: 0.2].
    #[arg(long, value_name = "T")]
    pub threshold: Option<f64>,
}

/// What the options default to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defaults {
    /// `table risk`: every model; SUDA over all quasi-identifiers unless `--no-suda`, k-map at the
    /// job's k unless `--k-map`.
    Profile,
    /// The `risk` object of `table evaluate`'s and `table anonymize --report`'s reports
    /// ([`crate::jobs::release_report::report_options`]): SUDA only with `--suda-max-size`, k-map only with
    /// `--k-map`.
    Report,
}

/// An engine refusal of the options, under the flag it concerns.
pub fn risk_error(e: RiskError) -> anyhow::Error {
    let flag = match &e {
        RiskError::Threshold(_) => "--threshold",
        RiskError::PopulationSize(_) => "--population",
        RiskError::SamplingFraction(_) => "--sampling-fraction",
        RiskError::Suda(_) => "--suda-max-size",
        RiskError::PopulationTable(_) => "--population-table",
        RiskError::KMapK(_) => "--k-map",
        RiskError::KMapSignificance(_) => "--k-map-significance",
        RiskError::PresenceBound { name: "min", .. } | RiskError::PresenceBounds { .. } => {
            "--delta-min"
        }
        RiskError::PresenceBound { .. } => "--delta-max",
        RiskError::Discovery(_) => "--qi-discovery",
        RiskError::NoQuasiIdentifiers => return anyhow!(e),
    };
    anyhow!("{flag}: {e}")
}

impl RiskOptionArgs {
    /// The flags given, by name (for a command where they apply only with another flag).
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--population", self.population.is_some()),
            ("--sampling-fraction", self.sampling_fraction.is_some()),
            ("--population-table", self.population_table.is_some()),
            ("--suda-max-size", self.suda_max_size.is_some()),
            ("--no-suda", self.no_suda),
            ("--k-map", self.k_map.is_some()),
            ("--k-map-significance", self.k_map_significance.is_some()),
            ("--delta-min", self.delta_min.is_some()),
            ("--delta-max", self.delta_max.is_some()),
            ("--qi-discovery", self.qi_discovery.is_some()),
            ("--threshold", self.threshold.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The options for `job`, validated before any table is read: the engine's rules (errors name
    /// the flag) and SUDA's size at most the job's quasi-identifiers.
    pub fn options(&self, defaults: Defaults, job: &JobSpec) -> anyhow::Result<RiskOptions> {
        let base = match defaults {
            Defaults::Profile => RiskOptions::default(),
            Defaults::Report => crate::jobs::release_report::report_options(),
        };
        let significance = self
            .k_map_significance
            .unwrap_or(DEFAULT_K_MAP_SIGNIFICANCE);
        let k_map = match (self.k_map, defaults) {
            (Some(k), _) => Some(k),
            (None, Defaults::Profile) => job.privacy.k,
            (None, Defaults::Report) => {
                if let Some(a) = self.k_map_significance {
                    bail!(
                        "--k-map-significance {a}: a report measures k-map only with --k-map (rule: give --k-map K with it)"
                    );
                }
                None
            }
        };
        let options = RiskOptions {
            threshold: self.threshold.unwrap_or(base.threshold),
            population: match (self.population, self.sampling_fraction) {
                (Some(n), _) => Some(Population::Size(n)),
                (None, Some(f)) => Some(Population::SamplingFraction(f)),
                (None, None) => None,
            },
            suda_max_size: self.suda_max_size,
            suda: match defaults {
                Defaults::Profile => !self.no_suda,
                Defaults::Report => self.suda_max_size.is_some(),
            },
            k_map: k_map.map(|k| KMapOptions { k, significance }),
            presence: PresenceBounds {
                min: self.delta_min,
                max: self.delta_max,
            },
            qi_discovery: self.qi_discovery,
        };
        options.validate().map_err(risk_error)?;
        if let Some(m) = self.suda_max_size {
            if m == 0 {
                return Err(risk_error(SudaError::MaxSizeZero(0).into()));
            }
            let quasi = job.quasi_count();
            if m > quasi {
                bail!(
                    "--suda-max-size {m}: more than the job's {quasi} quasi-identifiers (rule: 1 <= M <= the quasi-identifiers)"
                );
            }
        }
        Ok(options)
    }

    /// The population table (`--population-table`), read like the job's table.
    pub fn load_population(&self, job: &JobSpec, job_path: &Path) -> anyhow::Result<Option<Table>> {
        let Some(path) = &self.population_table else {
            return Ok(None);
        };
        load_table(job, job_path, Some(path))
            .with_context(|| format!("--population-table {}", path.display()))
            .map(Some)
    }

    /// The population table matched against the sample's classes `q`
    /// ([`crate::risk::matching::match_sample`]), and the options with the population's size
    /// defaulting to its records ([`RiskOptions::with_population_table`]); dropped once matched.
    pub fn match_population(
        &self,
        options: RiskOptions,
        q: &QuasiColumns,
        sample: Sample<'_>,
        population: Option<Table>,
    ) -> anyhow::Result<(RiskOptions, Option<PopulationTable>)> {
        let (Some(population), Some(path)) = (population, &self.population_table) else {
            return Ok((options, None));
        };
        let matched = match_sample(q, sample, &population)
            .map_err(|e| anyhow!("--population-table {}: {e}", path.display()))?;
        Ok((options.with_population_table(&matched), Some(matched)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
input = "t.csv"
[columns]
age = { role = "quasi", kind = "numeric" }
zip = { role = "quasi", kind = "numeric" }
disease = { role = "sensitive" }
[privacy]
k = 3
"#;

    fn job() -> JobSpec {
        JobSpec::parse("job", JOB).unwrap()
    }

    #[test]
    fn without_flags_a_report_measures_what_it_always_did() {
        let args = RiskOptionArgs::default();
        assert_eq!(
            args.options(Defaults::Report, &job()).unwrap(),
            crate::jobs::release_report::report_options()
        );
        let profile = args.options(Defaults::Profile, &job()).unwrap();
        assert!(profile.suda);
        assert_eq!(profile.k_map.map(|k| k.k), Some(3));
    }

    #[test]
    fn suda_max_size_turns_suda_on_in_a_report_and_is_bounded_by_the_quasi_identifiers() {
        let args = RiskOptionArgs {
            suda_max_size: Some(2),
            ..RiskOptionArgs::default()
        };
        let options = args.options(Defaults::Report, &job()).unwrap();
        assert!(options.suda);
        assert_eq!(options.suda_max_size, Some(2));
        for defaults in [Defaults::Profile, Defaults::Report] {
            let e = RiskOptionArgs {
                suda_max_size: Some(3),
                ..RiskOptionArgs::default()
            }
            .options(defaults, &job())
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with("--suda-max-size 3: more than the job's 2 quasi-identifiers"),
                "{e}"
            );
        }
    }

    #[test]
    fn refusals_name_the_flag() {
        let refused = |args: RiskOptionArgs, defaults| {
            args.options(defaults, &job()).unwrap_err().to_string()
        };
        let e = refused(
            RiskOptionArgs {
                threshold: Some(2.0),
                ..RiskOptionArgs::default()
            },
            Defaults::Report,
        );
        assert!(e.starts_with("--threshold: threshold = 2"), "{e}");
        let e = refused(
            RiskOptionArgs {
                suda_max_size: Some(0),
                ..RiskOptionArgs::default()
            },
            Defaults::Profile,
        );
        assert!(e.starts_with("--suda-max-size: suda_max_size = 0"), "{e}");
        let e = refused(
            RiskOptionArgs {
                k_map_significance: Some(0.05),
                ..RiskOptionArgs::default()
            },
            Defaults::Report,
        );
        assert!(e.starts_with("--k-map-significance 0.05:"), "{e}");
        let e = refused(
            RiskOptionArgs {
                delta_min: Some(0.5),
                delta_max: Some(0.1),
                ..RiskOptionArgs::default()
            },
            Defaults::Report,
        );
        assert!(e.starts_with("--delta-min: delta_min = 0.5"), "{e}");
    }
}
