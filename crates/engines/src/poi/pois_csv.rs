//! POI files: CSV with the header `id,lat,lon,category,name` (RFC 4180 quoting; UTF-8).
//!
//! Every limit is checked before a POI is kept: at most [`TableLimits::max_pois`] rows, fields of at
//! most [`TableLimits::max_field_bytes`] bytes, `lat` in [−90, 90] and `lon` in [−180, 180], non-empty
//! `id` and `category`, and ids unique in the file (a POI's id is what a client refines by and
//! tells POIs apart with). An error names the line (1-based, the header is line 1) and the field,
//! and quotes at most 64 bytes of the value ([`crate::text::quote`]). The caller bounds the length of one
//! record (the CLI wraps the file in `lines::BoundedLines`), so no record is buffered without bound.
use std::io::{Read, Write};

use super::Poi;
use crate::text::quote;

pub const HEADER: [&str; 5] = ["id", "lat", "lon", "category", "name"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableLimits {
    pub max_pois: usize,
    pub max_field_bytes: usize,
}

impl Default for TableLimits {
    fn default() -> Self {
        TableLimits {
            max_pois: 20_000_000,
            max_field_bytes: 256,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("line {line}: {field}: {rule}")]
    Field {
        line: u64,
        field: &'static str,
        rule: String,
    },
    #[error("line {line}: {0}", line = .1)]
    Csv(csv::Error, u64),
}

fn field_error(line: u64, field: &'static str, rule: impl Into<String>) -> TableError {
    TableError::Field {
        line,
        field,
        rule: rule.into(),
    }
}

/// Reads every POI of a CSV file.
pub fn read_pois(input: impl Read, limits: &TableLimits) -> Result<Vec<Poi>, TableError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(input);
    let mut record = csv::StringRecord::new();
    let mut pois = Vec::new();
    // The line each POI starts on, for naming both lines of a duplicate id.
    let mut lines: Vec<u64> = Vec::new();
    let mut line = 0u64;
    let mut header_seen = false;
    loop {
        let read = reader.read_record(&mut record);
        line = record
            .position()
            .map(|p| p.line())
            .unwrap_or(line + 1)
            .max(line + 1);
        match read {
            Err(e) => return Err(TableError::Csv(e, line)),
            Ok(false) => break,
            Ok(true) => {}
        }
        if !header_seen {
            header_seen = true;
            let header: Vec<&str> = record.iter().map(str::trim).collect();
            if header != HEADER {
                return Err(field_error(
                    1,
                    "header",
                    format!("must be {:?}", HEADER.join(",")),
                ));
            }
            continue;
        }
        if record.len() != HEADER.len() {
            return Err(field_error(
                line,
                "row",
                format!(
                    "has {} fields, must have 5 (id,lat,lon,category,name)",
                    record.len()
                ),
            ));
        }
        if pois.len() >= limits.max_pois {
            return Err(field_error(
                line,
                "row",
                format!("a POI file holds at most {} POIs", limits.max_pois),
            ));
        }
        for (i, name) in HEADER.iter().enumerate() {
            if record[i].len() > limits.max_field_bytes {
                return Err(field_error(
                    line,
                    name,
                    format!("must be at most {} bytes", limits.max_field_bytes),
                ));
            }
        }
        let number = |i: usize, field: &'static str, bound: f64| {
            let text = record[i].trim();
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v.abs() <= bound => Ok(v),
                _ => Err(field_error(
                    line,
                    field,
                    format!(
                        "must be a number in [-{bound}, {bound}] (got {})",
                        quote(text)
                    ),
                )),
            }
        };
        let lat = number(1, "lat", 90.0)?;
        let lon = number(2, "lon", 180.0)?;
        let (id, category) = (record[0].trim(), record[3].trim());
        if id.is_empty() {
            return Err(field_error(line, "id", "must not be empty"));
        }
        if category.is_empty() {
            return Err(field_error(line, "category", "must not be empty"));
        }
        pois.push(Poi {
            id: id.to_string(),
            lat,
            lon,
            category: category.to_string(),
            name: record[4].trim().to_string(),
        });
        lines.push(line);
    }
    if !header_seen {
        return Err(field_error(1, "header", "the file is empty"));
    }
    if let Some((first, again)) = first_duplicate(&pois) {
        return Err(field_error(
            lines[again],
            "id",
            format!(
                "{} is already the id of line {} (ids must be unique)",
                quote(&pois[again].id),
                lines[first]
            ),
        ));
    }
    Ok(pois)
}

