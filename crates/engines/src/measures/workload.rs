//! Brickell & Shmatikov's learning workload (KDD 2008, section 5): how well a classifier learns
//! attribute v from the other released attributes. U_max is the cross-validated accuracy on the
//! original table, U_base the best accuracy over the trivial sanitizations (the quasi-identifiers
//! removed; the sensitive attribute removed, where v is not it) and over the classifiers run, U_san
//! the accuracy on the release, per classifier; a release is worth U_san - U_base to a data miner.
//!
//! Invariants: pure (no runtime, files or clock). How a table becomes a dataset: an intact numeric
//! quasi-identifier (every released value a number) stays numeric; a column with any generalized cell
//! (an interval `lo-hi`, a hierarchy node, `*`) is nominal, each distinct released text one value, as
//! the paper's Weka runs treated them; the sensitive and insensitive columns are nominal (a numeric
//! sensitive column stays numeric unless it is v); v is always nominal; nominal values are declared in
//! order of first appearance. A bucketized release is learned from the table a miner reconstructs by
//! random association: each group's sensitive multiset is dealt to the group's rows in an order drawn
//! from the workload seed; the group id itself is not an attribute. If v is a quasi-identifier, the
//! "quasi-identifiers removed" sanitization keeps v (it is the class) and removes the others. A
//! release's column that the original table lacks (a file carrying columns the job drops) is not
//! learned from, so U_san, U_max and U_base see the same attributes. Every
//! model's count tables (classes × values) are checked against `max_model_cells` before any is
//! allocated; a run gives up (`Ok(None)`) between folds once `cancelled` turns true.
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::learning::dataset::Column;
use crate::learning::{
    Accuracy, Attribute, AttributeKind, Dataset, J48, Learner, LearningError, NaiveBayes,
    RandomForest, cross_validate_on,
};
use crate::relational::release::{Release, ReleasedColumn, ReleasedRole};
use crate::relational::table::{ColumnSlot, QuasiAttribute, Table};

/// The most folds a workload may ask for.
pub const MAX_FOLDS: usize = 100;

/// The model-size limit of the command line (classes × attribute values, 8 bytes each).
pub const DEFAULT_MAX_MODEL_CELLS: usize = 1 << 26;

/// Bytes the learning datasets of one table or release may take per cell at most: a value of 8
/// bytes in the dataset, its copies in a fold's training and test sets, and the reconstruction of
/// a bucketized release.
pub const DATASET_BYTES_PER_CELL: u64 = 32;

/// What the learning datasets of `table` (or of one release of it) may take, charged to the job's
/// memory budget before they are built.
pub fn datasets_bytes(table: &Table) -> u64 {
    (table.rows() as u64)
        .saturating_mul(table.layout.len() as u64)
        .saturating_mul(DATASET_BYTES_PER_CELL)
}

/// A classifier of the paper, with Weka 3.6's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Classifier {
    #[serde(rename = "j48")]
    J48,
    #[serde(rename = "rf")]
    RandomForest,
    #[serde(rename = "nb")]
    NaiveBayes,
}

impl Classifier {
    pub const ALL: [Classifier; 3] = [
        Classifier::J48,
        Classifier::RandomForest,
        Classifier::NaiveBayes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Classifier::J48 => "j48",
            Classifier::RandomForest => "rf",
            Classifier::NaiveBayes => "nb",
        }
    }
}

impl fmt::Display for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Classifier {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Classifier, WorkloadError> {
        Classifier::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| WorkloadError::Option {
                option: "classifiers",
                value: s.to_string(),
                rule: "each one of j48, rf, nb",
            })
    }
}

/// What to learn and how.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadOptions {
    /// v: the attribute to predict.
    pub attribute: String,
    pub classifiers: Vec<Classifier>,
    pub folds: usize,
    pub seed: u64,
    /// Threads one cross-validation's folds run on; 0 is the machine's parallelism. A caller that
    /// measures several releases at once on its own threads sets 1, so that the threads it starts
    /// are the whole budget. No accuracy depends on it.
    pub threads: usize,
}

impl WorkloadOptions {
    /// v with the defaults: every classifier, 10 folds, seed 1.
    pub fn new(attribute: impl Into<String>) -> WorkloadOptions {
        WorkloadOptions {
            attribute: attribute.into(),
            classifiers: Classifier::ALL.to_vec(),
            folds: 10,
            seed: 1,
            threads: 0,
        }
    }

