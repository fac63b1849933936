//! The report of a release, computed from the released rows themselves (not from the algorithm's
//! bookkeeping): equivalence classes are re-formed by grouping released rows on their released QI
//! values (generalization, trivial) or on the group id, with each group's sensitive values taken from
//! the sensitive table (bucketization). Measures as in docs/architecture.md#definitions: achieved k,
//! distinct / entropy /
//! probabilistic l, t under EMD and JS divergence, delta of delta-disclosure, discernibility
//! (Σ |class|²), average class size and the class size histogram; per requested model, how many
//! released classes violate it; and how far the barriers paper's attacks get ([`attacks`]).
//!
//! Invariants: Q is the sensitive distribution of the whole released table; a numeric sensitive
//! attribute's values are ordered by number for the ordered EMD; `delta` is `None` (JSON null) when
//! some class lacks a value of the table (unbounded delta). `seconds` is filled in by the caller (the
//! engine has no clock). Class histograms are kept sparse, so memory is O(rows + domain) however many
//! classes and distinct sensitive values there are.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::relational::attacks::{Attacks, ClassAttacks};
use crate::relational::distortion::Distortion;
use crate::relational::models::{ClassCounts, ModelSet, SensitiveDistribution};
use crate::relational::release::{Release, ReleasedRole, ReleasedTable, SensitiveTable};

/// How many classes have a given size.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClassSizeCount {
    pub size: u64,
    pub classes: u64,
}

/// One requested model, checked on the released classes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelCheck {
    pub model: String,
    pub violating_classes: u64,
}

/// The report of one release.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub release: String,
    pub rows: u64,
    pub classes: u64,
    pub k: u64,
    pub l_distinct: u64,
    pub l_entropy: f64,
    pub l_probabilistic: f64,
    pub t_emd: f64,
    pub t_js: f64,
    pub delta: Option<f64>,
    pub discernibility: f64,
    pub avg_class_size: f64,
    pub class_sizes: Vec<ClassSizeCount>,
    pub models: Vec<ModelCheck>,
    /// The homogeneity, background-knowledge and unsorted-matching attacks ([`attacks`]).
    pub attacks: Attacks,
    pub seconds: f64,
    /// The algorithm that formed the classes (mondrian, kaca, ola); set by the engine.
    pub algorithm: String,
    /// Distortion against the original table (set by the engine, which knows the original rows;
    /// `None` for a release read back without them).
    pub distortion: Option<Distortion>,
    /// OLA's search: the chosen node and how much of the lattice was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lattice: Option<LatticeSearch>,
}

/// What OLA's search did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatticeSearch {
    pub metric: String,
    pub max_suppression: f64,
    /// The chosen node: a hierarchy level per quasi-identifier, in column order.
    pub levels: Vec<usize>,
    pub loss: f64,
    pub lattice_size: u64,
    pub nodes_checked: u64,
}

impl Report {
    /// Whether every requested model holds on every released class.
    pub fn satisfied(&self) -> bool {
        self.models.iter().all(|m| m.violating_classes == 0)
    }
}

/// The release is not internally consistent (a hand-edited or truncated release).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    #[error("release has no sensitive column")]
    NoSensitive,
    #[error("release has no group column")]
    NoGroup,
    #[error("release is empty")]
    Empty,
    #[error(
        "group {group}: {rows} rows in the QI table but {counted} sensitive values in the sensitive table"
    )]
    GroupMismatch {
        group: String,
        rows: u64,
        counted: u64,
    },
}

/// Sorted domain positions of a released sensitive dictionary.
fn sorted_positions(dictionary: &[String], numeric: bool) -> Vec<u32> {
    let mut order: Vec<usize> = (0..dictionary.len()).collect();
    if numeric {
        let key = |s: &str| s.trim().parse::<f64>().unwrap_or(f64::NAN);
        order.sort_by(|&a, &b| {
            key(&dictionary[a])
                .total_cmp(&key(&dictionary[b]))
                .then_with(|| dictionary[a].cmp(&dictionary[b]))
        });
    } else {
        order.sort_by(|&a, &b| dictionary[a].cmp(&dictionary[b]));
    }
    let mut position = vec![0u32; dictionary.len()];
    for (p, &i) in order.iter().enumerate() {
        position[i] = p as u32;
    }
    position
}

/// Classes as size + sensitive histograms over the sorted domain, kept sparse: class `c`'s non-zero
/// counts are `cells[offsets[c]..offsets[c + 1]]` as (domain position, count), positions ascending.
/// Memory is O(rows + domain), whatever the number of classes times the domain (a dense classes ×
/// domain array would take gigabytes for a large table with many distinct sensitive values).
struct Classes {
    sizes: Vec<u64>,
    offsets: Vec<usize>,
    cells: Vec<(u32, u32)>,
    domain: usize,
    numeric: bool,
}

