//! The consistency check of a data directory, and its explicit repair: ONE implementation, used by
//! the daemon before it opens the store (it refuses to start on any problem) and by `cloakd store
//! check` / `cloakd store repair`.
//!
//! # Rules between the files
//! Beside each file's own rules ([`super::transaction_log`] invariants 2 and 3,
//! [`super::released_windows`] invariant 4), the log, its close markers and the release files must
//! agree:
//! 1. Within a stream, a record id appears once in the log.
//! 2. A stream's records and close markers follow its windows in order: each record is in the open
//!    window (one past the last close), each close marker closes the open window.
//! 3. A close marker holds exactly the records of its window in the log. (A window whose close was
//!    rebuilt from its release by a repair may hold fewer: the rest were lost, and the window is
//!    never released again.)
//! 4. Every release (or failure) file belongs to a window closed in the log, with the number of
//!    records its close marker says: a release without a close marker would let records be
//!    acknowledged into a window already released.
//! 5. A window has one outcome file, and a release file reads and verifies, in its place: it names
//!    the stream and window it is filed under ([`super::released_windows`] invariant 5).
//! 6. Every batch the journal of acknowledged batches names is still in the log
//!    ([`super::ack_journal`] invariant 3); otherwise the acknowledged records lost are named per
//!    stream and window ([`Report::lost`]), and the check never passes while they are.
//!
//! Not problems, but reported: a torn tail without a seal (cut at start), a closed window below the
//! highest released one without a file (re-anonymized from the log at start: the same bytes),
//! temporary files of a crash (deleted at start).
//!
//! # Repair
//! [`plan_repair`] turns every problem into a fix or says it has none; [`apply_repair`] applies a
//! plan only if every problem has a fix, first copying each file it changes into
//! `repair-backup-<unix seconds>/` of the data directory (each copy written atomically and
//! fsynced, [`crate::atomic_file`], before the file is changed; a file moved away is renamed into
//! it). Fixes: cut the log at its first bad frame (everything after it is lost, and said so);
//! remove a seal that does not match; move a damaged or misplaced outcome file away when the log
//! holds its window whole (it is re-anonymized at start, the same bytes); append the close marker
//! of a released window whose marker was lost, rebuilt from the release (its parameters and record
//! count), so that nothing is acknowledged into it again; cut the journal where the log stops
//! proving it, which is the explicit acceptance of the named loss (printed as `LOST for good:
//! ...`); cut a damaged journal (the log's batches past the cut are journaled again at start).
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::StoreError;
use super::ack_journal::{ACKS_FILE, Lost, Verdict};
use super::record_log::{LogEntry, WindowClose};
use super::release_store::WindowOutcome;
use super::released_windows::{OutcomeFile, list_window_files};
use super::released_windows::{Placed, read_placed_file};
use super::transaction_log::{LOG_FILE, LogEnd, SEAL_FILE, TransactionLog, scan_log};
use crate::transactions::{Mode, Params};

/// A place in a file and what is wrong (or notable) there.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub path: PathBuf,
    pub offset: u64,
    pub rule: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at byte {}: {}",
            self.path.display(),
            self.offset,
            self.rule
        )
    }
}

/// How a repair fixes one problem.
#[derive(Debug, Clone, PartialEq)]
pub enum Fix {
    /// Truncate the log to `at` bytes, dropping `dropped` bytes.
    CutLog { at: u64, dropped: u64 },
    /// Remove the seal (the log is then judged as after a crash).
    RemoveSeal,
    /// Move a damaged outcome file into the backup; the window is re-anonymized from the log.
    MoveAway(PathBuf),
    /// Append the close marker of a released window, rebuilt from its release.
    AppendClose(WindowClose),
    /// Cut the journal of acknowledged batches at `at`, accepting that the acknowledged records
    /// `lost` are gone.
    AcceptLoss { at: u64, lost: Vec<Lost> },
    /// Cut a damaged journal at `at`: the log's batches after it are journaled again at start.
    CutJournal { at: u64 },
}

