//! The table a classifier learns from: columnar, nominal attributes as value indices, numeric ones as
//! numbers, and its export to Weka's ARFF so the reference can be run on exactly the same data.
//!
//! Invariants: every column has one entry per row; a nominal code indexes its attribute's values,
//! which are distinct and in declared order (first appearance, for a dataset built from text rows);
//! a numeric value is finite; attribute names are distinct. There are no missing values.
use std::collections::HashMap;
use std::io::{self, Write};

use crate::text::quote;

/// What an attribute's values are.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeKind {
    /// One of these values, by index, in this order.
    Nominal(Vec<String>),
    /// A finite number.
    Numeric,
}

/// One attribute of a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub name: String,
    pub kind: AttributeKind,
}

impl Attribute {
    /// The number of values of a nominal attribute (0 for a numeric one).
    pub fn values(&self) -> usize {
        match &self.kind {
            AttributeKind::Nominal(values) => values.len(),
            AttributeKind::Numeric => 0,
        }
    }

    pub fn is_nominal(&self) -> bool {
        matches!(self.kind, AttributeKind::Nominal(_))
    }
}

/// The values of one attribute, one per row.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Nominal(Vec<u32>),
    Numeric(Vec<f64>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::Nominal(codes) => codes.len(),
            Column::Numeric(values) => values.len(),
        }
    }
}

/// Why a dataset could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DatasetError {
    #[error("attribute {0} appears twice (rule: attribute names are distinct)")]
    DuplicateName(String),
    #[error(
        "attribute {name} has {found} values but the dataset {expected} rows (rule: one value per row)"
    )]
    Length {
        name: String,
        expected: usize,
        found: usize,
    },
    #[error(
        "attribute {name}, row {row}: code {code} but {values} values (rule: a nominal code names a value)"
    )]
    Code {
        name: String,
        row: usize,
        code: u32,
        values: usize,
    },
    #[error(
        "attribute {name}, row {row}: {value} is not a finite number (rule: numeric attributes hold numbers)"
    )]
    NotNumeric {
        name: String,
        row: usize,
        value: String,
    },
    #[error(
        "row {row} has {found} values but there are {expected} attributes (rule: no ragged rows)"
    )]
    Ragged {
        row: usize,
        expected: usize,
        found: usize,
    },
    #[error("attribute {name} is {kind} (rule: {rule})")]
    Kind {
        name: String,
        kind: &'static str,
        rule: &'static str,
    },
    #[error("attribute {name} has the value {value} twice (rule: nominal values are distinct)")]
    DuplicateValue { name: String, value: String },
}

/// A table to learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    attributes: Vec<Attribute>,
    columns: Vec<Column>,
    rows: usize,
}

impl Dataset {
    /// A dataset of these attributes and columns (one column per attribute, of its kind), checked.
    pub fn new(attributes: Vec<Attribute>, columns: Vec<Column>) -> Result<Dataset, DatasetError> {
        let rows = columns.first().map_or(0, Column::len);
        let mut names = HashMap::new();
        for attribute in &attributes {
            if names.insert(attribute.name.as_str(), ()).is_some() {
                return Err(DatasetError::DuplicateName(quote(&attribute.name)));
            }
            if let AttributeKind::Nominal(values) = &attribute.kind {
                let mut seen = HashMap::new();
                for value in values {
                    if seen.insert(value.as_str(), ()).is_some() {
                        return Err(DatasetError::DuplicateValue {
                            name: quote(&attribute.name),
                            value: quote(value),
                        });
                    }
                }
            }
        }
        if attributes.len() != columns.len() {
            return Err(DatasetError::Ragged {
                row: 0,
                expected: attributes.len(),
                found: columns.len(),
            });
        }
        for (attribute, column) in attributes.iter().zip(&columns) {
            if column.len() != rows {
                return Err(DatasetError::Length {
                    name: quote(&attribute.name),
                    expected: rows,
                    found: column.len(),
                });
            }
            match (&attribute.kind, column) {
                (AttributeKind::Nominal(values), Column::Nominal(codes)) => {
                    if let Some((row, &code)) = codes
                        .iter()
                        .enumerate()
                        .find(|(_, c)| **c as usize >= values.len())
                    {
                        return Err(DatasetError::Code {
                            name: quote(&attribute.name),
                            row,
                            code,
                            values: values.len(),
                        });
                    }
                }
                (AttributeKind::Numeric, Column::Numeric(numbers)) => {
                    if let Some((row, value)) =
                        numbers.iter().enumerate().find(|(_, v)| !v.is_finite())
                    {
                        return Err(DatasetError::NotNumeric {
                            name: quote(&attribute.name),
                            row,
                            value: value.to_string(),
                        });
                    }
                }
                (AttributeKind::Nominal(_), Column::Numeric(_)) => {
                    return Err(DatasetError::Kind {
                        name: quote(&attribute.name),
                        kind: "nominal",
                        rule: "a nominal attribute has a column of codes",
                    });
                }
                (AttributeKind::Numeric, Column::Nominal(_)) => {
                    return Err(DatasetError::Kind {
                        name: quote(&attribute.name),
                        kind: "numeric",
                        rule: "a numeric attribute has a column of numbers",
                    });
                }
            }
        }
        Ok(Dataset {
            attributes,
            columns,
            rows,
        })
    }

