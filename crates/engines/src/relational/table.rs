//! The table model of batch relational anonymization: a columnar, dictionary-encoded table whose
//! columns have the roles of the papers (quasi-identifier, sensitive, identifier, insensitive).
//!
//! Invariants: every column holds one `u32` code per row, in input row order. A numeric
//! quasi-identifier's code is the rank of its value among the column's distinct values (so codes order
//! like values); a categorical quasi-identifier's code is its leaf in the column's [`Hierarchy`] (every
//! value is a leaf, checked on load); the sensitive column's code indexes its sorted domain (ascending
//! numbers for a numeric sensitive attribute, byte order otherwise). Identifier columns are dropped on
//! load and never stored. A table has at least one row, at least one quasi-identifier and exactly one
//! sensitive column. Loading reads any [`Read`] (no files here); every error names the source,
//! line, column and the rule.
use std::collections::HashMap;
use std::io::Read;

use crate::relational::hierarchy::Hierarchy;
use crate::relational::models::SensitiveDistribution;
use crate::text::quote;

/// What a column is to the anonymizer.
// One value per column of a schema: the size of a hierarchy inline does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum ColumnRole {
    /// A quasi-identifier, generalized on release.
    Quasi(QuasiKind),
    /// The sensitive attribute (exactly one per table); `numeric` selects the ordered EMD.
    Sensitive { numeric: bool },
    /// Explicit identifier: dropped.
    Identifier,
    /// Released as is.
    Insensitive,
}

/// How a quasi-identifier generalizes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum QuasiKind {
    /// Numbers, generalized to intervals `lo-hi`.
    Numeric,
    /// Values of a hierarchy, generalized to the lowest common hierarchy node.
    Categorical(Hierarchy),
}

/// One column of the job's schema.
#[derive(Debug, Clone)]
pub struct ColumnSchema {
    pub name: String,
    pub role: ColumnRole,
}

impl ColumnSchema {
    pub fn new(name: impl Into<String>, role: ColumnRole) -> ColumnSchema {
        ColumnSchema {
            name: name.into(),
            role,
        }
    }
}

/// What to do with input columns the schema does not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unlisted {
    /// Drop them, like identifiers (the safe default).
    #[default]
    Drop,
    /// Keep them as insensitive columns.
    Keep,
}

/// The roles of the columns of a table to load.
#[derive(Debug, Clone, Default)]
pub struct TableSchema {
    pub columns: Vec<ColumnSchema>,
    pub unlisted: Unlisted,
}

/// The sorted distinct values of a numeric quasi-identifier, with the text each had in the input.
#[derive(Debug, Clone, Default)]
pub struct NumericDomain {
    pub values: Vec<f64>,
    pub texts: Vec<String>,
}

/// The domain of a quasi-identifier.
#[derive(Debug, Clone)]
pub enum QuasiAttribute {
    Numeric(NumericDomain),
    Categorical(Hierarchy),
}

#[derive(Debug, Clone)]
pub struct QuasiColumn {
    pub name: String,
    pub attribute: QuasiAttribute,
    /// Per row: rank in the numeric domain, or leaf of the hierarchy.
    pub codes: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct SensitiveColumn {
    pub name: String,
    pub numeric: bool,
    /// Sorted domain: ascending numbers if `numeric`, byte order otherwise.
    pub domain: Vec<String>,
    pub codes: Vec<u32>,
}

/// A column released as is.
#[derive(Debug, Clone)]
pub struct PlainColumn {
    pub name: String,
    pub dictionary: Vec<String>,
    pub codes: Vec<u32>,
}

/// Where a released column comes from, in the input's column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnSlot {
    Quasi(usize),
    Sensitive,
    Insensitive(usize),
}

/// A loaded table.
#[derive(Debug, Clone)]
pub struct Table {
    rows: usize,
    pub quasi: Vec<QuasiColumn>,
    pub sensitive: SensitiveColumn,
    pub insensitive: Vec<PlainColumn>,
    /// The kept columns in input order (identifiers and dropped columns are absent).
    pub layout: Vec<ColumnSlot>,
    /// Names of the dropped columns (identifiers and unlisted ones).
    pub dropped: Vec<String>,
}

