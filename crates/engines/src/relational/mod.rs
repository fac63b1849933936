//! Batch relational anonymization: Mondrian strict multidimensional partitioning (LeFevre et al.),
//! KACA local recoding by clustering in the hierarchies ([`kaca`], Li, Wong, Fu & Pei) or OLA
//! optimal full-domain generalization with suppression ([`ola`], El Emam et al.), under any
//! combination of k-anonymity, l-diversity (distinct, entropy, probabilistic, recursive),
//! t-closeness (EMD or JS divergence) and delta-disclosure (Brickell & Shmatikov), released by
//! generalization, bucketization (Anatomy) or trivial sanitization, with a report computed from the
//! released rows and, for every algorithm, the distortion measures of
//! [`crate::relational::distortion`] over the release's cell-by-cell [`recoding`]. The distances
//! between distributions ([`distance`]) live here, below the measures that also use them.
//!
//! Invariants: [`anonymize`] never returns a release that violates a requested model: the whole table
//! is checked first (an unsatisfiable model is an error with the reason), every Mondrian split keeps
//! every class admissible, and the report, recomputed from the released rows, is checked again before
//! the release is handed out. The engine reads no files and no clock; randomness (row order, group
//! ids) comes only from the seed. Every release, whatever the algorithm, is finally put in an order
//! drawn from the seed and its released content ([`attacks::order_seed`]), so two releases of one
//! table with different generalizations do not join by row order, and its report measures the
//! barriers paper's attacks ([`attacks`]). Long work is cooperative: [`anonymize_unless`] looks at its
//! cancellation flag before each Mondrian split, between the phases and before each class of the
//! report, and gives up with
//! [`AnonymizeError::Cancelled`] (releasing nothing) soon after the flag turns true.
use std::sync::atomic::{AtomicBool, Ordering};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub mod attacks;
pub mod distance;
pub mod distortion;
pub mod groupify;
pub mod hierarchy;
pub mod job;
pub mod kaca;
pub mod models;
pub mod mondrian;
pub mod ola;
pub mod population;
pub mod recoding;
pub mod release;
pub mod report;
pub mod special;
pub mod table;

#[cfg(test)]
mod attacks_tests;
#[cfg(test)]
mod kaca_tests;
#[cfg(test)]
mod ola_tests;
#[cfg(test)]
mod risk_bounds_tests;
#[cfg(test)]
mod tests;

use models::PrivacySpec;
use ola::Metric;
use release::{Release, ReleaseMethod};
use report::Report;
use table::Table;

/// How the equivalence classes are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// Strict multidimensional partitioning ([`mondrian`]).
    #[default]
    Mondrian,
    /// Local recoding by clustering in the hierarchies ([`kaca`]).
    Kaca,
    /// Optimal full-domain generalization with suppression ([`ola`]).
    Ola,
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Algorithm, String> {
        match s {
            "mondrian" => Ok(Algorithm::Mondrian),
            "kaca" => Ok(Algorithm::Kaca),
            "ola" => Ok(Algorithm::Ola),
            other => Err(format!(
                "unknown algorithm {other:?} (known: mondrian, kaca, ola)"
            )),
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Algorithm::Mondrian => "mondrian",
            Algorithm::Kaca => "kaca",
            Algorithm::Ola => "ola",
        })
    }
}

/// The algorithm and its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlgorithmOptions {
    pub algorithm: Algorithm,
    /// OLA's information-loss metric.
    pub metric: Metric,
    /// OLA: the share of rows that may be suppressed, in [0, 1].
    pub max_suppression: f64,
    /// Exponent of the height weights of the reported WHD (>= 1).
    pub beta: f64,
}

