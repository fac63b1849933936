//! Releases of a partitioned table: generalization (each equivalence class's QI region: numeric
//! `lo-hi`, or the single value when lo == hi; categorical the lowest common hierarchy node),
//! bucketization (Anatomy, Xiao & Tao: the exact QIs with a group id, and a separate table of group id,
//! sensitive value, count) and trivial sanitization (every QI suppressed to `*`, the baseline of
//! Brickell & Shmatikov). Also the CSV writers of released tables, which by default neutralize
//! cells a spreadsheet would evaluate as a formula ([`Formulas`], OWASP's CSV injection advice).
//!
//! Invariants: a release never contains identifier columns; rows appear in a random order drawn from
//! the seeded RNG (and bucketization group ids are a random relabelling of the classes), so order leaks
//! nothing about the input order or the split order; a generalized region always contains the original
//! values of every row of its class; for bucketization, each group's sensitive table is exactly the
//! multiset of its rows' sensitive values.
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::str::FromStr;

use rand::Rng;
use rand::seq::SliceRandom;

use crate::relational::mondrian::Partitioning;
use crate::relational::table::{ColumnSlot, QuasiAttribute, Table};

/// How the equivalence classes are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReleaseMethod {
    #[default]
    Generalization,
    Bucketization,
    Trivial,
}

impl FromStr for ReleaseMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<ReleaseMethod, String> {
        match s {
            "generalization" => Ok(ReleaseMethod::Generalization),
            "bucketization" => Ok(ReleaseMethod::Bucketization),
            "trivial" => Ok(ReleaseMethod::Trivial),
            other => Err(format!(
                "unknown release method {other:?} (known: generalization, bucketization, trivial)"
            )),
        }
    }
}

impl fmt::Display for ReleaseMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReleaseMethod::Generalization => "generalization",
            ReleaseMethod::Bucketization => "bucketization",
            ReleaseMethod::Trivial => "trivial",
        })
    }
}

/// What a released column is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasedRole {
    Quasi,
    Sensitive {
        numeric: bool,
    },
    Insensitive,
    /// Bucketization's group id.
    Group,
}

/// A dictionary-encoded released column.
#[derive(Debug, Clone)]
pub struct ReleasedColumn {
    pub name: String,
    pub role: ReleasedRole,
    pub dictionary: Vec<String>,
    /// One code per released row, in release order.
    pub codes: Vec<u32>,
}

impl ReleasedColumn {
    pub fn value(&self, row: usize) -> &str {
        &self.dictionary[self.codes[row] as usize]
    }
}

/// A released table (rows already in release order).
#[derive(Debug, Clone)]
pub struct ReleasedTable {
    pub columns: Vec<ReleasedColumn>,
    pub rows: usize,
}

impl ReleasedTable {
    /// A released table from string rows (e.g. a published table read back from CSV); `roles` has one
    /// entry per column of `header`.
    pub fn from_rows<S: AsRef<str>>(
        header: &[&str],
        roles: &[ReleasedRole],
        rows: &[Vec<S>],
    ) -> ReleasedTable {
        let mut columns: Vec<(ReleasedColumn, Dictionary)> = header
            .iter()
            .zip(roles)
            .map(|(name, &role)| {
                (
                    ReleasedColumn {
                        name: name.to_string(),
                        role,
                        dictionary: Vec::new(),
                        codes: Vec::with_capacity(rows.len()),
                    },
                    Dictionary::default(),
                )
            })
            .collect();
        for row in rows {
            for ((column, dictionary), value) in columns.iter_mut().zip(row) {
                column
                    .codes
                    .push(dictionary.code(value.as_ref().to_string()));
            }
        }
        ReleasedTable {
            columns: columns
                .into_iter()
                .map(|(mut column, dictionary)| {
                    column.dictionary = dictionary.values;
                    column
                })
                .collect(),
            rows: rows.len(),
        }
    }

    pub fn header(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }

