//! Released windows: one file per window and stream, written atomically and never rewritten.
//!
//! Layout: `<data_dir>/windows/<hex of stream name>/<window id, 20 digits>.released` holds the exact
//! bytes sent to subscribers (an encoded `ReleasedWindow`); `<...>.failed` instead records that the
//! window could not be anonymized (its text is the reason) and is never released.
//!
//! # File format (versioned)
//! * **Version 2** (written now, [`encode_outcome_file`]): `CLKWIN02`, body length (u32 LE),
//!   CRC-32 of the body (u32 LE), then the body: window id (u64 LE), kind (1 release, 2 failure),
//!   stream name length (u32 LE), stream name (UTF-8), payload.
//! * **Version 1** (older versions): `CLKWIN01`, payload length (u32 LE), CRC-32 of the payload
//!   (u32 LE), payload. **Headerless** files (older still) are the payload alone.
//!
//! Every version is read.
//!
//! # Invariants
//! 1. **Atomic.** A window file is written to `<window id, 20 digits>.tmp`, fsync'd, renamed into
//!    place and the directory fsync'd ([`crate::atomic_file::write_bytes_as`]). A reader sees either
//!    no file or the complete file; leftovers `*.tmp` of a crash are deleted by
//!    [`ReleasedWindows::open`] and noted by `cloakd store check`. The temporary name is fixed, not
//!    `tempfile`'s own, because it is part of this directory's format: the scan
//!    ([`list_window_files`]) tells a crash's leftover from an unknown file by it, and data
//!    directories of earlier versions use the same name (one daemon per data directory, so no two
//!    writers share it).
//! 2. **Once.** A window that has a file is never written again ([`ReleasedWindows::write_blocking`]
//!    stores nothing and says so), so every subscriber, before and after any restart, receives the
//!    same bytes. One daemon per data directory ([`super::DataDirLock`]) makes check-then-write safe.
//! 3. **In order.** Windows of a stream are written in increasing id with no gaps, so the next window
//!    to release is the lowest without a file: normally one past the highest, and after a file was
//!    lost, the lost one (re-anonymized from the log: the same bytes).
//! 4. **Verified on read.** [`ReleasedWindows::read_blocking`] checks the header, length, checksum
//!    and (for a release) that it is the release of the window asked for; a damaged file is
//!    [`StoreError::Corrupt`] naming the file, the byte offset and the rule, never served as a
//!    window. A damaged file is never rewritten either (invariant 2): `cloakd store repair` moves it
//!    away explicitly.
//!
//! 5. **In its place.** A file is served only as the outcome of the window it is filed under: a
//!    version-2 header must name that stream, window and kind; a release of version 1 or without a
//!    header must decode as a `ReleasedWindow` naming that stream and window. Anything else (a file
//!    copied over another window's, two files swapped, a failure renamed to a release) is
//!    [`StoreError::Corrupt`] with the rule "misplaced window file", at check, at start and on
//!    every read: never served, so no window is released twice and none is skipped.
//!    A *failure* file of version 1 or without header holds only its reason and cannot prove its
//!    place: it is still read (data directories of older versions keep working), and `cloakd store
//!    check` notes each one ([`Placed::LegacyFailure`]).
//!
//! These are the [`ReleaseStore`] contract; the trait methods run the blocking file work on tokio's
//! blocking pool.
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::release_store::{ReleaseStore, Stored, WindowOutcome};
use super::{StoreError, stream_dir_name, sync_dir};
use crate::atomic_file::{Step, write_bytes_as};

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

/// Header of a version-1 window file: magic, payload length, CRC-32 of the payload.
const MAGIC_V1: &[u8; 8] = b"CLKWIN01";
/// Header of a version-2 window file: magic, body length, CRC-32 of the body; the body is the
/// file's place (window id, kind, stream) followed by the payload.
const MAGIC_V2: &[u8; 8] = b"CLKWIN02";
const HEADER: usize = 16;
/// Longest stream name a version-2 header holds (longer names are refused on write).
const MAX_STREAM_BYTES: usize = 64 << 10;

/// Whether a window file holds a release or a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    Released,
    Failed,
}

impl OutcomeKind {
    fn code(self) -> u8 {
        match self {
            OutcomeKind::Released => 1,
            OutcomeKind::Failed => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            OutcomeKind::Released => "release",
            OutcomeKind::Failed => "failure",
        }
    }
}

