//! Reading mobility traces (`user_id,timestamp_unix,lat,lon[,...]` CSV, optionally gzip-compressed), the
//! workload of `cloakd simulate`, the engine benchmark and the realistic tests; and, in [`roads`], the
//! road networks POIs are generated along.
pub mod roads;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// One position report of a trace (a type of the location engine, which replays traces).
pub use crate::location::replay::TracePoint;

/// A trace line that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{origin}: {source}")]
    Io {
        origin: String,
        source: std::io::Error,
    },
    #[error("{origin}:{line}: {rule}")]
    Line {
        origin: String,
        line: usize,
        rule: String,
    },
}

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

/// Parses `user_id,timestamp_unix,lat,lon[,...]` lines after one header line; extra columns are ignored.
pub fn read_trace(
    reader: impl Read,
    origin: &str,
    limit: Option<usize>,
) -> Result<Vec<TracePoint>, TraceError> {
    let mut points = Vec::new();
    // Bounded: a line past `crate::lines::MAX_LINE_BYTES` fails the read.
    let reader = BufReader::new(crate::lines::BoundedLines::new(
        reader,
        crate::lines::Records::Lines,
    ));
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io {
            origin: origin.to_string(),
            source,
        })?;
        let line_no = index + 1;
        if index == 0 || line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| points.len() >= l) {
            break;
        }
        let bad = |rule: String| TraceError::Line {
            origin: origin.to_string(),
            line: line_no,
            rule,
        };
        let mut fields = line.split(',');
        let mut next = |name: &str| {
            fields
                .next()
                .map(str::trim)
                .ok_or_else(|| bad(format!("missing column {name}")))
        };
        let user_id = next("user_id")?.to_string();
        let timestamp = next("timestamp_unix")?;
        let lat = next("lat")?;
        let lon = next("lon")?;
        let timestamp = timestamp
            .parse::<i64>()
            .map_err(|e| bad(format!("timestamp_unix {timestamp:?}: {e}")))?;
        let parse_deg = |name: &str, v: &str, bound: f64| -> Result<f64, TraceError> {
            let x = v
                .parse::<f64>()
                .map_err(|e| bad(format!("{name} {v:?}: {e}")))?;
            if !x.is_finite() || x.abs() > bound {
                return Err(bad(format!("{name} {x} outside [-{bound}, {bound}]")));
            }
            Ok(x)
        };
        let lat = parse_deg("lat", lat, 90.0)?;
        let lon = parse_deg("lon", lon, 180.0)?;
        points.push(TracePoint {
            user_id,
            timestamp,
            lat,
            lon,
        });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_points_and_reports_bad_lines() {
        let text = "user_id,timestamp_unix,lat,lon,x_m,y_m\n7,1704096000,53.1,8.2,1,2\n8,1704096001,53.2,8.3,3,4\n";
        let points = read_trace(text.as_bytes(), "t", None).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].user_id, "8");
        assert_eq!(points[1].timestamp, 1704096001);
        let err = read_trace("h\n1,2,95.0,1\n".as_bytes(), "t", None).unwrap_err();
        assert_eq!(err.to_string(), "t:2: lat 95 outside [-90, 90]");
        assert_eq!(read_trace(text.as_bytes(), "t", Some(1)).unwrap().len(), 1);
    }

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
