//! Reading mobility traces (`user_id,timestamp_unix,lat,lon[,...]` CSV, optionally gzip-compressed), the
//! workload of `cloakd simulate`, the engine benchmark and the realistic tests; and, in [`roads`], the
//! road networks POIs are generated along.
pub mod roads;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// One position report of a trace, a trace line that could not be read, and the parser (the
/// location engine's, which replays traces).
pub use crate::location::trace::{TraceError, TracePoint, read_trace};

/// Opens `path`, transparently decompressing it when it is gzip data (see [`maybe_gunzip`]).
pub fn open_maybe_gz(path: &Path) -> std::io::Result<Box<dyn Read + Send>> {
    maybe_gunzip(std::fs::File::open(path)?)
}

/// Wraps `reader` in a gzip decoder when its first bytes are the gzip magic number (so `.gz` files
/// and compressed data under any name are read transparently); otherwise reads it as it is.
pub fn maybe_gunzip(reader: impl Read + Send + 'static) -> std::io::Result<Box<dyn Read + Send>> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    if reader.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(reader),
        )))
    } else {
        Ok(Box::new(reader))
    }
}

/// Reads a trace file (see [`read_trace`]); `limit` stops after that many points.
pub fn read_trace_file(path: &Path, limit: Option<usize>) -> Result<Vec<TracePoint>, TraceError> {
    let origin = path.display().to_string();
    let reader = open_maybe_gz(path).map_err(|source| TraceError::Io {
        origin: origin.clone(),
        source,
    })?;
    read_trace(reader, &origin, limit)
}

/// Reads a whole text file (a job or hierarchy file) through a bounded line reader
/// ([`crate::lines::BoundedLines`]).
pub fn read_text_file(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    crate::lines::BoundedLines::new(std::fs::File::open(path)?, crate::lines::Records::Lines)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_detected_by_its_magic_bytes() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"compressed").unwrap();
        let mut out = String::new();
        maybe_gunzip(std::io::Cursor::new(gz.finish().unwrap()))
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "compressed");
        out.clear();
        maybe_gunzip(std::io::Cursor::new(b"plain".to_vec()))
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "plain");
    }
}
