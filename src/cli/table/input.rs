//! The inputs of the table commands: a job's table as [`crate::jobs::files`] reads it, with a
//! progress bar on stderr for large files. `anonymize`, `evaluate`, `frontier`, `figures` and
//! `risk` all load tables here.
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::jobs::files::load_table_counted;
use crate::relational::job::JobSpec;
use crate::relational::table::Table;

/// Loads the job's table ([`crate::jobs::files::load_table`]), showing the reading of an input of
/// 8 MiB or more on a progress bar.
pub fn load_table(job: &JobSpec, job_path: &Path, input: Option<&Path>) -> anyhow::Result<Table> {
    let mut shown = None;
    let table = load_table_counted(job, job_path, input, |input| {
        let size = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
        let progress = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
        if size < 8 << 20 {
            progress.set_draw_target(ProgressDrawTarget::hidden());
        }
        progress.set_style(
            ProgressStyle::with_template("reading {bar:40} {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        shown = Some(progress.clone());
        Some(Box::new(move |n: usize| progress.inc(n as u64)))
    })?;
    if let Some(progress) = shown {
        progress.finish_and_clear();
    }
    Ok(table)
}