/// Why a table could not be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TableError {
    #[error("{source_name}:{line}: {message} (rule: well-formed CSV)")]
    Csv {
        source_name: String,
        line: u64,
        message: String,
    },
    #[error("{source_name}:{line}: header: {rule}")]
    Header {
        source_name: String,
        line: u64,
        rule: String,
    },
    #[error(
        "{source_name}:{line}: {found} fields, but the header has {expected} (rule: no ragged rows)"
    )]
    Ragged {
        source_name: String,
        line: u64,
        expected: usize,
        found: usize,
    },
    #[error(
        "{source_name}:{line}:{column}: {} in column {} is not a number (rule: numeric columns hold finite numbers)",
        quote(.value),
        quote(.name)
    )]
    NotANumber {
        source_name: String,
        line: u64,
        column: usize,
        name: String,
        value: String,
    },
    #[error(
        "{source_name}:{line}:{column}: {} in column {} is missing from its hierarchy (rule: every value of a categorical quasi-identifier is a leaf of its hierarchy)",
        quote(.value),
        quote(.name)
    )]
    NotInHierarchy {
        source_name: String,
        line: u64,
        column: usize,
        name: String,
        value: String,
    },
    #[error("{source_name}: the table has no rows (rule: a table to anonymize is not empty)")]
    Empty { source_name: String },
    #[error("{source_name}:{line}: more than {limit} rows (rule: limit on rows per job)")]
    TooManyRows {
        source_name: String,
        line: u64,
        limit: usize,
    },
    #[error("schema: {rule}")]
    Schema { rule: String },
}

enum Slot {
    Dropped,
    Quasi(usize),
    Sensitive,
    Insensitive(usize),
}

/// Interns strings to dense codes.
#[derive(Debug, Default)]
struct Interner {
    /// Keyed by the caller's values: a randomly seeded hasher.
    index: HashMap<String, u32, foldhash::fast::RandomState>,
    values: Vec<String>,
}

impl Interner {
    /// The code of `value` and whether it is new.
    fn intern(&mut self, value: &str) -> (u32, bool) {
        if let Some(&code) = self.index.get(value) {
            return (code, false);
        }
        let code = self.values.len() as u32;
        self.values.push(value.to_string());
        self.index.insert(value.to_string(), code);
        (code, true)
    }
}

enum QuasiBuilder {
    /// Codes are first-seen text ids until `finish` turns them into ranks.
    Numeric {
        texts: Interner,
        values: Vec<f64>,
    },
    Categorical(Hierarchy),
}

/// Builds a [`Table`] row by row (from CSV, or from rows streamed over gRPC).
pub struct TableBuilder {
    source_name: String,
    header_len: usize,
    slots: Vec<Slot>,
    names: Vec<String>,
    quasi: Vec<(String, QuasiBuilder, Vec<u32>)>,
    sensitive: (String, bool, Interner, Vec<u32>),
    insensitive: Vec<(String, Interner, Vec<u32>)>,
    layout: Vec<ColumnSlot>,
    dropped: Vec<String>,
    rows: usize,
    max_rows: usize,
}

fn parse_number(text: &str) -> Option<f64> {
    let v: f64 = text.trim().parse().ok()?;
    v.is_finite().then_some(if v == 0.0 { 0.0 } else { v })
}