    /// v with the named classifiers, folds and seed, each defaulting as in [`WorkloadOptions::new`]
    /// when absent (`None`); validated. The command line (`--classifiers j48,rf` split on commas) and
    /// `TableEvaluator` (one name per `classifiers` entry) both build their options here.
    pub fn parse<'a>(
        attribute: &str,
        classifiers: Option<impl IntoIterator<Item = &'a str>>,
        folds: Option<usize>,
        seed: Option<u64>,
    ) -> Result<WorkloadOptions, WorkloadError> {
        let defaults = WorkloadOptions::new(attribute);
        let options = WorkloadOptions {
            classifiers: match classifiers {
                Some(names) => names
                    .into_iter()
                    .map(|name| name.trim().parse())
                    .collect::<Result<Vec<_>, _>>()?,
                None => defaults.classifiers,
            },
            folds: folds.unwrap_or(defaults.folds),
            seed: seed.unwrap_or(defaults.seed),
            threads: defaults.threads,
            attribute: defaults.attribute,
        };
        options.validate()?;
        Ok(options)
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.classifiers.is_empty() {
            return Err(WorkloadError::Option {
                option: "classifiers",
                value: String::new(),
                rule: "at least one of j48, rf, nb",
            });
        }
        for (i, c) in self.classifiers.iter().enumerate() {
            if self.classifiers[..i].contains(c) {
                return Err(WorkloadError::Option {
                    option: "classifiers",
                    value: c.name().to_string(),
                    rule: "each classifier at most once",
                });
            }
        }
        if !(2..=MAX_FOLDS).contains(&self.folds) {
            return Err(WorkloadError::Option {
                option: "folds",
                value: self.folds.to_string(),
                rule: "2 <= folds <= 100",
            });
        }
        Ok(())
    }
}

/// Why a workload could not be measured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{option} = {value:?}: {rule}")]
    Option {
        option: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error(
        "workload attribute {0:?} is not a column of the {1} (rule: the workload learns a released attribute)"
    )]
    NoAttribute(String, &'static str),
    #[error(
        "a model of {classes} classes over {values} attribute values needs {needed} cells, more than {max} (rule: model size within the limit)"
    )]
    TooLarge {
        classes: usize,
        values: usize,
        needed: u128,
        max: usize,
    },
    #[error(
        "group {group}: {rule} (rule: a bucketized release's sensitive counts match its groups)"
    )]
    Group { group: String, rule: &'static str },
    #[error(transparent)]
    Learning(#[from] LearningError),
}

/// Which trivial sanitization gave U_base; serialized as its [`Sanitization::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sanitization {
    QuasiRemoved,
    SensitiveRemoved,
}

impl Sanitization {
    /// The name of the JSON report and of `TableEvaluator`'s response.
    pub fn name(self) -> &'static str {
        match self {
            Sanitization::QuasiRemoved => "quasi-identifiers removed",
            Sanitization::SensitiveRemoved => "sensitive removed",
        }
    }
}

impl Serialize for Sanitization {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// The original table's side of a workload, computed once per table and options.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadBaseline {
    pub options: WorkloadOptions,
    /// U_max per classifier, in the options' order.
    pub u_max: Vec<f64>,
    pub u_base: f64,
    pub u_base_sanitization: Sanitization,
    pub u_base_classifier: Classifier,
}

/// One classifier's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassifierWorkload {
    pub classifier: Classifier,
    pub u_max: f64,
    pub u_san: f64,
    /// U_san - U_base: what the release is worth to a miner beyond the trivial sanitizations.
    pub u_san_minus_u_base: f64,
}

/// The workload figures of one release (the `workload` object of the evaluation report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadEvaluation {
    pub attribute: String,
    pub folds: u64,
    pub seed: u64,
    /// The best U_max over the classifiers run.
    pub u_max: f64,
    pub u_base: f64,
    pub u_base_sanitization: Sanitization,
    pub u_base_classifier: Classifier,
    pub classifiers: Vec<ClassifierWorkload>,
}

