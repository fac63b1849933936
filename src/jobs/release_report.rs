//! The JSON report of one release, the same for `cloakd table anonymize --report` and the
//! workbench's `report.json`: the engine's report and the release's re-identification risk (the
//! `risk` object of `table evaluate`'s report: without options, [`report_options`]; the command line
//! may ask for more, with the flags of `table risk`).
//!
//! Invariants: pure (the risk is computed from the released rows); the same release gives the same
//! bytes through either caller.
use crate::relational::release::Release;
use crate::relational::report::Report;

/// The report and the risk, serialized side by side (`risk` after the report's keys).
#[derive(serde::Serialize)]
pub struct AnonymizeReport<'a> {
    #[serde(flatten)]
    pub report: &'a Report,
    pub risk: &'a crate::risk::RiskProfile,
}

/// The risk options of a report when none are given: the sample-based models without SUDA
/// (`table evaluate` and `table anonymize --report` measure more when told, by the same flags as
/// `table risk`).
pub fn report_options() -> crate::risk::RiskOptions {
    crate::risk::RiskOptions {
        suda: false,
        ..crate::risk::RiskOptions::default()
    }
}

/// The risk profile of a release on its released quasi-identifiers (bucketization: its QI table),
/// as `table evaluate` measures it without risk options ([`report_options`]).
pub fn release_risk(
    released: &Release,
) -> Result<crate::risk::RiskProfile, crate::risk::RiskError> {
    crate::risk::profile(
        &crate::risk::classes::of_release(released.quasi_table()),
        &report_options(),
        None,
    )
}