impl TableBuilder {
    /// Maps the header's columns to the schema's roles. `header_line` is the header's line number.
    pub fn new(
        schema: TableSchema,
        header: &[&str],
        source_name: &str,
        header_line: u64,
    ) -> Result<TableBuilder, TableError> {
        let header_error = |rule: String| TableError::Header {
            source_name: source_name.to_string(),
            line: header_line,
            rule,
        };
        let mut seen = HashMap::new();
        for (i, name) in header.iter().enumerate() {
            if let Some(first) = seen.insert(*name, i) {
                return Err(header_error(format!(
                    "column {:?} appears twice (columns {} and {}; rule: column names are unique)",
                    name,
                    first + 1,
                    i + 1
                )));
            }
        }
        let sensitive_count = schema
            .columns
            .iter()
            .filter(|c| matches!(c.role, ColumnRole::Sensitive { .. }))
            .count();
        if sensitive_count != 1 {
            return Err(TableError::Schema {
                rule: format!(
                    "{sensitive_count} sensitive columns (rule: exactly one column is sensitive)"
                ),
            });
        }
        let mut by_name: HashMap<&str, &ColumnSchema> = HashMap::new();
        for column in &schema.columns {
            if by_name.insert(column.name.as_str(), column).is_some() {
                return Err(TableError::Schema {
                    rule: format!("column {:?} is described twice", column.name),
                });
            }
            if !seen.contains_key(column.name.as_str()) {
                return Err(header_error(format!(
                    "the job names column {:?}, which the header lacks (rule: job columns exist in the input)",
                    column.name
                )));
            }
        }
        let mut builder = TableBuilder {
            source_name: source_name.to_string(),
            header_len: header.len(),
            slots: Vec::with_capacity(header.len()),
            names: header.iter().map(|s| s.to_string()).collect(),
            quasi: Vec::new(),
            sensitive: (String::new(), false, Interner::default(), Vec::new()),
            insensitive: Vec::new(),
            layout: Vec::new(),
            dropped: Vec::new(),
            rows: 0,
            max_rows: usize::MAX,
        };
        for name in header {
            let role = match by_name.get(name) {
                Some(column) => column.role.clone(),
                None => match schema.unlisted {
                    Unlisted::Drop => ColumnRole::Identifier,
                    Unlisted::Keep => ColumnRole::Insensitive,
                },
            };
            let slot = match role {
                ColumnRole::Identifier => {
                    builder.dropped.push(name.to_string());
                    Slot::Dropped
                }
                ColumnRole::Quasi(kind) => {
                    let q = match kind {
                        QuasiKind::Numeric => QuasiBuilder::Numeric {
                            texts: Interner::default(),
                            values: Vec::new(),
                        },
                        QuasiKind::Categorical(h) => QuasiBuilder::Categorical(h),
                    };
                    builder.quasi.push((name.to_string(), q, Vec::new()));
                    builder
                        .layout
                        .push(ColumnSlot::Quasi(builder.quasi.len() - 1));
                    Slot::Quasi(builder.quasi.len() - 1)
                }
                ColumnRole::Sensitive { numeric } => {
                    builder.sensitive.0 = name.to_string();
                    builder.sensitive.1 = numeric;
                    builder.layout.push(ColumnSlot::Sensitive);
                    Slot::Sensitive
                }
                ColumnRole::Insensitive => {
                    builder
                        .insensitive
                        .push((name.to_string(), Interner::default(), Vec::new()));
                    builder
                        .layout
                        .push(ColumnSlot::Insensitive(builder.insensitive.len() - 1));
                    Slot::Insensitive(builder.insensitive.len() - 1)
                }
            };
            builder.slots.push(slot);
        }
        if builder.quasi.is_empty() {
            return Err(TableError::Schema {
                rule: "no quasi-identifier (rule: at least one column is a quasi-identifier)"
                    .to_string(),
            });
        }
        Ok(builder)
    }

    /// Refuses rows beyond `max_rows`.
    pub fn with_max_rows(mut self, max_rows: usize) -> TableBuilder {
        self.max_rows = max_rows;
        self
    }

