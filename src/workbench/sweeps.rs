//! The workbench's sweeps: `POST /api/v1/sweeps` validates the sweep (the fields and defaults of
//! `cloakd table frontier`'s flags, [`crate::jobs::sweep::SweepPlan`]), takes a table-job place
//! and runs [`crate::jobs::sweep::run_sweep`] in the background; `GET` shows its points as
//! releases finish; `DELETE` cancels it.
//!
//! Invariants: nothing runs before the whole request is validated and the job's table read (errors
//! are 400 naming the field); a sweep holds one place of `tables.max_concurrent_jobs` from its
//! start until its computation stops (429 when none is free); a cancelled sweep's releases see
//! the flag at their engine's next look and its place is freed then; a point's fields are exactly
//! the columns of `frontier.csv` ([`crate::measures::frontier::csv_header`]) plus its `release`
//! index, and `efficient` is [`mark_efficient`] over the points so far. A sweep's size is bounded
//! before anything runs (`tables.max_sweep_values` per list, duplicates removed,
//! `tables.max_sweep_points` releases: 400 past either), so its status is bounded too; its
//! computation holds a memory budget of `tables.max_job_bytes` (a sweep past it fails with
//! `resource_exhausted`; Uloss past it is null with `uloss_unavailable` in the point).
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;

use super::error::{ApiError, Code};
use super::tables::StoredTable;
use super::{Caller, Workbench, json_response, parse_json, read_body};
use crate::budget::MemoryBudget;
use crate::config::TablesConfig;
use crate::jobs::sweep::{SweepLimits, SweepOptions, SweepPlan, default_threads, run_sweep};
use crate::jobs::{JobFailure, JobRecord, Outcome};
use crate::measures::evaluate::{Baseline, EvaluationOptions};
use crate::measures::frontier::{FrontierPoint, csv_header, csv_record, mark_efficient};
use crate::measures::workload::{DEFAULT_MAX_MODEL_CELLS, WorkloadBaseline, WorkloadOptions};
use crate::relational::job::JobSpec;
use crate::relational::table::Table;

/// The body of `POST /api/v1/sweeps`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRequest {
    pub table: String,
    pub job: String,
    pub k: Option<Vec<f64>>,
    pub l: Option<Vec<f64>>,
    pub t: Option<Vec<f64>>,
    pub delta: Option<Vec<f64>>,
    pub t_distance: Option<String>,
    pub methods: Option<Vec<String>>,
    pub algorithms: Option<Vec<String>>,
    pub metric: Option<String>,
    pub max_suppression: Option<f64>,
    pub seed: Option<u64>,
    pub min_support: Option<f64>,
    pub queries: Option<usize>,
    pub qd: Option<usize>,
    pub sel: Option<f64>,
    pub query_seed: Option<u64>,
    pub workload: Option<WorkloadRequest>,
}

/// The learning workload of a sweep (`--workload`, `--classifiers`, `--folds`, `--learning-seed`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRequest {
    pub attribute: String,
    pub classifiers: Option<Vec<String>>,
    pub folds: Option<usize>,
    pub seed: Option<u64>,
}

/// Where a sweep is (its `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Done,
    Cancelled,
    Failed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Done => "done",
            Phase::Cancelled => "cancelled",
            Phase::Failed => "failed",
        }
    }
}

#[derive(Debug)]
struct Progress {
    state: Phase,
    done: usize,
    outcomes: Vec<Option<Result<FrontierPoint, String>>>,
    error: Option<ApiError>,
}

/// One release of a sweep, computed ([`super::releases`] computes it on demand).
pub struct Computed {
    /// Its job (TOML), runnable by `cloakd table anonymize`.
    pub job_toml: String,
    pub release: crate::relational::release::Release,
    pub report: crate::relational::report::Report,
}

/// A sweep, running or finished: what it was asked and what it found so far.
pub struct Sweep {
    /// The job's table (read under the job's roles), shared with the releases.
    pub table: Arc<Table>,
    /// The table's files (for exported jobs).
    pub source: Arc<StoredTable>,
    /// The job as the analyst wrote it.
    pub job_text: String,
    pub job: JobSpec,
    pub plan: SweepPlan,
    progress: Mutex<Progress>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The last release computed (the page asks for the same one several times).
    pub last: Mutex<Option<(usize, Arc<Computed>)>>,
}

impl Sweep {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn running(&self) -> bool {
        self.progress().state == Phase::Running
    }

    fn finish(&self, state: Phase, error: Option<ApiError>) {
        let mut p = self.progress();
        if p.state == Phase::Running {
            p.state = state;
            p.error = error;
        }
    }

    /// Cancels a running sweep: its computation sees the flag, its place is freed then.
    pub fn cancel(&self) {
        self.finish(Phase::Cancelled, None);
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }

