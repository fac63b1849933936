//! gRPC `TableEvaluator`: the privacy/utility evaluation of `cloakd table evaluate` over the wire.
//! The request carries the job (TOML), its hierarchies, the original table and the release inline;
//! the measurement runs on a blocking thread.
//!
//! Invariants: uploads (after gzip decoding) are bounded by `tables.max_bytes` and the table by
//! `tables.max_rows`; at most `tables.max_concurrent_jobs` evaluations run at once, further ones get
//! RESOURCE_EXHAUSTED; malformed input is INVALID_ARGUMENT with the file, line and rule.
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::config::TablesConfig;
use crate::measures::evaluate::{Baseline, EvaluationOptions, evaluate};
use crate::measures::released::read_release;
use crate::proto::table_evaluator_server::{TableEvaluator, TableEvaluatorServer};
use crate::proto::{EvaluateRequest, EvaluateResponse};
use crate::relational::hierarchy::Hierarchy;
use crate::relational::job::JobSpec;
use crate::relational::table::read_csv;

/// The evaluator service.
#[derive(Debug, Clone)]
pub struct Evaluator {
    max_rows: usize,
    max_bytes: usize,
    jobs: Arc<Semaphore>,
}

/// The `TableEvaluator` server with the limits of `config`.
pub fn table_evaluator(config: &TablesConfig) -> TableEvaluatorServer<Evaluator> {
    TableEvaluatorServer::new(Evaluator {
        max_rows: config.max_rows,
        max_bytes: config.max_bytes,
        jobs: Arc::new(Semaphore::new(config.max_concurrent_jobs.max(1))),
    })
    .max_decoding_message_size(config.max_bytes.saturating_add(1 << 20))
}

fn invalid(message: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::invalid_argument(message.to_string())
}

/// Plain bytes of an upload that may be gzip-compressed, at most `limit` bytes once decoded.
#[allow(clippy::result_large_err)]
fn decoded(name: &str, bytes: &[u8], limit: usize) -> Result<Vec<u8>, tonic::Status> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes.to_vec());
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| invalid(format!("{name}: not valid gzip: {e}")))?;
    if out.len() > limit {
        return Err(tonic::Status::resource_exhausted(format!(
            "{name}: more than tables.max_bytes = {limit} bytes once decompressed"
        )));
    }
    Ok(out)
}

#[allow(clippy::result_large_err)]
fn run(
    request: EvaluateRequest,
    max_rows: usize,
    max_bytes: usize,
) -> Result<EvaluateResponse, tonic::Status> {
    let job = JobSpec::parse("job_toml", &request.job_toml).map_err(invalid)?;
    let hierarchies: HashMap<&str, &str> = request
        .hierarchies
        .iter()
        .map(|h| (h.path.as_str(), h.text.as_str()))
        .collect();
    let schema = job
        .schema(|path, column| -> Result<Hierarchy, tonic::Status> {
            let text = hierarchies.get(path).ok_or_else(|| {
                invalid(format!(
                    "hierarchy {path:?} of column {column:?} is not in the request (rule: send every hierarchy the job names)"
                ))
            })?;
            Hierarchy::parse(path, text).map_err(invalid)
        })?;
    let original = decoded("original_csv", &request.original_csv, max_bytes)?;
    let table =
        read_csv(schema, original.as_slice(), "original_csv", job.delimiter).map_err(invalid)?;
    if table.rows() > max_rows {
        return Err(tonic::Status::resource_exhausted(format!(
            "original_csv: {} rows, more than tables.max_rows = {max_rows}",
            table.rows()
        )));
    }
    let release_bytes = decoded("release_csv", &request.release_csv, max_bytes)?;
    let sensitive_bytes = decoded("sensitive_csv", &request.sensitive_csv, max_bytes)?;
    let mut sensitive_reader = sensitive_bytes.as_slice();
    let release = read_release(
        &table,
        release_bytes.as_slice(),
        "release_csv",
        (!sensitive_bytes.is_empty())
            .then_some((&mut sensitive_reader as &mut dyn Read, "sensitive_csv")),
        job.delimiter,
    )
    .map_err(invalid)?;
    let defaults = EvaluationOptions::default();
    let options = EvaluationOptions {
        min_support: request.min_support.unwrap_or(defaults.min_support),
        queries: request.queries.map_or(defaults.queries, |q| q as usize),
        qd: request.qd.map_or(defaults.qd, |q| q as usize),
        sel: request.sel.unwrap_or(defaults.sel),
        seed: request.query_seed.unwrap_or(defaults.seed),
    };
    let baseline = Baseline::new(&table, options).map_err(invalid)?;
    let e = evaluate(&table, &baseline, &release).map_err(invalid)?;
    Ok(EvaluateResponse {
        ploss: e.ploss,
        uloss: e.uloss,
        a_know: e.a_know,
        a_acc: e.a_acc,
        query_error: e.query_error,
        discernibility: e.discernibility,
        avg_class_size: e.avg_class_size,
        rows: e.rows,
        classes: e.classes,
        large_populations: e.large_populations,
        queries: e.queries,
    })
}

#[tonic::async_trait]
impl TableEvaluator for Evaluator {
    async fn evaluate(
        &self,
        request: tonic::Request<EvaluateRequest>,
    ) -> Result<tonic::Response<EvaluateResponse>, tonic::Status> {
        let started = std::time::Instant::now();
        let result = self.run_job(request).await;
        crate::telemetry::record_table_job("evaluate", started, &result);
        result
    }
}

impl Evaluator {
    /// One evaluation job.
    async fn run_job(
        &self,
        request: tonic::Request<EvaluateRequest>,
    ) -> Result<tonic::Response<EvaluateResponse>, tonic::Status> {
        let permit = Arc::clone(&self.jobs).try_acquire_owned().map_err(|_| {
            tonic::Status::resource_exhausted(
                "tables.max_concurrent_jobs evaluations are running; retry later",
            )
        })?;
        let request = request.into_inner();
        let upload =
            request.original_csv.len() + request.release_csv.len() + request.sensitive_csv.len();
        if upload > self.max_bytes {
            return Err(tonic::Status::resource_exhausted(format!(
                "{upload} bytes uploaded, more than tables.max_bytes = {}",
                self.max_bytes
            )));
        }
        let (max_rows, max_bytes) = (self.max_rows, self.max_bytes);
        let response = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            run(request, max_rows, max_bytes)
        })
        .await
        .map_err(|e| tonic::Status::internal(format!("evaluation failed: {e}")))??;
        Ok(tonic::Response::new(response))
    }
}
