//! Table work, the one way: what `TableAnonymizer`, `TableEvaluator` and the workbench's HTTP API
//! ([`crate::workbench`]) all do around the engines. A job takes a place of the one table-job
//! limiter (`tables.max_concurrent_jobs`, shown on `cloakd_table_jobs_running`), runs on a blocking
//! thread with a cancellation flag ([`run_job`]) within `tables.max_job_ms` and a
//! memory budget of its own ([`MemoryBudget`], `tables.max_job_bytes`, its bytes shown on
//! `cloakd_table_job_bytes`), is counted by kind and outcome ([`JobRecord`]), and an engine
//! computation stopped by its flag is counted too.
//!
//! Invariants: every table job of the daemon, whatever its protocol, holds a place of the same
//! [`TableJobs`] while it computes; a job whose flag turns true stops at the engine's next look and
//! frees its place then; a job's budget is new for every job and holds nothing once the job's work
//! has returned (its reservations are dropped with it); [`anonymize_job`] is the anonymization of a job (its timing in
//! `report.seconds`), the same for the CLI, gRPC and HTTP.
pub mod files;
pub mod release_report;
pub mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::budget::MemoryBudget;

use crate::config::TablesConfig;
use crate::connections::{LimitExceeded, StreamLimit, StreamSlot};
use crate::relational::job::JobSpec;
use crate::relational::release::Release;
use crate::relational::report::Report;
use crate::relational::table::Table;
use crate::relational::{AnonymizeError, anonymize_with};

/// Bytes a parsed table may take per byte of its CSV at most (a code per cell of at least two bytes,
/// the domains' texts, the per-column indexes): charged before a table is read.
pub const TABLE_BYTES_PER_CSV_BYTE: u64 = 4;

/// The daemon's table-job places and budget, shared by every protocol.
#[derive(Debug, Clone)]
pub struct TableJobs {
    slots: StreamLimit,
    max_job: Duration,
    max_job_bytes: u64,
}

impl TableJobs {
    /// `tables.max_concurrent_jobs` places and the `tables.max_job_ms` budget.
    pub fn new(config: &TablesConfig) -> TableJobs {
        TableJobs {
            slots: StreamLimit::new("tables.max_concurrent_jobs", config.max_concurrent_jobs)
                .with_gauge(crate::telemetry::catalog::TABLE_JOBS_RUNNING),
            max_job: config.max_job,
            max_job_bytes: config.max_job_bytes,
        }
    }

    /// Takes a place, or refuses naming `tables.max_concurrent_jobs`.
    pub fn acquire(&self) -> Result<StreamSlot, LimitExceeded> {
        self.slots.acquire()
    }

    /// A new job's memory budget: `tables.max_job_bytes`, reported on `cloakd_table_job_bytes`.
    pub fn budget(&self) -> MemoryBudget {
        MemoryBudget::observed(self.max_job_bytes, crate::telemetry::record_table_job_bytes)
    }

    /// Places in use.
    pub fn in_use(&self) -> usize {
        self.slots.in_use()
    }

    /// Runs `work` holding `slot` on a blocking thread within `tables.max_job_ms` and a new memory
    /// budget of `tables.max_job_bytes` ([`TableJobs::budget`]); the flag it gets turns true when
    /// the returned future is dropped or the time passes. A result that `stopped` says is the
    /// engine's cancellation is counted in `cloakd_table_jobs_stopped_total{kind}`. The slot comes
    /// back with the result, for a job that still has something to send.
    pub async fn run<T, E>(
        &self,
        kind: &'static str,
        slot: StreamSlot,
        stopped: fn(&E) -> bool,
        work: impl FnOnce(&AtomicBool, &MemoryBudget) -> Result<T, E> + Send + 'static,
    ) -> Result<(Result<T, E>, StreamSlot), JobStopped>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        self.run_within(kind, slot, self.budget(), stopped, work)
            .await
    }

    /// [`TableJobs::run`] within `budget`, a budget the job already charged (an upload's body).
    pub async fn run_within<T, E>(
        &self,
        kind: &'static str,
        slot: StreamSlot,
        budget: MemoryBudget,
        stopped: fn(&E) -> bool,
        work: impl FnOnce(&AtomicBool, &MemoryBudget) -> Result<T, E> + Send + 'static,
    ) -> Result<(Result<T, E>, StreamSlot), JobStopped>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        run_job(slot, self.max_job, move |cancelled| {
            let result = work(cancelled, &budget);
            if let Err(e) = &result
                && stopped(e)
            {
                crate::telemetry::record_table_job_stopped(kind);
            }
            result
        })
        .await
    }
}

/// How a table job ended, for `cloakd_table_jobs_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Bad input or an unsatisfiable model.
    Invalid,
    /// A limit refused it.
    Exhausted,
    /// Its caller went away, it was cancelled, or a deadline passed.
    Cancelled,
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Exhausted => "exhausted",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
        }
    }

    /// The outcome of a job's result, its error classified.
    pub fn of<T>(result: Result<T, JobFailure>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(failure) => failure.outcome(),
        }
    }
}

/// What kind of failure ended a table job: the one classification of table-job errors, whatever
/// the protocol. Each adapter maps it once (gRPC to a `tonic::Status` code, the workbench to its
/// API error code) and counts the job's [`Outcome`] from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobFailure {
    /// Bad input: a field, a file, a row or a value breaks a rule.
    Invalid,
    /// The model cannot be met on this table (an unsatisfiable model, OLA without an anonymous
    /// node, a release whose measured risk exceeds a risk bound).
    Unsatisfiable,
    /// A limit refused it: the job places, a size, the job's memory budget.
    Exhausted,
    /// Its caller went away or cancelled it.
    Cancelled,
    /// It ran past `tables.max_job_ms`, the caller's deadline, or an upload went idle.
    OverBudget,
    /// A bug, or a failure that is not the caller's.
    Internal,
}

