//! One release of a sweep, recomputed on demand (deterministic by the job and its seed; only the
//! last one computed per sweep is kept): its job (TOML that `cloakd table anonymize` runs to the same
//! release), its report (byte for byte what `--report` writes), class sizes, a preview of rows, the
//! downloads, and the sensitive distribution of one class against the table's.
//!
//! Invariants: the CSV downloads write formula-like cells as the job's `[release] formulas` says
//! (neutralized unless it says `keep`), as `cloakd table anonymize` does with the exported job; a
//! release's job is the sweep's job text with `[privacy]` and `[release]` replaced by
//! the release's (checked by parsing it back before it is served); recomputing holds a table-job
//! place like any other table job; downloads are `attachment`s with `Cache-Control: no-store`.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use super::error::{ApiError, Code};
use super::sweeps::{Computed, Sweep, find};
use super::tables::toml_string;
use super::{Caller, Workbench, json_response};
use crate::jobs::{JobFailure, JobRecord, Outcome, anonymize_job};
use crate::relational::AnonymizeError;
use crate::relational::job::JobSpec;
use crate::relational::models::PrivacySpec;
use crate::relational::release::{self, Release, ReleasedRole};
use crate::relational::report::Report;

/// Rows of a release's preview.
pub const PREVIEW_ROWS: usize = 100;

/// `[privacy]` of a release, as TOML lines.
fn privacy_toml(privacy: &PrivacySpec) -> String {
    let mut out = String::from("[privacy]\n");
    if let Some(k) = privacy.k {
        out.push_str(&format!("k = {k}\n"));
    }
    if let Some(l) = &privacy.l {
        out.push_str(&format!("l = {}\n", toml_string(&l.to_string())));
    }
    if let Some(t) = &privacy.t {
        out.push_str(&format!("t = {}\n", toml_string(&t.to_string())));
    }
    if let Some(delta) = privacy.delta {
        out.push_str(&format!("delta = {}\n", toml::Value::Float(delta)));
    }
    out
}

/// The spec of release `n` of the sweep: the sweep's job with the release's privacy, method, seed
/// and algorithm.
fn release_spec(sweep: &Sweep, n: usize) -> JobSpec {
    let item = sweep.plan.items[n];
    let mut spec = sweep.job.clone();
    spec.privacy = sweep.plan.privacy(&item);
    spec.release = item.method;
    spec.seed = sweep.plan.seed;
    spec.algorithm = sweep.plan.algorithm_options(item.algorithm);
    spec
}

/// The sweep's job text without its `[privacy]`, `[release]` and `[sweep]` sections (a section
/// runs from its header line to the next header line).
fn without_sections(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let name = trimmed
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            skipping = name == "privacy"
                || name == "release"
                || name == "sweep"
                || name.starts_with("sweep.");
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// The TOML of release `n`: runnable by `cloakd table anonymize` with the same result.
pub fn release_job_toml(sweep: &Sweep, n: usize) -> Result<String, ApiError> {
    let item = sweep.plan.items[n];
    let spec = release_spec(sweep, n);
    let mut text = without_sections(&sweep.job_text);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "\n# Release {n} of a workbench sweep: {} {} by {} with {}.\n",
        item.model.name(),
        item.parameter,
        item.method,
        item.algorithm
    ));
    text.push_str(&privacy_toml(&spec.privacy));
    text.push_str(&format!(
        "\n[release]\nmethod = {}\nalgorithm = {}\nseed = {}\n",
        toml_string(&item.method.to_string()),
        toml_string(&item.algorithm.to_string()),
        spec.seed
    ));
    if spec.formulas != crate::relational::release::Formulas::default() {
        text.push_str(&format!(
            "formulas = {}\n",
            toml_string(&spec.formulas.to_string())
        ));
    }
    if item.algorithm == crate::relational::Algorithm::Ola {
        text.push_str(&format!(
            "metric = {}\nmax_suppression = {}\n",
            toml_string(&spec.algorithm.metric.to_string()),
            toml::Value::Float(spec.algorithm.max_suppression)
        ));
    }
    // The job must say exactly what the release is.
    let back = JobSpec::parse("job.toml", &text)
        .map_err(|e| ApiError::internal(format!("the exported job does not parse: {e}")))?;
    if back.privacy != spec.privacy
        || back.release != spec.release
        || back.seed != spec.seed
        || back.algorithm != spec.algorithm
        || back.formulas != spec.formulas
        || back.columns.len() != spec.columns.len()
    {
        return Err(ApiError::internal(
            "the exported job does not state the release (rule: [privacy] and [release] are replaced whole; write them as sections, not dotted keys)",
        ));
    }
    Ok(text)
}

fn index(sweep: &Sweep, n: &str) -> Result<usize, ApiError> {
    n.parse::<usize>()
        .ok()
        .filter(|&n| n < sweep.plan.items.len())
        .ok_or_else(|| {
            ApiError::new(
                Code::NotFound,
                Some("n"),
                format!(
                    "n: no release {} in this sweep (rule: 0 <= n < {})",
                    crate::text::quote(n),
                    sweep.plan.items.len()
                ),
            )
        })
}

