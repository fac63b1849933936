//! Writing a file atomically, the one way every writer of a whole file does it (the command
//! outputs, the store's seal and window files, the ledger's compaction and hash secret): the content
//! goes into a temporary file beside the target, which is fsynced, renamed over the target and
//! followed by an fsync of the directory.
//!
//! Two kinds of temporary name:
//! * [`AtomicFile::create`]: `tempfile`'s, `.NAME.XXXXXX.partial`, a name of its own, so runs side
//!   by side never share one (the command outputs, the ledger's hash secret).
//! * [`AtomicFile::create_as`]: a name the caller gives, for a writer alone in its directory (the
//!   store under the data-directory lock, the ledger under its own): there the temporary name is
//!   part of the directory's format, which recovery and `cloakd store check` recognise by name, and
//!   which builds before and after this one share. A leftover of that name (a crash) is removed and
//!   created anew, never written through.
//!
//! Invariants: the target holds either its old content (or does not exist) or the whole new
//! content, never part of it, even if the process dies; once [`AtomicFile::commit`] (or
//! [`write_atomically`]) returns `Ok`, the new content and its name are durable;
//! [`AtomicFile::commit_noclobber`] never replaces a target that exists (the file stays as the
//! other writer left it); a temporary file not committed (an error, a panic, an early return) is
//! removed when dropped. This module imports nothing of the crate (a leaf of the layers).
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// A file being written beside its target, renamed into place on [`AtomicFile::commit`].
#[derive(Debug)]
pub struct AtomicFile {
    temporary: tempfile::NamedTempFile,
    target: PathBuf,
}

impl AtomicFile {
    /// A new empty temporary file in `target`'s directory (`.NAME.XXXXXX.partial`).
    pub fn create(target: &Path) -> io::Result<AtomicFile> {
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".partial");
        // As `File::create` would: what the umask allows (tempfile's own default is 0600).
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let temporary = builder.tempfile_in(directory_of(target))?;
        Ok(AtomicFile {
            temporary,
            target: target.to_path_buf(),
        })
    }

    /// A new empty temporary file named `temporary_name` in `target`'s directory, for a writer
    /// alone in that directory (module docs): a file of that name left by a crash is removed first,
    /// so the content never goes through a file or link that was there. `temporary_name` is a plain
    /// file name other than the target's.
    pub fn create_as(target: &Path, temporary_name: &str) -> io::Result<AtomicFile> {
        let name = std::ffi::OsStr::new(temporary_name);
        let plain = Path::new(name).file_name() == Some(name);
        if !plain || target.file_name() == Some(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{temporary_name:?} is not a temporary file name beside the target"),
            ));
        }
        let path = directory_of(target).join(temporary_name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        // Removed when dropped from here on (`TempPath` makes a relative path absolute).
        let temporary_path = match tempfile::TempPath::try_from_path(&path) {
            Ok(temporary_path) => temporary_path,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(AtomicFile {
            temporary: tempfile::NamedTempFile::from_parts(file, temporary_path),
            target: target.to_path_buf(),
        })
    }

    /// The temporary file, to write the content into.
    pub fn file(&mut self) -> &mut File {
        self.temporary.as_file_mut()
    }

    /// Where the content is written until the commit (to name it in an error).
    pub fn temporary_path(&self) -> &Path {
        self.temporary.path()
    }

    /// Makes the content durable and puts it in place of the target: fsync, rename, directory
    /// fsync.
    pub fn commit(self) -> Result<(), WriteError> {
        self.finish(true)
    }

    /// [`AtomicFile::commit`], but only if the target does not exist: otherwise the target is left
    /// as it is, the temporary file is removed, and the error is a [`Step::Rename`] of kind
    /// [`io::ErrorKind::AlreadyExists`] (so of two writers racing to create a file, the first one
    /// wins and the other can read what it wrote).
    pub fn commit_noclobber(self) -> Result<(), WriteError> {
        self.finish(false)
    }

    fn finish(self, replace: bool) -> Result<(), WriteError> {
        let failed = |step: Step, path: &Path| {
            let path = path.to_path_buf();
            move |source: io::Error| WriteError { step, path, source }
        };
        let temporary_path = self.temporary.path().to_path_buf();
        self.temporary
            .as_file()
            .sync_all()
            .map_err(failed(Step::Sync, &temporary_path))?;
        let persisted = if replace {
            self.temporary.persist(&self.target)
        } else {
            self.temporary.persist_noclobber(&self.target)
        };
        // On an error the temporary file is dropped with the `PersistError`: removed.
        persisted.map_err(|e| failed(Step::Rename, &self.target)(e.error))?;
        let dir = directory_of(&self.target);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(failed(Step::SyncDirectory, dir))
    }
}

