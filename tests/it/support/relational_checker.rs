//! The independent brute-force checker of relational releases, written from the definitions in
//! docs/architecture.md#definitions: it reads only the released CSV text and the original rows and
//! shares no code with the engine. Used by the engine's unit tests (`crates/engines/src/relational/tests.rs` includes
//! this file) and by the integration tests that check a release downloaded from the daemon
//! (`workbench::api`, `workbench::browser`). The includer brings `PrivacySpec`, `LDiversity` and
//! `Distance` (`crate::relational::models` or `cloakd::relational::models`) into scope.
use std::collections::{BTreeMap, HashMap};

use super::{Distance, LDiversity, PrivacySpec};

/// A quasi-identifier as the checker understands it.
#[derive(Debug, Clone)]
pub enum CheckQuasi {
    Numeric,
    /// leaf -> every label on its hierarchy line (the leaf itself first).
    Categorical(HashMap<String, Vec<String>>),
}

/// The original table, as strings.
#[derive(Debug, Clone)]
pub struct Original {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// (column index, kind) of each quasi-identifier.
    pub quasi: Vec<(usize, CheckQuasi)>,
    pub sensitive: usize,
    pub sensitive_numeric: bool,
    /// The column that identifies rows (an insensitive unique id), if any.
    pub id: Option<usize>,
}

impl Original {
    /// The table's sensitive multiset, the quasi-identifiers' names, the sensitive column's name.
    fn names(&self) -> (Multiset, Vec<&str>, &String) {
        (
            multiset(self.rows.iter().map(|r| &r[self.sensitive])),
            self.quasi
                .iter()
                .map(|(i, _)| self.header[*i].as_str())
                .collect(),
            &self.header[self.sensitive],
        )
    }
}

pub fn parse_csv(text: &[u8]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::ReaderBuilder::new().from_reader(text);
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

pub fn hierarchy_lines(text: &str) -> HashMap<String, Vec<String>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let labels: Vec<String> = l.split(';').map(|s| s.trim().to_string()).collect();
            (labels[0].clone(), labels)
        })
        .collect()
}

/// Whether a released QI value covers an original one.
fn covers(kind: &CheckQuasi, released: &str, original: &str) -> bool {
    if released == "*" {
        return true;
    }
    match kind {
        CheckQuasi::Numeric => {
            let v: f64 = original.parse().unwrap();
            if let Ok(x) = released.parse::<f64>() {
                return x == v;
            }
            let (lo, hi) = released.split_once('-').unwrap();
            lo.parse::<f64>().unwrap() <= v && v <= hi.parse::<f64>().unwrap()
        }
        CheckQuasi::Categorical(lines) => lines[original].iter().any(|l| l == released),
    }
}

/// Sensitive multiset of one class: value -> count.
pub type Multiset = BTreeMap<String, u64>;

fn distribution(m: &Multiset, domain: &[String]) -> Vec<f64> {
    let n: u64 = m.values().sum();
    domain
        .iter()
        .map(|v| *m.get(v).unwrap_or(&0) as f64 / n as f64)
        .collect()
}

