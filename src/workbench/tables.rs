//! The workbench's tables: an uploaded CSV with its hierarchies, or an example shipped in the repo
//! (embedded in the binary), kept in memory under a random id; and the job resolver that reads a
//! job's `input` and `hierarchy` paths from the table's files instead of the disk.
//!
//! Invariants: an upload is bounded by `tables.max_bytes` (once decompressed too) and
//! `tables.max_rows` before it is kept, and is a table job: it holds a place of
//! `tables.max_concurrent_jobs` while it is read and surveyed, and its body, its one kept copy of
//! the CSV and the survey's per-column counts are charged to its memory budget
//! (`tables.max_job_bytes`) before they are made; a CSV whose header names a column twice is
//! refused; a table's files are the only files a job can name (a job
//! naming another is refused, naming the path); the suggested job of an example is the example's own
//! job file (`examples/adult.toml`), so an exported job saved in `examples/` runs as is.
use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;

use serde::Deserialize;

use super::error::ApiError;
use crate::budget::{MemoryBudget, ReadWithin, Reservation, read_to_end_within};
use crate::relational::hierarchy::Hierarchy;
use crate::relational::job::JobSpec;
use crate::relational::table::{Table, read_csv};
use crate::text::quote;

/// An example shipped in the repository, embedded in the binary.
pub struct Example {
    pub name: &'static str,
    pub description: &'static str,
    /// The example's job file (its `input` and hierarchy paths name `files`).
    pub job: &'static str,
    /// The table: its path as the job names it, and its bytes (gzip or plain).
    pub input: (&'static str, &'static [u8]),
    pub hierarchies: &'static [(&'static str, &'static str)],
}

macro_rules! hierarchy {
    ($name:literal) => {
        (
            concat!("data/hierarchies/", $name, ".csv"),
            include_str!(concat!("../../examples/data/hierarchies/", $name, ".csv")),
        )
    };
}

/// The examples of `GET /api/v1/examples`.
pub const EXAMPLES: &[Example] = &[Example {
    name: "adult",
    description: "UCI Adult (45,222 rows without missing values): Li & Li's setup, quasi-identifiers age, workclass, education, marital-status, race, sex; sensitive occupation (examples/adult.toml)",
    job: include_str!("../../examples/adult.toml"),
    input: (
        "data/adult.csv.gz",
        include_bytes!("../../examples/data/adult.csv.gz"),
    ),
    hierarchies: &[
        hierarchy!("age"),
        hierarchy!("education"),
        hierarchy!("income"),
        hierarchy!("marital-status"),
        hierarchy!("native-country"),
        hierarchy!("occupation"),
        hierarchy!("race"),
        hierarchy!("sex"),
        hierarchy!("workclass"),
    ],
}];

/// The body of `POST /api/v1/tables`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRequest {
    pub example: Option<String>,
    pub name: Option<String>,
    pub csv: Option<String>,
    /// The upload's delimiter (one ASCII character); absent: detected from the header line.
    pub delimiter: Option<String>,
    #[serde(default)]
    pub hierarchies: BTreeMap<String, String>,
}

/// A column as the page shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ColumnInfo {
    pub name: String,
    /// `numeric` when every value parses as a number, else `categorical`.
    pub kind: &'static str,
    pub distinct: usize,
    /// The table's hierarchy files whose name is the column's (`hierarchies/age.csv` for `age`).
    pub hierarchies: Vec<String>,
}

/// A kept table: its files and what the page shows of it.
#[derive(Debug)]
pub struct StoredTable {
    /// The CSV's path as the job's `input` names it.
    pub name: String,
    /// The CSV, decompressed (shared by the table's versions: adding a hierarchy copies no row).
    pub csv: Arc<Vec<u8>>,
    /// The CSV's delimiter.
    pub delimiter: u8,
    /// Hierarchy path (as a job names it) → CSV text.
    pub hierarchies: BTreeMap<String, String>,
    pub rows: usize,
    pub columns: Vec<ColumnInfo>,
    /// The suggested job (TOML).
    pub job: String,
}

