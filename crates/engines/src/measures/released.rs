//! Reading a published release back from its files, so that any release (made by `cloakd table
//! anonymize` or by another tool) can be measured: a generalized CSV (QI values exact, `lo-hi` numeric
//! ranges, hierarchy nodes or `*`), or bucketization's QI CSV (exact QIs plus a group id) with its
//! sensitive CSV (`group,<sensitive>,count`). The original table itself is a valid generalized release.
//!
//! Invariants: column roles come from the original table's schema (a column named like a
//! quasi-identifier is a QI, the sensitive column by name, the group column is the first column of the
//! sensitive CSV); every QI and (without a sensitive table) the sensitive column must be present;
//! a cell a neutralizing writer wrote as `'<cell>` ([`restore_formula`]) reads as the cell;
//! every error names the file, line and rule.
use std::collections::HashMap;
use std::io::Read;

use crate::relational::release::{
    Release, ReleasedColumn, ReleasedRole, ReleasedTable, SensitiveEntry, SensitiveTable,
    restore_formula,
};
use crate::relational::table::Table;

/// Why a release could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReleaseReadError {
    #[error("{source_name}:{line}: {message} (rule: well-formed CSV)")]
    Csv {
        source_name: String,
        line: u64,
        message: String,
    },
    #[error("{source_name}: {rule}")]
    Header { source_name: String, rule: String },
    #[error(
        "{source_name}:{line}: {found} fields, but the header has {expected} (rule: no ragged rows)"
    )]
    Ragged {
        source_name: String,
        line: u64,
        expected: usize,
        found: usize,
    },
    #[error("{source_name}:{line}: {rule}")]
    Value {
        source_name: String,
        line: u64,
        rule: String,
    },
    #[error("{source_name}: the release has no rows (rule: a release to measure is not empty)")]
    Empty { source_name: String },
}

fn csv_reader(reader: impl Read, delimiter: u8) -> csv::Reader<impl Read> {
    csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .flexible(true)
        .has_headers(false)
        .trim(csv::Trim::All)
        .from_reader(reader)
}

/// Reads the rows of a CSV: the header and the records (as owned strings), with line numbers.
fn read_rows(
    reader: impl Read,
    source_name: &str,
    delimiter: u8,
) -> Result<(Vec<String>, Vec<csv::StringRecord>), ReleaseReadError> {
    let mut csv = csv_reader(reader, delimiter);
    let mut header = csv::StringRecord::new();
    let csv_error = |e: csv::Error, line: u64| ReleaseReadError::Csv {
        source_name: source_name.to_string(),
        line: e.position().map(|p| p.line()).unwrap_or(line),
        message: e.to_string(),
    };
    if !csv.read_record(&mut header).map_err(|e| csv_error(e, 1))? {
        return Err(ReleaseReadError::Empty {
            source_name: source_name.to_string(),
        });
    }
    // A cell written as '<cell> by a neutralizing writer reads back as the cell.
    let header: Vec<String> = header
        .iter()
        .map(|h| restore_formula(h).to_string())
        .collect();
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    let mut line = 1;
    loop {
        line += 1;
        match csv.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(e, line)),
        }
        let found_line = record.position().map_or(line, |p| p.line());
        if record.len() != header.len() {
            return Err(ReleaseReadError::Ragged {
                source_name: source_name.to_string(),
                line: found_line,
                expected: header.len(),
                found: record.len(),
            });
        }
        if record.iter().any(|c| restore_formula(c).len() != c.len()) {
            rows.push(record.iter().map(restore_formula).collect());
        } else {
            rows.push(record.clone());
        }
    }
    Ok((header, rows))
}

