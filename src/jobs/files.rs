//! A table job read from files, the one way for the table commands, benches, examples and tests:
//! the job file ([`read_job`]), its table ([`load_table`]: the hierarchies, relative to the job
//! file, and the CSV input, plain or gzip, through the one bounded reader [`crate::lines`]) and any
//! other table file a command reads ([`open_input`]).
//!
//! No progress bar here: a caller that shows one passes a [`Counter`] the bytes read from disk go
//! to ([`load_table_counted`]; `cloakd table` draws its bar from them).
use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};

use crate::relational::hierarchy::Hierarchy;
use crate::relational::job::JobSpec;
use crate::relational::table::{Table, read_csv};

/// Told the number of bytes of each read from disk (before decompression).
pub type Counter = Box<dyn FnMut(usize) + Send>;

/// A reader that tells `count` the bytes read through it.
struct Counting<R> {
    inner: R,
    count: Counter,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.count)(n);
        Ok(n)
    }
}

/// Reads and parses a job file.
pub fn read_job(path: &Path) -> anyhow::Result<JobSpec> {
    let text = crate::data_files::read_text_file(path)
        .with_context(|| format!("{}: cannot read the job file", path.display()))?;
    Ok(JobSpec::parse(&path.display().to_string(), &text)?)
}

/// Opens a file that may be gzip-compressed ([`crate::data_files::maybe_gunzip`]) through the bounded
/// reader, telling `count` the bytes read from disk.
pub fn open_input(path: &Path, count: Option<Counter>) -> anyhow::Result<Box<dyn Read + Send>> {
    let file =
        File::open(path).with_context(|| format!("{}: cannot open the input", path.display()))?;
    let reader = match count {
        Some(count) => crate::data_files::maybe_gunzip(Counting { inner: file, count }),
        None => crate::data_files::maybe_gunzip(file),
    };
    let reader = reader.with_context(|| format!("{}: cannot read the input", path.display()))?;
    // Bounded: a CSV record past `crate::lines::MAX_LINE_BYTES` fails the read.
    Ok(Box::new(crate::lines::BoundedLines::new(
        reader,
        crate::lines::Records::Csv,
    )))
}

/// Loads the job's table: hierarchies (relative to the job file) and the input CSV (`input`, or
/// else the job's `input` relative to the job file).
pub fn load_table(job: &JobSpec, job_path: &Path, input: Option<&Path>) -> anyhow::Result<Table> {
    load_table_counted(job, job_path, input, |_| None)
}

/// [`load_table`], calling `start` with the input's path once the hierarchies are read and before
/// the input is opened; the [`Counter`] it returns is told the bytes read from disk.
pub fn load_table_counted(
    job: &JobSpec,
    job_path: &Path,
    input: Option<&Path>,
    start: impl FnOnce(&Path) -> Option<Counter>,
) -> anyhow::Result<Table> {
    let base = job_path.parent().unwrap_or(Path::new("."));
    let schema = job.schema(|path, column| -> anyhow::Result<Hierarchy> {
        let path = base.join(path);
        let text = crate::data_files::read_text_file(&path).with_context(|| {
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
    let count = start(&input);
    let reader = open_input(&input, count)?;
    Ok(read_csv(
        schema,
        reader,
        &input.display().to_string(),
        job.delimiter,
    )?)
}