impl std::fmt::Display for Fix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fix::CutLog { at, dropped } => write!(
                f,
                "cut {LOG_FILE} at byte {at}, dropping {dropped} bytes (every entry in them is lost; a record id in them is forgotten and a re-published one is taken as new)"
            ),
            Fix::RemoveSeal => write!(f, "remove {SEAL_FILE}"),
            Fix::AcceptLoss { at, lost } => write!(
                f,
                "cut {ACKS_FILE} at byte {at}, accepting the loss: {}; they are never released, and a producer that publishes their ids again is taken as new",
                Verdict {
                    lost: lost.clone(),
                    ..Verdict::default()
                }
                .describe_lost()
            ),
            Fix::CutJournal { at } => write!(
                f,
                "cut {ACKS_FILE} at byte {at}; the log's batches after it are journaled again as they are at the next start"
            ),
            Fix::MoveAway(path) => write!(
                f,
                "move {} into the backup; its window is re-anonymized from the log at the next start (the same bytes)",
                path.display()
            ),
            Fix::AppendClose(c) => write!(
                f,
                "append to {LOG_FILE} the close marker of window {} of stream {:?} ({} records), rebuilt from its release; records of it not in the log are lost",
                c.window_id, c.stream, c.records
            ),
        }
    }
}

/// A problem and its fix, if it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub finding: Finding,
    pub fix: Option<Fix>,
}

/// What [`check_data_dir`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Violations: the daemon refuses to start while there is one.
    pub problems: Vec<Problem>,
    /// Not problems: what the daemon does about them at start.
    pub notes: Vec<Finding>,
    /// Entries in the valid prefix of the log.
    pub log_entries: usize,
    /// Outcome files.
    pub window_files: usize,
    /// Acknowledged records the log no longer holds, per stream and window.
    pub lost: Vec<Lost>,
}

impl Report {
    /// Total of [`Self::lost`].
    pub fn lost_records(&self) -> u64 {
        self.lost.iter().map(|l| l.records).sum()
    }
}

impl Report {
    /// The refusal of a daemon start: the first problem, with how many more there are.
    pub fn refusal(&self) -> Option<StoreError> {
        let first = self.problems.first()?;
        let more = self.problems.len() - 1;
        Some(StoreError::Corrupt {
            path: first.finding.path.clone(),
            offset: first.finding.offset,
            rule: format!(
                "{}{}{}; see `cloakd store check` and `cloakd store repair` (docs/operations.md)",
                first.finding.rule,
                if self.lost.is_empty() || first.finding.rule.contains("acknowledged records lost")
                {
                    String::new()
                } else {
                    format!(
                        "; {}",
                        Verdict {
                            lost: self.lost.clone(),
                            ..Verdict::default()
                        }
                        .describe_lost()
                    )
                },
                if more > 0 {
                    format!(" (and {more} more problems)")
                } else {
                    String::new()
                }
            ),
        })
    }
}

/// Per-stream state of the walk over the log.
#[derive(Debug, Default)]
struct StreamWalk {
    /// Record id -> offset of its first frame.
    ids: HashMap<String, u64>,
    /// The open window, once known.
    open: Option<u64>,
    /// Records of the open window so far.
    open_records: u64,
    /// Closed windows: id -> (close marker, its offset, records of it in the log).
    closed: BTreeMap<u64, (WindowClose, u64, u64)>,
}