/// One outcome file found in the windows directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeFile {
    pub stream: String,
    pub window_id: u64,
    pub kind: OutcomeKind,
    pub path: PathBuf,
}

/// What the windows directory holds: outcome files, temporary files of a crash, and anything else.
#[derive(Debug, Clone, Default)]
pub struct WindowFiles {
    pub outcomes: Vec<OutcomeFile>,
    pub temporary: Vec<PathBuf>,
    pub unknown: Vec<PathBuf>,
}

/// The bytes of the (version-2) file holding `payload` as the `kind` outcome of window
/// `window_id` of `stream` (invariant 5).
pub fn encode_outcome_file(
    stream: &str,
    window_id: u64,
    kind: OutcomeKind,
    payload: &[u8],
) -> Vec<u8> {
    let mut body = Vec::with_capacity(13 + stream.len() + payload.len());
    body.extend_from_slice(&window_id.to_le_bytes());
    body.push(kind.code());
    body.extend_from_slice(&(stream.len() as u32).to_le_bytes());
    body.extend_from_slice(stream.as_bytes());
    body.extend_from_slice(payload);
    let mut crc = flate2::Crc::new();
    crc.update(&body);
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC_V2);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The bytes of a version-1 file (written by older versions; kept for tests of reading them).
pub fn encode_outcome_file_v1(payload: &[u8]) -> Vec<u8> {
    let mut crc = flate2::Crc::new();
    crc.update(payload);
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC_V1);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Whether a verified outcome file proves its place by itself (version 2, or a release naming its
/// stream and window), or is a failure file of an older version that cannot (invariant 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    Proven,
    LegacyFailure,
}

/// The rule a misplaced file breaks.
fn misplaced(
    kind: OutcomeKind,
    stream: &str,
    window_id: u64,
    found_kind: OutcomeKind,
    found_stream: &str,
    found_window: u64,
) -> String {
    format!(
        "misplaced window file: filed as the {} of window {window_id} of stream {}, it is the {} of window {found_window} of stream {} (a window file must name the stream and window it is filed under)",
        kind.name(),
        crate::text::quote(stream),
        found_kind.name(),
        crate::text::quote(found_stream),
    )
}

/// Verifies the bytes of window `window_id` of `stream`'s outcome file (invariants 4 and 5): the
/// outcome, or (byte offset, rule).
pub fn verify_outcome_file(
    bytes: &[u8],
    kind: OutcomeKind,
    stream: &str,
    window_id: u64,
) -> Result<WindowOutcome, (u64, String)> {
    verify_placed(bytes, kind, stream, window_id).map(|(outcome, _)| outcome)
}