/// Writes `bytes` to `target` atomically through the temporary file `temporary_name` beside it
/// ([`AtomicFile::create_as`], [`AtomicFile::commit`]); an error says the step and its file, for
/// the caller to name them in its own error.
pub fn write_bytes_as(target: &Path, temporary_name: &str, bytes: &[u8]) -> Result<(), WriteError> {
    let file = AtomicFile::create_as(target, temporary_name).map_err(|source| WriteError {
        step: Step::Create,
        path: directory_of(target).join(temporary_name),
        source,
    })?;
    write_into(file, bytes)?.commit()
}

/// Creates `target` holding `bytes`, atomically, unless it exists ([`AtomicFile::create`],
/// [`AtomicFile::commit_noclobber`]): a target that exists, even one created meanwhile by another
/// process, is left as it is (a [`Step::Rename`] error of kind [`io::ErrorKind::AlreadyExists`]).
/// A [`Step::Create`] error names the target (the temporary file has no name yet).
pub fn create_with_bytes(target: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let file = AtomicFile::create(target).map_err(|source| WriteError {
        step: Step::Create,
        path: target.to_path_buf(),
        source,
    })?;
    write_into(file, bytes)?.commit_noclobber()
}

fn write_into(mut file: AtomicFile, bytes: &[u8]) -> Result<AtomicFile, WriteError> {
    match io::Write::write_all(file.file(), bytes) {
        Ok(()) => Ok(file),
        Err(source) => Err(WriteError {
            step: Step::Write,
            path: file.temporary_path().to_path_buf(),
            source,
        }),
    }
}

/// The step of an atomic write that failed, the file it failed on and the error.
#[derive(Debug)]
pub struct WriteError {
    pub step: Step,
    /// The temporary file (up to [`Step::Sync`]), the target ([`Step::Rename`]) or the target's
    /// directory ([`Step::SyncDirectory`]).
    pub path: PathBuf,
    pub source: io::Error,
}

/// A step of an atomic write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating the temporary file ([`write_bytes_as`], [`create_with_bytes`]).
    Create,
    /// Writing the content into it ([`write_bytes_as`], [`create_with_bytes`]).
    Write,
    /// The fsync of the content.
    Sync,
    /// The rename over the target.
    Rename,
    /// The fsync of the directory.
    SyncDirectory,
}

impl std::fmt::Display for WriteError {
    /// The I/O error's own words (the callers name the file and the step).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for WriteError {}

impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> io::Error {
        e.source
    }
}

/// Writes `target` atomically with what `body` writes into the temporary file.
pub fn write_atomically(
    target: &Path,
    body: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = AtomicFile::create(target)?;
    body(file.file())?;
    Ok(file.commit()?)
}

/// The directory a file path is in (`.` for a bare name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn the_target_changes_only_on_commit_and_no_temporary_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.csv");
        std::fs::write(&target, "old").unwrap();
        let mut staged = AtomicFile::create(&target).unwrap();
        staged.file().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        staged.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");

        let failed = write_atomically(&target, |file| {
            file.write_all(b"partial")?;
            Err(io::Error::other("the writer failed"))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_given_temporary_name_replaces_a_leftover_and_is_gone_after_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("seal");
        let leftover = dir.path().join("seal.tmp");
        std::fs::write(&leftover, "a crash left this longer content").unwrap();
        let mut staged = AtomicFile::create_as(&target, "seal.tmp").unwrap();
        assert_eq!(staged.temporary_path(), leftover);
        assert_eq!(std::fs::read(&leftover).unwrap(), b"", "created anew");
        staged.file().write_all(b"new").unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert!(!leftover.exists());

        let mut dropped = AtomicFile::create_as(&target, "seal.tmp").unwrap();
        dropped.file().write_all(b"never").unwrap();
        drop(dropped);
        assert!(!leftover.exists());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");

        for bad in ["seal", "sub/seal.tmp", "..", ""] {
            let err = AtomicFile::create_as(&target, bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn commit_noclobber_leaves_an_existing_target_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("key");
        let mut first = AtomicFile::create(&target).unwrap();
        first.file().write_all(b"first").unwrap();
        let mut second = AtomicFile::create(&target).unwrap();
        second.file().write_all(b"second").unwrap();
        first.commit_noclobber().unwrap();
        let err = second.commit_noclobber().unwrap_err();
        assert_eq!(err.step, Step::Rename);
        assert_eq!(err.path, target);
        assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "first");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}
