//! Re-identification risk in the workbench (docs/risk.md): `POST /api/v1/tables/{id}/risk` measures
//! a kept table before anonymization on the quasi-identifiers of the page's job, with the engine
//! function `cloakd table risk` uses ([`crate::risk::profile`] over [`of_table`]); and
//! [`record_risk`] is the record-risk histogram and the riskiest classes of a table or a release
//! (the `record_risk` object of the table's risk and of a release, [`super::releases`]).
//!
//! Invariants: the request is validated whole before anything is read (400 naming the field: the
//! options as the engine's rules, SUDA at most [`MAX_SUDA_SIZE`] and within the engine's bounds for
//! the table's rows, the job); measuring takes a table-job place (429 without) and its memory (the
//! parsed table, the profile's columns and grouping, SUDA's bitsets) is reserved from the job's
//! budget before it is allocated (413 naming `tables.max_job_bytes`); the answer holds class sizes,
//! counts, risks and column names, never a value of a quasi-identifier.
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;

use super::error::{ApiError, Code};
use super::{Caller, Workbench, json_response, parse_json, read_body};
use crate::jobs::{JobFailure, JobRecord, Outcome};
use crate::relational::job::JobSpec;
use crate::risk::classes::{QuasiColumns, of_table};
use crate::risk::sample::{risk_bins, riskiest};
use crate::risk::{Population, RiskError, RiskOptions, histogram, profile, profile_bytes, suda};

/// SUDA's largest MSU size the workbench searches (the page measures while the analyst waits).
pub const MAX_SUDA_SIZE: usize = 3;

/// How many of the smallest class sizes `riskiest_classes` lists.
pub const RISKIEST: usize = 10;

/// The most bytes of a risk request's body (a job file and a few numbers).
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The body of `POST /api/v1/tables/{id}/risk`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRiskRequest {
    /// The job (TOML) whose quasi-identifiers the risk is measured on.
    pub job: String,
    pub population: Option<f64>,
    pub sampling_fraction: Option<f64>,
    /// SUDA's largest MSU size; absent or null: no SUDA.
    pub suda_max_size: Option<usize>,
    pub threshold: Option<f64>,
}

/// The request field an engine refusal concerns.
fn field_of(e: &RiskError) -> &'static str {
    match e {
        RiskError::Threshold(_) => "threshold",
        RiskError::PopulationSize(_) => "population",
        RiskError::SamplingFraction(_) => "sampling_fraction",
        RiskError::Suda(_) => "suda_max_size",
        _ => "job",
    }
}

fn risk_error(e: &RiskError) -> ApiError {
    ApiError::invalid(field_of(e), e)
}

/// The request's options and job, checked against the table's `rows` before anything is read.
fn validate(request: &TableRiskRequest, rows: usize) -> Result<(RiskOptions, JobSpec), ApiError> {
    let population = match (request.population, request.sampling_fraction) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "sampling_fraction",
                "given with population (rule: at most one of population and sampling_fraction)",
            ));
        }
        (Some(p), None) => Some(Population::Size(p)),
        (None, Some(f)) => Some(Population::SamplingFraction(f)),
        (None, None) => None,
    };
    if let Some(m) = request.suda_max_size
        && !(1..=MAX_SUDA_SIZE).contains(&m)
    {
        return Err(ApiError::invalid(
            "suda_max_size",
            format!(
                "{m} (rule: the workbench searches MSUs of 1 to {MAX_SUDA_SIZE} quasi-identifiers; cloakd table risk searches larger ones)"
            ),
        ));
    }
    let options = RiskOptions {
        threshold: request
            .threshold
            .unwrap_or(RiskOptions::default().threshold),
        population,
        suda_max_size: request.suda_max_size,
        suda: request.suda_max_size.is_some(),
        ..RiskOptions::default()
    };
    options.validate().map_err(|e| risk_error(&e))?;
    let job = JobSpec::parse("job", &request.job).map_err(|e| ApiError::invalid("job", e))?;
    let quasi = job.quasi_count();
    if let Some(m) = options.suda_max_size {
        suda::check_size(quasi, rows, m).map_err(|e| risk_error(&e.into()))?;
    }
    Ok((options, job))
}

