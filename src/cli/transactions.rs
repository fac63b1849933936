//! `cloakd transactions ...`: batch anonymization of set-valued records with personalized
//! rho-uncertainty ([`crate::transactions`]) and generation of "personalized+" sensitive constraints.
//!
//! Files: one record per line, items separated by whitespace (any string; interned to dense ids);
//! `.gz` is read and written transparently. The constraints file has line i = the sensitive items of
//! record i (possibly empty), so it must have exactly as many lines as the records file. Outputs are
//! written to a temporary file beside the target and renamed into place, so a failed run never
//! leaves a partial file. Bad input is refused with `file:line: rule`.
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::transactions::support::FxHashMap;
use crate::transactions::{
    AnonymizeError, ItemId, Mode, Params, PersonalizedPlus, Record, UtilityReport, anonymize,
};

#[derive(Debug, Args)]
pub struct TransactionsArgs {
    #[command(subcommand)]
    pub command: TransactionsCommand,
}

#[derive(Debug, Subcommand)]
pub enum TransactionsCommand {
    /// Anonymize a file of records by partial suppression (personalized rho^m-uncertainty).
    Anonymize(AnonymizeArgs),
    /// Generate "personalized+" sensitive constraints for a file of records.
    Constraints(ConstraintsArgs),
}

#[derive(Debug, Args)]
pub struct AnonymizeArgs {
    /// Records: one per line, space-separated items (`.gz` read transparently).
    #[arg(long, value_name = "RECORDS")]
    pub input: PathBuf,
    /// Sensitive constraints: line i = the sensitive items of record i (may be empty).
    #[arg(long, value_name = "CONSTRAINTS")]
    pub sensitive: PathBuf,
    /// Largest confidence a released rule Q → e may have, in (0, 1).
    #[arg(long)]
    pub rho: f64,
    /// Largest adversary knowledge |Q|, >= 1.
    #[arg(long)]
    pub m: u32,
    /// (eps, delta)-rho^m-uncertainty with sampled adversaries instead of every adversary.
    #[arg(long)]
    pub sampled: bool,
    /// Sampled mode: eps in (0, 1).
    #[arg(long, required_if_eq("sampled", "true"))]
    pub epsilon: Option<f64>,
    /// Sampled mode: delta in (0, 1).
    #[arg(long, required_if_eq("sampled", "true"))]
    pub delta: Option<f64>,
    /// Seed of every random choice (suppressed records, sampled adversaries, output order).
    #[arg(long)]
    pub seed: u64,
    /// Released records, one per line (an empty line when every item was suppressed).
    #[arg(long, value_name = "OUT")]
    pub output: PathBuf,
    /// Keep the input order (for evaluation) instead of shuffling the released records.
    #[arg(long)]
    pub keep_order: bool,
    /// Write the utility report as JSON here.
    #[arg(long, value_name = "REPORT")]
    pub report: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConstraintsArgs {
    /// Records: one per line, space-separated items (`.gz` read transparently).
    #[arg(long, value_name = "RECORDS")]
    pub input: PathBuf,
    /// Fraction of the items that tend to be sensitive, in [0, 1].
    #[arg(long)]
    pub sensitive_share: f64,
    #[arg(long)]
    pub seed: u64,
    /// Constraints file to write (line i = sensitive items of record i).
    #[arg(long, value_name = "CONSTRAINTS")]
    pub output: PathBuf,
}

/// Why a batch command failed.
#[derive(Debug, thiserror::Error)]
pub enum TransactionsCliError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {rule}")]
    Line {
        path: String,
        line: usize,
        rule: String,
    },
    #[error("{field}: {rule}")]
    Argument { field: &'static str, rule: String },
    #[error(
        "{sensitive}: has {constraint_lines} lines but {input} has {records} records; line i must hold the sensitive items of record i"
    )]
    LineCountMismatch {
        sensitive: String,
        constraint_lines: usize,
        input: String,
        records: usize,
    },
    #[error("{input}: {source}")]
    Engine {
        input: String,
        source: AnonymizeError,
    },
}