/// Release `n` of sweep `id`, computed (or the one computed last).
pub(super) async fn computed(
    workbench: &Workbench,
    owner: &str,
    id: &str,
    n: &str,
) -> Result<(Arc<Sweep>, usize, Arc<Computed>), ApiError> {
    let sweep = find(workbench, owner, id)?;
    let n = index(&sweep, n)?;
    if let Some((at, done)) = sweep
        .last
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        && *at == n
    {
        return Ok((Arc::clone(&sweep), n, Arc::clone(done)));
    }
    let job_toml = release_job_toml(&sweep, n)?;
    let spec = release_spec(&sweep, n);
    let record = JobRecord::start("release");
    let slot = workbench.jobs.acquire().map_err(|e| {
        record_refusal(
            Code::ResourceExhausted,
            format!("tables.max_concurrent_jobs: {e}"),
        )
    })?;
    let table = Arc::clone(&sweep.table);
    let stopped = |e: &AnonymizeError| matches!(e, AnonymizeError::Cancelled);
    let result = workbench
        .jobs
        .run("release", slot, stopped, move |cancelled, _budget| {
            anonymize_job(&table, &spec, cancelled)
        })
        .await;
    let (release, report) = match result {
        Ok((Ok(done), _)) => done,
        Ok((Err(e), _)) => {
            let failure = JobFailure::of_anonymize(&e);
            record.finish(failure.outcome());
            return Err(ApiError::new(
                Code::of_failure(failure),
                None,
                e.to_string(),
            ));
        }
        Err(stopped) => {
            let failure = JobFailure::of_stopped(&stopped);
            record.finish(failure.outcome());
            return Err(ApiError::new(
                Code::of_failure(failure),
                None,
                format!("tables.max_job_ms: {stopped}"),
            ));
        }
    };
    record.finish(Outcome::Ok);
    let done = Arc::new(Computed {
        job_toml,
        release,
        report,
    });
    *sweep.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((n, Arc::clone(&done)));
    Ok((sweep, n, done))
}

fn record_refusal(code: Code, message: String) -> ApiError {
    ApiError::new(code, None, message)
}

/// The report as `cloakd table anonymize --report` writes it (pretty JSON and a newline).
pub fn report_bytes(report: &Report, release: &Release) -> Result<Vec<u8>, ApiError> {
    let risk = crate::jobs::release_report::release_risk(release).map_err(ApiError::internal)?;
    let report = crate::jobs::release_report::AnonymizeReport {
        report,
        risk: &risk,
    };
    let mut out = serde_json::to_vec_pretty(&report).map_err(ApiError::internal)?;
    out.push(b'\n');
    Ok(out)
}

/// Each released row's class, classes numbered in order of first appearance: rows with the same
/// quasi-identifier values (generalization) or the same group (bucketization).
fn classes(release: &Release) -> (Vec<u32>, usize) {
    let table = release.quasi_table();
    let key_columns: Vec<&release::ReleasedColumn> = table
        .columns
        .iter()
        .filter(|c| match release {
            Release::Generalized(_) => c.role == ReleasedRole::Quasi,
            Release::Bucketized { .. } => c.role == ReleasedRole::Group,
        })
        .collect();
    let mut ids: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut of_row = Vec::with_capacity(table.rows);
    for row in 0..table.rows {
        let key: Vec<u32> = key_columns.iter().map(|c| c.codes[row]).collect();
        let next = ids.len() as u32;
        of_row.push(*ids.entry(key).or_insert(next));
    }
    (of_row, ids.len())
}