impl Classes {
    /// Classes from (class, domain position, count) triples in any order; `sizes` must already hold
    /// every class.
    fn from_triples(
        sizes: Vec<u64>,
        mut triples: Vec<(u32, u32, u32)>,
        domain: usize,
        numeric: bool,
    ) -> Classes {
        triples.sort_unstable_by_key(|&(c, s, _)| (c, s));
        let mut offsets = Vec::with_capacity(sizes.len() + 1);
        let mut cells: Vec<(u32, u32)> = Vec::with_capacity(triples.len());
        let mut next = 0;
        for c in 0..sizes.len() as u32 {
            offsets.push(cells.len());
            let mut last: Option<u32> = None;
            while let Some(&(tc, s, count)) = triples.get(next) {
                if tc != c {
                    break;
                }
                match (last, cells.last_mut()) {
                    (Some(l), Some(cell)) if l == s => cell.1 += count,
                    _ => cells.push((s, count)),
                }
                last = Some(s);
                next += 1;
            }
        }
        offsets.push(cells.len());
        Classes {
            sizes,
            offsets,
            cells,
            domain,
            numeric,
        }
    }

    /// The non-zero (domain position, count) cells of class `c`.
    fn cells(&self, c: usize) -> &[(u32, u32)] {
        &self.cells[self.offsets[c]..self.offsets[c + 1]]
    }
}

fn classes_of_generalized(table: &ReleasedTable) -> Result<Classes, ReportError> {
    let sensitive = table
        .columns
        .iter()
        .find(|c| matches!(c.role, ReleasedRole::Sensitive { .. }))
        .ok_or(ReportError::NoSensitive)?;
    let numeric = matches!(sensitive.role, ReleasedRole::Sensitive { numeric: true });
    let position = sorted_positions(&sensitive.dictionary, numeric);
    let quasi: Vec<&[u32]> = table
        .columns
        .iter()
        .filter(|c| c.role == ReleasedRole::Quasi)
        .map(|c| c.codes.as_slice())
        .collect();
    let m = sensitive.dictionary.len();
    let mut sizes: Vec<u64> = Vec::new();
    let mut triples: Vec<(u32, u32, u32)> = Vec::with_capacity(table.rows);
    let mut add = |class: usize, row: usize, sizes: &mut Vec<u64>| {
        if class == sizes.len() {
            sizes.push(0);
        }
        sizes[class] += 1;
        triples.push((class as u32, position[sensitive.codes[row] as usize], 1));
    };
    // The released QI tuple as one mixed-radix number when it fits in 64 bits, else as a vector.
    let radices: Option<Vec<u64>> = table
        .columns
        .iter()
        .filter(|c| c.role == ReleasedRole::Quasi)
        .try_fold((Vec::new(), 1u64), |(mut radices, product), c| {
            radices.push(product);
            product
                .checked_mul(c.dictionary.len().max(1) as u64)
                .map(|p| (radices, p))
        })
        .map(|(radices, _)| radices);
    if let Some(radices) = radices {
        let mut class_of_key: HashMap<u64, usize> = HashMap::new();
        for row in 0..table.rows {
            let key: u64 = quasi
                .iter()
                .zip(&radices)
                .map(|(codes, radix)| codes[row] as u64 * radix)
                .sum();
            let next = class_of_key.len();
            let class = *class_of_key.entry(key).or_insert(next);
            add(class, row, &mut sizes);
        }
    } else {
        let mut class_of_key: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut key = Vec::with_capacity(quasi.len());
        for row in 0..table.rows {
            key.clear();
            key.extend(quasi.iter().map(|codes| codes[row]));
            let class = match class_of_key.get(key.as_slice()) {
                Some(&c) => c,
                None => {
                    let c = class_of_key.len();
                    class_of_key.insert(key.clone(), c);
                    c
                }
            };
            add(class, row, &mut sizes);
        }
    }
    Ok(Classes::from_triples(sizes, triples, m, numeric))
}

fn classes_of_bucketized(
    quasi_table: &ReleasedTable,
    sensitive_table: &SensitiveTable,
) -> Result<Classes, ReportError> {
    let group = quasi_table
        .columns
        .iter()
        .find(|c| c.role == ReleasedRole::Group)
        .ok_or(ReportError::NoGroup)?;
    let mut class_of_group: HashMap<&str, usize> = HashMap::new();
    let mut sizes: Vec<u64> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for row in 0..quasi_table.rows {
        let g = group.value(row);
        let c = *class_of_group.entry(g).or_insert_with(|| {
            sizes.push(0);
            names.push(g);
            sizes.len() - 1
        });
        sizes[c] += 1;
    }
    let mut dictionary: Vec<String> = sensitive_table
        .entries
        .iter()
        .map(|e| e.value.clone())
        .collect();
    dictionary.sort();
    dictionary.dedup();
    let position = sorted_positions(&dictionary, sensitive_table.numeric);
    let index: HashMap<&str, usize> = dictionary
        .iter()
        .enumerate()
        .map(|(i, v)| (v.as_str(), i))
        .collect();
    let m = dictionary.len();
    let mut triples: Vec<(u32, u32, u32)> = Vec::with_capacity(sensitive_table.entries.len());
    let mut counted = vec![0u64; sizes.len()];
    for e in &sensitive_table.entries {
        let g = e.group.to_string();
        let c = match class_of_group.get(g.as_str()) {
            Some(&c) => c,
            None => {
                return Err(ReportError::GroupMismatch {
                    group: g,
                    rows: 0,
                    counted: e.count,
                });
            }
        };
        let s = position[index[e.value.as_str()]];
        triples.push((c as u32, s, e.count as u32));
        counted[c] += e.count;
    }
    for (c, (&rows, &counted)) in sizes.iter().zip(&counted).enumerate() {
        if rows != counted {
            return Err(ReportError::GroupMismatch {
                group: names[c].to_string(),
                rows,
                counted,
            });
        }
    }
    Ok(Classes::from_triples(
        sizes,
        triples,
        m,
        sensitive_table.numeric,
    ))
}