    /// The body of `GET /api/v1/sweeps/{id}`.
    fn to_json(&self) -> serde_json::Value {
        let p = self.progress();
        let mut indices = Vec::new();
        let mut points = Vec::new();
        let mut left_out = Vec::new();
        for (i, outcome) in p.outcomes.iter().enumerate() {
            match outcome {
                Some(Ok(point)) => {
                    indices.push(i);
                    points.push(point.clone());
                }
                Some(Err(reason)) => left_out.push(serde_json::json!({
                    "release": i,
                    "reason": reason,
                })),
                None => {}
            }
        }
        mark_efficient(&mut points);
        let header = csv_header();
        let points: Vec<serde_json::Value> = indices
            .iter()
            .zip(&points)
            .map(|(&i, point)| point_json(i, &header, point))
            .collect();
        serde_json::json!({
            "state": p.state.name(),
            "done": p.done,
            "total": self.plan.items.len(),
            "error": p.error.as_ref().map(ApiError::to_json),
            "points": points,
            "left_out": left_out,
        })
    }
}

/// A point as JSON: `release` and every column of `frontier.csv` by its name, numbers as numbers,
/// `efficient` as a boolean, empty cells as null; `uloss_unavailable` when Uloss is null for want
/// of memory.
fn point_json(release: usize, header: &[String], point: &FrontierPoint) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("release".into(), release.into());
    for (name, value) in header.iter().zip(csv_record(point)) {
        let json = match name.as_str() {
            "model" | "method" | "algorithm" => serde_json::Value::String(value),
            "efficient" => serde_json::Value::Bool(value == "true"),
            _ if value.is_empty() => serde_json::Value::Null,
            _ => value
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or(serde_json::Value::String(value), serde_json::Value::Number),
        };
        object.insert(name.clone(), json);
    }
    if let Some(reason) = &point.evaluation.uloss_unavailable {
        object.insert("uloss_unavailable".into(), reason.clone().into());
    }
    serde_json::Value::Object(object)
}

/// The validated request: the sweep and its measurements.
struct Validated {
    plan: SweepPlan,
    options: EvaluationOptions,
    workload: Option<WorkloadOptions>,
    job: JobSpec,
}

fn validate(request: &SweepRequest, limits: &TablesConfig) -> Result<Validated, ApiError> {
    let max_queries = limits.max_queries;
    let defaults = SweepOptions::default();
    let plan = SweepPlan::new(
        &SweepOptions {
            k: request.k.clone(),
            l: request.l.clone(),
            t: request.t.clone(),
            delta: request.delta.clone(),
            t_distance: request.t_distance.clone().unwrap_or(defaults.t_distance),
            methods: request.methods.clone().unwrap_or(defaults.methods),
            algorithms: request.algorithms.clone().unwrap_or(defaults.algorithms),
            metric: request.metric.clone().unwrap_or(defaults.metric),
            max_suppression: request.max_suppression.unwrap_or(defaults.max_suppression),
            seed: request.seed.unwrap_or(defaults.seed),
        },
        SweepLimits::of(limits),
    )
    .map_err(|e| ApiError::new(Code::InvalidArgument, Some(e.field), e.to_string()))?;
    let d = EvaluationOptions::default();
    let options = EvaluationOptions {
        min_support: request.min_support.unwrap_or(d.min_support),
        queries: request.queries.unwrap_or(d.queries),
        qd: request.qd.unwrap_or(d.qd),
        sel: request.sel.unwrap_or(d.sel),
        seed: request.query_seed.unwrap_or(d.seed),
    };
    if options.queries > max_queries {
        return Err(ApiError::invalid(
            "queries",
            format!(
                "{} is more than tables.max_queries = {max_queries}",
                options.queries
            ),
        ));
    }
    options
        .validate()
        .map_err(|e| ApiError::invalid(e.option, &e))?;
    let workload = match &request.workload {
        None => None,
        Some(w) => Some(
            WorkloadOptions::parse(
                &w.attribute,
                w.classifiers.as_ref().map(|c| c.iter().map(String::as_str)),
                w.folds,
                w.seed,
            )
            .map_err(|e| ApiError::invalid("workload", e))?,
        ),
    };
    let job = JobSpec::parse("job", &request.job).map_err(|e| ApiError::invalid("job", e))?;
    Ok(Validated {
        plan,
        options,
        workload,
        job,
    })
}

/// Why a sweep's computation ended early.
enum SweepFailure {
    Cancelled,
    Failed(ApiError),
}