/// Nominal values in order of first appearance, from per-row texts.
fn nominal<'a>(name: &str, texts: impl Iterator<Item = &'a str>) -> (Attribute, Column) {
    let mut index: HashMap<&'a str, u32> = HashMap::new();
    let mut values = Vec::new();
    let codes = texts
        .map(|t| {
            *index.entry(t).or_insert_with(|| {
                values.push(t.to_string());
                values.len() as u32 - 1
            })
        })
        .collect();
    (
        Attribute {
            name: name.to_string(),
            kind: AttributeKind::Nominal(values),
        },
        Column::Nominal(codes),
    )
}

fn numeric(name: &str, values: Vec<f64>) -> (Attribute, Column) {
    (
        Attribute {
            name: name.to_string(),
            kind: AttributeKind::Numeric,
        },
        Column::Numeric(values),
    )
}

fn dataset(parts: Vec<(Attribute, Column)>) -> Dataset {
    let (attributes, columns) = parts.into_iter().unzip();
    Dataset::new(attributes, columns).expect("columns of one table are consistent")
}

/// The original table as a dataset, columns in the table's order; v (`class`) nominal.
pub fn original_dataset(table: &Table, class: &str) -> Dataset {
    let parts = table
        .layout
        .iter()
        .map(|&slot| match slot {
            ColumnSlot::Quasi(q) => {
                let column = &table.quasi[q];
                match &column.attribute {
                    QuasiAttribute::Numeric(domain) if column.name != class => numeric(
                        &column.name,
                        column
                            .codes
                            .iter()
                            .map(|&c| domain.values[c as usize])
                            .collect(),
                    ),
                    QuasiAttribute::Numeric(domain) => nominal(
                        &column.name,
                        column
                            .codes
                            .iter()
                            .map(|&c| domain.texts[c as usize].as_str()),
                    ),
                    QuasiAttribute::Categorical(h) => nominal(
                        &column.name,
                        column.codes.iter().map(|&c| h.label(h.ancestor(c, 0))),
                    ),
                }
            }
            ColumnSlot::Sensitive => {
                let s = &table.sensitive;
                let texts = s.codes.iter().map(|&c| s.domain[c as usize].as_str());
                numbers(&s.name, s.numeric && s.name != class, texts.clone())
                    .unwrap_or_else(|| nominal(&s.name, texts))
            }
            ColumnSlot::Insensitive(i) => {
                let c = &table.insensitive[i];
                nominal(
                    &c.name,
                    c.codes.iter().map(|&k| c.dictionary[k as usize].as_str()),
                )
            }
        })
        .collect();
    dataset(parts)
}

