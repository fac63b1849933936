//! Writing a file atomically, the one way every command that writes an output uses: the content
//! goes into a new temporary file beside the target (`tempfile`, a name of its own, so runs side by
//! side never share one), which is fsynced, renamed over the target and followed by an fsync of the
//! directory.
//!
//! Invariants: the target holds either its old content (or does not exist) or the whole new
//! content, never part of it, even if the process dies; once [`AtomicFile::commit`] (or
//! [`write_atomically`]) returns `Ok`, the new content and its name are durable; a temporary file
//! not committed (an error, a panic, an early return) is removed when dropped.
use std::fs::File;
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

    /// The temporary file, to write the content into.
    pub fn file(&mut self) -> &mut File {
        self.temporary.as_file_mut()
    }

    /// Makes the content durable and puts it in place of the target: fsync, rename, directory
    /// fsync.
    pub fn commit(self) -> io::Result<()> {
        self.temporary.as_file().sync_all()?;
        self.temporary.persist(&self.target).map_err(|e| e.error)?;
        File::open(directory_of(&self.target))?.sync_all()
    }
}

/// Writes `target` atomically with what `body` writes into the temporary file.
pub fn write_atomically(
    target: &Path,
    body: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = AtomicFile::create(target)?;
    body(file.file())?;
    file.commit()
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
}