    pub fn row(&self, row: usize) -> impl Iterator<Item = &str> {
        self.columns.iter().map(move |c| c.value(row))
    }
}

/// One line of bucketization's sensitive table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensitiveEntry {
    pub group: u32,
    pub value: String,
    pub count: u64,
}

/// Bucketization's sensitive table, sorted by group then value.
#[derive(Debug, Clone)]
pub struct SensitiveTable {
    pub group_name: String,
    pub sensitive_name: String,
    pub numeric: bool,
    pub entries: Vec<SensitiveEntry>,
}

/// A released table.
#[derive(Debug, Clone)]
pub enum Release {
    /// Generalization and trivial releases: one table.
    Generalized(ReleasedTable),
    /// Bucketization: the QI table (exact QIs + group id) and the sensitive table.
    Bucketized {
        quasi_table: ReleasedTable,
        sensitive_table: SensitiveTable,
    },
}

impl Release {
    /// The table of released quasi-identifiers: generalization's table, bucketization's QI table.
    pub fn quasi_table(&self) -> &ReleasedTable {
        match self {
            Release::Generalized(t) => t,
            Release::Bucketized { quasi_table, .. } => quasi_table,
        }
    }
}

/// Interns released strings per column.
#[derive(Default)]
struct Dictionary {
    index: HashMap<String, u32>,
    values: Vec<String>,
}

impl Dictionary {
    fn code(&mut self, value: String) -> u32 {
        if let Some(&c) = self.index.get(&value) {
            return c;
        }
        let c = self.values.len() as u32;
        self.index.insert(value.clone(), c);
        self.values.push(value);
        c
    }
}

/// The generalized label of one QI for the rows of one class.
pub fn generalize(attribute: &QuasiAttribute, codes: &[u32], rows: &[u32]) -> String {
    match attribute {
        QuasiAttribute::Numeric(domain) => {
            let mut lo = u32::MAX;
            let mut hi = 0;
            for &r in rows {
                let c = codes[r as usize];
                lo = lo.min(c);
                hi = hi.max(c);
            }
            if lo == u32::MAX {
                return "*".to_string();
            }
            if lo == hi {
                domain.texts[lo as usize].clone()
            } else {
                format!(
                    "{}-{}",
                    domain.texts[lo as usize], domain.texts[hi as usize]
                )
            }
        }
        QuasiAttribute::Categorical(h) => {
            match h.lowest_common_ancestor(rows.iter().map(|&r| codes[r as usize])) {
                Some((_, node)) => h.label(node).to_string(),
                None => "*".to_string(),
            }
        }
    }
}

fn exact_label(attribute: &QuasiAttribute, code: u32) -> &str {
    match attribute {
        QuasiAttribute::Numeric(domain) => &domain.texts[code as usize],
        QuasiAttribute::Categorical(h) => h.label(h.ancestor(code, 0)),
    }
}

/// The first row order of a release, and the first draw from its RNG: row `order[i]` of the input
/// is released at position i. The engine re-draws it from the seed to know each row's input position
/// ([`crate::relational::attacks`]); every release function draws it first.
pub fn release_order(n: usize, rng: &mut impl Rng) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(rng);
    order
}

/// A sensitive or insensitive column as released: its values as they are, rows in `order`; `None`
/// for a quasi-identifier (each release method releases those its own way).
pub(crate) fn plain_column(
    table: &Table,
    slot: ColumnSlot,
    order: &[u32],
) -> Option<ReleasedColumn> {
    match slot {
        ColumnSlot::Sensitive => Some(ReleasedColumn {
            name: table.sensitive.name.clone(),
            role: ReleasedRole::Sensitive {
                numeric: table.sensitive.numeric,
            },
            dictionary: table.sensitive.domain.clone(),
            codes: order
                .iter()
                .map(|&r| table.sensitive.codes[r as usize])
                .collect(),
        }),
        ColumnSlot::Insensitive(i) => {
            let column = &table.insensitive[i];
            Some(ReleasedColumn {
                name: column.name.clone(),
                role: ReleasedRole::Insensitive,
                dictionary: column.dictionary.clone(),
                codes: order.iter().map(|&r| column.codes[r as usize]).collect(),
            })
        }
        ColumnSlot::Quasi(_) => None,
    }
}

