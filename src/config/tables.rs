//! `[tables]`: limits of table jobs and evaluations (rows, bytes, concurrent jobs, deadlines).
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, positive_usize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTables {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_concurrent_jobs: usize,
    pub rows_per_chunk: usize,
    pub max_queries: usize,
    pub upload_idle_ms: u64,
    pub max_job_ms: u64,
}

#[derive(Debug, Clone)]
pub struct TablesConfig {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_concurrent_jobs: usize,
    pub rows_per_chunk: usize,
    /// Most COUNT queries one evaluation may ask for.
    pub max_queries: usize,
    /// An upload with no message for this long is cancelled.
    pub upload_idle: Duration,
    /// The most time one job's computation (anonymization or evaluation) may take before it is
    /// stopped, whatever deadline its caller set.
    pub max_job: Duration,
}

impl RawTables {
    pub(super) fn validate(self) -> Result<TablesConfig, ConfigError> {
        Ok(TablesConfig {
            max_rows: positive_usize("tables.max_rows", self.max_rows)?,
            max_bytes: positive_usize("tables.max_bytes", self.max_bytes)?,
            max_concurrent_jobs: positive_usize(
                "tables.max_concurrent_jobs",
                self.max_concurrent_jobs,
            )?,
            rows_per_chunk: positive_usize("tables.rows_per_chunk", self.rows_per_chunk)?,
            max_queries: positive_usize("tables.max_queries", self.max_queries)?,
            upload_idle: if self.upload_idle_ms == 0 {
                return Err(invalid("tables.upload_idle_ms", "must be at least 1"));
            } else {
                Duration::from_millis(self.upload_idle_ms)
            },
            max_job: if self.max_job_ms == 0 {
                return Err(invalid("tables.max_job_ms", "must be at least 1"));
            } else {
                Duration::from_millis(self.max_job_ms)
            },
        })
    }
}