/// [`verify_outcome_file`], also saying whether the file proved its place.
pub fn verify_placed(
    bytes: &[u8],
    kind: OutcomeKind,
    stream: &str,
    window_id: u64,
) -> Result<(WindowOutcome, Placed), (u64, String)> {
    let headed = |magic: &[u8; 8]| {
        bytes
            .get(..HEADER)
            .filter(|h| h.starts_with(magic))
            .map(|h| {
                (
                    u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize,
                    u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
                )
            })
    };
    let checked = |len: usize, crc: u32| -> Result<&[u8], (u64, String)> {
        let body = &bytes[HEADER..];
        if body.len() != len {
            return Err((
                (HEADER + body.len().min(len)) as u64,
                format!(
                    "the header announces {len} payload bytes, the file holds {}",
                    body.len()
                ),
            ));
        }
        let mut actual = flate2::Crc::new();
        actual.update(body);
        if actual.sum() != crc {
            return Err((
                HEADER as u64,
                format!(
                    "checksum mismatch: the header's CRC-32 is {crc:08x}, the payload gives {:08x}",
                    actual.sum()
                ),
            ));
        }
        Ok(body)
    };
    if let Some((len, crc)) = headed(MAGIC_V2) {
        let body = checked(len, crc)?;
        let place = (|| {
            let found_window = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
            let found_kind = match body.get(8)? {
                1 => OutcomeKind::Released,
                2 => OutcomeKind::Failed,
                _ => return None,
            };
            let name_len = u32::from_le_bytes(body.get(9..13)?.try_into().ok()?) as usize;
            let name = std::str::from_utf8(body.get(13..13usize.checked_add(name_len)?)?).ok()?;
            Some((found_window, found_kind, name, 13 + name_len))
        })();
        let Some((found_window, found_kind, found_stream, at)) = place else {
            return Err((
                HEADER as u64,
                "the header's place (window id, kind, stream name) does not decode".to_string(),
            ));
        };
        if (found_window, found_kind, found_stream) != (window_id, kind, stream) {
            return Err((
                HEADER as u64,
                misplaced(
                    kind,
                    stream,
                    window_id,
                    found_kind,
                    found_stream,
                    found_window,
                ),
            ));
        }
        let payload = &body[at..];
        return match kind {
            OutcomeKind::Released => {
                Ok((WindowOutcome::Released(payload.to_vec()), Placed::Proven))
            }
            OutcomeKind::Failed => failure(payload).map(|o| (o, Placed::Proven)),
        };
    }
    let payload = if let Some((len, crc)) = headed(MAGIC_V1) {
        checked(len, crc)?
    } else if MAGIC_V1.starts_with(bytes)
        || MAGIC_V2.starts_with(bytes)
        || bytes.starts_with(&MAGIC_V1[..4])
    {
        return Err((
            bytes.len().min(HEADER) as u64,
            format!(
                "the file is cut inside its {HEADER}-byte header ({} bytes)",
                bytes.len()
            ),
        ));
    } else {
        // Written before the header existed.
        bytes
    };
    match kind {
        // A release of an older version names its stream and window in its content.
        OutcomeKind::Released => {
            let window = <crate::proto::ReleasedWindow as prost::Message>::decode(payload)
                .map_err(|e| (0, format!("the release does not decode: {e}")))?;
            if window.stream != stream || window.window_id != window_id {
                return Err((
                    0,
                    misplaced(
                        kind,
                        stream,
                        window_id,
                        kind,
                        &window.stream,
                        window.window_id,
                    ),
                ));
            }
            if window.report.is_none() {
                return Err((0, "the release has no report".to_string()));
            }
            Ok((WindowOutcome::Released(payload.to_vec()), Placed::Proven))
        }
        // A failure file of an older version holds only its reason: accepted (documented).
        OutcomeKind::Failed => failure(payload).map(|o| (o, Placed::LegacyFailure)),
    }
}

fn failure(payload: &[u8]) -> Result<WindowOutcome, (u64, String)> {
    match std::str::from_utf8(payload) {
        Ok(reason) if !reason.is_empty() => Ok(WindowOutcome::Failed(reason.to_string())),
        _ => Err((0, "the failure reason is empty or not UTF-8".to_string())),
    }
}

/// Lists `<data_dir>/windows` without changing it; a missing directory holds nothing.
pub fn list_window_files(data_dir: &Path) -> Result<WindowFiles, StoreError> {
    let root = data_dir.join(WINDOWS_DIR);
    let mut found = WindowFiles::default();
    let streams = match std::fs::read_dir(&root) {
        Ok(streams) => streams,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(StoreError::io(&root, "listing released windows")(e)),
    };
    for stream_dir in streams {
        let dir = stream_dir
            .map_err(StoreError::io(&root, "listing released windows"))?
            .path();
        let stream = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(super::stream_name_of_dir);
        let (Some(stream), true) = (stream, dir.is_dir()) else {
            found.unknown.push(dir);
            continue;
        };
        let files =
            std::fs::read_dir(&dir).map_err(StoreError::io(&dir, "listing released windows"))?;
        for file in files {
            let path = file
                .map_err(StoreError::io(&dir, "listing released windows"))?
                .path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            let id = path
                .file_stem()
                .and_then(|s| s.to_str())
                .filter(|s| s.len() == 20)
                .and_then(|s| s.parse::<u64>().ok());
            let kind = match ext {
                RELEASED_EXT => Some(OutcomeKind::Released),
                FAILED_EXT => Some(OutcomeKind::Failed),
                _ => None,
            };
            match (kind, id) {
                (Some(kind), Some(window_id)) => found.outcomes.push(OutcomeFile {
                    stream: stream.clone(),
                    window_id,
                    kind,
                    path,
                }),
                _ if ext == TMP_EXT => found.temporary.push(path),
                _ => found.unknown.push(path),
            }
        }
    }
    found
        .outcomes
        .sort_by(|a, b| (&a.stream, a.window_id).cmp(&(&b.stream, b.window_id)));
    Ok(found)
}