/// The JSON report of `cloakd transactions anonymize`.
#[derive(Debug, serde::Serialize)]
struct BatchReport<'a> {
    #[serde(flatten)]
    report: &'a UtilityReport,
    /// Wall-clock seconds of the whole command (reading, anonymizing, writing).
    total_seconds: f64,
    input: String,
    sensitive: String,
}

/// Interned item names: name → dense id, and back.
///
/// Names of at most 15 bytes (every item of the public data sets) are looked up by their bytes
/// packed into a `u128` with the length in the last byte, so the tens of millions of tokens of a
/// constraints file cost one integer hash and compare each instead of a string hash and a `memcmp`
/// behind a pointer; longer names go through a string map.
#[derive(Default)]
struct ItemNames {
    short: FxHashMap<u128, ItemId>,
    long: FxHashMap<Box<str>, ItemId>,
    names: Vec<Box<str>>,
}

impl ItemNames {
    fn intern(&mut self, name: &str) -> ItemId {
        let next = self.names.len() as ItemId;
        let id = match short_key(name) {
            Some(key) => *self.short.entry(key).or_insert(next),
            None => match self.long.get(name) {
                Some(&id) => id,
                None => {
                    self.long.insert(name.into(), next);
                    next
                }
            },
        };
        if id == next {
            self.names.push(name.into());
        }
        id
    }
}

/// `name`'s bytes and length packed into one integer, if it has at most 15 bytes.
fn short_key(name: &str) -> Option<u128> {
    let bytes = name.as_bytes();
    if bytes.len() > 15 {
        return None;
    }
    let mut packed = [0u8; 16];
    packed[..bytes.len()].copy_from_slice(bytes);
    packed[15] = bytes.len() as u8;
    Some(u128::from_le_bytes(packed))
}

/// A reader whose source (typically a gzip decoder) runs on its own thread, one block ahead of
/// the consumer, so inflating a large file and parsing it overlap on two cores. The thread ends
/// at the end of the input, at its first error (handed on to the consumer) or when the consumer
/// is dropped.
struct ReadAhead {
    blocks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    block: Vec<u8>,
    at: usize,
}

impl ReadAhead {
    const BLOCK: usize = 1 << 20;
    const BLOCKS_AHEAD: usize = 4;