    /// Rows added so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds one row; `line` is its line number in the source (for messages).
    pub fn push_row<'a>(
        &mut self,
        fields: impl IntoIterator<Item = &'a str>,
        line: u64,
    ) -> Result<(), TableError> {
        if self.rows >= self.max_rows {
            return Err(TableError::TooManyRows {
                source_name: self.source_name.clone(),
                line,
                limit: self.max_rows,
            });
        }
        let mut found = 0;
        for (i, value) in fields.into_iter().enumerate() {
            let value = value.trim();
            found = i + 1;
            if i >= self.header_len {
                continue;
            }
            match self.slots[i] {
                Slot::Dropped => {}
                Slot::Quasi(q) => {
                    let (_, builder, codes) = &mut self.quasi[q];
                    let code = match builder {
                        QuasiBuilder::Numeric { texts, values } => {
                            let (code, new) = texts.intern(value);
                            if new {
                                let Some(v) = parse_number(value) else {
                                    return Err(TableError::NotANumber {
                                        source_name: self.source_name.clone(),
                                        line,
                                        column: i + 1,
                                        name: self.names[i].clone(),
                                        value: value.to_string(),
                                    });
                                };
                                values.push(v);
                            }
                            code
                        }
                        QuasiBuilder::Categorical(h) => match h.leaf(value) {
                            Some(leaf) => leaf,
                            None => {
                                return Err(TableError::NotInHierarchy {
                                    source_name: self.source_name.clone(),
                                    line,
                                    column: i + 1,
                                    name: self.names[i].clone(),
                                    value: value.to_string(),
                                });
                            }
                        },
                    };
                    codes.push(code);
                }
                Slot::Sensitive => {
                    let (_, numeric, interner, codes) = &mut self.sensitive;
                    let (code, new) = interner.intern(value);
                    if new && *numeric && parse_number(value).is_none() {
                        return Err(TableError::NotANumber {
                            source_name: self.source_name.clone(),
                            line,
                            column: i + 1,
                            name: self.names[i].clone(),
                            value: value.to_string(),
                        });
                    }
                    codes.push(code);
                }
                Slot::Insensitive(c) => {
                    let (_, interner, codes) = &mut self.insensitive[c];
                    codes.push(interner.intern(value).0);
                }
            }
        }
        if found != self.header_len {
            return Err(TableError::Ragged {
                source_name: self.source_name.clone(),
                line,
                expected: self.header_len,
                found,
            });
        }
        self.rows += 1;
        Ok(())
    }

    /// Finishes the table: turns numeric codes into ranks and sorts the sensitive domain.
    pub fn finish(self) -> Result<Table, TableError> {
        if self.rows == 0 {
            return Err(TableError::Empty {
                source_name: self.source_name,
            });
        }
        let quasi = self
            .quasi
            .into_iter()
            .map(|(name, builder, mut codes)| {
                let attribute = match builder {
                    QuasiBuilder::Numeric { texts, values } => {
                        let (domain, remap) = rank_numbers(&texts.values, &values);
                        for code in &mut codes {
                            *code = remap[*code as usize];
                        }
                        QuasiAttribute::Numeric(domain)
                    }
                    QuasiBuilder::Categorical(h) => QuasiAttribute::Categorical(h),
                };
                QuasiColumn {
                    name,
                    attribute,
                    codes,
                }
            })
            .collect();
        let (name, numeric, interner, mut codes) = self.sensitive;
        let mut order: Vec<u32> = (0..interner.values.len() as u32).collect();
        if numeric {
            let values: Vec<f64> = interner
                .values
                .iter()
                .map(|v| parse_number(v).unwrap_or(f64::NAN))
                .collect();
            order.sort_by(|&a, &b| {
                values[a as usize]
                    .total_cmp(&values[b as usize])
                    .then_with(|| interner.values[a as usize].cmp(&interner.values[b as usize]))
            });
        } else {
            order.sort_by(|&a, &b| interner.values[a as usize].cmp(&interner.values[b as usize]));
        }
        let mut remap = vec![0u32; order.len()];
        for (rank, &old) in order.iter().enumerate() {
            remap[old as usize] = rank as u32;
        }
        for code in &mut codes {
            *code = remap[*code as usize];
        }
        let domain = order
            .iter()
            .map(|&old| interner.values[old as usize].clone())
            .collect();
        Ok(Table {
            rows: self.rows,
            quasi,
            sensitive: SensitiveColumn {
                name,
                numeric,
                domain,
                codes,
            },
            insensitive: self
                .insensitive
                .into_iter()
                .map(|(name, interner, codes)| PlainColumn {
                    name,
                    dictionary: interner.values,
                    codes,
                })
                .collect(),
            layout: self.layout,
            dropped: self.dropped,
        })
    }
}

/// Sorts distinct numbers; texts with equal values share a rank (the first text represents it).
fn rank_numbers(texts: &[String], values: &[f64]) -> (NumericDomain, Vec<u32>) {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]).then(a.cmp(&b)));
    let mut domain = NumericDomain::default();
    let mut remap = vec![0u32; values.len()];
    for &i in &order {
        if domain.values.last() != Some(&values[i]) {
            domain.values.push(values[i]);
            domain.texts.push(texts[i].clone());
        }
        remap[i] = (domain.values.len() - 1) as u32;
    }
    (domain, remap)
}

