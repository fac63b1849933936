//! Released windows: one file per window and stream, written atomically and never rewritten.
//!
//! Layout: `<data_dir>/windows/<hex of stream name>/<window id, 20 digits>.released` holds the exact
//! bytes sent to subscribers (an encoded `ReleasedWindow`); `<...>.failed` instead records that the
//! window could not be anonymized (its text is the reason) and is never released.
//!
//! # Invariants
//! 1. **Atomic.** A window file is written to `<name>.tmp`, fsync'd, renamed into place and the
//!    directory fsync'd. A reader sees either no file or the complete file; leftovers `*.tmp` of a
//!    crash are deleted by [`ReleasedWindows::open`].
//! 2. **Once.** A window that has a file is never written again ([`ReleasedWindows::write_blocking`]
//!    stores nothing and says so), so every subscriber, before and after any restart, receives the
//!    same bytes. One daemon per data directory ([`super::DataDirLock`]) makes check-then-write safe.
//! 3. **In order.** Windows of a stream are written in increasing id with no gaps, so the next window
//!    to release is one past the highest file present.
//!
//! These are the [`ReleaseStore`] contract; the trait methods run the blocking file work on tokio's
//! blocking pool.
use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::release_store::{ReleaseStore, Stored, WindowOutcome};
use super::{StoreError, stream_dir_name, sync_dir};

/// Directory of released windows inside the data directory.
pub const WINDOWS_DIR: &str = "windows";
const RELEASED_EXT: &str = "released";
const FAILED_EXT: &str = "failed";
const TMP_EXT: &str = "tmp";

/// The released windows of every stream.
#[derive(Debug, Clone)]
pub struct ReleasedWindows {
    root: PathBuf,
}

impl ReleasedWindows {
    /// Opens (creating) `<data_dir>/windows` and deletes temporary files left by a crash.
    pub fn open(data_dir: &Path) -> Result<ReleasedWindows, StoreError> {
        let root = data_dir.join(WINDOWS_DIR);
        std::fs::create_dir_all(&root)
            .map_err(StoreError::io(&root, "creating the windows directory"))?;
        sync_dir(data_dir)?;
        let streams =
            std::fs::read_dir(&root).map_err(StoreError::io(&root, "listing released windows"))?;
        for stream in streams {
            let stream = stream.map_err(StoreError::io(&root, "listing released windows"))?;
            let dir = stream.path();
            if !dir.is_dir() {
                continue;
            }
            let files = std::fs::read_dir(&dir)
                .map_err(StoreError::io(&dir, "listing released windows"))?;
            for file in files {
                let path = file
                    .map_err(StoreError::io(&dir, "listing released windows"))?
                    .path();
                if path.extension().is_some_and(|e| e == TMP_EXT) {
                    std::fs::remove_file(&path)
                        .map_err(StoreError::io(&path, "removing a temporary window file"))?;
                }
            }
        }
        Ok(ReleasedWindows { root })
    }

    fn stream_dir(&self, stream: &str) -> PathBuf {
        self.root.join(stream_dir_name(stream))
    }

    fn file(&self, stream: &str, window_id: u64, ext: &str) -> PathBuf {
        self.stream_dir(stream)
            .join(format!("{window_id:020}"))
            .with_extension(ext)
    }

    /// Writes the outcome of window `window_id` of `stream` atomically (invariant 1), unless the
    /// window already has one (invariant 2).
    pub fn write_blocking(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        if self.read_blocking(stream, window_id)?.is_some() {
            return Ok(Stored::Already);
        }
        let dir = self.stream_dir(stream);
        if !dir.exists() {
            std::fs::create_dir_all(&dir)
                .map_err(StoreError::io(&dir, "creating a stream's window directory"))?;
            sync_dir(&self.root)?;
        }
        let (ext, bytes): (&str, &[u8]) = match outcome {
            WindowOutcome::Released(bytes) => (RELEASED_EXT, bytes),
            WindowOutcome::Failed(reason) => (FAILED_EXT, reason.as_bytes()),
        };
        let target = self.file(stream, window_id, ext);
        let tmp = self.file(stream, window_id, TMP_EXT);
        let mut file =
            std::fs::File::create(&tmp).map_err(StoreError::io(&tmp, "creating a window file"))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(StoreError::io(&tmp, "writing a window file"))?;
        drop(file);
        std::fs::rename(&tmp, &target)
            .map_err(StoreError::io(&target, "renaming a window file"))?;
        sync_dir(&dir)?;
        Ok(Stored::Written)
    }

    /// The outcome of window `window_id` of `stream`, if it has one.
    pub fn read_blocking(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        let released = self.file(stream, window_id, RELEASED_EXT);
        match std::fs::read(&released) {
            Ok(bytes) => return Ok(Some(WindowOutcome::Released(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(&released, "reading a window file")(e)),
        }
        let failed = self.file(stream, window_id, FAILED_EXT);
        match std::fs::read(&failed) {
            Ok(bytes) => Ok(Some(WindowOutcome::Failed(
                String::from_utf8_lossy(&bytes).into_owned(),
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(&failed, "reading a window file")(e)),
        }
    }

    /// One past the highest window of `stream` with an outcome; 0 if none (invariant 3).
    pub fn next_unreleased_blocking(&self, stream: &str) -> Result<u64, StoreError> {
        let dir = self.stream_dir(stream);
        let files = match std::fs::read_dir(&dir) {
            Ok(files) => files,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io(&dir, "listing released windows")(e)),
        };
        let mut next = 0;
        for file in files {
            let path = file
                .map_err(StoreError::io(&dir, "listing released windows"))?
                .path();
            let is_outcome = path
                .extension()
                .is_some_and(|e| e == RELEASED_EXT || e == FAILED_EXT);
            let id = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok());
            if let (true, Some(id)) = (is_outcome, id) {
                next = next.max(id + 1);
            }
        }
        Ok(next)
    }
}

#[async_trait]
impl ReleaseStore for ReleasedWindows {
    async fn write_once(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        let (store, stream, outcome) = (self.clone(), stream.to_string(), outcome.clone());
        super::blocking(&self.root, "running a window store task", move || {
            store.write_blocking(&stream, window_id, &outcome)
        })
        .await
    }

    async fn read(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        let (store, stream) = (self.clone(), stream.to_string());
        super::blocking(&self.root, "running a window store task", move || {
            store.read_blocking(&stream, window_id)
        })
        .await
    }

    async fn next_unreleased(&self, stream: &str) -> Result<u64, StoreError> {
        let (store, stream) = (self.clone(), stream.to_string());
        super::blocking(&self.root, "running a window store task", move || {
            store.next_unreleased_blocking(&stream)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_removes_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReleasedWindows::open(dir.path()).unwrap();
        store
            .write_blocking("a", 0, &WindowOutcome::Released(vec![1]))
            .unwrap();
        let stream_dir = dir.path().join(WINDOWS_DIR).join(stream_dir_name("a"));
        let tmp = stream_dir.join(format!("{:020}.{TMP_EXT}", 1));
        std::fs::write(&tmp, b"half").unwrap();
        let store = ReleasedWindows::open(dir.path()).unwrap();
        assert!(!tmp.exists());
        assert_eq!(store.next_unreleased_blocking("a").unwrap(), 1);
        assert_eq!(store.read_blocking("a", 1).unwrap(), None);
    }
}