/// Checks the data directory `dir` without changing anything. `Err` only for I/O errors.
pub fn check_data_dir(dir: &Path) -> Result<Report, StoreError> {
    let log_path = dir.join(LOG_FILE);
    let (scan, seal_problem) = scan_log(dir)?;
    let mut report = Report {
        log_entries: scan.entries.len(),
        lost: scan.verdict.lost.clone(),
        ..Report::default()
    };
    match scan.file_problem() {
        Some((offset, rule)) => {
            let fix = if scan.valid_len < scan.total_len {
                Fix::CutLog {
                    at: scan.valid_len,
                    dropped: scan.total_len - scan.valid_len,
                }
            } else {
                Fix::RemoveSeal
            };
            report.problems.push(Problem {
                finding: Finding {
                    path: log_path.clone(),
                    offset,
                    rule,
                },
                fix: Some(fix),
            });
            if scan.seal.is_some() && scan.valid_len < scan.total_len {
                report.problems.push(Problem {
                    finding: Finding {
                        path: dir.join(SEAL_FILE),
                        offset: 0,
                        rule: "the seal describes the log before the damage".into(),
                    },
                    fix: Some(Fix::RemoveSeal),
                });
            }
        }
        None => match &scan.end {
            LogEnd::Torn { offset, reason } if scan.verdict.unproven.is_some() => {
                // Past acknowledged data that is lost: cut with it.
                report.problems.push(Problem {
                    finding: Finding {
                        path: log_path.clone(),
                        offset: *offset,
                        rule: format!("{reason}, after acknowledged data that is lost"),
                    },
                    fix: Some(Fix::CutLog {
                        at: scan.valid_len,
                        dropped: scan.total_len - scan.valid_len,
                    }),
                });
            }
            LogEnd::Torn { offset, reason } => {
                report.notes.push(Finding {
                    path: log_path.clone(),
                    offset: *offset,
                    rule: format!(
                        "torn tail ({reason}, {} bytes) after a stop without a clean shutdown: cut at start; nothing in it was acknowledged ({})",
                        scan.total_len - offset,
                        if scan.journal.present {
                            format!("{ACKS_FILE} names acknowledged batches up to byte {}", scan.verdict.proven_end)
                        } else {
                            format!("no {ACKS_FILE}: a data directory of an older version, which cannot prove it")
                        }
                    ),
                });
            }
            _ => {}
        },
    }

    if let (Some((offset, rule)), Some(unproven)) = (scan.lost_problem(), scan.verdict.unproven) {
        report.problems.push(Problem {
            finding: Finding {
                path: log_path.clone(),
                offset,
                rule,
            },
            fix: Some(Fix::AcceptLoss {
                at: unproven.journal_offset,
                lost: scan.verdict.lost.clone(),
            }),
        });
    }
    if let Some((offset, rule)) = &scan.journal.corrupt {
        report.problems.push(Problem {
            finding: Finding {
                path: dir.join(ACKS_FILE),
                offset: *offset,
                rule: rule.clone(),
            },
            fix: Some(Fix::CutJournal { at: *offset }),
        });
    }
    if let Some((offset, rule)) = seal_problem {
        report.problems.push(Problem {
            finding: Finding {
                path: dir.join(SEAL_FILE),
                offset,
                rule,
            },
            fix: Some(Fix::RemoveSeal),
        });
    }
    // Rules 1 to 3 over the valid prefix.
    let mut streams: BTreeMap<String, StreamWalk> = BTreeMap::new();
    let problem = |offset: u64, rule: String| Problem {
        finding: Finding {
            path: log_path.clone(),
            offset,
            rule,
        },
        fix: None,
    };
    for (offset, entry) in &scan.entries {
        let walk = streams.entry(entry.stream().to_string()).or_default();
        match entry {
            LogEntry::Record(r) => {
                if let Some(first) = walk.ids.get(&r.record_id) {
                    report.problems.push(problem(
                        *offset,
                        format!(
                            "a record id of stream {:?} appears a second time (first at byte {first}) (rule 1)",
                            r.stream
                        ),
                    ));
                    continue;
                }
                walk.ids.insert(r.record_id.clone(), *offset);
                let open = *walk.open.get_or_insert(r.window_id);
                if r.window_id != open {
                    report.problems.push(problem(
                        *offset,
                        format!(
                            "a record of stream {:?} is in window {} but the open window is {open} (rule 2)",
                            r.stream, r.window_id
                        ),
                    ));
                    continue;
                }
                walk.open_records += 1;
            }
            LogEntry::Close(c) => {
                let open = *walk.open.get_or_insert(c.window_id);
                if c.window_id != open {
                    report.problems.push(problem(
                        *offset,
                        format!(
                            "the close marker of window {} of stream {:?} does not close the open window {open} (rule 2)",
                            c.window_id, c.stream
                        ),
                    ));
                    continue;
                }
                walk.closed
                    .insert(c.window_id, (c.clone(), *offset, walk.open_records));
                walk.open = Some(c.window_id + 1);
                walk.open_records = 0;
            }
        }
    }

    // Rules 4 and 5 over the window files.
    let files = list_window_files(dir)?;
    report.window_files = files.outcomes.len();
    for path in &files.temporary {
        report.notes.push(Finding {
            path: path.clone(),
            offset: 0,
            rule: "temporary file of a window written when the daemon stopped: deleted at start"
                .into(),
        });
    }
    let mut by_window: BTreeMap<(String, u64), Vec<&OutcomeFile>> = BTreeMap::new();
    for file in &files.outcomes {
        by_window
            .entry((file.stream.clone(), file.window_id))
            .or_default()
            .push(file);
    }
    // Windows with a verified release, for rule 3's exception.
    let mut released_whole: HashMap<(String, u64), u64> = HashMap::new();
    for ((stream, window_id), outcome_files) in &by_window {
        if outcome_files.len() > 1 {
            report.problems.push(Problem {
                finding: Finding {
                    path: outcome_files[1].path.clone(),
                    offset: 0,
                    rule: format!(
                        "window {window_id} of stream {stream:?} has both a release and a failure file (rule 5)"
                    ),
                },
                fix: None,
            });
            continue;
        }
        let file = outcome_files[0];
        let walk = streams.entry(stream.clone()).or_default();
        let closed = walk.closed.get(window_id).cloned();
        let outcome = match read_placed_file(file) {
            Ok((outcome, Placed::Proven)) => outcome,
            Ok((outcome, Placed::LegacyFailure)) => {
                report.notes.push(Finding {
                    path: file.path.clone(),
                    offset: 0,
                    rule: format!(
                        "failure file of window {window_id} of stream {} written by an older version: it holds only its reason and cannot prove it is filed under its own window (accepted)",
                        crate::text::quote(stream)
                    ),
                });
                outcome
            }
            Err(StoreError::Corrupt { path, offset, rule }) => {
                // The log holds the window whole: it is re-anonymized from it.
                let rebuildable = closed
                    .as_ref()
                    .is_some_and(|(close, _, in_log)| close.records == *in_log);
                report.problems.push(Problem {
                    finding: Finding {
                        path,
                        offset,
                        rule: format!("{rule} (rule 5)"),
                    },
                    fix: rebuildable.then(|| Fix::MoveAway(file.path.clone())),
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let released = match &outcome {
            WindowOutcome::Released(bytes) => {
                <crate::proto::ReleasedWindow as prost::Message>::decode(bytes.as_slice()).ok()
            }
            WindowOutcome::Failed(_) => None,
        };
        match closed {
            Some((close, _, _)) => {
                if let Some(released) = &released
                    && released.records.len() as u64 != close.records
                {
                    report.problems.push(Problem {
                        finding: Finding {
                            path: file.path.clone(),
                            offset: 0,
                            rule: format!(
                                "the release of window {window_id} of stream {stream:?} holds {} records, its close marker says {} (rule 4)",
                                released.records.len(),
                                close.records
                            ),
                        },
                        fix: None,
                    });
                } else {
                    released_whole.insert((stream.clone(), *window_id), close.records);
                }
            }
            None => {
                // A close marker rebuilt from the release, if the window is the stream's open one.
                let rebuilt = released.as_ref().and_then(|released| {
                    let open = walk.open.unwrap_or(*window_id);
                    let report = released.report.as_ref()?;
                    let records = released.records.len() as u64;
                    (open == *window_id && walk.open_records <= records).then(|| WindowClose {
                        stream: stream.clone(),
                        window_id: *window_id,
                        records,
                        params: Params {
                            rho: report.rho,
                            m: report.m,
                            mode: if report.mode == "sampled" {
                                Mode::Sampled {
                                    epsilon: report.epsilon,
                                    delta: report.delta,
                                }
                            } else {
                                Mode::Exact
                            },
                        },
                    })
                });
                if let Some(close) = &rebuilt {
                    walk.closed
                        .insert(*window_id, (close.clone(), u64::MAX, walk.open_records));
                    walk.open = Some(window_id + 1);
                    walk.open_records = 0;
                    released_whole.insert((stream.clone(), *window_id), close.records);
                }
                report.problems.push(Problem {
                    finding: Finding {
                        path: file.path.clone(),
                        offset: 0,
                        rule: format!(
                            "window {window_id} of stream {stream:?} has an outcome file but {LOG_FILE} has no close marker for it{}: records could be acknowledged into a window already released (rule 4)",
                            if scan.total_len == 0 { " (the log is empty or missing)" } else { "" }
                        ),
                    },
                    fix: rebuilt.map(Fix::AppendClose),
                });
            }
        }
    }
    // Rule 3, and closed windows without a file below the highest with one.
    for (stream, walk) in &streams {
        let highest = by_window
            .range((stream.clone(), 0)..=(stream.clone(), u64::MAX))
            .next_back()
            .map(|((_, w), _)| *w);
        for (window_id, (close, offset, in_log)) in &walk.closed {
            if *offset == u64::MAX {
                continue;
            }
            let rebuilt_short = released_whole.contains_key(&(stream.clone(), *window_id))
                && *in_log < close.records;
            if *in_log != close.records && !rebuilt_short {
                report.problems.push(problem(
                    *offset,
                    format!(
                        "the close marker of window {window_id} of stream {stream:?} says {} records, the log holds {in_log} (rule 3)",
                        close.records
                    ),
                ));
            }
            if highest.is_some_and(|h| *window_id < h)
                && !by_window.contains_key(&(stream.clone(), *window_id))
            {
                report.notes.push(Finding {
                    path: dir
                        .join(super::released_windows::WINDOWS_DIR)
                        .join(super::stream_dir_name(stream))
                        .join(format!("{window_id:020}.released")),
                    offset: 0,
                    rule: format!(
                        "window {window_id} of stream {stream:?} has no outcome file: re-anonymized from the log at start (the same bytes)"
                    ),
                });
            }
        }
    }
    Ok(report)
}

/// A repair: the problems it fixes, in order, and the ones it cannot fix.
#[derive(Debug, Clone, Default)]
pub struct RepairPlan {
    pub fixes: Vec<(Finding, Fix)>,
    pub unfixable: Vec<Finding>,
}

/// Plans the repair of `dir` from its check (read-only).
pub fn plan_repair(dir: &Path) -> Result<RepairPlan, StoreError> {
    let report = check_data_dir(dir)?;
    let mut plan = RepairPlan::default();
    for problem in report.problems {
        match problem.fix {
            Some(fix) if !plan.fixes.iter().any(|(_, f)| *f == fix) => {
                plan.fixes.push((problem.finding, fix))
            }
            Some(_) => {}
            None => plan.unfixable.push(problem.finding),
        }
    }
    Ok(plan)
}

/// Copies `from` to `to` atomically and durably ([`crate::atomic_file`]): a backup is on disk, whole,
/// before the file it saves is cut.
fn copy_durably(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut source = std::fs::File::open(from)?;
    crate::atomic_file::write_atomically(to, |file| std::io::copy(&mut source, file).map(drop))
}

/// Applies `plan` to `dir` (only if it has no unfixable problem), copying every file it changes
/// into `backup` first (durably, before it is changed; a file moved into the backup is renamed).
/// Returns what it did, one line per change.
pub fn apply_repair(
    dir: &Path,
    plan: &RepairPlan,
    backup: &Path,
) -> Result<Vec<String>, StoreError> {
    if let Some(first) = plan.unfixable.first() {
        return Err(StoreError::Corrupt {
            path: first.path.clone(),
            offset: first.offset,
            rule: format!("{} (no automatic repair; nothing was changed)", first.rule),
        });
    }
    let mut done = Vec::new();
    if plan.fixes.is_empty() {
        return Ok(done);
    }
    std::fs::create_dir_all(backup).map_err(StoreError::io(backup, "creating the backup"))?;
    // The backup's name is durable before anything in it is relied upon.
    if let Some(parent) = backup.parent().filter(|p| !p.as_os_str().is_empty()) {
        super::sync_dir(parent)?;
    }
    let backup_of = |path: &Path| -> Result<PathBuf, StoreError> {
        let relative = path.strip_prefix(dir).unwrap_or(path);
        let target = backup.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(StoreError::io(parent, "creating the backup"))?;
        }
        Ok(target)
    };
    let log = dir.join(LOG_FILE);
    let mut log_backed_up = false;
    let mut backup_log = |done: &mut Vec<String>| -> Result<(), StoreError> {
        if !log_backed_up && log.exists() {
            let target = backup_of(&log)?;
            copy_durably(&log, &target).map_err(StoreError::io(&target, "backing up the log"))?;
            done.push(format!("copied {} to {}", log.display(), target.display()));
            log_backed_up = true;
        }
        Ok(())
    };
    // Seal and cut first, so that the log opens for the appended close markers.
    let mut closes = Vec::new();
    for (_, fix) in &plan.fixes {
        match fix {
            Fix::RemoveSeal => {
                let seal = dir.join(SEAL_FILE);
                let target = backup_of(&seal)?;
                std::fs::rename(&seal, &target)
                    .map_err(StoreError::io(&seal, "moving the seal into the backup"))?;
                done.push(format!("moved {} to {}", seal.display(), target.display()));
            }
            Fix::CutLog { at, dropped } => {
                backup_log(&mut done)?;
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&log)
                    .map_err(StoreError::io(&log, "opening the log to cut it"))?;
                file.set_len(*at)
                    .and_then(|()| file.sync_all())
                    .map_err(StoreError::io(&log, "cutting the log"))?;
                done.push(format!(
                    "cut {} at byte {at}: dropped {dropped} bytes",
                    log.display()
                ));
            }
            Fix::MoveAway(path) => {
                let target = backup_of(path)?;
                std::fs::rename(path, &target).map_err(StoreError::io(
                    path,
                    "moving a damaged window file into the backup",
                ))?;
                done.push(format!("moved {} to {}", path.display(), target.display()));
            }
            Fix::AppendClose(close) => closes.push(LogEntry::Close(close.clone())),
            Fix::AcceptLoss { at, .. } | Fix::CutJournal { at } => {
                let journal = dir.join(ACKS_FILE);
                let target = backup_of(&journal)?;
                if !target.exists() {
                    copy_durably(&journal, &target)
                        .map_err(StoreError::io(&target, "backing up the journal"))?;
                    done.push(format!(
                        "copied {} to {}",
                        journal.display(),
                        target.display()
                    ));
                }
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&journal)
                    .map_err(StoreError::io(&journal, "opening the journal to cut it"))?;
                file.set_len(*at)
                    .and_then(|()| file.sync_all())
                    .map_err(StoreError::io(&journal, "cutting the journal"))?;
                done.push(format!("cut {} at byte {at}", journal.display()));
                if let Fix::AcceptLoss { lost, .. } = fix {
                    done.push(format!(
                        "LOST for good: {}",
                        Verdict {
                            lost: lost.clone(),
                            ..Verdict::default()
                        }
                        .describe_lost()
                    ));
                }
            }
        }
    }
    super::sync_dir(dir)?;
    if !closes.is_empty() {
        backup_log(&mut done)?;
        let (mut opened, _, _) = TransactionLog::open(dir)?;
        opened.append(&closes)?;
        for close in &closes {
            if let LogEntry::Close(c) = close {
                done.push(format!(
                    "appended to {} the close marker of window {} of stream {:?} ({} records), rebuilt from its release",
                    log.display(),
                    c.window_id,
                    c.stream,
                    c.records
                ));
            }
        }
    }
    Ok(done)
}