/// Builds the release of `partitioning` (for [`ReleaseMethod::Trivial`] the partitioning is ignored:
/// the whole table is one class).
pub fn release(
    table: &Table,
    partitioning: &Partitioning,
    method: ReleaseMethod,
    rng: &mut impl Rng,
) -> Release {
    let n = table.rows();
    let order = release_order(n, rng);
    let trivial;
    let partitioning = if method == ReleaseMethod::Trivial {
        trivial = Partitioning::whole_table(n);
        &trivial
    } else {
        partitioning
    };
    let mut class_of_row = vec![0u32; n];
    for (c, range) in partitioning.classes.iter().enumerate() {
        for &r in &partitioning.rows[range.clone()] {
            class_of_row[r as usize] = c as u32;
        }
    }
    let plain = |slot: ColumnSlot| plain_column(table, slot, &order);
    match method {
        ReleaseMethod::Generalization | ReleaseMethod::Trivial => {
            let mut columns = Vec::with_capacity(table.layout.len());
            for &slot in &table.layout {
                if let ColumnSlot::Quasi(q) = slot {
                    let column = &table.quasi[q];
                    let mut dictionary = Dictionary::default();
                    let labels: Vec<u32> = (0..partitioning.classes.len())
                        .map(|c| {
                            if method == ReleaseMethod::Trivial {
                                dictionary.code("*".to_string())
                            } else {
                                dictionary.code(generalize(
                                    &column.attribute,
                                    &column.codes,
                                    partitioning.class_rows(c),
                                ))
                            }
                        })
                        .collect();
                    columns.push(ReleasedColumn {
                        name: column.name.clone(),
                        role: ReleasedRole::Quasi,
                        dictionary: dictionary.values,
                        codes: order
                            .iter()
                            .map(|&r| labels[class_of_row[r as usize] as usize])
                            .collect(),
                    });
                } else if let Some(column) = plain(slot) {
                    columns.push(column);
                }
            }
            Release::Generalized(ReleasedTable { columns, rows: n })
        }
        ReleaseMethod::Bucketization => {
            let classes = partitioning.classes.len();
            let mut group_of_class: Vec<u32> = (0..classes as u32).collect();
            group_of_class.shuffle(rng);
            let mut columns = Vec::with_capacity(table.layout.len());
            for &slot in &table.layout {
                match slot {
                    ColumnSlot::Quasi(q) => {
                        let column = &table.quasi[q];
                        let mut dictionary = Dictionary::default();
                        let mut label_of_code: HashMap<u32, u32> = HashMap::new();
                        let codes = order
                            .iter()
                            .map(|&r| {
                                let code = column.codes[r as usize];
                                *label_of_code.entry(code).or_insert_with(|| {
                                    dictionary
                                        .code(exact_label(&column.attribute, code).to_string())
                                })
                            })
                            .collect();
                        columns.push(ReleasedColumn {
                            name: column.name.clone(),
                            role: ReleasedRole::Quasi,
                            dictionary: dictionary.values,
                            codes,
                        });
                    }
                    ColumnSlot::Sensitive => {}
                    ColumnSlot::Insensitive(_) => columns.extend(plain(slot)),
                }
            }
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            let mut group_name = "group".to_string();
            while names.contains(&group_name.as_str()) || group_name == table.sensitive.name {
                group_name.insert(0, '_');
            }
            columns.push(ReleasedColumn {
                name: group_name.clone(),
                role: ReleasedRole::Group,
                dictionary: (1..=classes).map(|g| g.to_string()).collect(),
                codes: order
                    .iter()
                    .map(|&r| group_of_class[class_of_row[r as usize] as usize])
                    .collect(),
            });
            let m = table.sensitive.domain.len();
            let mut counts = vec![0u64; classes * m];
            for (r, &c) in class_of_row.iter().enumerate() {
                let g = group_of_class[c as usize] as usize;
                counts[g * m + table.sensitive.codes[r] as usize] += 1;
            }
            let mut entries = Vec::new();
            for g in 0..classes {
                for (s, value) in table.sensitive.domain.iter().enumerate() {
                    let count = counts[g * m + s];
                    if count > 0 {
                        entries.push(SensitiveEntry {
                            group: g as u32 + 1,
                            value: value.clone(),
                            count,
                        });
                    }
                }
            }
            Release::Bucketized {
                quasi_table: ReleasedTable { columns, rows: n },
                sensitive_table: SensitiveTable {
                    group_name,
                    sensitive_name: table.sensitive.name.clone(),
                    numeric: table.sensitive.numeric,
                    entries,
                },
            }
        }
    }
}

