//! One daemon per data directory: an exclusive advisory lock (`flock`) on `data_dir/LOCK`, held for
//! the daemon's life. The kernel releases it when the process ends in any way (crash, kill -9), so a
//! stale lock file never blocks a restart; the file also records the holder's pid, which a refused
//! second daemon reports.
//!
//! Invariant: while a [`DataDirLock`] lives, no other process (and no second lock in this process)
//! can lock the same directory, so only one writer ever appends to its transaction log.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use super::StoreError;

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

/// The held lock of a data directory; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Locks `dir` (creating it if needed), or reports who holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, StoreError> {
        std::fs::create_dir_all(dir).map_err(StoreError::io(dir, "creating the data directory"))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(StoreError::io(&path, "opening the lock file"))?;
        if let Err(err) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if err == rustix::io::Errno::WOULDBLOCK {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(StoreError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder.trim().parse().ok(),
                });
            }
            return Err(StoreError::Io {
                path,
                action: "locking the data directory",
                source: err.into(),
            });
        }
        let record_pid = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            writeln!(file, "{}", std::process::id())?;
            file.sync_all()
        };
        record_pid(&mut file).map_err(StoreError::io(&path, "writing the lock file"))?;
        Ok(DataDirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        drop(lock);
        assert!(DataDirLock::acquire(dir.path()).is_ok());
    }
}
