//! `[tables]`: limits of table jobs and evaluations (rows, bytes, concurrent jobs, deadlines, each
//! job's memory, the size of a sweep).
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
    pub max_job_bytes: u64,
    pub max_sweep_points: usize,
    pub max_sweep_values: usize,
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
    /// The most memory one job's computation may hold (its heavy allocations, charged before they are
    /// made; [`crate::budget::MemoryBudget`]).
    pub max_job_bytes: u64,
    /// The most releases one sweep may make (after duplicates are removed).
    pub max_sweep_points: usize,
    /// The most values one swept parameter (k, l, t, delta) may list (after duplicates are removed).
    pub max_sweep_values: usize,
}

/// The least `tables.max_job_bytes` accepted (1 MiB): less would refuse every table.
pub const MIN_JOB_BYTES: u64 = 1 << 20;

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
            max_job_bytes: if self.max_job_bytes < MIN_JOB_BYTES {
                return Err(invalid(
                    "tables.max_job_bytes",
                    format!(
                        "{} must be at least {MIN_JOB_BYTES} (1 MiB)",
                        self.max_job_bytes
                    ),
                ));
            } else {
                self.max_job_bytes
            },
            max_sweep_points: positive_usize("tables.max_sweep_points", self.max_sweep_points)?,
            max_sweep_values: positive_usize("tables.max_sweep_values", self.max_sweep_values)?,
        })
    }
}
