//! Job descriptions of batch relational anonymization: a TOML file naming the input CSV, each column's
//! role (`quasi`, `sensitive`, `identifier`, `insensitive`) and kind, the privacy models and the
//! release. Parsed from text (no file access here: the caller resolves `input` and hierarchy paths
//! against the job file's directory and hands hierarchies in through a loader).
//!
//! ```toml
//! input = "data/adult.csv.gz"      # relative to the job file; gzip is detected by content
//! delimiter = ","                  # optional, one ASCII character
//! unlisted = "drop"                # columns not listed below: "drop" (default) or "keep"
//! [columns]
//! age        = { role = "quasi", kind = "numeric" }
//! workclass  = { role = "quasi", hierarchy = "data/hierarchies/workclass.csv" }
//! occupation = { role = "sensitive" }              # kind = "numeric" selects the ordered EMD
//! fnlwgt     = { role = "identifier" }
//! [privacy]                        # any combination, at least one
//! k = 10
//! l = "distinct:3"                 # distinct:L | entropy:L | probabilistic:L | recursive:L:c=C
//! t = "emd:0.2"                    # emd:T | js:T, T in [0, 1]
//! delta = 1.2                      # > 0
//! max_risk_highest = 0.1           # highest prosecutor risk, in (0, 1]
//! max_risk_average = 0.05          # average prosecutor risk, in (0, 1]
//! population_uniqueness = { model = "dankar", population = 318900000, max = 0.01 }
//! [release]
//! method = "generalization"        # generalization | bucketization | trivial
//! algorithm = "mondrian"           # mondrian (default) | kaca | ola (kaca, ola: generalization only)
//! metric = "dm"                    # ola's loss: dm | prec | entropy
//! max_suppression = 0.0            # ola: share of rows that may be suppressed, in [0, 1]
//! seed = 7
//! formulas = "neutralize"          # CSV cells a spreadsheet would evaluate: neutralize (default) | keep
//! [sweep]                          # optional: the settings `cloakd table frontier` and the
//! k = [10, 50, 100]                # workbench sweep with (flags override them); kept as written
//! ```
//!
//! Invariants: a parsed job has exactly one sensitive column, at least one quasi-identifier, every
//! categorical quasi-identifier names a hierarchy, and valid model parameters; every error names the
//! job source, line and column of the offending key and the rule.
use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::relational::AlgorithmOptions;
use crate::relational::hierarchy::Hierarchy;
use crate::relational::models::{LDiversity, PrivacySpec, TCloseness, UniquenessBound};
use crate::relational::release::{Formulas, ReleaseMethod};
use crate::relational::table::{ColumnRole, ColumnSchema, QuasiKind, TableSchema, Unlisted};

/// A job rejected: where and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{source_name}:{line}:{column}: {rule}")]
pub struct JobError {
    pub source_name: String,
    pub line: usize,
    pub column: usize,
    pub rule: String,
}

/// A column's role as the job states it.
#[derive(Debug, Clone, PartialEq)]
pub enum RoleSpec {
    QuasiNumeric,
    /// `hierarchy` is the path as written in the job.
    QuasiCategorical {
        hierarchy: String,
    },
    Sensitive {
        numeric: bool,
    },
    Identifier,
    Insensitive,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub name: String,
    pub role: RoleSpec,
    /// Where the column's entry is in the job text (for messages about it).
    pub span: Range<usize>,
}