/// Reads and verifies one outcome file (invariants 4 and 5).
pub fn read_outcome_file(file: &OutcomeFile) -> Result<WindowOutcome, StoreError> {
    read_placed_file(file).map(|(outcome, _)| outcome)
}

/// [`read_outcome_file`], also saying whether the file proved its place.
pub fn read_placed_file(file: &OutcomeFile) -> Result<(WindowOutcome, Placed), StoreError> {
    let bytes =
        std::fs::read(&file.path).map_err(StoreError::io(&file.path, "reading a window file"))?;
    verify_placed(&bytes, file.kind, &file.stream, file.window_id).map_err(|(offset, rule)| {
        StoreError::Corrupt {
            path: file.path.clone(),
            offset,
            rule,
        }
    })
}

impl ReleasedWindows {
    /// Opens (creating) `<data_dir>/windows` and deletes temporary files left by a crash.
    pub fn open(data_dir: &Path) -> Result<ReleasedWindows, StoreError> {
        let root = data_dir.join(WINDOWS_DIR);
        std::fs::create_dir_all(&root)
            .map_err(StoreError::io(&root, "creating the windows directory"))?;
        sync_dir(data_dir)?;
        for path in list_window_files(data_dir)?.temporary {
            std::fs::remove_file(&path)
                .map_err(StoreError::io(&path, "removing a temporary window file"))?;
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
    /// window already has a file, even a damaged one (invariant 2).
    pub fn write_blocking(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        if self.file(stream, window_id, RELEASED_EXT).exists()
            || self.file(stream, window_id, FAILED_EXT).exists()
        {
            return Ok(Stored::Already);
        }
        let dir = self.stream_dir(stream);
        if !dir.exists() {
            std::fs::create_dir_all(&dir)
                .map_err(StoreError::io(&dir, "creating a stream's window directory"))?;
            sync_dir(&self.root)?;
        }
        let (ext, kind, payload): (&str, OutcomeKind, &[u8]) = match outcome {
            WindowOutcome::Released(bytes) => (RELEASED_EXT, OutcomeKind::Released, bytes),
            WindowOutcome::Failed(reason) => (FAILED_EXT, OutcomeKind::Failed, reason.as_bytes()),
        };
        if stream.len() > MAX_STREAM_BYTES {
            return Err(StoreError::Unavailable {
                action: "writing a window file",
                detail: format!(
                    "stream names are at most {MAX_STREAM_BYTES} bytes in a window file's header"
                ),
            });
        }
        let target = self.file(stream, window_id, ext);
        let bytes = encode_outcome_file(stream, window_id, kind, payload);
        write_bytes_as(&target, &format!("{window_id:020}.{TMP_EXT}"), &bytes).map_err(|e| {
            let action = match e.step {
                Step::Create => "creating a window file",
                Step::Write | Step::Sync => "writing a window file",
                Step::Rename => "renaming a window file",
                Step::SyncDirectory => "syncing the directory",
            };
            StoreError::io(&e.path, action)(e.source)
        })?;
        Ok(Stored::Written)
    }

    /// The verified outcome of window `window_id` of `stream`, if it has one (invariant 4).
    pub fn read_blocking(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        for (ext, kind) in [
            (RELEASED_EXT, OutcomeKind::Released),
            (FAILED_EXT, OutcomeKind::Failed),
        ] {
            let file = OutcomeFile {
                stream: stream.to_string(),
                window_id,
                kind,
                path: self.file(stream, window_id, ext),
            };
            match read_outcome_file(&file) {
                Ok(outcome) => return Ok(Some(outcome)),
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The lowest window of `stream` without an outcome file (invariant 3).
    pub fn next_unreleased_blocking(&self, stream: &str) -> Result<u64, StoreError> {
        let dir = self.stream_dir(stream);
        let files = match std::fs::read_dir(&dir) {
            Ok(files) => files,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io(&dir, "listing released windows")(e)),
        };
        let mut present = std::collections::BTreeSet::new();
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
                present.insert(id);
            }
        }
        Ok((0..).find(|id| !present.contains(id)).unwrap_or(0))
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