/// Checks one class's multiset against the requested models; returns the violated model's name.
pub fn brute_violation(
    privacy: &PrivacySpec,
    class: &Multiset,
    table: &Multiset,
    numeric: bool,
) -> Option<&'static str> {
    let size: u64 = class.values().sum();
    let mut domain: Vec<String> = table.keys().cloned().collect();
    if numeric {
        domain.sort_by(|a, b| a.parse::<f64>().unwrap().total_cmp(&b.parse().unwrap()));
    }
    let p = distribution(class, &domain);
    let q = distribution(table, &domain);
    const EPS: f64 = 1e-9;
    if let Some(k) = privacy.k
        && size < k
    {
        return Some("k");
    }
    if let Some(l) = privacy.l {
        let mut counts: Vec<u64> = class.values().copied().filter(|&c| c > 0).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let ok = match l {
            LDiversity::Distinct(l) => counts.len() as f64 >= l,
            LDiversity::Entropy(l) => {
                let h: f64 = counts
                    .iter()
                    .map(|&c| {
                        let x = c as f64 / size as f64;
                        -x * x.ln()
                    })
                    .sum();
                h >= l.ln() - EPS
            }
            LDiversity::Probabilistic(l) => counts[0] as f64 / size as f64 <= 1.0 / l + EPS,
            LDiversity::Recursive { l, c } => {
                let tail: u64 = counts.iter().skip(l - 1).sum();
                (counts[0] as f64) < c * tail as f64
            }
        };
        if !ok {
            return Some("l");
        }
    }
    if let Some(t) = privacy.t {
        let d = match t.distance {
            Distance::Emd if numeric => {
                // Ordered EMD: minimal work moving mass between adjacent values, normalized.
                let mut work = 0.0;
                let mut carry = 0.0;
                for i in 0..domain.len() {
                    carry += p[i] - q[i];
                    work += f64::abs(carry);
                }
                if domain.len() > 1 {
                    work / (domain.len() - 1) as f64
                } else {
                    0.0
                }
            }
            Distance::Emd => p.iter().zip(&q).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0,
            Distance::Js => {
                let kl = |x: &[f64], y: &[f64]| -> f64 {
                    x.iter()
                        .zip(y)
                        .filter(|(a, _)| **a > 0.0)
                        .map(|(a, b)| a * (a / b).ln())
                        .sum()
                };
                let m: Vec<f64> = p.iter().zip(&q).map(|(a, b)| (a + b) / 2.0).collect();
                (kl(&p, &m) + kl(&q, &m)) / 2.0
            }
        };
        if d > t.t + EPS {
            return Some("t");
        }
    }
    if let Some(delta) = privacy.delta {
        for (i, &qi) in q.iter().enumerate() {
            if p[i] == 0.0 || (p[i] / qi).ln().abs() >= delta {
                return Some("delta");
            }
        }
    }
    None
}

pub fn multiset<'a>(values: impl IntoIterator<Item = &'a String>) -> Multiset {
    let mut m = Multiset::new();
    for v in values {
        *m.entry(v.clone()).or_default() += 1;
    }
    m
}

/// Checks a generalized release (its CSV text) against the original table and the requested models:
/// every row released with its own sensitive value (the column's multiset), every class within
/// every model. `strict` (Mondrian) also requires every original row to lie in exactly one released region.
/// Full-domain generalization with suppression (a class of `*`) and local recoding (classes at
/// different levels) release overlapping regions, so OLA and KACA are checked with `strict` false:
/// each released row still covers its own original row (by id), and every class satisfies every
/// model. Panics with the reason on any failure.
pub fn check_generalized_csv(
    original: &Original,
    privacy: &PrivacySpec,
    text: &[u8],
    strict: bool,
) {
    let (table_multiset, quasi_names, sensitive_name) = original.names();
    let (header, rows) = parse_csv(text);
    assert_eq!(rows.len(), original.rows.len(), "row count");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let qcols: Vec<usize> = quasi_names.iter().map(|n| col(n)).collect();
    let scol = col(sensitive_name);
    // Generalization recodes the quasi-identifiers only: every row keeps its sensitive value.
    assert_eq!(
        multiset(rows.iter().map(|r| &r[scol])),
        table_multiset,
        "the sensitive column's multiset"
    );
    // Classes = released rows grouped by their released QI values.
    let mut classes: BTreeMap<Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
    for row in &rows {
        let key = qcols.iter().map(|&c| row[c].clone()).collect();
        classes.entry(key).or_default().push(row);
    }
    for (key, members) in &classes {
        let m = multiset(members.iter().map(|r| &r[scol]));
        if let Some(model) =
            brute_violation(privacy, &m, &table_multiset, original.sensitive_numeric)
        {
            panic!("class {key:?} ({m:?}) violates {model}");
        }
    }
    if strict {
        // Every original row lies in exactly one released region, and the originals inside each
        // region carry exactly the class's sensitive values.
        let mut contained: BTreeMap<&Vec<String>, Vec<&String>> = BTreeMap::new();
        for row in &original.rows {
            let regions: Vec<&Vec<String>> = classes
                .keys()
                .filter(|key| {
                    original
                        .quasi
                        .iter()
                        .zip(key.iter())
                        .all(|((i, kind), released)| covers(kind, released, &row[*i]))
                })
                .collect();
            assert_eq!(
                regions.len(),
                1,
                "original row {row:?} lies in regions {regions:?}"
            );
            contained
                .entry(regions[0])
                .or_default()
                .push(&row[original.sensitive]);
        }
        for (key, members) in &classes {
            let released = multiset(members.iter().map(|r| &r[scol]));
            let inside = multiset(contained.get(key).cloned().unwrap_or_default());
            assert_eq!(released, inside, "region {key:?}");
        }
    }
    // With a row id, each released row covers its own original row.
    if let Some(id) = original.id {
        let idcol = col(&original.header[id]);
        let by_id: HashMap<&String, &Vec<String>> =
            original.rows.iter().map(|r| (&r[id], r)).collect();
        for row in &rows {
            let o = by_id[&row[idcol]];
            assert_eq!(row[scol], o[original.sensitive]);
            for ((i, kind), &c) in original.quasi.iter().zip(&qcols) {
                assert!(covers(kind, &row[c], &o[*i]), "{row:?} vs {o:?}");
            }
        }
    }
}