impl StoredTable {
    /// Calls `each` with every row's value of `column` (trimmed), reading the CSV with its
    /// delimiter; an unknown column is refused naming it.
    pub fn each_value(&self, column: &str, mut each: impl FnMut(&str)) -> Result<(), ApiError> {
        let at = self
            .columns
            .iter()
            .position(|c| c.name == column)
            .ok_or_else(|| {
                ApiError::invalid(
                    "column",
                    format!("column {} is not a column of the table", quote(column)),
                )
            })?;
        let mut reader = csv::ReaderBuilder::new()
            .flexible(false)
            .delimiter(self.delimiter)
            .from_reader(crate::lines::BoundedLines::new(
                self.csv.as_slice(),
                crate::lines::Records::Csv,
            ));
        for record in reader.records() {
            let record = record
                .map_err(|e| ApiError::invalid("csv", format!("{}: {e}", quote(&self.name))))?;
            each(record.get(at).unwrap_or_default().trim());
        }
        Ok(())
    }

    /// Every file a job can name: the CSV, then the hierarchies.
    pub fn files(&self) -> Vec<String> {
        std::iter::once(self.name.clone())
            .chain(self.hierarchies.keys().cloned())
            .collect()
    }

    /// The job's table, read from this table's files (the job resolver): `input` must name the
    /// CSV (or be absent), every hierarchy path one of the hierarchies.
    pub fn load(&self, job: &JobSpec, budget: &MemoryBudget) -> Result<Table, ApiError> {
        let _held = budget
            .try_reserve(
                (self.csv.len() as u64).saturating_mul(crate::jobs::TABLE_BYTES_PER_CSV_BYTE),
                "the job's table (parsed)",
            )
            .map_err(|e| ApiError::memory(&e))?;
        if let Some(input) = &job.input
            && *input != self.name
        {
            return Err(ApiError::invalid(
                "job",
                format!(
                    "input = {} is not this table's file {} (rule: a job names the files of its table)",
                    quote(input),
                    quote(&self.name)
                ),
            ));
        }
        let schema = job.schema(|path, column| -> Result<Hierarchy, ApiError> {
            let text = self.hierarchies.get(path).ok_or_else(|| {
                ApiError::invalid(
                    "job",
                    format!(
                        "hierarchy {} of column {} is not a file of this table (files: {})",
                        quote(path),
                        quote(column),
                        self.hierarchies
                            .keys()
                            .map(|k| quote(k))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
            Hierarchy::parse(path, text).map_err(|e| ApiError::invalid("hierarchies", e))
        })?;
        let reader =
            crate::lines::BoundedLines::new(self.csv.as_slice(), crate::lines::Records::Csv);
        read_csv(schema, reader, &self.name, job.delimiter).map_err(|e| ApiError::invalid("job", e))
    }
}

/// Decompresses `bytes` when gzip, refusing more than `max_bytes` once decompressed; what it keeps
/// is charged to `held` as it grows.
fn plain(
    field: &str,
    bytes: &[u8],
    max_bytes: usize,
    held: &mut Reservation,
) -> Result<Vec<u8>, ApiError> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        held.grow(bytes.len() as u64, field)
            .map_err(|e| ApiError::memory(&e))?;
        return Ok(bytes.to_vec());
    }
    read_to_end_within(
        flate2::read::MultiGzDecoder::new(bytes),
        max_bytes,
        held,
        field,
    )
    .map_err(|e| match e {
        ReadWithin::Memory(e) => ApiError::memory(&e),
        ReadWithin::TooLarge(_) => too_large(field, max_bytes),
        ReadWithin::Io(e) => ApiError::invalid(field, format!("not valid gzip: {e}")),
    })
}

/// Bytes the survey keeps per column (its counts, its description, its line of the suggested job)
/// beyond the column's name, and per distinct value of a column (a hash in a set).
const SURVEY_COLUMN_BYTES: u64 = 256;
const SURVEY_VALUE_BYTES: u64 = 32;

pub fn too_large(field: &str, max_bytes: usize) -> ApiError {
    ApiError::new(
        super::error::Code::TooLarge,
        Some(field),
        format!("{field}: larger than tables.max_bytes = {max_bytes} bytes"),
    )
}

/// The delimiters detection chooses from, in order of preference on a tie.
const DELIMITERS: [u8; 4] = [b',', b';', b'\t', b'|'];

/// The upload's delimiter: the request's when given (one ASCII character, not a quote or a line
/// break), else the one of `,` `;` tab `|` the header line holds most often outside quotes (`,`
/// when it holds none).
pub fn delimiter_of(given: Option<&str>, csv: &[u8]) -> Result<u8, ApiError> {
    if let Some(d) = given {
        return match d.as_bytes() {
            [b] if b.is_ascii() && !matches!(b, b'"' | b'\n' | b'\r') => Ok(*b),
            _ => Err(ApiError::invalid(
                "delimiter",
                format!(
                    "{} is not a delimiter (rule: one ASCII character other than a quote or a line break)",
                    quote(d)
                ),
            )),
        };
    }
    let header = csv.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut counts = [0usize; DELIMITERS.len()];
    let mut quoted = false;
    for &b in header {
        if b == b'"' {
            quoted = !quoted;
        } else if !quoted && let Some(i) = DELIMITERS.iter().position(|&d| d == b) {
            counts[i] += 1;
        }
    }
    let best = (0..DELIMITERS.len())
        .max_by_key(|&i| (counts[i], std::cmp::Reverse(i)))
        .filter(|&i| counts[i] > 0)
        .unwrap_or(0);
    Ok(DELIMITERS[best])
}

/// Refuses a file that is not text: a NUL byte, or more than 1 % of undecodable characters (what a
/// browser's `File.text()` makes of binary), in its first 64 KiB.
fn refuse_binary(name: &str, csv: &[u8]) -> Result<(), ApiError> {
    let head = &csv[..csv.len().min(64 * 1024)];
    let text = String::from_utf8_lossy(head);
    let chars = text.chars().count().max(1);
    let undecodable = text.chars().filter(|&c| c == '\u{FFFD}').count();
    if head.contains(&0) || undecodable * 100 > chars {
        return Err(ApiError::invalid(
            "csv",
            format!(
                "{} is not a text table: it holds binary data (rule: a CSV text file with a header line)",
                quote(name)
            ),
        ));
    }
    Ok(())
}

/// Reads the CSV's header, rows and per-column kinds and distinct counts, within `max_rows`,
/// charging what it keeps to `held`; a header naming a column twice is refused, and so is a file
/// that is not a table (binary, a single column, no rows).
fn survey(
    name: &str,
    csv: &[u8],
    delimiter: u8,
    hierarchies: &BTreeMap<String, String>,
    max_rows: usize,
    held: &mut Reservation,
) -> Result<(usize, Vec<ColumnInfo>), ApiError> {
    refuse_binary(name, csv)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .delimiter(delimiter)
        .from_reader(crate::lines::BoundedLines::new(
            csv,
            crate::lines::Records::Csv,
        ));
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| ApiError::invalid("csv", format!("{}: {e}", quote(name))))?
        .iter()
        .map(str::to_string)
        .collect();
    if header.is_empty() || header.iter().all(String::is_empty) {
        return Err(ApiError::invalid(
            "csv",
            "the first line must name the columns (rule: a CSV with a header line)",
        ));
    }
    let names: usize = header.iter().map(String::len).sum();
    held.grow(
        (header.len() as u64)
            .saturating_mul(SURVEY_COLUMN_BYTES)
            .saturating_add((names as u64).saturating_mul(3)),
        "the upload's columns",
    )
    .map_err(|e| ApiError::memory(&e))?;
    let mut seen = HashSet::with_capacity(header.len());
    for column in &header {
        if !seen.insert(column.as_str()) {
            return Err(ApiError::invalid(
                "csv",
                format!(
                    "the header names column {} more than once (rule: column names are unique)",
                    quote(column)
                ),
            ));
        }
    }
    drop(seen);
    if header.len() < 2 {
        return Err(ApiError::invalid(
            "delimiter",
            format!(
                "{}: one column found with delimiter {} (rule: a table has at least two columns, a quasi-identifier and a sensitive attribute); if the file separates its columns with another character, choose it",
                quote(name),
                quote(&char::from(delimiter).to_string())
            ),
        ));
    }
    // Distinct values are counted by a 64-bit hash of each (the counts are what the page shows; a
    // hash costs 8 bytes whatever the value's length).
    let hasher = std::collections::hash_map::RandomState::new();
    let mut distinct: Vec<HashSet<u64>> = vec![HashSet::new(); header.len()];
    let mut numeric = vec![true; header.len()];
    let mut rows = 0usize;
    for record in reader.records() {
        let record =
            record.map_err(|e| ApiError::invalid("csv", format!("{}: {e}", quote(name))))?;
        rows += 1;
        if rows > max_rows {
            return Err(ApiError::new(
                super::error::Code::TooLarge,
                Some("csv"),
                format!("csv: more than tables.max_rows = {max_rows} rows"),
            ));
        }
        for (i, value) in record.iter().enumerate() {
            let value = value.trim();
            numeric[i] &= value.parse::<f64>().is_ok_and(f64::is_finite);
            if distinct[i].insert(hasher.hash_one(value)) {
                held.grow(SURVEY_VALUE_BYTES, "the upload's distinct values")
                    .map_err(|e| ApiError::memory(&e))?;
            }
        }
    }
    if rows == 0 {
        return Err(ApiError::invalid(
            "csv",
            format!(
                "{}: no rows under the header (rule: a table has at least one row)",
                quote(name)
            ),
        ));
    }
    let columns = header
        .iter()
        .enumerate()
        .map(|(i, column)| ColumnInfo {
            name: column.clone(),
            kind: if numeric[i] && rows > 0 {
                "numeric"
            } else {
                "categorical"
            },
            distinct: distinct[i].len(),
            hierarchies: hierarchies
                .keys()
                .filter(|path| {
                    let file = path.rsplit('/').next().unwrap_or(path);
                    file.strip_suffix(".csv").unwrap_or(file) == column
                })
                .cloned()
                .collect(),
        })
        .collect();
    Ok((rows, columns))
}

/// The suggested job of an upload: the table as input and every column commented out (dropped),
/// with its kind and hierarchy, for the page (or the analyst) to assign roles.
fn suggested_job(name: &str, delimiter: u8, columns: &[ColumnInfo]) -> String {
    let mut job = format!(
        "# The workbench's suggested job for {}: give columns a role (quasi, sensitive, identifier,\n# insensitive); columns not listed are dropped.\ninput = {}\n",
        name,
        toml_string(name)
    );
    if delimiter != b',' {
        job.push_str(&format!(
            "delimiter = {}\n",
            toml_string(&char::from(delimiter).to_string())
        ));
    }
    job.push_str("unlisted = \"drop\"\n\n[columns]\n");
    for c in columns {
        let entry = match (c.kind, c.hierarchies.first()) {
            ("numeric", _) => "{ role = \"quasi\", kind = \"numeric\" }".to_string(),
            (_, Some(h)) => format!("{{ role = \"quasi\", hierarchy = {} }}", toml_string(h)),
            _ => "{ role = \"sensitive\" }".to_string(),
        };
        job.push_str(&format!("# {} = {entry}\n", toml_key(&c.name)));
    }
    job.push_str("\n[privacy]\nk = 10\n\n[release]\nmethod = \"generalization\"\nseed = 7\n");
    job
}

/// A TOML basic string.
pub fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A TOML key: bare when it can be, else quoted.
pub fn toml_key(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        s.to_string()
    } else {
        toml_string(s)
    }
}

