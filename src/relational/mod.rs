//! Batch relational anonymization: Mondrian strict multidimensional partitioning (LeFevre et al.)
//! under any combination of k-anonymity, l-diversity (distinct, entropy, probabilistic, recursive),
//! t-closeness (EMD or JS divergence) and delta-disclosure (Brickell & Shmatikov), released by
//! generalization, bucketization (Anatomy) or trivial sanitization, with a report computed from the
//! released rows.
//!
//! Invariants: [`anonymize`] never returns a release that violates a requested model: the whole table
//! is checked first (an unsatisfiable model is an error with the reason), every Mondrian split keeps
//! every class admissible, and the report, recomputed from the released rows, is checked again before
//! the release is handed out. The engine reads no files and no clock; randomness (row order, group
//! ids) comes only from the seed.
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub mod hierarchy;
pub mod job;
pub mod models;
pub mod mondrian;
pub mod release;
pub mod report;
pub mod table;

#[cfg(test)]
mod tests;

use models::PrivacySpec;
use release::{Release, ReleaseMethod};
use report::Report;
use table::Table;

/// Why a table could not be anonymized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnonymizeError {
    #[error("privacy model {0}")]
    Spec(#[from] models::ModelSpecError),
    #[error(transparent)]
    Unsatisfiable(#[from] mondrian::Unsatisfiable),
    #[error("internal error: the release violates {model} in {classes} classes; nothing released")]
    ReleaseViolates { model: String, classes: u64 },
    #[error("internal error: {0}")]
    Report(#[from] report::ReportError),
}

/// Partitions, releases and reports: the release satisfies every requested model, as checked on the
/// released rows. `report.seconds` is left 0 for the caller to fill in.
pub fn anonymize(
    table: &Table,
    privacy: &PrivacySpec,
    method: ReleaseMethod,
    seed: u64,
) -> Result<(Release, Report), AnonymizeError> {
    privacy.validate()?;
    let models = privacy.models();
    let partitioning = if method == ReleaseMethod::Trivial {
        mondrian::check_whole_table(table, &models, &table.sensitive_distribution())?;
        mondrian::Partitioning::whole_table(table.rows())
    } else {
        mondrian::partition(table, &models)?
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let released = release::release(table, &partitioning, method, &mut rng);
    let report = report::evaluate(&released, &method.to_string(), &models)?;
    if let Some(check) = report.models.iter().find(|m| m.violating_classes > 0) {
        return Err(AnonymizeError::ReleaseViolates {
            model: check.model.clone(),
            classes: check.violating_classes,
        });
    }
    Ok((released, report))
}