    fn spawn(mut source: Box<dyn Read + Send>) -> Self {
        let (sender, blocks) = std::sync::mpsc::sync_channel(Self::BLOCKS_AHEAD);
        std::thread::spawn(move || {
            loop {
                let mut block = vec![0; Self::BLOCK];
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut block[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(read) => {
                            filled += read;
                            if filled == block.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                block.truncate(filled);
                let last = filled == 0 || result.is_err();
                let sent = match result {
                    Ok(()) => sender.send(Ok(block)),
                    Err(e) => sender.send(Err(e)),
                };
                if last || sent.is_err() {
                    return;
                }
            }
        });
        ReadAhead {
            blocks,
            block: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.block.len() {
            match self.blocks.recv() {
                Ok(Ok(block)) if block.is_empty() => return Ok(0),
                Ok(Ok(block)) => {
                    self.block = block;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                // The thread has ended after the last block.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.block.len() - self.at);
        out[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> TransactionsCliError + '_ {
    move |source| TransactionsCliError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads a file of item sets, one per line. `allow_empty`: whether a line may hold no item.
fn read_item_sets(
    path: &Path,
    names: &mut ItemNames,
    allow_empty: bool,
) -> Result<Vec<Vec<ItemId>>, TransactionsCliError> {
    let reader = crate::workload::open_maybe_gz(path).map_err(io_error(path))?;
    let mut reader = BufReader::with_capacity(1 << 16, ReadAhead::spawn(reader));
    let mut sets = Vec::new();
    let mut line = String::new();
    let mut line_no = 0;
    loop {
        line.clear();
        let read = reader.read_line(&mut line).map_err(io_error(path))?;
        if read == 0 {
            break;
        }
        line_no += 1;
        let bad = |rule: String| TransactionsCliError::Line {
            path: path.display().to_string(),
            line: line_no,
            rule,
        };
        let mut items: Vec<ItemId> = line.split_whitespace().map(|t| names.intern(t)).collect();
        if items.is_empty() && !allow_empty {
            return Err(bad("a record needs at least one item".into()));
        }
        items.sort_unstable();
        if let Some(pair) = items.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!(
                "item {:?} appears twice",
                names.names[pair[0] as usize]
            )));
        }
        sets.push(items);
    }
    Ok(sets)
}

/// Writes `lines` of item sets to `path` via a temporary file and a rename; gzip when `.gz`.
fn write_item_sets<'a>(
    path: &Path,
    names: &ItemNames,
    lines: impl Iterator<Item = &'a Vec<ItemId>>,
) -> Result<(), TransactionsCliError> {
    let file_name = path
        .file_name()
        .ok_or_else(|| TransactionsCliError::Argument {
            field: "output",
            rule: format!("{} is not a file path", path.display()),
        })?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(format!(".tmp{}", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    let result = (|| -> std::io::Result<()> {
        let file = std::fs::File::create(&temporary)?;
        // Buffer in front of the encoder: it is slow on the many tiny writes of item names.
        if path.extension().is_some_and(|e| e == "gz") {
            let encoder = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            let mut out = BufWriter::with_capacity(1 << 16, encoder);
            write_lines(&mut out, names, lines)?;
            out.into_inner()
                .map_err(std::io::IntoInnerError::into_error)?
                .finish()?;
        } else {
            let mut out = BufWriter::with_capacity(1 << 16, file);
            write_lines(&mut out, names, lines)?;
            out.flush()?;
        }
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map_err(io_error(path))
}

fn write_lines<'a>(
    out: &mut impl Write,
    names: &ItemNames,
    lines: impl Iterator<Item = &'a Vec<ItemId>>,
) -> std::io::Result<()> {
    for items in lines {
        let mut first = true;
        for &item in items {
            if !first {
                out.write_all(b" ")?;
            }
            first = false;
            out.write_all(names.names[item as usize].as_bytes())?;
        }
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn progress(message: &'static str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub fn run(args: TransactionsArgs) -> anyhow::Result<()> {
    match args.command {
        TransactionsCommand::Anonymize(args) => {
            run_anonymize(&args)?;
        }
        TransactionsCommand::Constraints(args) => run_constraints(&args)?,
    }
    Ok(())
}

fn run_anonymize(args: &AnonymizeArgs) -> Result<UtilityReport, TransactionsCliError> {
    let started = Instant::now();
    let mode = if args.sampled {
        Mode::Sampled {
            epsilon: args.epsilon.unwrap_or(f64::NAN),
            delta: args.delta.unwrap_or(f64::NAN),
        }
    } else {
        Mode::Exact
    };
    let params = Params {
        rho: args.rho,
        m: args.m,
        mode,
    };
    let input = args.input.display().to_string();
    let engine_error = |source| TransactionsCliError::Engine {
        input: input.clone(),
        source,
    };
    // Refuse bad parameters before reading anything.
    anonymize(&[], &params, args.seed).map_err(engine_error)?;

    let spinner = progress("reading records");
    let mut names = ItemNames::default();
    let records = read_item_sets(&args.input, &mut names, false)?;
    spinner.set_message("reading constraints");
    let constraints = read_item_sets(&args.sensitive, &mut names, true)?;
    if constraints.len() != records.len() {
        return Err(TransactionsCliError::LineCountMismatch {
            sensitive: args.sensitive.display().to_string(),
            constraint_lines: constraints.len(),
            input: input.clone(),
            records: records.len(),
        });
    }
    let window: Vec<Record> = records
        .into_iter()
        .zip(constraints)
        .map(|(items, sensitive)| Record { items, sensitive })
        .collect();
    spinner.set_message(format!("anonymizing {} records", window.len()));
    let engine_started = Instant::now();
    let mut anonymized = anonymize(&window, &params, args.seed).map_err(engine_error)?;
    anonymized.report.seconds = engine_started.elapsed().as_secs_f64();
    drop(window);

    spinner.set_message("writing");
    let mut order: Vec<usize> = (0..anonymized.records.len()).collect();
    if !args.keep_order {
        // A separate stream of the seed, so the output order does not replay the engine's choices.
        let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
        rng.set_stream(1);
        order.shuffle(&mut rng);
    }
    write_item_sets(
        &args.output,
        &names,
        order.iter().map(|&i| &anonymized.records[i]),
    )?;
    let report = anonymized.report;
    if let Some(path) = &args.report {
        let batch = BatchReport {
            report: &report,
            total_seconds: started.elapsed().as_secs_f64(),
            input,
            sensitive: args.sensitive.display().to_string(),
        };
        let json = serde_json::to_vec_pretty(&batch).map_err(|e| TransactionsCliError::Io {
            path: path.display().to_string(),
            source: e.into(),
        })?;
        write_atomically(path, &json)?;
    }
    spinner.finish_and_clear();
    eprintln!(
        "{} records: suppressed {} of {} occurrences (util_info {:.4}, util_dist {:.4}, util_mining {:.4}), {} rounds, {:.3} s anonymizing, {:.3} s total",
        report.records,
        report.suppressed,
        report.occurrences,
        report.util_info,
        report.util_dist,
        report.util_mining,
        report.rounds,
        report.seconds,
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TransactionsCliError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".tmp{}", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let result = std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map_err(io_error(path))
}

fn run_constraints(args: &ConstraintsArgs) -> Result<(), TransactionsCliError> {
    if !(0.0..=1.0).contains(&args.sensitive_share) {
        return Err(TransactionsCliError::Argument {
            field: "sensitive-share",
            rule: format!("{} is outside [0, 1]", args.sensitive_share),
        });
    }
    let spinner = progress("reading records");
    let mut names = ItemNames::default();
    let records = read_item_sets(&args.input, &mut names, false)?;
    let universe: Vec<ItemId> = (0..names.names.len() as ItemId).collect();
    spinner.set_message("drawing constraints");
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let constraints =
        PersonalizedPlus::paper(args.sensitive_share).generate(&universe, records.len(), &mut rng);
    spinner.set_message("writing");
    write_item_sets(&args.output, &names, constraints.iter())?;
    spinner.finish_and_clear();
    let marked: usize = constraints.iter().map(Vec::len).sum();
    eprintln!(
        "{} records over {} items: {:.1} sensitive items per record",
        records.len(),
        universe.len(),
        marked as f64 / records.len().max(1) as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::{ItemNames, ReadAhead, short_key};

    #[test]
    fn read_ahead_hands_on_every_byte_in_order() {
        let data: Vec<u8> = (0..(3 * ReadAhead::BLOCK + 12_345))
            .map(|i| (i % 251) as u8)
            .collect();
        let mut read = Vec::new();
        ReadAhead::spawn(Box::new(std::io::Cursor::new(data.clone())))
            .read_to_end(&mut read)
            .unwrap();
        assert_eq!(read, data);
        let mut empty = Vec::new();
        ReadAhead::spawn(Box::new(std::io::empty()))
            .read_to_end(&mut empty)
            .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn read_ahead_hands_on_the_source_error() {
        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::other("disk on fire"));
                }
                let n = out.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
        }
        let mut read = Vec::new();
        let error = ReadAhead::spawn(Box::new(Failing(ReadAhead::BLOCK + 7)))
            .read_to_end(&mut read)
            .unwrap_err();
        assert_eq!(error.to_string(), "disk on fire");
    }

    #[test]
    fn names_intern_to_dense_ids_short_and_long() {
        let mut names = ItemNames::default();
        let words = [
            "a",
            "ab",
            "a\0",
            "",
            "exactly15bytes!",
            "sixteen_bytes_xx",
            "a much longer item name",
        ];
        let ids: Vec<u32> = words.iter().map(|w| names.intern(w)).collect();
        assert_eq!(ids, (0..words.len() as u32).collect::<Vec<_>>());
        for (word, id) in words.iter().zip(&ids) {
            assert_eq!(names.intern(word), *id);
            assert_eq!(&*names.names[*id as usize], *word);
        }
        assert!(short_key("exactly15bytes!").is_some());
        assert!(short_key("sixteen_bytes_xx").is_none());
    }
}