/// Builds a kept table from a request, within the limits, charging `held` as it reads; the
/// request's CSV text becomes the kept table's bytes (no copy).
pub fn build(
    request: TableRequest,
    max_rows: usize,
    max_bytes: usize,
    held: &mut Reservation,
) -> Result<StoredTable, ApiError> {
    match (&request.example, &request.csv) {
        (Some(example), None) => {
            if request.name.is_some() || !request.hierarchies.is_empty() {
                return Err(ApiError::invalid(
                    "example",
                    "given with name or hierarchies (rule: either an example, or name, csv and hierarchies)",
                ));
            }
            let Some(e) = EXAMPLES.iter().find(|e| e.name == example) else {
                return Err(ApiError::invalid(
                    "example",
                    format!(
                        "no example {} (known: {})",
                        quote(example),
                        EXAMPLES
                            .iter()
                            .map(|e| e.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            let csv = plain("example", e.input.1, max_bytes, held)?;
            let hierarchies: BTreeMap<String, String> = e
                .hierarchies
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect();
            let (rows, columns) = survey(e.input.0, &csv, b',', &hierarchies, max_rows, held)?;
            Ok(StoredTable {
                name: e.input.0.to_string(),
                csv: Arc::new(csv),
                delimiter: b',',
                hierarchies,
                rows,
                columns,
                job: e.job.to_string(),
            })
        }
        (None, Some(_)) => {
            let name = request.name.clone().unwrap_or_else(|| "table.csv".into());
            if name.is_empty() || name.len() > 255 || name.contains(['\n', '\r', '\0']) {
                return Err(ApiError::invalid(
                    "name",
                    "must be a file name of 1 to 255 bytes without line breaks",
                ));
            }
            for path in request.hierarchies.keys() {
                if path.is_empty()
                    || path.len() > 255
                    || path == &name
                    || path.contains(['\n', '\r', '\0'])
                {
                    return Err(ApiError::invalid(
                        "hierarchies",
                        format!(
                            "{}: a hierarchy's name must be a file name of 1 to 255 bytes, not the table's",
                            quote(path)
                        ),
                    ));
                }
                Hierarchy::parse(path, &request.hierarchies[path])
                    .map_err(|e| ApiError::invalid("hierarchies", e))?;
            }
            let csv = request.csv.unwrap_or_default().into_bytes();
            let delimiter = delimiter_of(request.delimiter.as_deref(), &csv)?;
            let (rows, columns) =
                survey(&name, &csv, delimiter, &request.hierarchies, max_rows, held)?;
            let job = suggested_job(&name, delimiter, &columns);
            Ok(StoredTable {
                name,
                csv: Arc::new(csv),
                delimiter,
                hierarchies: request.hierarchies,
                rows,
                columns,
                job,
            })
        }
        _ => Err(ApiError::invalid(
            "example",
            "give either example, or csv (with name and hierarchies), not both nor neither",
        )),
    }
}

/// The body of `GET /api/v1/examples`: each example with its row count (counted once).
pub fn examples_json() -> serde_json::Value {
    static ROWS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    let rows = ROWS.get_or_init(|| {
        EXAMPLES
            .iter()
            .map(|e| {
                plain(
                    "example",
                    e.input.1,
                    usize::MAX,
                    &mut MemoryBudget::unlimited().reservation(),
                )
                .map(|csv| {
                    csv.iter()
                        .filter(|&&b| b == b'\n')
                        .count()
                        .saturating_sub(1)
                })
                .unwrap_or(0)
            })
            .collect()
    });
    serde_json::Value::Array(
        EXAMPLES
            .iter()
            .zip(rows)
            .map(|(e, rows)| {
                serde_json::json!({"name": e.name, "description": e.description, "rows": rows})
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    //! Random CSV bytes through the real upload: never a panic, either a table or an error naming
    //! its field and rule; duplicate column names refused.
    use super::*;
    use proptest::prelude::*;

    fn upload(csv: String, budget: &MemoryBudget) -> Result<StoredTable, ApiError> {
        let request = TableRequest {
            example: None,
            name: Some("t.csv".into()),
            csv: Some(csv),
            delimiter: None,
            hierarchies: BTreeMap::new(),
        };
        build(request, 50, 4096, &mut budget.reservation())
    }

    #[test]
    fn duplicate_column_names_are_refused() {
        let budget = MemoryBudget::unlimited();
        let e = upload("a,b,a\n1,2,3\n".into(), &budget).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("csv"));
        assert!(e.message.contains("more than once"), "{e:?}");
        assert!(upload("a,b,c\n1,2,3\n".into(), &budget).is_ok());
    }

    #[test]
    fn the_delimiter_is_the_headers_most_frequent_outside_quotes() {
        let d = |csv: &str| delimiter_of(None, csv.as_bytes()).unwrap();
        assert_eq!(d("a,b,c\n1,2,3\n"), b',');
        assert_eq!(d("a;b;c\n1,5;2;3\n"), b';');
        assert_eq!(d("a\tb\n1\t2\n"), b'\t');
        assert_eq!(d("\"x;y\",b,c\n"), b',');
        assert_eq!(d("prose without separators\n"), b',');
        assert_eq!(delimiter_of(Some("|"), b"a;b\n").unwrap(), b'|');
        for bad in ["", "ab", "\"", "\n", "é"] {
            let e = delimiter_of(Some(bad), b"a,b\n").unwrap_err();
            assert_eq!(e.field.as_deref(), Some("delimiter"), "{bad:?}");
        }
    }

    #[test]
    fn files_that_are_not_tables_are_refused_in_words() {
        let budget = MemoryBudget::unlimited();
        let e = upload("just one column\nof prose\n".into(), &budget).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("delimiter"));
        assert!(e.message.contains("one column found"), "{e:?}");
        let e = upload("a,b\u{0}\n1,2\n".into(), &budget).unwrap_err();
        assert!(e.message.contains("not a text table"), "{e:?}");
        let e = upload("a,b\n".into(), &budget).unwrap_err();
        assert!(e.message.contains("no rows"), "{e:?}");
        let table = upload("a;b\n1;x\n".into(), &budget).unwrap();
        assert_eq!(table.columns.len(), 2);
        assert!(table.job.contains("delimiter = \";\""), "{}", table.job);
    }

    #[test]
    fn an_upload_past_the_budget_is_refused_naming_it() {
        let csv: String = std::iter::once("a,b\n".to_string())
            .chain((0..40).map(|i| format!("{i},{}\n", i % 3)))
            .collect();
        // Two columns (512 bytes) and 43 distinct values (1,376 bytes) pass 1,000 bytes.
        let budget = MemoryBudget::new(1000);
        let e = upload(csv, &budget).unwrap_err();
        assert!(e.message.contains("tables.max_job_bytes"), "{e:?}");
        assert_eq!(budget.held(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_csv_bytes_are_a_table_or_a_named_error(
            bytes in prop::collection::vec(
                prop_oneof![
                    prop::sample::select(b"ab1,,\n\n\r\" .-e9".to_vec()),
                    any::<u8>(),
                ],
                0..300,
            ),
            budget in prop_oneof![Just(u64::MAX), 64u64..4096],
        ) {
            let budget = MemoryBudget::new(budget);
            let csv = String::from_utf8_lossy(&bytes).into_owned();
            match upload(csv, &budget) {
                Ok(table) => {
                    prop_assert!(table.rows <= 50);
                    let mut names: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
                    names.sort_unstable();
                    names.dedup();
                    prop_assert_eq!(names.len(), table.columns.len());
                }
                Err(e) => {
                    prop_assert!(!e.message.is_empty());
                    match &e.field {
                        Some(field) => prop_assert!(e.message.contains(field.as_str()), "{e:?}"),
                        None => prop_assert!(e.message.contains("tables.max_job_bytes"), "{e:?}"),
                    }
                }
            }
        }
    }
}