/// Writes a released table as CSV with a header line.
pub fn write_csv(table: &ReleasedTable, formulas: Formulas, writer: impl Write) -> csv::Result<()> {
    let mut out = CsvOut::new(writer, formulas);
    out.row(&table.header())?;
    let mut cells = Vec::with_capacity(table.columns.len());
    for row in 0..table.rows {
        cells.clear();
        cells.extend(table.row(row));
        out.row(&cells)?;
    }
    out.finish()
}

/// Whether the CSV writers neutralize formula-like cells (the job's `[release] formulas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Formulas {
    /// A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return and does not parse as
    /// a plain (finite) number is written as `'` and the cell, as a quoted field; so is a cell that
    /// starts with `'` (so that [`restore_formula`] gives every cell back exactly). Numbers such as
    /// `-5` or `+1.5e3` stay as they are.
    #[default]
    Neutralize,
    /// Every cell as it is.
    Keep,
}

impl FromStr for Formulas {
    type Err = String;
    fn from_str(s: &str) -> Result<Formulas, String> {
        match s {
            "neutralize" => Ok(Formulas::Neutralize),
            "keep" => Ok(Formulas::Keep),
            other => Err(format!(
                "unknown formulas {other:?} (known: neutralize, keep)"
            )),
        }
    }
}

impl fmt::Display for Formulas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Formulas::Neutralize => "neutralize",
            Formulas::Keep => "keep",
        })
    }
}

/// Whether a spreadsheet would read `cell` as a formula: it starts with `=`, `+`, `-`, `@`, a tab
/// or a carriage return and is not a plain finite number.
fn is_formula(cell: &str) -> bool {
    cell.starts_with(['=', '+', '-', '@', '\t', '\r'])
        && !cell.parse::<f64>().is_ok_and(f64::is_finite)
}

/// Whether [`Formulas::Neutralize`] writes `cell` with a `'` before it.
fn needs_quote_mark(cell: &str) -> bool {
    is_formula(cell) || cell.starts_with('\'')
}

/// A cell as it was before [`Formulas::Neutralize`]: one leading `'` taken off when the rest would
/// have been given one. Readers of released CSVs call this on every cell.
pub fn restore_formula(cell: &str) -> &str {
    match cell.strip_prefix('\'') {
        Some(rest) if needs_quote_mark(rest) => rest,
        _ => cell,
    }
}

/// The CSV writer of releases: the `csv` crate's as it is with [`Formulas::Keep`]; with
/// [`Formulas::Neutralize`] the same bytes (a field quoted when it holds a comma, a quote, CR or LF;
/// a record of one empty field written `""`; `\n` after each record) except that a formula-like
/// cell is written `"'<cell>"`.
enum CsvOut<W: Write> {
    Keep(Box<csv::Writer<W>>),
    Neutralize(std::io::BufWriter<W>),
}

impl<W: Write> CsvOut<W> {
    fn new(writer: W, formulas: Formulas) -> CsvOut<W> {
        match formulas {
            Formulas::Keep => CsvOut::Keep(Box::new(csv::Writer::from_writer(writer))),
            Formulas::Neutralize => CsvOut::Neutralize(std::io::BufWriter::new(writer)),
        }
    }