impl Table {
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The sensitive attribute's distribution over the whole table (Q).
    pub fn sensitive_distribution(&self) -> SensitiveDistribution {
        let mut counts = vec![0u64; self.sensitive.domain.len()];
        for &c in &self.sensitive.codes {
            counts[c as usize] += 1;
        }
        SensitiveDistribution::from_counts(counts, self.sensitive.numeric)
    }

    /// Names of the kept columns, in input order.
    pub fn column_names(&self) -> Vec<&str> {
        self.layout
            .iter()
            .map(|slot| match *slot {
                ColumnSlot::Quasi(q) => self.quasi[q].name.as_str(),
                ColumnSlot::Sensitive => self.sensitive.name.as_str(),
                ColumnSlot::Insensitive(i) => self.insensitive[i].name.as_str(),
            })
            .collect()
    }
}

/// Reads a CSV table (with a header line) from any reader. Fields are trimmed. `source_name` names the
/// input in errors.
pub fn read_csv(
    schema: TableSchema,
    reader: impl Read,
    source_name: &str,
    delimiter: u8,
) -> Result<Table, TableError> {
    let mut csv = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .flexible(true)
        .has_headers(false)
        .from_reader(reader);
    let mut record = csv::StringRecord::new();
    let csv_error = |e: csv::Error, line: u64| TableError::Csv {
        source_name: source_name.to_string(),
        line: e.position().map(|p| p.line()).unwrap_or(line),
        message: e.to_string(),
    };
    let has_header = csv.read_record(&mut record).map_err(|e| csv_error(e, 1))?;
    if !has_header {
        return Err(TableError::Empty {
            source_name: source_name.to_string(),
        });
    }
    let header: Vec<&str> = record.iter().map(str::trim).collect();
    let mut builder = TableBuilder::new(schema, &header, source_name, 1)?;
    let mut line = 1;
    loop {
        match csv.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(e, line + 1)),
        }
        line = record.position().map(|p| p.line()).unwrap_or(line + 1);
        builder.push_row(record.iter(), line)?;
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> TableSchema {
        let h = Hierarchy::parse("sex.csv", "Male;*\nFemale;*\n").unwrap();
        TableSchema {
            columns: vec![
                ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric)),
                ColumnSchema::new("sex", ColumnRole::Quasi(QuasiKind::Categorical(h))),
                ColumnSchema::new("disease", ColumnRole::Sensitive { numeric: false }),
                ColumnSchema::new("ssn", ColumnRole::Identifier),
            ],
            unlisted: Unlisted::Drop,
        }
    }

    #[test]
    fn loads_columns() {
        let csv =
            "ssn,age,sex,disease,zip\n1,30,Male,flu,1\n2,25.0,Female,cold,2\n3,30,Male,cold,3\n";
        let t = read_csv(schema(), csv.as_bytes(), "t.csv", b',').unwrap();
        assert_eq!(t.rows(), 3);
        assert_eq!(t.column_names(), vec!["age", "sex", "disease"]);
        assert_eq!(t.dropped, vec!["ssn", "zip"]);
        assert_eq!(t.quasi[0].codes, vec![1, 0, 1]);
        assert_eq!(t.sensitive.domain, vec!["cold", "flu"]);
        assert_eq!(t.sensitive.codes, vec![1, 0, 0]);
        assert_eq!(t.sensitive_distribution().counts, vec![2, 1]);
    }

    #[test]
    fn errors_name_line_column_and_rule() {
        let err = |csv: &str| {
            read_csv(schema(), csv.as_bytes(), "t.csv", b',')
                .unwrap_err()
                .to_string()
        };
        assert!(err("ssn,age,sex,disease\n1,30,Male\n").starts_with("t.csv:2: 3 fields"));
        assert!(
            err("ssn,age,sex,disease\n1,30,Male,a\n1,x,Male,a\n").starts_with("t.csv:3:2: \"x\"")
        );
        assert!(
            err("ssn,age,sex,disease\n1,30,Other,a\n")
                .contains("t.csv:2:3: \"Other\" in column \"sex\" is missing from its hierarchy")
        );
        assert!(err("ssn,age,sex,disease\n").contains("no rows"));
        assert!(err("").contains("no rows"));
        assert!(err("ssn,age,sex\n1,2,Male\n").contains("lacks"));
        assert!(err("ssn,age,sex,disease,age\n").contains("twice"));
    }
}