pub async fn release(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path((id, n)): Path<(String, String)>,
) -> Response {
    let result = async {
        let (_, _, done) = computed(&workbench, &principal.name, &id, &n).await?;
        let report: serde_json::Value =
            serde_json::from_slice(&report_bytes(&done.report, &done.release)?).map_err(ApiError::internal)?;
        let table = done.release.quasi_table();
        let rows: Vec<Vec<&str>> = (0..table.rows.min(PREVIEW_ROWS))
            .map(|r| table.row(r).collect())
            .collect();
        let (_, classes) = classes(&done.release);
        // Bucketization's second table: its first lines, so the preview shows the sensitive values
        // the groups of the released rows hold.
        let (method, sensitive_preview) = match &done.release {
            Release::Generalized(_) => ("generalization", serde_json::Value::Null),
            Release::Bucketized {
                sensitive_table, ..
            } => (
                "bucketization",
                serde_json::json!({
                    "columns": [sensitive_table.group_name, sensitive_table.sensitive_name, "count"],
                    "rows": sensitive_table.entries.iter().take(PREVIEW_ROWS)
                        .map(|e| serde_json::json!([e.group.to_string(), e.value, e.count.to_string()]))
                        .collect::<Vec<_>>(),
                }),
            ),
        };
        Ok::<_, ApiError>(serde_json::json!({
            "job": done.job_toml,
            "method": method,
            "report": report,
            "class_sizes": done.report.class_sizes.iter().map(|c| serde_json::json!({"size": c.size, "count": c.classes})).collect::<Vec<_>>(),
            "classes": classes,
            "record_risk": super::risk::record_risk(
                &crate::risk::classes::of_release(table),
                crate::risk::RiskOptions::default().threshold,
            ),
            "preview": {"columns": table.header(), "rows": rows},
            "sensitive_preview": sensitive_preview,
        }))
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

/// A download: `attachment; filename=NAME`, not cached.
fn download(name: &str, content_type: &'static str, body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        body,
    )
        .into_response()
}

async fn file(
    workbench: &Workbench,
    owner: &str,
    id: &str,
    n: &str,
    which: &str,
) -> Result<Response, ApiError> {
    if which == "job.toml" {
        let sweep = find(workbench, owner, id)?;
        let n = index(&sweep, n)?;
        let text = release_job_toml(&sweep, n)?;
        return Ok(download(
            &format!("release-{n}.toml"),
            "application/toml; charset=utf-8",
            text.into_bytes(),
        ));
    }
    let (sweep, n, done) = computed(workbench, owner, id, n).await?;
    match which {
        "release.csv" => {
            let mut out = Vec::new();
            release::write_csv(done.release.quasi_table(), sweep.job.formulas, &mut out)
                .map_err(ApiError::internal)?;
            Ok(download(
                &format!("release-{n}.csv"),
                "text/csv; charset=utf-8",
                out,
            ))
        }
        "sensitive.csv" => match &done.release {
            Release::Bucketized {
                sensitive_table, ..
            } => {
                let mut out = Vec::new();
                release::write_sensitive_csv(sensitive_table, sweep.job.formulas, &mut out)
                    .map_err(ApiError::internal)?;
                Ok(download(
                    &format!("release-{n}.sensitive.csv"),
                    "text/csv; charset=utf-8",
                    out,
                ))
            }
            Release::Generalized(_) => Err(ApiError::new(
                Code::NotFound,
                Some("n"),
                format!(
                    "n: release {n} is not a bucketization (rule: only bucketization has a sensitive table)"
                ),
            )),
        },
        _ => Ok(download(
            &format!("release-{n}.report.json"),
            "application/json",
            report_bytes(&done.report, &done.release)?,
        )),
    }
}

macro_rules! download_route {
    ($name:ident, $file:literal) => {
        pub async fn $name(
            State(workbench): State<Arc<Workbench>>,
            axum::Extension(Caller(principal)): axum::Extension<Caller>,
            Path((id, n)): Path<(String, String)>,
        ) -> Response {
            file(&workbench, &principal.name, &id, &n, $file)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
    };
}

download_route!(release_csv, "release.csv");
download_route!(sensitive_csv, "sensitive.csv");
download_route!(report_json, "report.json");
download_route!(job_toml, "job.toml");

pub async fn class(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path((id, n, c)): Path<(String, String, String)>,
) -> Response {
    let result = async {
        let (sweep, _, done) = computed(&workbench, &principal.name, &id, &n).await?;
        let (of_row, count) = classes(&done.release);
        let c = c.parse::<usize>().ok().filter(|&c| c < count).ok_or_else(|| {
            ApiError::new(
                Code::NotFound,
                Some("c"),
                format!(
                    "c: no class {} in this release (rule: 0 <= c < {count}, classes numbered in order of first row)",
                    crate::text::quote(&c)
                ),
            )
        })?;
        let size = of_row.iter().filter(|&&k| k as usize == c).count();
        let mut in_class: BTreeMap<String, u64> = BTreeMap::new();
        let attribute;
        match &done.release {
            Release::Generalized(table) => {
                let column = table
                    .columns
                    .iter()
                    .find(|col| matches!(col.role, ReleasedRole::Sensitive { .. }))
                    .ok_or_else(|| ApiError::internal("the release has no sensitive column"))?;
                attribute = column.name.clone();
                for (row, &k) in of_row.iter().enumerate() {
                    if k as usize == c {
                        *in_class.entry(column.value(row).to_string()).or_default() += 1;
                    }
                }
            }
            Release::Bucketized {
                quasi_table,
                sensitive_table,
            } => {
                attribute = sensitive_table.sensitive_name.clone();
                let group = quasi_table
                    .columns
                    .iter()
                    .find(|col| col.role == ReleasedRole::Group)
                    .ok_or_else(|| ApiError::internal("the release has no group column"))?;
                let row = of_row.iter().position(|&k| k as usize == c).unwrap_or(0);
                let id: u32 = group.value(row).parse().map_err(ApiError::internal)?;
                for e in sensitive_table.entries.iter().filter(|e| e.group == id) {
                    *in_class.entry(e.value.clone()).or_default() += e.count;
                }
            }
        }
        let sensitive = &sweep.table.sensitive;
        let mut table: BTreeMap<String, u64> = BTreeMap::new();
        for &code in &sensitive.codes {
            *table.entry(sensitive.domain[code as usize].clone()).or_default() += 1;
        }
        Ok::<_, ApiError>(serde_json::json!({
            "class": c,
            "size": size,
            "sensitive": {"attribute": attribute, "class": in_class, "table": table},
        }))
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}
