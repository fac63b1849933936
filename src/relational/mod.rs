//! Batch relational anonymization: Mondrian strict multidimensional partitioning (LeFevre et al.)
//! under any combination of k-anonymity, l-diversity (distinct, entropy, probabilistic, recursive),
//! t-closeness (EMD or JS divergence) and delta-disclosure (Brickell & Shmatikov), released by
//! generalization, bucketization (Anatomy) or trivial sanitization, with a report computed from the
//! released rows. The distances between distributions ([`distance`]) live here, below the measures
//! that also use them.
//!
//! Invariants: [`anonymize`] never returns a release that violates a requested model: the whole table
//! is checked first (an unsatisfiable model is an error with the reason), every Mondrian split keeps
//! every class admissible, and the report, recomputed from the released rows, is checked again before
//! the release is handed out. The engine reads no files and no clock; randomness (row order, group
//! ids) comes only from the seed. Long work is cooperative: [`anonymize_unless`] looks at its
//! cancellation flag before each Mondrian split, between the phases and before each class of the
//! report, and gives up with
//! [`AnonymizeError::Cancelled`] (releasing nothing) soon after the flag turns true.
use std::sync::atomic::{AtomicBool, Ordering};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub mod distance;
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
    let report = report::evaluate_unless(&released, &method.to_string(), &models, cancelled)?
        .ok_or(AnonymizeError::Cancelled)?;
    if let Some(check) = report.models.iter().find(|m| m.violating_classes > 0) {
        return Err(AnonymizeError::ReleaseViolates {
            model: check.model.clone(),
            classes: check.violating_classes,
        });
    }
    Ok((released, report))
}