impl AlgorithmOptions {
    /// Checks the options against each other and the release method; the error is the rule.
    pub fn validate(&self, method: ReleaseMethod) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.max_suppression) {
            return Err(format!(
                "max_suppression = {} must lie in [0, 1]",
                self.max_suppression
            ));
        }
        crate::relational::distortion::validate_beta(self.beta).map_err(|e| e.to_string())?;
        if self.algorithm != Algorithm::Mondrian && method != ReleaseMethod::Generalization {
            return Err(format!(
                "algorithm {} releases by generalization only (got method {method})",
                self.algorithm
            ));
        }
        if self.algorithm != Algorithm::Ola && self.max_suppression != 0.0 {
            return Err(format!(
                "max_suppression = {} applies to algorithm ola only (got algorithm {}): set it to 0",
                self.max_suppression, self.algorithm
            ));
        }
        Ok(())
    }
}

impl Default for AlgorithmOptions {
    fn default() -> AlgorithmOptions {
        AlgorithmOptions {
            algorithm: Algorithm::Mondrian,
            metric: Metric::Dm,
            max_suppression: 0.0,
            beta: 1.0,
        }
    }
}

/// Why a table could not be anonymized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnonymizeError {
    #[error("privacy model {0}")]
    Spec(#[from] models::ModelSpecError),
    #[error(transparent)]
    Unsatisfiable(#[from] mondrian::Unsatisfiable),
    #[error("ola: {0}")]
    Ola(ola::OlaError),
    #[error("kaca: {0}")]
    Kaca(kaca::KacaError),
    #[error("{0}")]
    Options(String),
    #[error("internal error: the release violates {model} in {classes} classes; nothing released")]
    ReleaseViolates { model: String, classes: u64 },
    /// The release's measured risk exceeds a configured bound (the criterion, bound and value).
    #[error("release refused: {0}; nothing released")]
    RiskBound(models::ReleaseViolation),
    #[error("internal error: {0}")]
    Report(#[from] report::ReportError),
    /// The caller's cancellation flag turned true; nothing was released.
    #[error("cancelled before the release was complete; nothing released")]
    Cancelled,
}

impl From<mondrian::PartitionError> for AnonymizeError {
    fn from(e: mondrian::PartitionError) -> AnonymizeError {
        match e {
            mondrian::PartitionError::Unsatisfiable(u) => AnonymizeError::Unsatisfiable(u),
            mondrian::PartitionError::Cancelled => AnonymizeError::Cancelled,
        }
    }
}

/// Partitions, releases and reports: the release satisfies every requested model, as checked on the
/// released rows. `report.seconds` is left 0 for the caller to fill in.
pub fn anonymize(
    table: &Table,
    privacy: &PrivacySpec,
    method: ReleaseMethod,
    seed: u64,
) -> Result<(Release, Report), AnonymizeError> {
    anonymize_unless(table, privacy, method, seed, &AtomicBool::new(false))
}

/// [`anonymize`], giving up with [`AnonymizeError::Cancelled`] soon after `cancelled` turns true (it
/// is looked at before every Mondrian split, between partitioning, release and report, and before
/// each class of the report): the
/// daemon sets it when the caller goes away or its deadline passes.
pub fn anonymize_unless(
    table: &Table,
    privacy: &PrivacySpec,
    method: ReleaseMethod,
    seed: u64,
    cancelled: &AtomicBool,
) -> Result<(Release, Report), AnonymizeError> {
    anonymize_with(
        table,
        privacy,
        method,
        seed,
        &AlgorithmOptions::default(),
        cancelled,
    )
}

/// [`anonymize_unless`] with a chosen algorithm. KACA and OLA release by generalization only; every
/// release is checked from its released rows, and its report carries the distortion measures and the
/// attacks ([`attacks`]). The algorithm's release, drawn in [`release::release_order`] from the seed,
/// is reordered once more with a seed mixed from the seed and the released content, and the report
/// measures the final order against the input order (unsorted matching).
pub fn anonymize_with(
    table: &Table,
    privacy: &PrivacySpec,
    method: ReleaseMethod,
    seed: u64,
    options: &AlgorithmOptions,
    cancelled: &AtomicBool,
) -> Result<(Release, Report), AnonymizeError> {
    let (mut released, mut report) =
        form_release(table, privacy, method, seed, options, cancelled)?;
    // Every algorithm's release function draws its order first from a ChaCha8 seeded with `seed`.
    let first = release::release_order(table.rows(), &mut ChaCha8Rng::seed_from_u64(seed));
    let last = attacks::reorder(seed, &mut released);
    let source: Vec<u32> = last.iter().map(|&i| first[i as usize]).collect();
    report.attacks.unsorted_matching = Some(attacks::unsorted_matching(&source));
    Ok((released, report))
}

/// Refuses risk bounds on a bucketized release (its QI table publishes the exact quasi-identifiers,
/// so no bound could hold by construction); the rule, for the engine and the adapters that check a
/// job before its rows arrive.
pub fn check_risk_release(privacy: &PrivacySpec, method: ReleaseMethod) -> Result<(), String> {
    if method == ReleaseMethod::Bucketization && !privacy.risk.is_empty() {
        return Err(
            "max_risk_highest, max_risk_average and population_uniqueness bound generalization and trivial releases (rule: bucketization publishes the exact quasi-identifiers)".into(),
        );
    }
    Ok(())
}

/// Forms the classes with the chosen algorithm and releases them (rows in [`release::release_order`]
/// drawn from a ChaCha8 seeded with `seed`).
fn form_release(
    table: &Table,
    privacy: &PrivacySpec,
    method: ReleaseMethod,
    seed: u64,
    options: &AlgorithmOptions,
    cancelled: &AtomicBool,
) -> Result<(Release, Report), AnonymizeError> {
    options.validate(method).map_err(AnonymizeError::Options)?;
    check_risk_release(privacy, method).map_err(AnonymizeError::Options)?;
    match options.algorithm {
        Algorithm::Mondrian => {}
        Algorithm::Ola => {
            privacy.validate()?;
            let models = privacy.models();
            let found = ola::ola_unless(
                table,
                privacy,
                options.metric,
                options.max_suppression,
                cancelled,
            )
            .map_err(|e| match e {
                ola::OlaError::Cancelled => AnonymizeError::Cancelled,
                other => AnonymizeError::Ola(other),
            })?;
            let (released, mut report) = release_recoded(
                table,
                &found.recoding,
                Algorithm::Ola,
                seed,
                options.beta,
                &models,
                cancelled,
            )?;
            report.lattice = Some(report::LatticeSearch {
                metric: options.metric.to_string(),
                max_suppression: options.max_suppression,
                levels: found.levels,
                loss: found.loss,
                lattice_size: found.lattice_size,
                nodes_checked: found.nodes_checked,
            });
            return Ok((released, report));
        }
        Algorithm::Kaca => {
            privacy.validate()?;
            let models = privacy.models();
            // The clustering draws from a stream of its own, so the release order is drawn first
            // from `seed` as for every algorithm (what `anonymize_with` measures it against).
            let mut draws = ChaCha8Rng::seed_from_u64(seed);
            draws.set_stream(1);
            let found = kaca::kaca_unless(table, privacy, options.beta, &mut draws, cancelled)
                .map_err(|e| match e {
                    kaca::KacaError::Cancelled => AnonymizeError::Cancelled,
                    kaca::KacaError::Unsatisfiable(u) => AnonymizeError::Unsatisfiable(u),
                    other => AnonymizeError::Kaca(other),
                })?;
            return release_recoded(
                table,
                &found.recoding,
                Algorithm::Kaca,
                seed,
                options.beta,
                &models,
                cancelled,
            );
        }
    }
    let check = || {
        if cancelled.load(Ordering::Relaxed) {
            Err(AnonymizeError::Cancelled)
        } else {
            Ok(())
        }
    };
    privacy.validate()?;
    let models = privacy.models();
    let partitioning = if method == ReleaseMethod::Trivial {
        mondrian::check_whole_table(table, &models, &table.sensitive_distribution())?;
        mondrian::Partitioning::whole_table(table.rows())
    } else {
        mondrian::partition_unless(table, &models, cancelled)?
    };
    check()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let released = release::release(table, &partitioning, method, &mut rng);
    check()?;
    let mut report = checked_report(&released, &method.to_string(), &models, cancelled)?;
    report.algorithm = Algorithm::Mondrian.to_string();
    let recoding = match method {
        ReleaseMethod::Generalization => recoding::Recoding::of_partitioning(table, &partitioning),
        ReleaseMethod::Trivial => recoding::Recoding::of_partitioning(
            table,
            &mondrian::Partitioning::whole_table(table.rows()),
        ),
        ReleaseMethod::Bucketization => recoding::Recoding::identity(table),
    };
    let mut distortion = crate::relational::distortion::distortion(table, &recoding, options.beta);
    if method == ReleaseMethod::Bucketization {
        distortion.discernibility = crate::relational::distortion::bucket_discernibility(
            partitioning.classes.iter().map(|c| c.len() as u64),
        );
    }
    report.distortion = Some(distortion);
    Ok((released, report))
}

/// The release of a recoding found by KACA or OLA: rows in [`release::release_order`] drawn from a
/// ChaCha8 seeded with `seed`, the report checked from the released rows, with the algorithm's name
/// and the distortion measures of the recoding.
fn release_recoded(
    table: &Table,
    recoding: &recoding::Recoding,
    algorithm: Algorithm,
    seed: u64,
    beta: f64,
    models: &models::ModelSet,
    cancelled: &AtomicBool,
) -> Result<(Release, Report), AnonymizeError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let released = recoding::release_generalized(table, recoding, &mut rng);
    let mut report = checked_report(&released, "generalization", models, cancelled)?;
    report.algorithm = algorithm.to_string();
    report.distortion = Some(distortion::distortion(table, recoding, beta));
    Ok((released, report))
}

/// The report of a release, computed from its rows; an error if any class violates a model.
fn checked_report(
    released: &Release,
    name: &str,
    models: &models::ModelSet,
    cancelled: &AtomicBool,
) -> Result<Report, AnonymizeError> {
    let report = report::evaluate_unless(released, name, models, cancelled)?
        .ok_or(AnonymizeError::Cancelled)?;
    if let Some(check) = report.models.iter().find(|m| m.violating_classes > 0) {
        return Err(AnonymizeError::ReleaseViolates {
            model: check.model.clone(),
            classes: check.violating_classes,
        });
    }
    if let Release::Generalized(table) = released
        && let Some(violation) = models.release_violation(released_class_sizes(table))
    {
        return Err(AnonymizeError::RiskBound(violation));
    }
    Ok(report)
}

/// The sizes of a generalized release's classes on its released quasi-identifiers, rows whose every
/// quasi-identifier is `*` left out (as the risk engine measures a release, docs/risk.md).
pub fn released_class_sizes(table: &release::ReleasedTable) -> Vec<u64> {
    let quasi: Vec<&release::ReleasedColumn> = table
        .columns
        .iter()
        .filter(|c| c.role == release::ReleasedRole::Quasi)
        .collect();
    let wildcard: Vec<Option<u32>> = quasi
        .iter()
        .map(|c| c.dictionary.iter().position(|v| v == "*").map(|p| p as u32))
        .collect();
    let mut sizes: std::collections::HashMap<Vec<u32>, u64> = Default::default();
    for r in 0..table.rows {
        let key: Vec<u32> = quasi.iter().map(|c| c.codes[r]).collect();
        let outlier = !key.is_empty() && key.iter().zip(&wildcard).all(|(&k, w)| Some(k) == *w);
        if !outlier {
            *sizes.entry(key).or_default() += 1;
        }
    }
    sizes.into_values().collect()
}