/// A parsed, validated job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub source_name: String,
    /// The input path as written (relative to the job file), if any.
    pub input: Option<String>,
    pub delimiter: u8,
    pub unlisted: Unlisted,
    pub columns: Vec<ColumnSpec>,
    pub privacy: PrivacySpec,
    pub release: ReleaseMethod,
    pub seed: u64,
    /// The algorithm and its parameters (`[release] algorithm`, `metric`, `max_suppression`).
    pub algorithm: AlgorithmOptions,
    /// How the released CSVs write formula-like cells (`[release] formulas`).
    pub formulas: Formulas,
    /// The `[sweep]` section as written (the frontier's settings, validated by the sweep that reads
    /// them; anonymization ignores it), with its position for messages.
    pub sweep: Option<(toml::Table, Range<usize>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    input: Option<Spanned<String>>,
    delimiter: Option<Spanned<String>>,
    unlisted: Option<Spanned<String>>,
    columns: Option<Spanned<BTreeMap<String, Spanned<RawColumn>>>>,
    privacy: Option<Spanned<RawPrivacy>>,
    release: Option<RawRelease>,
    sweep: Option<Spanned<toml::Table>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    role: Spanned<String>,
    kind: Option<Spanned<String>>,
    hierarchy: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrivacy {
    k: Option<Spanned<i64>>,
    l: Option<Spanned<String>>,
    t: Option<Spanned<String>>,
    delta: Option<Spanned<f64>>,
    max_risk_highest: Option<Spanned<f64>>,
    max_risk_average: Option<Spanned<f64>>,
    population_uniqueness: Option<Spanned<RawUniqueness>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUniqueness {
    model: Spanned<String>,
    population: Spanned<f64>,
    max: Spanned<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelease {
    method: Option<Spanned<String>>,
    seed: Option<Spanned<i64>>,
    algorithm: Option<Spanned<String>>,
    metric: Option<Spanned<String>>,
    max_suppression: Option<Spanned<f64>>,
    formulas: Option<Spanned<String>>,
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before[nl + 1..].chars().count()
    }) + 1;
    (line, column)
}

impl JobSpec {
    /// The number of quasi-identifier columns.
    pub fn quasi_count(&self) -> usize {
        self.columns
            .iter()
            .filter(|c| {
                matches!(
                    c.role,
                    RoleSpec::QuasiNumeric | RoleSpec::QuasiCategorical { .. }
                )
            })
            .count()
    }

    /// Parses and validates a job's TOML text; `source_name` names it in errors.
    pub fn parse(source_name: &str, text: &str) -> Result<JobSpec, JobError> {
        let error = |span: Range<usize>, rule: String| {
            let (line, column) = line_column(text, span.start);
            JobError {
                source_name: source_name.to_string(),
                line,
                column,
                rule,
            }
        };
        let raw: RawJob = toml::from_str(text).map_err(|e| {
            error(
                e.span().unwrap_or(0..0),
                e.message().trim().replace('\n', " "),
            )
        })?;
        let delimiter = match &raw.delimiter {
            None => b',',
            Some(d) => match d.get_ref().as_bytes() {
                [b] if b.is_ascii() && *b != b'"' && *b != b'\n' => *b,
                _ => {
                    return Err(error(
                        d.span(),
                        "delimiter must be one ASCII character".into(),
                    ));
                }
            },
        };
        let unlisted = match &raw.unlisted {
            None => Unlisted::Drop,
            Some(u) => match u.get_ref().as_str() {
                "drop" => Unlisted::Drop,
                "keep" => Unlisted::Keep,
                other => {
                    return Err(error(
                        u.span(),
                        format!("unlisted must be \"drop\" or \"keep\" (got {other:?})"),
                    ));
                }
            },
        };
        let Some(columns_raw) = raw.columns else {
            return Err(error(
                0..0,
                "missing [columns] (rule: the job names each column's role)".into(),
            ));
        };
        let columns_span = columns_raw.span();
        let mut columns = Vec::new();
        for (name, column) in columns_raw.into_inner() {
            let span = column.span();
            let column = column.into_inner();
            let kind = column
                .kind
                .as_ref()
                .map(|k| (k.get_ref().as_str(), k.span()));
            let role = match column.role.get_ref().as_str() {
                "quasi" => match (kind, &column.hierarchy) {
                    (Some(("numeric", _)), None) => RoleSpec::QuasiNumeric,
                    (Some(("numeric", s)), Some(_)) => {
                        return Err(error(
                            s,
                            format!(
                                "column {name:?}: a numeric quasi-identifier takes no hierarchy"
                            ),
                        ));
                    }
                    (None | Some(("categorical", _)), Some(h)) => RoleSpec::QuasiCategorical {
                        hierarchy: h.get_ref().clone(),
                    },
                    (None | Some(("categorical", _)), None) => {
                        return Err(error(
                            span,
                            format!(
                                "column {name:?}: a categorical quasi-identifier needs a hierarchy (or kind = \"numeric\")"
                            ),
                        ));
                    }
                    (Some((other, s)), _) => {
                        return Err(error(
                            s,
                            format!(
                                "column {name:?}: unknown kind {other:?} (known: numeric, categorical)"
                            ),
                        ));
                    }
                },
                "sensitive" => {
                    if let Some(h) = &column.hierarchy {
                        return Err(error(
                            h.span(),
                            format!("column {name:?}: only quasi-identifiers take a hierarchy"),
                        ));
                    }
                    match kind {
                        None | Some(("categorical", _)) => RoleSpec::Sensitive { numeric: false },
                        Some(("numeric", _)) => RoleSpec::Sensitive { numeric: true },
                        Some((other, s)) => {
                            return Err(error(
                                s,
                                format!(
                                    "column {name:?}: unknown kind {other:?} (known: numeric, categorical)"
                                ),
                            ));
                        }
                    }
                }
                "identifier" | "insensitive" => {
                    if let Some(s) = column
                        .hierarchy
                        .as_ref()
                        .map(|h| h.span())
                        .or(column.kind.as_ref().map(|k| k.span()))
                    {
                        return Err(error(
                            s,
                            format!(
                                "column {name:?}: kind and hierarchy apply to quasi-identifiers and the sensitive column only"
                            ),
                        ));
                    }
                    if column.role.get_ref() == "identifier" {
                        RoleSpec::Identifier
                    } else {
                        RoleSpec::Insensitive
                    }
                }
                other => {
                    return Err(error(
                        column.role.span(),
                        format!(
                            "column {name:?}: unknown role {other:?} (known: quasi, sensitive, identifier, insensitive)"
                        ),
                    ));
                }
            };
            columns.push(ColumnSpec { name, role, span });
        }
        let sensitive: Vec<&ColumnSpec> = columns
            .iter()
            .filter(|c| matches!(c.role, RoleSpec::Sensitive { .. }))
            .collect();
        match sensitive.as_slice() {
            [_] => {}
            [] => {
                return Err(error(
                    columns_span,
                    "no sensitive column (rule: exactly one column has role = \"sensitive\")"
                        .into(),
                ));
            }
            [_, second, ..] => {
                let names: Vec<&str> = sensitive.iter().map(|c| c.name.as_str()).collect();
                return Err(error(
                    second.span.clone(),
                    format!(
                        "{} sensitive columns {names:?} (rule: exactly one column has role = \"sensitive\")",
                        names.len()
                    ),
                ));
            }
        }
        if !columns.iter().any(|c| {
            matches!(
                c.role,
                RoleSpec::QuasiNumeric | RoleSpec::QuasiCategorical { .. }
            )
        }) {
            return Err(error(
                columns_span,
                "no quasi-identifier (rule: at least one column has role = \"quasi\")".into(),
            ));
        }
        let mut privacy = PrivacySpec::default();
        let privacy_span = raw.privacy.as_ref().map_or(0..0, |p| p.span());
        if let Some(p) = raw.privacy.map(Spanned::into_inner) {
            if let Some(k) = p.k {
                if *k.get_ref() < 1 {
                    return Err(error(k.span(), "k must be at least 1".into()));
                }
                privacy.k = Some(*k.get_ref() as u64);
            }
            if let Some(l) = p.l {
                privacy.l = Some(
                    l.get_ref()
                        .parse::<LDiversity>()
                        .map_err(|e| error(l.span(), format!("l: {e}")))?,
                );
            }
            if let Some(t) = p.t {
                privacy.t = Some(
                    t.get_ref()
                        .parse::<TCloseness>()
                        .map_err(|e| error(t.span(), format!("t: {e}")))?,
                );
            }
            if let Some(d) = p.delta {
                let delta = *d.get_ref();
                if !(delta.is_finite() && delta > 0.0) {
                    return Err(error(d.span(), "delta must be a finite number > 0".into()));
                }
                privacy.delta = Some(delta);
            }
            for (key, raw, slot) in [
                (
                    "max_risk_highest",
                    p.max_risk_highest,
                    &mut privacy.risk.highest,
                ),
                (
                    "max_risk_average",
                    p.max_risk_average,
                    &mut privacy.risk.average,
                ),
            ] {
                if let Some(r) = raw {
                    let value = *r.get_ref();
                    if !(value > 0.0 && value <= 1.0) {
                        return Err(error(r.span(), format!("{key} must lie in (0, 1]")));
                    }
                    *slot = Some(value);
                }
            }
            if let Some(u) = p.population_uniqueness.map(Spanned::into_inner) {
                let model = u.model.get_ref().parse().map_err(|e| {
                    error(u.model.span(), format!("population_uniqueness.model: {e}"))
                })?;
                let population = *u.population.get_ref();
                if !(population.is_finite() && population >= 1.0) {
                    return Err(error(
                        u.population.span(),
                        "population_uniqueness.population must be a finite number >= 1".into(),
                    ));
                }
                let max = *u.max.get_ref();
                if !(0.0..=1.0).contains(&max) {
                    return Err(error(
                        u.max.span(),
                        "population_uniqueness.max must lie in [0, 1]".into(),
                    ));
                }
                privacy.risk.population_uniqueness = Some(UniquenessBound {
                    model,
                    population,
                    max,
                });
            }
        }
        privacy
            .validate()
            .map_err(|e| error(privacy_span, format!("[privacy]: {}", e.rule)))?;
        let mut release = ReleaseMethod::default();
        let mut seed = 0;
        let mut algorithm = AlgorithmOptions::default();
        let mut formulas = Formulas::default();
        if let Some(r) = raw.release {
            if let Some(f) = &r.formulas {
                formulas = f
                    .get_ref()
                    .parse()
                    .map_err(|e| error(f.span(), format!("formulas: {e}")))?;
            }
            if let Some(m) = r.method {
                release = m.get_ref().parse().map_err(|e| error(m.span(), e))?;
            }
            if let Some(s) = r.seed {
                if *s.get_ref() < 0 {
                    return Err(error(s.span(), "seed must be >= 0".into()));
                }
                seed = *s.get_ref() as u64;
            }
            if let Some(a) = &r.algorithm {
                algorithm.algorithm = a.get_ref().parse().map_err(|e| error(a.span(), e))?;
            }
            if let Some(m) = &r.metric {
                algorithm.metric = m.get_ref().parse().map_err(|e| error(m.span(), e))?;
            }
            if let Some(x) = &r.max_suppression {
                algorithm.max_suppression = *x.get_ref();
            }
            if let Err(rule) = algorithm.validate(release) {
                let span = r
                    .max_suppression
                    .as_ref()
                    .map(|x| x.span())
                    .or(r.algorithm.as_ref().map(|a| a.span()))
                    .unwrap_or(0..0);
                return Err(error(span, format!("[release]: {rule}")));
            }
        }
        Ok(JobSpec {
            source_name: source_name.to_string(),
            input: raw.input.map(Spanned::into_inner),
            delimiter,
            unlisted,
            columns,
            privacy,
            release,
            seed,
            algorithm,
            formulas,
            sweep: raw.sweep.map(|s| {
                let span = s.span();
                (s.into_inner(), span)
            }),
        })
    }

    /// The table schema, with each categorical column's hierarchy obtained from `load_hierarchy`
    /// (called with the path as written in the job and the column name).
    pub fn schema<E>(
        &self,
        mut load_hierarchy: impl FnMut(&str, &str) -> Result<Hierarchy, E>,
    ) -> Result<TableSchema, E> {
        let mut columns = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            let role = match &c.role {
                RoleSpec::QuasiNumeric => ColumnRole::Quasi(QuasiKind::Numeric),
                RoleSpec::QuasiCategorical { hierarchy } => {
                    ColumnRole::Quasi(QuasiKind::Categorical(load_hierarchy(hierarchy, &c.name)?))
                }
                RoleSpec::Sensitive { numeric } => ColumnRole::Sensitive { numeric: *numeric },
                RoleSpec::Identifier => ColumnRole::Identifier,
                RoleSpec::Insensitive => ColumnRole::Insensitive,
            };
            columns.push(ColumnSchema {
                name: c.name.clone(),
                role,
            });
        }
        Ok(TableSchema {
            columns,
            unlisted: self.unlisted,
        })
    }
}