/// A numeric attribute of these texts, if `wanted` and every text is a finite number.
fn numbers<'a>(
    name: &str,
    wanted: bool,
    texts: impl Iterator<Item = &'a str>,
) -> Option<(Attribute, Column)> {
    if !wanted {
        return None;
    }
    let values = texts
        .map(|t| t.trim().parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect::<Option<Vec<f64>>>()?;
    Some(numeric(name, values))
}

fn released_column(table: &Table, column: &ReleasedColumn, class: &str) -> (Attribute, Column) {
    let numeric_in_table = match column.role {
        ReleasedRole::Quasi => table
            .quasi
            .iter()
            .any(|q| q.name == column.name && matches!(q.attribute, QuasiAttribute::Numeric(_))),
        ReleasedRole::Sensitive { numeric } => numeric,
        ReleasedRole::Insensitive | ReleasedRole::Group => false,
    };
    let texts = column
        .codes
        .iter()
        .map(|&c| column.dictionary[c as usize].as_str());
    numbers(
        &column.name,
        numeric_in_table && column.name != class,
        texts.clone(),
    )
    .unwrap_or_else(|| nominal(&column.name, texts))
}

/// Whether a released column is an attribute of the release's dataset: not the group id, and not a
/// column the original table does not have (a release file may carry columns the job drops; U_max
/// and U_base never see them, so U_san must not either).
fn learned_from(table: &Table, column: &ReleasedColumn) -> bool {
    match column.role {
        ReleasedRole::Group => false,
        ReleasedRole::Insensitive => table.column_names().contains(&column.name.as_str()),
        ReleasedRole::Quasi | ReleasedRole::Sensitive { .. } => true,
    }
}

/// The release as a dataset (see the module's invariants for bucketized releases).
pub fn release_dataset(
    table: &Table,
    release: &Release,
    class: &str,
    seed: u64,
) -> Result<Dataset, WorkloadError> {
    match release {
        Release::Generalized(t) => Ok(dataset(
            t.columns
                .iter()
                .filter(|c| learned_from(table, c))
                .map(|c| released_column(table, c, class))
                .collect(),
        )),
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => {
            let mut parts: Vec<(Attribute, Column)> = quasi_table
                .columns
                .iter()
                .filter(|c| learned_from(table, c))
                .map(|c| released_column(table, c, class))
                .collect();
            let group = quasi_table
                .columns
                .iter()
                .find(|c| c.role == ReleasedRole::Group)
                .ok_or_else(|| WorkloadError::Group {
                    group: sensitive_table.group_name.clone(),
                    rule: "the QI table has no group column",
                })?;
            let groups = group.dictionary.len();
            let mut rows_of_group: Vec<Vec<usize>> = vec![Vec::new(); groups];
            for (row, &g) in group.codes.iter().enumerate() {
                rows_of_group[g as usize].push(row);
            }
            let group_index: HashMap<&str, usize> = group
                .dictionary
                .iter()
                .enumerate()
                .map(|(i, g)| (g.as_str(), i))
                .collect();
            let mut values_of_group: Vec<Vec<&str>> = vec![Vec::new(); groups];
            for entry in &sensitive_table.entries {
                let name = entry.group.to_string();
                let g = *group_index
                    .get(name.as_str())
                    .ok_or_else(|| WorkloadError::Group {
                        group: name.clone(),
                        rule: "it has no released rows",
                    })?;
                let have = values_of_group[g].len() as u64;
                if have + entry.count > rows_of_group[g].len() as u64 {
                    return Err(WorkloadError::Group {
                        group: name,
                        rule: "more sensitive values than rows",
                    });
                }
                values_of_group[g].extend((0..entry.count).map(|_| entry.value.as_str()));
            }
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut sensitive = vec![""; quasi_table.rows];
            for (g, (rows, values)) in rows_of_group.iter().zip(&mut values_of_group).enumerate() {
                if values.len() != rows.len() {
                    return Err(WorkloadError::Group {
                        group: group.dictionary[g].clone(),
                        rule: "fewer sensitive values than rows",
                    });
                }
                values.shuffle(&mut rng);
                for (&row, &value) in rows.iter().zip(values.iter()) {
                    sensitive[row] = value;
                }
            }
            let name = &sensitive_table.sensitive_name;
            let texts = sensitive.iter().copied();
            parts.push(
                numbers(
                    name,
                    sensitive_table.numeric && name != class,
                    texts.clone(),
                )
                .unwrap_or_else(|| nominal(name, texts)),
            );
            Ok(dataset(parts))
        }
    }
}

/// Refuses a dataset whose models' count tables would pass `max_cells`, before any is built.
fn check_size(data: &Dataset, class: usize, max_cells: usize) -> Result<(), WorkloadError> {
    let classes = data.attribute(class).values();
    let values: usize = data.attributes().iter().map(|a| a.values().max(1)).sum();
    let needed = classes as u128 * values as u128;
    if needed > max_cells as u128 {
        return Err(WorkloadError::TooLarge {
            classes,
            values,
            needed,
            max: max_cells,
        });
    }
    Ok(())
}

/// Cross-validated accuracy of `classifier` predicting `class` of `data`, `None` once cancelled.
fn accuracy(
    classifier: Classifier,
    data: &Dataset,
    class: usize,
    options: &WorkloadOptions,
    cancelled: &AtomicBool,
) -> Result<Option<f64>, WorkloadError> {
    let run = match classifier {
        Classifier::J48 => cross_validate_with(&J48::default(), data, class, options, cancelled)?,
        Classifier::RandomForest => {
            cross_validate_with(&RandomForest::default(), data, class, options, cancelled)?
        }
        Classifier::NaiveBayes => {
            cross_validate_with(&NaiveBayes, data, class, options, cancelled)?
        }
    };
    Ok(run.map(|a| a.rate()))
}

/// `learner`'s cross-validation with the options' folds, seed and threads.
fn cross_validate_with<L: Learner + Sync>(
    learner: &L,
    data: &Dataset,
    class: usize,
    options: &WorkloadOptions,
    cancelled: &AtomicBool,
) -> Result<Option<Accuracy>, LearningError> {
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    cross_validate_on(
        learner,
        data,
        class,
        options.folds,
        options.seed,
        threads,
        cancelled,
    )
}

fn class_index(
    data: &Dataset,
    attribute: &str,
    what: &'static str,
) -> Result<usize, WorkloadError> {
    data.index_of(attribute)
        .ok_or_else(|| WorkloadError::NoAttribute(attribute.to_string(), what))
}

impl WorkloadBaseline {
    /// U_max and U_base of `options` on `table`; `Ok(None)` once `cancelled` turns true.
    pub fn new_unless(
        table: &Table,
        options: WorkloadOptions,
        max_cells: usize,
        cancelled: &AtomicBool,
    ) -> Result<Option<WorkloadBaseline>, WorkloadError> {
        options.validate()?;
        let original = original_dataset(table, &options.attribute);
        let class = class_index(&original, &options.attribute, "table")?;
        check_size(&original, class, max_cells)?;
        let is_quasi = |name: &str| table.quasi.iter().any(|q| q.name == name);
        let mut trivial = vec![(
            Sanitization::QuasiRemoved,
            (0..original.attributes().len())
                .filter(|&a| a == class || !is_quasi(&original.attribute(a).name))
                .collect::<Vec<_>>(),
        )];
        if options.attribute != table.sensitive.name {
            trivial.push((
                Sanitization::SensitiveRemoved,
                (0..original.attributes().len())
                    .filter(|&a| original.attribute(a).name != table.sensitive.name)
                    .collect(),
            ));
        }
        let mut u_max = Vec::with_capacity(options.classifiers.len());
        for &classifier in &options.classifiers {
            let Some(rate) = accuracy(classifier, &original, class, &options, cancelled)? else {
                return Ok(None);
            };
            u_max.push(rate);
        }
        let mut best: Option<(f64, Sanitization, Classifier)> = None;
        for (sanitization, keep) in trivial {
            let data = original.select(&keep);
            let class = class_index(&data, &options.attribute, "table")?;
            for &classifier in &options.classifiers {
                let Some(rate) = accuracy(classifier, &data, class, &options, cancelled)? else {
                    return Ok(None);
                };
                if best.is_none_or(|(b, _, _)| rate > b) {
                    best = Some((rate, sanitization, classifier));
                }
            }
        }
        let (u_base, u_base_sanitization, u_base_classifier) =
            best.expect("at least one sanitization and one classifier");
        Ok(Some(WorkloadBaseline {
            options,
            u_max,
            u_base,
            u_base_sanitization,
            u_base_classifier,
        }))
    }

    /// The workload figures of `release`; `Ok(None)` once `cancelled` turns true.
    pub fn measure_unless(
        &self,
        table: &Table,
        release: &Release,
        max_cells: usize,
        cancelled: &AtomicBool,
    ) -> Result<Option<WorkloadEvaluation>, WorkloadError> {
        let options = &self.options;
        let data = release_dataset(table, release, &options.attribute, options.seed)?;
        let class = class_index(&data, &options.attribute, "release")?;
        check_size(&data, class, max_cells)?;
        let mut classifiers = Vec::with_capacity(options.classifiers.len());
        for (&classifier, &u_max) in options.classifiers.iter().zip(&self.u_max) {
            let Some(u_san) = accuracy(classifier, &data, class, options, cancelled)? else {
                return Ok(None);
            };
            classifiers.push(ClassifierWorkload {
                classifier,
                u_max,
                u_san,
                u_san_minus_u_base: u_san - self.u_base,
            });
        }
        Ok(Some(WorkloadEvaluation {
            attribute: options.attribute.clone(),
            folds: options.folds as u64,
            seed: options.seed,
            u_max: self.u_max.iter().copied().fold(f64::MIN, f64::max),
            u_base: self.u_base,
            u_base_sanitization: self.u_base_sanitization,
            u_base_classifier: self.u_base_classifier,
            classifiers,
        }))
    }
}

/// The workload figures of `release` against `table` (U_max and U_base on the table, then U_san on
/// the release), as `cloakd table evaluate --workload` and `TableEvaluator` report them; `Ok(None)`
/// once `cancelled` turns true. Every model is checked against `max_cells` before it is built.
pub fn measure_workload_unless(
    table: &Table,
    release: &Release,
    options: WorkloadOptions,
    max_cells: usize,
    cancelled: &AtomicBool,
) -> Result<Option<WorkloadEvaluation>, WorkloadError> {
    match WorkloadBaseline::new_unless(table, options, max_cells, cancelled)? {
        Some(baseline) => baseline.measure_unless(table, release, max_cells, cancelled),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relational::hierarchy::Hierarchy;
    use crate::relational::mondrian::Partitioning;
    use crate::relational::release::{ReleaseMethod, release};
    use crate::relational::table::{
        ColumnRole, ColumnSchema, QuasiKind, TableSchema, Unlisted, read_csv,
    };
    use std::fmt::Write;

    /// 300 rows: age (numeric QI), sex (QI), occupation (S), income (insensitive) equal to sex's
    /// image, so a classifier that sees sex predicts income exactly.
    fn table() -> Table {
        let sex = Hierarchy::parse("sex.csv", "Male;*\nFemale;*\n").unwrap();
        let schema = TableSchema {
            columns: vec![
                ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric)),
                ColumnSchema::new("sex", ColumnRole::Quasi(QuasiKind::Categorical(sex))),
                ColumnSchema::new("occupation", ColumnRole::Sensitive { numeric: false }),
                ColumnSchema::new("income", ColumnRole::Insensitive),
            ],
            unlisted: Unlisted::Drop,
        };
        let mut csv = String::from("age,sex,occupation,income\n");
        for i in 0..300u32 {
            let sex = if (i * 7) % 5 < 2 { "Female" } else { "Male" };
            let income = if sex == "Male" { ">50K" } else { "<=50K" };
            let occupation = ["a", "b", "c"][(i % 3) as usize];
            writeln!(csv, "{},{sex},{occupation},{income}", 20 + (i * 13) % 50).unwrap();
        }
        read_csv(schema, csv.as_bytes(), "t.csv", b',').unwrap()
    }

    fn options() -> WorkloadOptions {
        WorkloadOptions {
            attribute: "income".into(),
            classifiers: vec![Classifier::NaiveBayes, Classifier::RandomForest],
            folds: 10,
            seed: 1,
            threads: 0,
        }
    }

    #[test]
    fn baseline_and_releases() {
        let table = table();
        let never = AtomicBool::new(false);
        let original = original_dataset(&table, "income");
        assert_eq!(original.attribute(0).kind, AttributeKind::Numeric);
        assert!(original.attribute(1).is_nominal());
        let baseline = WorkloadBaseline::new_unless(&table, options(), 1 << 20, &never)
            .unwrap()
            .unwrap();
        assert_eq!(baseline.u_max, vec![1.0, 1.0]);
        // Without the QIs, income is not predictable; without occupation, sex still gives it.
        assert_eq!(baseline.u_base, 1.0);
        assert_eq!(baseline.u_base_sanitization, Sanitization::SensitiveRemoved);
        assert_eq!(baseline.u_base_classifier, Classifier::NaiveBayes);

        // The whole table in one class: sex generalized to `*`, age to one interval (nominal).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let whole = Partitioning::whole_table(table.rows());
        let generalized = release(&table, &whole, ReleaseMethod::Generalization, &mut rng);
        let data = release_dataset(&table, &generalized, "income", 1).unwrap();
        assert!(data.attribute(data.index_of("age").unwrap()).is_nominal());
        let measured = baseline
            .measure_unless(&table, &generalized, 1 << 20, &never)
            .unwrap()
            .unwrap();
        assert_eq!(measured.classifiers.len(), 2);
        for c in &measured.classifiers {
            assert!(c.u_san < 0.7, "{c:?}");
            assert_eq!(c.u_san_minus_u_base, c.u_san - 1.0);
        }

        // Bucketization keeps the QIs exact: sex, hence income, stays learnable; the sensitive
        // column is dealt from each group's counts.
        let bucketized = release(&table, &whole, ReleaseMethod::Bucketization, &mut rng);
        let data = release_dataset(&table, &bucketized, "income", 1).unwrap();
        assert_eq!(data.attribute(0).kind, AttributeKind::Numeric);
        let occupation = data.index_of("occupation").unwrap();
        let mut counts = [0; 3];
        for &c in data.nominal_codes(occupation) {
            counts[c as usize] += 1;
        }
        assert_eq!(counts, [100, 100, 100]);
        assert!(data.index_of("group").is_none());
        let measured = baseline
            .measure_unless(&table, &bucketized, 1 << 20, &never)
            .unwrap()
            .unwrap();
        assert!(measured.classifiers.iter().all(|c| c.u_san == 1.0));
    }

    #[test]
    fn a_column_the_table_lacks_is_not_learned_from() {
        let table = table();
        let never = AtomicBool::new(false);
        // Every QI suppressed, plus `leak`, a copy of income the job does not keep.
        let mut csv = String::from("age,sex,occupation,income,leak\n");
        for i in 0..table.rows() {
            let sex = if (i * 7) % 5 < 2 { "Female" } else { "Male" };
            let income = if sex == "Male" { ">50K" } else { "<=50K" };
            let occupation = ["a", "b", "c"][i % 3];
            writeln!(csv, "*,*,{occupation},{income},{income}").unwrap();
        }
        let release = crate::measures::released::read_release(
            &table,
            csv.as_bytes(),
            "release.csv",
            None,
            b',',
        )
        .unwrap();
        let data = release_dataset(&table, &release, "income", 1).unwrap();
        assert!(data.index_of("leak").is_none());
        assert_eq!(data.attributes().len(), 4);
        let baseline = WorkloadBaseline::new_unless(&table, options(), 1 << 20, &never)
            .unwrap()
            .unwrap();
        let measured = baseline
            .measure_unless(&table, &release, 1 << 20, &never)
            .unwrap()
            .unwrap();
        for c in &measured.classifiers {
            assert!(c.u_san < 0.7, "{c:?}");
        }
    }

    #[test]
    fn refuses_bad_options_and_large_models_and_gives_up_when_cancelled() {
        let table = table();
        let never = AtomicBool::new(false);
        let mut bad = options();
        bad.folds = 1;
        let err = WorkloadBaseline::new_unless(&table, bad, 1 << 20, &never).unwrap_err();
        assert!(err.to_string().contains("2 <= folds <= 100"), "{err}");
        let parse = |list: &str, folds| {
            WorkloadOptions::parse("income", Some(list.split(',')), folds, Some(7))
        };
        let err = parse("j48,svm", None).unwrap_err();
        assert!(err.to_string().contains("one of j48, rf, nb"), "{err}");
        let parsed = parse("j48, rf", None).unwrap();
        assert_eq!(
            parsed.classifiers,
            vec![Classifier::J48, Classifier::RandomForest]
        );
        assert_eq!((parsed.folds, parsed.seed), (10, 7));
        let err = parse("nb", Some(101)).unwrap_err();
        assert!(err.to_string().contains("2 <= folds <= 100"), "{err}");
        let err = parse("nb,rf,nb", None).unwrap_err();
        assert!(err.to_string().contains("at most once"), "{err}");
        assert_eq!(
            WorkloadOptions::parse("income", None::<[&str; 0]>, None, None).unwrap(),
            WorkloadOptions::new("income")
        );
        assert_eq!(
            serde_json::to_value(Sanitization::QuasiRemoved).unwrap(),
            Sanitization::QuasiRemoved.name()
        );
        let mut twice = options();
        twice.classifiers = vec![Classifier::NaiveBayes, Classifier::NaiveBayes];
        assert!(twice.validate().is_err());
        let mut missing = options();
        missing.attribute = "salary".into();
        let err = WorkloadBaseline::new_unless(&table, missing, 1 << 20, &never).unwrap_err();
        assert!(err.to_string().contains("\"salary\""), "{err}");
        let err = WorkloadBaseline::new_unless(&table, options(), 10, &never).unwrap_err();
        assert!(matches!(err, WorkloadError::TooLarge { .. }), "{err}");
        let cancelled = AtomicBool::new(true);
        assert_eq!(
            WorkloadBaseline::new_unless(&table, options(), 1 << 20, &cancelled).unwrap(),
            None
        );
    }
}