/// The record-risk histogram and the riskiest classes of `q` (a table's or a release's
/// quasi-identifiers): class sizes, counts and risks only.
pub fn record_risk(q: &QuasiColumns, threshold: f64) -> serde_json::Value {
    let h = histogram(q);
    serde_json::json!({
        "threshold": threshold,
        "records": h.records(),
        "outliers": q.rows as u64 - h.records(),
        "classes": h.classes(),
        "bins": risk_bins(&h),
        "riskiest_classes": riskiest(&h, RISKIEST),
    })
}

/// `POST /api/v1/tables/{id}/risk`.
pub async fn table_risk(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let record = JobRecord::start("risk");
    let result = measure(&workbench, &principal.name, &id, request).await;
    record.finish(Outcome::of(result.as_ref().map_err(|e| e.code.failure())));
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

async fn measure(
    workbench: &Arc<Workbench>,
    owner: &str,
    id: &str,
    request: Request,
) -> Result<serde_json::Value, ApiError> {
    let stored = super::hierarchies::table(workbench, owner, id)?;
    let (parts, body) = request.into_parts();
    let bytes = read_body(
        body,
        &parts.headers,
        MAX_REQUEST_BYTES.min(workbench.limits.max_bytes),
    )
    .await?;
    let request: TableRiskRequest = parse_json(&bytes)?;
    let (options, job) = validate(&request, stored.rows)?;
    let slot = workbench.jobs.acquire().map_err(|e| {
        ApiError::new(
            Code::ResourceExhausted,
            None,
            format!("tables.max_concurrent_jobs: {e}"),
        )
    })?;
    let result = workbench
        .jobs
        .run(
            "risk",
            slot,
            |_: &ApiError| false,
            move |_, budget| {
                let table = stored.load(&job, budget)?;
                let quasi = table.quasi.len();
                let suda = options
                    .suda_max_size
                    .map_or(0, |m| suda::suda_bytes(quasi, table.rows(), m));
                let _held = budget
                    .try_reserve(
                        profile_bytes(table.rows(), quasi).saturating_add(suda),
                        "the table's risk profile",
                    )
                    .map_err(|e| ApiError::memory(&e))?;
                let q = of_table(&table);
                drop(table);
                let risk = profile(&q, &options, None).map_err(|e| risk_error(&e))?;
                Ok(serde_json::json!({
                    "risk": risk,
                    "record_risk": record_risk(&q, options.threshold),
                }))
            },
        )
        .await;
    match result {
        Ok((done, _slot)) => done,
        Err(stopped) => Err(ApiError::new(
            Code::of_failure(JobFailure::of_stopped(&stopped)),
            None,
            format!("tables.max_job_ms: {stopped}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: serde_json::Value) -> Result<(RiskOptions, JobSpec), ApiError> {
        let r: TableRiskRequest = parse_json(body.to_string().as_bytes())?;
        validate(&r, 1000)
    }

    const JOB: &str = "[columns]\na = { role = \"quasi\", kind = \"numeric\" }\nb = { role = \"sensitive\" }\n[privacy]\nk = 2\n";

    #[test]
    fn options_are_refused_naming_their_field() {
        let field = |body: serde_json::Value| request(body).unwrap_err().field.unwrap();
        assert_eq!(
            field(serde_json::json!({"job": JOB, "threshold": 2.0})),
            "threshold"
        );
        assert_eq!(
            field(serde_json::json!({"job": JOB, "population": 0.5})),
            "population"
        );
        assert_eq!(
            field(serde_json::json!({"job": JOB, "sampling_fraction": 0.0})),
            "sampling_fraction"
        );
        assert_eq!(
            field(serde_json::json!({"job": JOB, "population": 10.0, "sampling_fraction": 0.5})),
            "sampling_fraction"
        );
        assert_eq!(
            field(serde_json::json!({"job": JOB, "suda_max_size": 0})),
            "suda_max_size"
        );
        assert_eq!(
            field(serde_json::json!({"job": JOB, "suda_max_size": 4})),
            "suda_max_size"
        );
        assert_eq!(field(serde_json::json!({"job": "[columns]"})), "job");
        let (options, _) =
            request(serde_json::json!({"job": JOB, "suda_max_size": 2, "population": 1e6}))
                .unwrap();
        assert!(options.suda);
        assert_eq!(options.population, Some(Population::Size(1e6)));
        let (options, _) = request(serde_json::json!({"job": JOB})).unwrap();
        assert!(!options.suda);
    }
}