    fn row(&mut self, cells: &[&str]) -> csv::Result<()> {
        let out = match self {
            CsvOut::Keep(csv) => return csv.write_record(cells),
            CsvOut::Neutralize(out) => out,
        };
        if let [only] = cells
            && only.is_empty()
        {
            out.write_all(b"\"\"\n")?;
            return Ok(());
        }
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            let mark = needs_quote_mark(cell);
            if mark || cell.contains([',', '"', '\n', '\r']) {
                out.write_all(if mark { b"\"'" } else { b"\"" })?;
                out.write_all(cell.replace('"', "\"\"").as_bytes())?;
                out.write_all(b"\"")?;
            } else {
                out.write_all(cell.as_bytes())?;
            }
        }
        out.write_all(b"\n")?;
        Ok(())
    }

    fn finish(self) -> csv::Result<()> {
        match self {
            CsvOut::Keep(mut csv) => csv.flush()?,
            CsvOut::Neutralize(mut out) => out.flush()?,
        }
        Ok(())
    }
}

/// Writes bucketization's sensitive table as CSV: `group,<sensitive>,count`.
pub fn write_sensitive_csv(
    table: &SensitiveTable,
    formulas: Formulas,
    writer: impl Write,
) -> csv::Result<()> {
    let mut out = CsvOut::new(writer, formulas);
    out.row(&[
        table.group_name.as_str(),
        table.sensitive_name.as_str(),
        "count",
    ])?;
    for e in &table.entries {
        let (group, count) = (e.group.to_string(), e.count.to_string());
        out.row(&[&group, &e.value, &count])?;
    }
    out.finish()
}

#[cfg(test)]
mod formula_tests {
    use super::*;

    fn table(cells: &[&str]) -> ReleasedTable {
        let mut dictionary: Vec<String> = Vec::new();
        let codes = cells
            .iter()
            .map(|c| {
                let at = dictionary.iter().position(|d| d == c).unwrap_or_else(|| {
                    dictionary.push(c.to_string());
                    dictionary.len() - 1
                });
                at as u32
            })
            .collect();
        ReleasedTable {
            columns: vec![ReleasedColumn {
                name: "v".into(),
                role: ReleasedRole::Quasi,
                dictionary,
                codes,
            }],
            rows: cells.len(),
        }
    }

    fn csv(cells: &[&str], formulas: Formulas) -> String {
        let mut out = Vec::new();
        write_csv(&table(cells), formulas, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn formula_cells_are_neutralized_and_numbers_are_not() {
        let cells = [
            "=cmd|' /C calc'!A0",
            "+SUM(1,2)",
            "@HYPERLINK(\"x\")",
            "-5-10",
            "\tx",
            "'quoted",
            "-5",
            "+1.5e3",
            "flu",
        ];
        assert_eq!(
            csv(&cells, Formulas::Neutralize),
            "v\n\"'=cmd|' /C calc'!A0\"\n\"'+SUM(1,2)\"\n\"'@HYPERLINK(\"\"x\"\")\"\n\"'-5-10\"\n\"'\tx\"\n\"''quoted\"\n-5\n+1.5e3\nflu\n"
        );
        for cell in cells {
            let written = if needs_quote_mark(cell) {
                format!("'{cell}")
            } else {
                cell.to_string()
            };
            assert_eq!(restore_formula(&written), cell);
        }
        assert!(csv(&cells, Formulas::Keep).contains("\n=cmd|' /C calc'!A0\n"));
    }

    #[test]
    fn without_formulas_both_writers_write_the_same_bytes() {
        for cells in [
            &[
                "a,b",
                "say \"hi\"",
                "two\nlines",
                "cr\rx",
                "",
                "plain",
                "-3",
            ][..],
            &[""][..],
        ] {
            assert_eq!(csv(cells, Formulas::Neutralize), csv(cells, Formulas::Keep));
        }
    }
}