/// Reads a release. `release` is the released (generalized, or bucketization's QI) CSV; `sensitive`
/// is bucketization's sensitive CSV, with its source name. `table` gives the column roles.
pub fn read_release(
    table: &Table,
    release: impl Read,
    release_name: &str,
    sensitive: Option<(&mut dyn Read, &str)>,
    delimiter: u8,
) -> Result<Release, ReleaseReadError> {
    let (header, rows) = read_rows(release, release_name, delimiter)?;
    if rows.is_empty() {
        return Err(ReleaseReadError::Empty {
            source_name: release_name.to_string(),
        });
    }
    let header_error = |rule: String| ReleaseReadError::Header {
        source_name: release_name.to_string(),
        rule,
    };
    let sensitive_table = match sensitive {
        Some((reader, name)) => Some(read_sensitive_table(table, reader, name, delimiter)?),
        None => None,
    };
    let mut roles = Vec::with_capacity(header.len());
    for name in &header {
        let role = if table.quasi.iter().any(|q| &q.name == name) {
            ReleasedRole::Quasi
        } else if sensitive_table
            .as_ref()
            .is_some_and(|s| &s.group_name == name)
        {
            ReleasedRole::Group
        } else if *name == table.sensitive.name {
            ReleasedRole::Sensitive {
                numeric: table.sensitive.numeric,
            }
        } else {
            ReleasedRole::Insensitive
        };
        roles.push(role);
    }
    for q in &table.quasi {
        if !header.contains(&q.name) {
            return Err(header_error(format!(
                "quasi-identifier {:?} is missing (rule: a release keeps every quasi-identifier column, generalized or exact)",
                q.name
            )));
        }
    }
    match &sensitive_table {
        None if !header.contains(&table.sensitive.name) => {
            return Err(header_error(format!(
                "sensitive column {:?} is missing (rule: a generalized release keeps the sensitive column; a bucketized one needs --sensitive-table)",
                table.sensitive.name
            )));
        }
        Some(s) if !header.contains(&s.group_name) => {
            return Err(header_error(format!(
                "group column {:?} of the sensitive table is missing (rule: a bucketized release has a group id per row)",
                s.group_name
            )));
        }
        _ => {}
    }
    let mut columns: Vec<ReleasedColumn> = header
        .iter()
        .zip(&roles)
        .map(|(name, &role)| ReleasedColumn {
            name: name.clone(),
            role,
            dictionary: Vec::new(),
            codes: Vec::with_capacity(rows.len()),
        })
        .collect();
    let mut dictionaries: Vec<HashMap<String, u32>> = vec![HashMap::new(); columns.len()];
    for row in &rows {
        for ((column, dictionary), value) in columns.iter_mut().zip(&mut dictionaries).zip(row) {
            let code = match dictionary.get(value) {
                Some(&c) => c,
                None => {
                    let c = column.dictionary.len() as u32;
                    column.dictionary.push(value.to_string());
                    dictionary.insert(value.to_string(), c);
                    c
                }
            };
            column.codes.push(code);
        }
    }
    let quasi_table = ReleasedTable {
        columns,
        rows: rows.len(),
    };
    Ok(match sensitive_table {
        None => Release::Generalized(quasi_table),
        Some(sensitive_table) => Release::Bucketized {
            quasi_table,
            sensitive_table,
        },
    })
}

/// Reads bucketization's sensitive CSV: `group,<sensitive>,count`, group a positive integer.
fn read_sensitive_table(
    table: &Table,
    reader: &mut dyn Read,
    source_name: &str,
    delimiter: u8,
) -> Result<SensitiveTable, ReleaseReadError> {
    let (header, rows) = read_rows(reader, source_name, delimiter)?;
    if header.len() != 3 || header[1] != table.sensitive.name {
        return Err(ReleaseReadError::Header {
            source_name: source_name.to_string(),
            rule: format!(
                "header {header:?} (rule: a sensitive table has the columns group,{},count)",
                table.sensitive.name
            ),
        });
    }
    let mut entries = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let line = row.position().map_or(i as u64 + 2, |p| p.line());
        let value_error = |rule: String| ReleaseReadError::Value {
            source_name: source_name.to_string(),
            line,
            rule,
        };
        let group: u32 = row[0].parse().map_err(|_| {
            value_error(format!(
                "group {:?} is not a non-negative integer (rule: group ids are integers)",
                &row[0]
            ))
        })?;
        let count: u64 = row[2].parse().map_err(|_| {
            value_error(format!(
                "count {:?} is not a non-negative integer (rule: counts are integers)",
                &row[2]
            ))
        })?;
        entries.push(SensitiveEntry {
            group,
            value: row[1].to_string(),
            count,
        });
    }
    Ok(SensitiveTable {
        group_name: header[0].clone(),
        sensitive_name: header[1].clone(),
        numeric: table.sensitive.numeric,
        entries,
    })
}