    /// A dataset from text rows: `numeric[i]` says whether attribute `i` is numeric; a nominal
    /// attribute's values are numbered in order of first appearance.
    pub fn from_rows<'a, R, I>(
        names: &[&str],
        numeric: &[bool],
        rows: R,
    ) -> Result<Dataset, DatasetError>
    where
        R: IntoIterator<Item = I>,
        I: IntoIterator<Item = &'a str>,
    {
        assert_eq!(names.len(), numeric.len(), "one kind per name");
        let mut interned: Vec<HashMap<String, u32>> = vec![HashMap::new(); names.len()];
        let mut values: Vec<Vec<String>> = vec![Vec::new(); names.len()];
        let mut columns: Vec<Column> = numeric
            .iter()
            .map(|&n| {
                if n {
                    Column::Numeric(Vec::new())
                } else {
                    Column::Nominal(Vec::new())
                }
            })
            .collect();
        for (row, cells) in rows.into_iter().enumerate() {
            let mut found = 0;
            for (i, cell) in cells.into_iter().enumerate() {
                found += 1;
                if i >= names.len() {
                    continue;
                }
                match &mut columns[i] {
                    Column::Numeric(numbers) => match cell.trim().parse::<f64>() {
                        Ok(v) if v.is_finite() => numbers.push(v),
                        _ => {
                            return Err(DatasetError::NotNumeric {
                                name: quote(names[i]),
                                row,
                                value: quote(cell),
                            });
                        }
                    },
                    Column::Nominal(codes) => {
                        let next = values[i].len() as u32;
                        let code = *interned[i].entry(cell.to_string()).or_insert_with(|| {
                            values[i].push(cell.to_string());
                            next
                        });
                        codes.push(code);
                    }
                }
            }
            if found != names.len() {
                return Err(DatasetError::Ragged {
                    row,
                    expected: names.len(),
                    found,
                });
            }
        }
        let attributes = names
            .iter()
            .zip(numeric)
            .zip(values)
            .map(|((name, &n), values)| Attribute {
                name: name.to_string(),
                kind: if n {
                    AttributeKind::Numeric
                } else {
                    AttributeKind::Nominal(values)
                },
            })
            .collect();
        Dataset::new(attributes, columns)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn attributes(&self) -> &[Attribute] {
        &self.attributes
    }

    pub fn attribute(&self, index: usize) -> &Attribute {
        &self.attributes[index]
    }

    /// The index of the attribute named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.attributes.iter().position(|a| a.name == name)
    }

    pub fn column(&self, index: usize) -> &Column {
        &self.columns[index]
    }

    /// The codes of nominal attribute `index`. Panics on a numeric attribute (a caller's bug).
    pub fn nominal_codes(&self, index: usize) -> &[u32] {
        match &self.columns[index] {
            Column::Nominal(codes) => codes,
            Column::Numeric(_) => panic!("attribute {index} is numeric"),
        }
    }

    /// The numbers of numeric attribute `index`. Panics on a nominal attribute (a caller's bug).
    pub fn numeric_values(&self, index: usize) -> &[f64] {
        match &self.columns[index] {
            Column::Numeric(values) => values,
            Column::Nominal(_) => panic!("attribute {index} is nominal"),
        }
    }

    /// The dataset of these attributes only, in this order (a trivial sanitization removes some).
    pub fn select(&self, keep: &[usize]) -> Dataset {
        Dataset {
            attributes: keep.iter().map(|&i| self.attributes[i].clone()).collect(),
            columns: keep.iter().map(|&i| self.columns[i].clone()).collect(),
            rows: self.rows,
        }
    }

    /// Writes the dataset as Weka's ARFF (every name and nominal value single-quoted, nominal values
    /// declared in this dataset's order), the reference's input.
    pub fn write_arff(&self, relation: &str, mut out: impl Write) -> io::Result<()> {
        writeln!(out, "@relation {}", arff_quote(relation))?;
        for attribute in &self.attributes {
            match &attribute.kind {
                AttributeKind::Numeric => {
                    writeln!(out, "@attribute {} numeric", arff_quote(&attribute.name))?
                }
                AttributeKind::Nominal(values) => {
                    let values: Vec<String> = values.iter().map(|v| arff_quote(v)).collect();
                    writeln!(
                        out,
                        "@attribute {} {{{}}}",
                        arff_quote(&attribute.name),
                        values.join(",")
                    )?
                }
            }
        }
        writeln!(out, "@data")?;
        let mut line = String::new();
        for row in 0..self.rows {
            line.clear();
            for (i, (attribute, column)) in self.attributes.iter().zip(&self.columns).enumerate() {
                if i > 0 {
                    line.push(',');
                }
                match (column, &attribute.kind) {
                    (Column::Numeric(values), _) => line.push_str(&values[row].to_string()),
                    (Column::Nominal(codes), AttributeKind::Nominal(values)) => {
                        line.push_str(&arff_quote(&values[codes[row] as usize]))
                    }
                    (Column::Nominal(_), AttributeKind::Numeric) => {
                        unreachable!("checked on construction")
                    }
                }
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

/// A single-quoted ARFF token (backslash and quote escaped).
fn arff_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('\'');
    for c in text.chars() {
        match c {
            '\\' | '\'' => {
                quoted.push('\\');
                quoted.push(c);
            }
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            _ => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_from_rows_in_order_of_appearance_and_writes_arff() {
        let rows = [["b", "1.5", "x"], ["a", "2", "y"], ["b", "3", "x"]];
        let data = Dataset::from_rows(
            &["n", "v", "class"],
            &[false, true, false],
            rows.iter().map(|r| r.iter().copied()),
        )
        .unwrap();
        assert_eq!(data.rows(), 3);
        assert_eq!(
            data.attribute(0).kind,
            AttributeKind::Nominal(vec!["b".into(), "a".into()])
        );
        assert_eq!(data.nominal_codes(0), &[0, 1, 0]);
        assert_eq!(data.numeric_values(1), &[1.5, 2.0, 3.0]);
        let mut arff = Vec::new();
        data.write_arff("t", &mut arff).unwrap();
        let arff = String::from_utf8(arff).unwrap();
        assert!(arff.contains("@attribute 'n' {'b','a'}"), "{arff}");
        assert!(arff.contains("@attribute 'v' numeric"), "{arff}");
        assert!(arff.ends_with("'b',3,'x'\n"), "{arff}");
        let only = data.select(&[2, 0]);
        assert_eq!(only.attribute(0).name, "class");
        assert_eq!(only.nominal_codes(1), &[0, 1, 0]);
    }

    #[test]
    fn refuses_bad_input_naming_the_rule() {
        let err = Dataset::from_rows(&["v"], &[true], [["x"].iter().copied()]).unwrap_err();
        assert!(err.to_string().contains("not a finite number"), "{err}");
        let err =
            Dataset::from_rows(&["a", "b"], &[false, false], [["x"].iter().copied()]).unwrap_err();
        assert!(err.to_string().contains("no ragged rows"), "{err}");
        let err = Dataset::new(
            vec![Attribute {
                name: "a".into(),
                kind: AttributeKind::Nominal(vec!["x".into()]),
            }],
            vec![Column::Nominal(vec![0, 1])],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("a nominal code names a value"),
            "{err}"
        );
        assert_eq!(arff_quote("it's"), "'it\\'s'");
    }
}