/// The first repeated id in file order: (position of its first use, position of the repeat).
/// Sorting positions by id keeps the memory to one index per POI (no set of the ids).
fn first_duplicate(pois: &[Poi]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..pois.len()).collect();
    order.sort_unstable_by(|&a, &b| pois[a].id.cmp(&pois[b].id).then(a.cmp(&b)));
    order
        .windows(2)
        .filter(|w| pois[w[0]].id == pois[w[1]].id)
        .map(|w| (w[0], w[1]))
        .min_by_key(|&(_, again)| again)
}

/// Writes POIs as CSV (header first; coordinates with 7 decimals, about 1 cm).
pub fn write_pois(output: impl Write, pois: &[Poi]) -> csv::Result<()> {
    let mut writer = csv::Writer::from_writer(output);
    writer.write_record(HEADER)?;
    for p in pois {
        writer.write_record([
            p.id.as_str(),
            &format!("{:.7}", p.lat),
            &format!("{:.7}", p.lon),
            p.category.as_str(),
            p.name.as_str(),
        ])?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Vec<Poi>, TableError> {
        read_pois(text.as_bytes(), &TableLimits::default())
    }

    #[test]
    fn round_trip() {
        let pois =
            read("id,lat,lon,category,name\n1,53.1,8.2,cafe,\"Caf\u{e9}, am Markt\"\n").unwrap();
        assert_eq!(pois.len(), 1);
        assert_eq!(pois[0].name, "Caf\u{e9}, am Markt");
        let mut out = Vec::new();
        write_pois(&mut out, &pois).unwrap();
        assert_eq!(read(std::str::from_utf8(&out).unwrap()).unwrap(), pois);
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let e = read("id,lat,lon,category,name\n1,53.1,8.2,cafe,x\n2,95,8.2,cafe,y\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: lat: must be a number in [-90, 90] (got \"95\")"
        );
        let e = read("id,lat,lon,category,name\n1,53.1,8.2,,x\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2: category: must not be empty");
        let e = read("id,lat,lon,category\n").unwrap_err();
        assert!(e.to_string().starts_with("line 1: header: must be"), "{e}");
        let e = read("id,lat,lon,category,name\n1,53.1,8.2,cafe\n").unwrap_err();
        assert!(
            e.to_string().starts_with("line 2: row: has 4 fields"),
            "{e}"
        );
        let limits = TableLimits {
            max_pois: 1,
            max_field_bytes: 8,
        };
        let two = "id,lat,lon,category,name\n1,53.1,8.2,cafe,x\n2,53.1,8.2,cafe,y\n";
        let e = read_pois(two.as_bytes(), &limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: row: a POI file holds at most 1 POIs"
        );
        let long = "id,lat,lon,category,name\n1,53.1,8.2,cafe,abcdefghij\n";
        let e = read_pois(long.as_bytes(), &limits).unwrap_err();
        assert_eq!(e.to_string(), "line 2: name: must be at most 8 bytes");
    }

    #[test]
    fn a_duplicate_id_names_both_lines() {
        let text = "id,lat,lon,category,name\nb,53.1,8.2,cafe,x\na,53.1,8.2,cafe,\"two\nlines\"\nc,1,2,bank,\nb,3,4,bank,\na,5,6,fuel,\n";
        let e = read(text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 6: id: \"b\" is already the id of line 2 (ids must be unique)"
        );
        let e =
            read("id,lat,lon,category,name\nx,1,2,c,\ny,1,2,c,\ny,1,2,c,\nx,1,2,c,\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 4: id: \"y\" is already the id of line 3"),
            "{e}"
        );
        assert!(read("id,lat,lon,category,name\nx,1,2,c,\nX,1,2,c,\n").is_ok());
    }
}