/// Computes the report of a release from its rows; `release_name` labels it, `models` are the
/// requested models to check.
pub fn evaluate(
    release: &Release,
    release_name: &str,
    models: &ModelSet,
) -> Result<Report, ReportError> {
    Ok(
        evaluate_unless(release, release_name, models, &AtomicBool::new(false))?
            .expect("a report that cannot be cancelled completes"),
    )
}

/// [`evaluate`], giving up (`Ok(None)`) soon after `cancelled` turns true (it is looked at before
/// each class: measuring a class is a pass over the sensitive domain).
pub fn evaluate_unless(
    release: &Release,
    release_name: &str,
    models: &ModelSet,
    cancelled: &AtomicBool,
) -> Result<Option<Report>, ReportError> {
    let classes = match release {
        Release::Generalized(table) => classes_of_generalized(table)?,
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => classes_of_bucketized(quasi_table, sensitive_table)?,
    };
    if classes.sizes.is_empty() {
        return Err(ReportError::Empty);
    }
    let m = classes.domain;
    let mut totals = vec![0u64; m];
    for &(s, count) in &classes.cells {
        totals[s as usize] += u64::from(count);
    }
    let distribution = SensitiveDistribution::from_counts(totals, classes.numeric);
    let rows: u64 = classes.sizes.iter().sum();
    let mut attacked = ClassAttacks::default();
    let mut report = Report {
        release: release_name.to_string(),
        rows,
        classes: classes.sizes.len() as u64,
        k: u64::MAX,
        l_distinct: u64::MAX,
        l_entropy: f64::INFINITY,
        l_probabilistic: f64::INFINITY,
        t_emd: 0.0,
        t_js: 0.0,
        delta: Some(0.0),
        discernibility: 0.0,
        avg_class_size: rows as f64 / classes.sizes.len() as f64,
        class_sizes: Vec::new(),
        models: models
            .names()
            .into_iter()
            .map(|model| ModelCheck {
                model,
                violating_classes: 0,
            })
            .collect(),
        attacks: Attacks::default(),
        seconds: 0.0,
        algorithm: String::new(),
        distortion: None,
        lattice: None,
    };
    let mut histogram: BTreeMap<u64, u64> = BTreeMap::new();
    // One dense histogram, filled from a class's cells and cleared after it.
    let mut counts = vec![0u32; m];
    for (c, &size) in classes.sizes.iter().enumerate() {
        if cancelled.load(Ordering::Relaxed) {
            return Ok(None);
        }
        for &(s, count) in classes.cells(c) {
            counts[s as usize] = count;
        }
        let class = ClassCounts {
            size,
            counts: &counts,
        };
        report.k = report.k.min(size);
        report.l_distinct = report.l_distinct.min(class.distinct() as u64);
        report.l_entropy = report.l_entropy.min(class.entropy().exp());
        report.l_probabilistic = report
            .l_probabilistic
            .min(size as f64 / class.max_count().max(1) as f64);
        report.t_emd = report.t_emd.max(class.emd(&distribution));
        report.t_js = report.t_js.max(class.js(&distribution));
        let delta = class.delta(&distribution);
        report.delta = match report.delta {
            Some(d) if delta.is_finite() => Some(d.max(delta)),
            _ => None,
        };
        report.discernibility += (size as f64) * (size as f64);
        *histogram.entry(size).or_default() += 1;
        attacked.add(classes.cells(c).iter().map(|&(_, count)| u64::from(count)));
        for (check, model) in report.models.iter_mut().zip(&models.models) {
            if !model.admits(&class, &distribution) {
                check.violating_classes += 1;
            }
        }
        for &(s, _) in classes.cells(c) {
            counts[s as usize] = 0;
        }
    }
    report.class_sizes = histogram
        .into_iter()
        .map(|(size, classes)| ClassSizeCount { size, classes })
        .collect();
    let (homogeneity, background_knowledge) =
        attacked.finish(&distribution.probabilities, report.delta);
    report.attacks.homogeneity = homogeneity;
    report.attacks.background_knowledge = background_knowledge;
    Ok(Some(report))
}