/// Algorithm settings given by name, as `cloakd table anonymize`'s flags and `TableAnonymizer`'s job
/// fields carry them; `None` keeps the job's setting.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlgorithmOverrides<'a> {
    pub algorithm: Option<&'a str>,
    pub metric: Option<&'a str>,
    pub max_suppression: Option<f64>,
}

/// The setting an [`AlgorithmOverrides`] error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmField {
    Algorithm,
    Metric,
    MaxSuppression,
}

/// An algorithm setting refused: which one and the rule.
#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmFieldError {
    pub field: AlgorithmField,
    pub rule: String,
}

impl JobSpec {
    /// Applies algorithm settings over the job's and checks the result against each other and the
    /// release method ([`AlgorithmOptions::validate`]): the one implementation behind the CLI flags
    /// and the gRPC job fields. On error the job is unchanged.
    pub fn override_algorithm(
        &mut self,
        overrides: AlgorithmOverrides<'_>,
    ) -> Result<(), AlgorithmFieldError> {
        let refuse = |field, rule: String| AlgorithmFieldError { field, rule };
        let mut options = self.algorithm;
        if let Some(a) = overrides.algorithm {
            options.algorithm = a
                .parse()
                .map_err(|e| refuse(AlgorithmField::Algorithm, e))?;
        }
        if let Some(m) = overrides.metric {
            options.metric = m.parse().map_err(|e| refuse(AlgorithmField::Metric, e))?;
        }
        if let Some(x) = overrides.max_suppression {
            options.max_suppression = x;
        }
        options.validate(self.release).map_err(|rule| {
            // The share is at fault when it is out of range or given for another algorithm.
            let share_at_fault = overrides.max_suppression.is_some()
                && (!(0.0..=1.0).contains(&options.max_suppression)
                    || options.algorithm != crate::relational::Algorithm::Ola);
            let field = if share_at_fault {
                AlgorithmField::MaxSuppression
            } else {
                AlgorithmField::Algorithm
            };
            refuse(field, rule)
        })?;
        self.algorithm = options;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
input = "t.csv"
[columns]
age = { role = "quasi", kind = "numeric" }
sex = { role = "quasi", hierarchy = "sex.csv" }
disease = { role = "sensitive" }
[privacy]
k = 3
l = "recursive:2:c=3"
[release]
method = "bucketization"
seed = 9
"#;

    #[test]
    fn parses_a_job() {
        let job = JobSpec::parse("job.toml", JOB).unwrap();
        assert_eq!(job.input.as_deref(), Some("t.csv"));
        assert_eq!(job.privacy.k, Some(3));
        assert_eq!(job.privacy.l, Some(LDiversity::Recursive { l: 2, c: 3.0 }));
        assert_eq!(job.release, ReleaseMethod::Bucketization);
        assert_eq!(job.seed, 9);
        assert_eq!(job.columns.len(), 3);
    }

    #[test]
    fn parses_the_algorithm() {
        let ola = JOB.replace(
            "method = \"bucketization\"",
            "method = \"generalization\"\nalgorithm = \"ola\"\nmetric = \"entropy\"\nmax_suppression = 0.05",
        );
        let job = JobSpec::parse("job.toml", &ola).unwrap();
        assert_eq!(job.algorithm.algorithm, crate::relational::Algorithm::Ola);
        assert_eq!(
            job.algorithm.metric,
            crate::relational::ola::Metric::Entropy
        );
        assert_eq!(job.algorithm.max_suppression, 0.05);
        assert_eq!(
            JobSpec::parse("job.toml", JOB).unwrap().algorithm,
            AlgorithmOptions::default()
        );
        let err = |t: &str| JobSpec::parse("job.toml", t).unwrap_err().to_string();
        let bucket = JOB.replace("seed = 9", "algorithm = \"ola\"");
        assert!(
            err(&bucket).contains("generalization only"),
            "{}",
            err(&bucket)
        );
        let metric = ola.replace("\"entropy\"", "\"gini\"");
        assert!(
            err(&metric).contains("unknown metric \"gini\""),
            "{}",
            err(&metric)
        );
        let share = ola.replace("0.05", "1.5");
        assert!(
            err(&share).contains("job.toml:14:19: [release]: max_suppression = 1.5"),
            "{}",
            err(&share)
        );
        let mondrian = share
            .replace("\"ola\"", "\"mondrian\"")
            .replace("1.5", "0.1");
        assert!(err(&mondrian).contains("ola only"), "{}", err(&mondrian));
        let unknown = JOB.replace("seed = 9", "algorithm = \"incognito\"");
        assert!(
            err(&unknown).contains("unknown algorithm"),
            "{}",
            err(&unknown)
        );
    }

    #[test]
    fn errors_point_at_the_key() {
        let err = |t: &str| JobSpec::parse("job.toml", t).unwrap_err().to_string();
        let bad_k = JOB.replace("k = 3", "k = 0");
        assert!(
            err(&bad_k).starts_with("job.toml:8:5: k must be at least 1"),
            "{}",
            err(&bad_k)
        );
        let bad_l = JOB.replace("recursive:2:c=3", "diverse:2");
        assert!(err(&bad_l).contains("job.toml:9:5: l:"), "{}", err(&bad_l));
        assert!(err(&bad_l).contains("unknown l-diversity"));
        let two = JOB.replace("role = \"quasi\", kind", "role = \"sensitive\", kind");
        assert!(err(&two).contains("2 sensitive columns"), "{}", err(&two));
        let none = JOB.replace("disease = { role = \"sensitive\" }", "");
        assert!(err(&none).contains("no sensitive column"));
        let t = JOB.replace("k = 3", "t = \"emd:1.5\"");
        assert!(err(&t).contains("[0, 1]"));
        let d = JOB.replace("k = 3", "delta = -1");
        assert!(err(&d).contains("delta must be"));
        let typo = JOB.replace("k = 3", "kk = 3");
        assert!(err(&typo).starts_with("job.toml:8:1:"), "{}", err(&typo));
        let method = JOB.replace("bucketization", "shuffle");
        assert!(err(&method).contains("unknown release method"));
    }

    #[test]
    fn parses_and_checks_risk_bounds() {
        let risky = JOB.replace(
            "k = 3",
            "max_risk_highest = 0.2\nmax_risk_average = 0.05\npopulation_uniqueness = { model = \"dankar\", population = 1000, max = 0.01 }",
        );
        let job = JobSpec::parse("job.toml", &risky).unwrap();
        assert_eq!(job.privacy.risk.highest, Some(0.2));
        assert_eq!(job.privacy.risk.average, Some(0.05));
        assert_eq!(
            job.privacy.risk.population_uniqueness,
            Some(UniquenessBound {
                model: crate::relational::models::UniquenessModel::Dankar,
                population: 1000.0,
                max: 0.01
            })
        );
        // A risk bound alone is a privacy request.
        let only = JOB
            .replace("k = 3", "max_risk_average = 0.5")
            .replace("l = \"recursive:2:c=3\"\n", "");
        assert_eq!(
            JobSpec::parse("job.toml", &only)
                .unwrap()
                .privacy
                .risk
                .average,
            Some(0.5)
        );
        let err = |t: &str| JobSpec::parse("job.toml", t).unwrap_err().to_string();
        let zero = risky.replace("max_risk_highest = 0.2", "max_risk_highest = 0");
        assert!(
            err(&zero).starts_with("job.toml:8:20: max_risk_highest must lie in (0, 1]"),
            "{}",
            err(&zero)
        );
        let above = risky.replace("max_risk_average = 0.05", "max_risk_average = 1.5");
        assert!(err(&above).contains("max_risk_average must lie in (0, 1]"));
        let model = risky.replace("\"dankar\"", "\"poisson\"");
        assert!(
            err(&model).contains("population_uniqueness.model: unknown population model"),
            "{}",
            err(&model)
        );
        let population = risky.replace("population = 1000", "population = 0.5");
        assert!(err(&population).contains("population_uniqueness.population must be"));
        let max = risky.replace("max = 0.01", "max = 2");
        assert!(err(&max).contains("population_uniqueness.max must lie in [0, 1]"));
        let unknown = risky.replace("max = 0.01", "max = 0.01, size = 3");
        assert!(err(&unknown).contains("size"), "{}", err(&unknown));
    }
}
