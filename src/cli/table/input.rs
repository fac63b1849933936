//! The inputs of the table commands: a job's table (its hierarchies, relative to the job file, and
//! its CSV input, plain or gzip, through the one bounded reader [`crate::lines`]) with a progress bar
//! on stderr for large files. `anonymize`, `evaluate` and `frontier` all load tables here.
use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::relational::hierarchy::Hierarchy;
use crate::relational::job::JobSpec;
use crate::relational::table::{Table, read_csv};

/// A reader that counts the bytes read through it (for the progress bar).
struct Counting<R> {
    inner: R,
    progress: ProgressBar,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.inc(n as u64);
        Ok(n)
    }
}

/// Opens a file that may be gzip-compressed ([`crate::workload::maybe_gunzip`]), counting the bytes
/// read from disk on `progress`.
pub fn open_maybe_gzip(
    path: &Path,
    progress: Option<&ProgressBar>,
) -> anyhow::Result<Box<dyn Read + Send>> {
    let file =
        File::open(path).with_context(|| format!("{}: cannot open the input", path.display()))?;
    let reader = match progress {
        Some(p) => crate::workload::maybe_gunzip(Counting {
            inner: file,
            progress: p.clone(),
        }),
        None => crate::workload::maybe_gunzip(file),
    };
    let reader = reader.with_context(|| format!("{}: cannot read the input", path.display()))?;
    // Bounded: a CSV record past `crate::lines::MAX_LINE_BYTES` fails the read.
    Ok(Box::new(crate::lines::BoundedLines::new(
        reader,
        crate::lines::Records::Csv,
    )))
}

/// Loads the job's table: hierarchies (relative to the job file) and the input CSV.
pub fn load_table(job: &JobSpec, job_path: &Path, input: Option<&Path>) -> anyhow::Result<Table> {
    let base = job_path.parent().unwrap_or(Path::new("."));
    let schema = job.schema(|path, column| -> anyhow::Result<Hierarchy> {
        let path = base.join(path);
        let text = crate::lines::read_text_file(&path).with_context(|| {
            format!(
                "{}: cannot read the hierarchy of column {column:?}",
                path.display()
            )
        })?;
        Ok(Hierarchy::parse(&path.display().to_string(), &text)?)
    })?;
    let input = match (input, &job.input) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(path)) => base.join(path),
        (None, None) => bail!(
            "{}: no input (rule: the job names `input`, or pass --input)",
            job.source_name
        ),
    };
    let size = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
    let progress = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
    if size < 8 << 20 {
        progress.set_draw_target(ProgressDrawTarget::hidden());
    }
    progress.set_style(
        ProgressStyle::with_template("reading {bar:40} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let reader = open_maybe_gzip(&input, Some(&progress))?;
    let table = read_csv(schema, reader, &input.display().to_string(), job.delimiter)?;
    progress.finish_and_clear();
    Ok(table)
}