impl JobFailure {
    /// The class of an anonymization's error.
    pub fn of_anonymize(e: &AnonymizeError) -> JobFailure {
        match e {
            AnonymizeError::Unsatisfiable(_)
            | AnonymizeError::RiskBound(_)
            | AnonymizeError::Ola(crate::relational::ola::OlaError::NoAnonymousNode { .. }) => {
                JobFailure::Unsatisfiable
            }
            AnonymizeError::Spec(_)
            | AnonymizeError::Options(_)
            | AnonymizeError::Ola(_)
            | AnonymizeError::Kaca(_) => JobFailure::Invalid,
            AnonymizeError::Cancelled => JobFailure::Cancelled,
            _ => JobFailure::Internal,
        }
    }

    /// The class of a job [`run_job`] stopped.
    pub fn of_stopped(e: &JobStopped) -> JobFailure {
        match e {
            JobStopped::OverBudget { .. } => JobFailure::OverBudget,
            JobStopped::Panicked(_) => JobFailure::Internal,
        }
    }

    /// How a job that failed so counts.
    pub fn outcome(self) -> Outcome {
        match self {
            JobFailure::Invalid | JobFailure::Unsatisfiable => Outcome::Invalid,
            JobFailure::Exhausted => Outcome::Exhausted,
            JobFailure::Cancelled | JobFailure::OverBudget => Outcome::Cancelled,
            JobFailure::Internal => Outcome::Failed,
        }
    }
}

/// One table job being timed and counted: [`JobRecord::finish`] counts it by its outcome; dropped
/// unfinished (its future was dropped: the caller went away) it counts as cancelled.
#[derive(Debug)]
pub struct JobRecord {
    kind: &'static str,
    started: Instant,
    finished: bool,
}

impl JobRecord {
    /// Starts timing a job of `kind` (anonymize, evaluate, sweep, release).
    pub fn start(kind: &'static str) -> JobRecord {
        JobRecord {
            kind,
            started: Instant::now(),
            finished: false,
        }
    }

    pub fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        crate::telemetry::record_table_job(self.kind, outcome.label(), self.started.elapsed());
    }
}

impl Drop for JobRecord {
    fn drop(&mut self) {
        if !self.finished {
            crate::telemetry::record_table_job(self.kind, "cancelled", self.started.elapsed());
        }
    }
}

/// Anonymizes `table` as `job` says (privacy, release method, seed, algorithm), giving up when
/// `cancelled` turns true; `report.seconds` is the engine's time. What `cloakd table anonymize`,
/// `TableAnonymizer` and the workbench's releases run.
pub fn anonymize_job(
    table: &Table,
    job: &JobSpec,
    cancelled: &AtomicBool,
) -> Result<(Release, Report), AnonymizeError> {
    let started = Instant::now();
    let (release, mut report) = anonymize_with(
        table,
        &job.privacy,
        job.release,
        job.seed,
        &job.algorithm,
        cancelled,
    )?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok((release, report))
}

/// Sets its flag when dropped: the engine work watching the flag stops at its next look.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Why [`run_job`] has no result of the work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobStopped {
    /// The work ran past the server's budget and was stopped.
    #[error("the job ran longer than {budget_ms} ms and was stopped")]
    OverBudget { budget_ms: u64 },
    /// The work panicked (a bug): the job fails, the daemon lives.
    #[error("the job's thread failed: {0}")]
    Panicked(String),
}

/// Runs `work` on a blocking thread, handing it a cancellation flag that turns true when the
/// returned future is dropped (tonic drops a call's future when its client goes away or its
/// deadline passes) or when `budget` has passed. `slot` (the job's place of its limiter) is held
/// by the thread and freed when `work` returns, so the limiter counts exactly the jobs still
/// computing, and a cancelled job frees its place as soon as the engine looks at the flag. The
/// slot comes back with the result, for a job that still has a response to send.
pub async fn run_job<T: Send + 'static>(
    slot: StreamSlot,
    budget: Duration,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Result<(T, StreamSlot), JobStopped> {
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(Arc::clone(&cancelled));
    let thread = tokio::task::spawn_blocking(move || (work(&cancelled), slot));
    match tokio::time::timeout(budget, thread).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(JobStopped::Panicked(e.to_string())),
        // `_cancel` sets the flag on return.
        Err(_) => Err(JobStopped::OverBudget {
            budget_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_as_their_outcome() {
        assert_eq!(
            JobFailure::of_anonymize(&AnonymizeError::Cancelled).outcome(),
            Outcome::Cancelled
        );
        let over = JobStopped::OverBudget { budget_ms: 1 };
        assert_eq!(JobFailure::of_stopped(&over), JobFailure::OverBudget);
        let panicked = JobStopped::Panicked("bug".into());
        assert_eq!(JobFailure::of_stopped(&panicked).outcome(), Outcome::Failed);
        assert_eq!(
            Outcome::of::<()>(Err(JobFailure::Unsatisfiable)),
            Outcome::Invalid
        );
        assert_eq!(Outcome::of(Ok::<_, JobFailure>(())), Outcome::Ok);
        // A release refused by a risk bound is the table's, not a failure of the daemon.
        let refused = AnonymizeError::RiskBound(crate::relational::models::ReleaseViolation {
            criterion: "average prosecutor risk (max_risk_average=0.01)".into(),
            bound: 0.01,
            measured: Ok(0.5),
        });
        assert_eq!(
            JobFailure::of_anonymize(&refused),
            JobFailure::Unsatisfiable
        );
    }
}