pub async fn create(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    match start(&workbench, &principal.name, &parts.headers, body).await {
        Ok((id, total)) => json_response(
            StatusCode::ACCEPTED,
            &serde_json::json!({"sweep": id, "total": total}),
        ),
        Err(e) => e.into_response(),
    }
}

async fn start(
    workbench: &Arc<Workbench>,
    owner: &str,
    headers: &http::HeaderMap,
    body: Body,
) -> Result<(String, usize), ApiError> {
    let bytes = read_body(body, headers, workbench.limits.max_bytes).await?;
    let request: SweepRequest = parse_json(&bytes)?;
    let source = workbench
        .tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(owner, &request.table)
        .ok_or_else(|| ApiError::not_found("table", "table", &request.table))?;
    let Validated {
        plan,
        options,
        workload,
        job,
    } = validate(&request, &workbench.limits)?;
    let slot = workbench.jobs.acquire().map_err(|e| {
        ApiError::new(
            Code::ResourceExhausted,
            None,
            format!("tables.max_concurrent_jobs: {e}"),
        )
    })?;
    let (loaded, slot) = {
        let (source, job) = (Arc::clone(&source), job.clone());
        workbench
            .jobs
            .run(
                "sweep",
                slot,
                |_: &ApiError| false,
                move |_, budget| source.load(&job, budget),
            )
            .await
            .map_err(|e| ApiError::new(Code::Internal, None, e.to_string()))?
    };
    let table = Arc::new(loaded?);
    let total = plan.items.len();
    let sweep = Arc::new(Sweep {
        table: Arc::clone(&table),
        source,
        job_text: request.job,
        job,
        plan,
        progress: Mutex::new(Progress {
            state: Phase::Running,
            done: 0,
            outcomes: vec![None; total],
            error: None,
        }),
        task: Mutex::new(None),
        last: Mutex::new(None),
    });
    let id = workbench
        .sweeps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(owner, Arc::clone(&sweep), |s| !s.running());
    let record = JobRecord::start("sweep");
    let jobs = workbench.jobs.clone();
    let running = Arc::clone(&sweep);
    let task = tokio::spawn(async move {
        let work = {
            let sweep = Arc::clone(&running);
            move |cancelled: &AtomicBool, budget: &MemoryBudget| {
                compute(&sweep, options, workload, budget, cancelled)
            }
        };
        let stopped = |e: &SweepFailure| matches!(e, SweepFailure::Cancelled);
        match jobs.run("sweep", slot, stopped, work).await {
            Ok((Ok(()), _)) => {
                running.finish(Phase::Done, None);
                record.finish(Outcome::Ok);
            }
            Ok((Err(SweepFailure::Cancelled), _)) => {
                running.finish(Phase::Cancelled, None);
                record.finish(Outcome::Cancelled);
            }
            Ok((Err(SweepFailure::Failed(e)), _)) => {
                let outcome = e.code.failure().outcome();
                running.finish(Phase::Failed, Some(e));
                record.finish(outcome);
            }
            Err(stopped) => {
                let failure = JobFailure::of_stopped(&stopped);
                running.finish(
                    Phase::Failed,
                    Some(ApiError::new(
                        Code::of_failure(failure),
                        None,
                        format!("tables.max_job_ms: {stopped}"),
                    )),
                );
                record.finish(failure.outcome());
            }
        }
    });
    *sweep.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
    Ok((id, total))
}

/// The sweep's computation, on its blocking thread: the baselines, then every release.
fn compute(
    sweep: &Sweep,
    options: EvaluationOptions,
    workload: Option<WorkloadOptions>,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
) -> Result<(), SweepFailure> {
    let table = &sweep.table;
    let baseline = Baseline::new_unless(table, options, budget, cancelled)
        .map_err(|e| SweepFailure::Failed(ApiError::invalid(e.option, &e)))?
        .ok_or(SweepFailure::Cancelled)?;
    // The original's learning datasets, held for the whole sweep.
    let _datasets = match &workload {
        Some(_) => Some(
            budget
                .try_reserve(
                    crate::measures::workload::datasets_bytes(table),
                    "the learning workload's datasets",
                )
                .map_err(|e| SweepFailure::Failed(ApiError::memory(&e)))?,
        ),
        None => None,
    };
    let learning = match workload {
        Some(options) => Some(
            WorkloadBaseline::new_unless(table, options, DEFAULT_MAX_MODEL_CELLS, cancelled)
                .map_err(|e| SweepFailure::Failed(ApiError::invalid("workload", e)))?
                .ok_or(SweepFailure::Cancelled)?,
        ),
        None => None,
    };
    run_sweep(
        table,
        &baseline,
        learning.as_ref(),
        &sweep.plan,
        default_threads(),
        budget,
        cancelled,
        &|i, outcome| {
            let mut p = sweep.progress();
            if p.state == Phase::Running {
                p.outcomes[i] = Some(outcome.clone());
                p.done += 1;
            }
        },
    )
    .map_err(|e| SweepFailure::Failed(ApiError::memory(&e)))?;
    if cancelled.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(SweepFailure::Cancelled);
    }
    Ok(())
}

