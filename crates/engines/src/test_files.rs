//! The files the engines' tests read: the repository's test data and examples (this crate sits two
//! levels below the repository's root), and mobility traces, gzip or not. Tests only: the engines
//! themselves open no file.
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::location::trace::{TracePoint, read_trace};

/// A trace file of the repository or the shared data, gzip or not, for the engines' tests on
/// real traces.
pub(crate) fn read_trace_file(path: &Path, limit: Option<usize>) -> Vec<TracePoint> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let origin = path.display().to_string();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        read_trace(
            flate2::read::MultiGzDecoder::new(bytes.as_slice()),
            &origin,
            limit,
        )
    } else {
        read_trace(bytes.as_slice(), &origin, limit)
    }
    .unwrap()
}

/// A path of the repository (the workspace root, two levels above this crate).
pub(crate) fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}
