//! `cloakd store check DIR` and `cloakd store repair DIR`: the embedded transaction store of a data
//! directory, checked by the same rules the daemon checks before it starts
//! ([`crate::store::check`]), and repaired only when asked.
//!
//! `check` is read-only and exits non-zero on any problem, printing each with its file, byte offset
//! and rule. `repair` takes the data directory's lock (no daemon may run on it), prints every fix
//! before applying it, copies every file it changes into `DIR/repair-backup-<unix seconds>/`, and
//! changes nothing when a problem has no fix or with `--dry-run`.
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::store::check::{apply_repair, check_data_dir, plan_repair};

#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Check a data directory (transactions.data_dir) without changing it: the log's frames and
    /// seal, the release files, and the rules between them. Exits 1 on any problem.
    Check {
        /// The data directory.
        dir: PathBuf,
    },
    /// Repair a data directory explicitly (the daemon must be stopped): prints what it drops or
    /// rebuilds, and keeps a copy of every changed file in DIR/repair-backup-<unix seconds>/.
    Repair {
        /// The data directory.
        dir: PathBuf,
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs the command; `Ok(false)` when the directory has problems left (exit status 1).
pub fn run(args: StoreArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    match args.command {
        StoreCommand::Check { dir } => check(&dir, out),
        StoreCommand::Repair { dir, dry_run } => repair(&dir, dry_run, out),
    }
}

fn require_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        anyhow::bail!(
            "{}: not a directory (give transactions.data_dir)",
            dir.display()
        );
    }
    Ok(())
}

fn check(dir: &std::path::Path, out: &mut impl Write) -> anyhow::Result<bool> {
    require_dir(dir)?;
    let report = check_data_dir(dir)?;
    for problem in &report.problems {
        writeln!(out, "PROBLEM {}", problem.finding)?;
        match &problem.fix {
            Some(fix) => writeln!(out, "  repair would: {fix}")?,
            None => writeln!(out, "  no automatic repair")?,
        }
    }
    for note in &report.notes {
        writeln!(out, "NOTE {note}")?;
    }
    if report.lost_records() > 0 {
        writeln!(
            out,
            "LOST {}",
            crate::store::ack_journal::Verdict {
                lost: report.lost.clone(),
                ..Default::default()
            }
            .describe_lost()
        )?;
    }
    writeln!(
        out,
        "{}: {} log entries, {} window files, {} problems, {} acknowledged records lost",
        dir.display(),
        report.log_entries,
        report.window_files,
        report.problems.len(),
        report.lost_records()
    )?;
    Ok(report.problems.is_empty())
}

fn repair(dir: &std::path::Path, dry_run: bool, out: &mut impl Write) -> anyhow::Result<bool> {
    require_dir(dir)?;
    let _lock = crate::store::DataDirLock::acquire(dir)?;
    let plan = plan_repair(dir)?;
    for (finding, fix) in &plan.fixes {
        writeln!(out, "PROBLEM {finding}")?;
        writeln!(out, "  {}: {fix}", if dry_run { "would" } else { "will" })?;
    }
    for finding in &plan.unfixable {
        writeln!(out, "PROBLEM {finding}")?;
        writeln!(out, "  no automatic repair")?;
    }
    if !plan.unfixable.is_empty() {
        writeln!(
            out,
            "{} problems have no automatic repair: nothing was changed (see docs/operations.md, \"The daemon refuses to start: the store\")",
            plan.unfixable.len()
        )?;
        return Ok(false);
    }
    if plan.fixes.is_empty() {
        writeln!(out, "{}: nothing to repair", dir.display())?;
        return Ok(true);
    }
    if dry_run {
        writeln!(out, "dry run: nothing was changed")?;
        return Ok(true);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let backup = dir.join(format!("repair-backup-{stamp}"));
    for line in apply_repair(dir, &plan, &backup)? {
        writeln!(out, "{line}")?;
    }
    let after = check_data_dir(dir)?;
    for problem in &after.problems {
        writeln!(out, "PROBLEM left: {}", problem.finding)?;
    }
    writeln!(
        out,
        "repaired; backup in {}; {} problems left",
        backup.display(),
        after.problems.len()
    )?;
    Ok(after.problems.is_empty())
}