/// The sweep `id` of the caller.
pub fn find(workbench: &Workbench, owner: &str, id: &str) -> Result<Arc<Sweep>, ApiError> {
    workbench
        .sweeps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(owner, id)
        .ok_or_else(|| ApiError::not_found("id", "sweep", id))
}

pub async fn status(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    match find(&workbench, &principal.name, &id) {
        Ok(sweep) => json_response(StatusCode::OK, &sweep.to_json()),
        Err(e) => e.into_response(),
    }
}

pub async fn cancel(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    match find(&workbench, &principal.name, &id) {
        Ok(sweep) => {
            sweep.cancel();
            json_response(StatusCode::OK, &sweep.to_json())
        }
        Err(e) => e.into_response(),
    }
}

impl Workbench {
    /// Cancels every running sweep (at shutdown).
    pub fn cancel_all(&self) {
        let sweeps = self.sweeps.lock().unwrap_or_else(|p| p.into_inner());
        for (_, sweep) in sweeps.items.values() {
            sweep.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Random sweep requests through the real parsing and validation: never a panic, either a plan
    //! within the limits or an error naming its field and rule.
    use super::*;
    use proptest::prelude::*;

    fn limits() -> TablesConfig {
        let mut limits = crate::config::Config::embedded_defaults().tables;
        limits.max_sweep_values = 6;
        limits.max_sweep_points = 20;
        limits
    }

    fn number() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            (-3i64..8).prop_map(serde_json::Value::from),
            (-2.0f64..8.0).prop_map(serde_json::Value::from),
            Just(serde_json::Value::from(0.5)),
            Just(serde_json::Value::from(1e300)),
            Just(serde_json::Value::from("3")),
            Just(serde_json::Value::Null),
        ]
    }

    fn list<T: Strategy<Value = serde_json::Value>>(
        item: T,
    ) -> impl Strategy<Value = Option<serde_json::Value>> {
        proptest::option::of(prop_oneof![
            prop::collection::vec(item, 0..10).prop_map(serde_json::Value::from),
            Just(serde_json::Value::from(7)),
        ])
    }

    fn word(words: &'static [&'static str]) -> impl Strategy<Value = serde_json::Value> {
        prop::sample::select(words).prop_map(serde_json::Value::from)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_plans_are_a_bounded_plan_or_a_named_error(
            k in list(number()),
            l in list(number()),
            t in list(number()),
            delta in list(number()),
            methods in list(word(&["generalization", "bucketization", "anatomy", ""])),
            algorithms in list(word(&["mondrian", "kaca", "ola", "incognito"])),
            t_distance in proptest::option::of(word(&["js", "emd", "x"])),
            metric in proptest::option::of(word(&["dm", "whd", "loss", "?"])),
            max_suppression in proptest::option::of(number()),
            queries in proptest::option::of(0usize..3),
            stray in any::<bool>(),
        ) {
            let mut body = serde_json::json!({"table": "t", "job": "[columns]\na = { role = \"sensitive\" }\n"});
            for (key, value) in [
                ("k", k), ("l", l), ("t", t), ("delta", delta), ("methods", methods),
                ("algorithms", algorithms), ("t_distance", t_distance), ("metric", metric),
                ("max_suppression", max_suppression),
                ("queries", queries.map(serde_json::Value::from)),
                ("bogus", stray.then(|| serde_json::Value::from(1))),
            ] {
                if let Some(value) = value {
                    body[key] = value;
                }
            }
            let bytes = serde_json::to_vec(&body).unwrap();
            let limits = limits();
            let validated = parse_json::<SweepRequest>(&bytes).and_then(|r| validate(&r, &limits));
            match validated {
                Ok(v) => {
                    prop_assert!(!v.plan.items.is_empty());
                    prop_assert!(v.plan.items.len() <= limits.max_sweep_points);
                    for (i, a) in v.plan.items.iter().enumerate() {
                        prop_assert!(v.plan.privacy(a).validate().is_ok(), "{a:?}");
                        for b in &v.plan.items[i + 1..] {
                            prop_assert!(a != b, "{a:?} twice");
                        }
                    }
                }
                Err(e) => {
                    prop_assert_eq!(e.code, Code::InvalidArgument);
                    let field = e.field.clone().unwrap_or_default();
                    prop_assert!(!field.is_empty() && e.message.contains(&field), "{e:?}");
                }
            }
        }
    }
}