/// Checks a bucketized release (the QI table's and the sensitive table's CSV text) against the
/// original table and the requested models. Panics with the reason on any failure.
#[allow(
    dead_code,
    reason = "the engine's unit tests check bucketized releases; the integration tests don't"
)]
pub fn check_bucketized_csv(
    original: &Original,
    privacy: &PrivacySpec,
    quasi_csv: &[u8],
    sensitive_csv: &[u8],
) {
    let (table_multiset, quasi_names, sensitive_name) = original.names();
    let (header, rows) = parse_csv(quasi_csv);
    let (_, sens_rows) = parse_csv(sensitive_csv);
    assert_eq!(rows.len(), original.rows.len());
    assert!(
        !header.contains(sensitive_name),
        "QI table leaks the sensitive column"
    );
    let gcol = header.len() - 1;
    let mut sens: BTreeMap<String, Multiset> = BTreeMap::new();
    for r in &sens_rows {
        *sens
            .entry(r[0].clone())
            .or_default()
            .entry(r[1].clone())
            .or_default() += r[2].parse::<u64>().unwrap();
    }
    let mut groups: BTreeMap<String, Vec<&Vec<String>>> = BTreeMap::new();
    for row in &rows {
        groups.entry(row[gcol].clone()).or_default().push(row);
    }
    assert_eq!(groups.len(), sens.len(), "groups in both tables");
    // The QI table holds the exact QI values (multiset of QI tuples unchanged).
    let qcols: Vec<usize> = quasi_names
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let released_qis = multiset_of_tuples(
        rows.iter()
            .map(|r| qcols.iter().map(|&c| r[c].clone()).collect()),
    );
    let original_qis = multiset_of_tuples(
        original
            .rows
            .iter()
            .map(|r| original.quasi.iter().map(|(i, _)| r[*i].clone()).collect()),
    );
    assert_eq!(released_qis, original_qis, "exact QIs");
    for (g, members) in &groups {
        let m = &sens[g];
        assert_eq!(
            m.values().sum::<u64>(),
            members.len() as u64,
            "group {g} size"
        );
        if let Some(model) =
            brute_violation(privacy, m, &table_multiset, original.sensitive_numeric)
        {
            panic!("group {g} ({m:?}) violates {model}");
        }
        if let Some(id) = original.id {
            let idcol = header
                .iter()
                .position(|h| *h == original.header[id])
                .unwrap();
            let by_id: HashMap<&String, &Vec<String>> =
                original.rows.iter().map(|r| (&r[id], r)).collect();
            let truth = multiset(
                members
                    .iter()
                    .map(|r| &by_id[&r[idcol]][original.sensitive]),
            );
            assert_eq!(
                &truth, m,
                "group {g}: sensitive table differs from its rows"
            );
        }
    }
}

#[allow(dead_code, reason = "used by `check_bucketized_csv` only")]
pub fn multiset_of_tuples(tuples: impl Iterator<Item = Vec<String>>) -> BTreeMap<Vec<String>, u64> {
    let mut m = BTreeMap::new();
    for t in tuples {
        *m.entry(t).or_default() += 1;
    }
    m
}
