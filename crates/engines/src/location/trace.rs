//! A mobility trace as the location engine reads it: `user_id,timestamp_unix,lat,lon[,...]` lines
//! after one header line, parsed from any reader (the daemon's `data_files` opens the file and
//! decompresses it). Every line passes through a [`crate::lines::BoundedLines`], so no line is
//! buffered past its limit; a bad line is named by its origin and number.
use std::io::{BufRead, BufReader, Read};

/// One position report of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePoint {
    pub user_id: String,
    /// Unix seconds.
    pub timestamp: i64,
    pub lat: f64,
    pub lon: f64,
}

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
}
