//! Tests of the whole relational pipeline against an independent brute-force checker (written from
//! the definitions in docs/architecture.md#definitions, reading only the released CSV text and the
//! original rows, sharing no code with the engine; it lives in
//! `tests/it/support/relational_checker.rs`, shared with the integration tests that check releases
//! downloaded from the daemon), over
//! proptest-generated tables and jobs; and golden tests on the worked examples (tables 1-4) of
//! Wiegand & Schallner, "Barriers to the implementation of k-anonymity".
use std::collections::BTreeMap;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::relational::anonymize;
use crate::relational::hierarchy::Hierarchy;
use crate::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
use crate::relational::release::{
    Formulas, Release, ReleaseMethod, ReleasedRole, ReleasedTable, write_csv, write_sensitive_csv,
};
use crate::relational::report::evaluate;
use crate::relational::table::{
    ColumnRole, ColumnSchema, QuasiKind, TableSchema, Unlisted, read_csv,
};

// ------------------------------------------------------------------------------------------------
// The brute-force checker
// ------------------------------------------------------------------------------------------------

#[path = "../../../../tests/it/support/relational_checker.rs"]
mod checker;
pub(super) use checker::{
    CheckQuasi, Multiset, Original, brute_violation, check_bucketized_csv, check_generalized_csv,
    hierarchy_lines, multiset, parse_csv,
};

/// Checks a release against the original table and the requested models (the CSV-level checker of
/// `tests/it/support/relational_checker.rs`, on the release's CSV text). Panics with the reason on
/// any failure.
pub(super) fn check_release(original: &Original, privacy: &PrivacySpec, release: &Release) {
    check_release_with(original, privacy, release, true)
}

/// [`check_release`]; `strict` as in [`check_generalized_csv`] (false for OLA and KACA).
pub(super) fn check_release_with(
    original: &Original,
    privacy: &PrivacySpec,
    release: &Release,
    strict: bool,
) {
    match release {
        Release::Generalized(table) => {
            let mut text = Vec::new();
            write_csv(table, Formulas::default(), &mut text).unwrap();
            check_generalized_csv(original, privacy, &text, strict);
        }
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => {
            let mut quasi = Vec::new();
            write_csv(quasi_table, Formulas::default(), &mut quasi).unwrap();
            let mut sensitive = Vec::new();
            write_sensitive_csv(sensitive_table, Formulas::default(), &mut sensitive).unwrap();
            check_bucketized_csv(original, privacy, &quasi, &sensitive);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Random tables and jobs
// ------------------------------------------------------------------------------------------------

pub(crate) struct Generated {
    pub(super) csv: String,
    pub(super) schema: TableSchema,
    pub(super) original: Original,
}

/// A random hierarchy over `leaves` leaves, `height` levels, nested groups of `branching`.
pub(super) fn random_hierarchy(
    column: usize,
    leaves: usize,
    height: usize,
    branching: usize,
) -> String {
    let mut text = String::new();
    for leaf in 0..leaves {
        let mut labels = vec![format!("c{column}v{leaf}")];
        for level in 1..height - 1 {
            labels.push(format!(
                "c{column}g{level}_{}",
                leaf / branching.pow(level as u32)
            ));
        }
        labels.push("*".to_string());
        text.push_str(&labels.join(";"));
        text.push('\n');
    }
    text
}

/// Draws one cell of a generated column.
type ValueGenerator = Box<dyn Fn(&mut ChaCha8Rng) -> String>;

pub(super) fn generate(seed: u64) -> Generated {
    generate_with(seed, 0.5)
}

/// A generated table whose quasi-identifiers all have hierarchies (for OLA and KACA).
pub(super) fn generate_categorical(seed: u64) -> Generated {
    generate_with(seed, 0.0)
}

fn generate_with(seed: u64, numeric_share: f64) -> Generated {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rows = rng.random_range(1..80);
    let quasi_count = rng.random_range(1..=3);
    let sensitive_values = rng.random_range(1..=6);
    let sensitive_numeric = rng.random_bool(0.3);
    let mut header = vec!["id".to_string()];
    let mut columns = vec![ColumnSchema::new("id", ColumnRole::Insensitive)];
    let mut quasi = Vec::new();
    let mut generators: Vec<ValueGenerator> = Vec::new();
    for q in 0..quasi_count {
        let name = format!("q{q}");
        header.push(name.clone());
        if rng.random_bool(numeric_share) {
            let spread = rng.random_range(1..40u32);
            let fractional = rng.random_bool(0.2);
            columns.push(ColumnSchema {
                name,
                role: ColumnRole::Quasi(QuasiKind::Numeric),
            });
            quasi.push((header.len() - 1, CheckQuasi::Numeric));
            generators.push(Box::new(move |r: &mut ChaCha8Rng| {
                let v = r.random_range(0..spread);
                if fractional {
                    format!("{v}.5")
                } else {
                    v.to_string()
                }
            }));
        } else {
            let leaves = rng.random_range(1..12);
            let height = rng.random_range(2..=4);
            let branching = rng.random_range(2..=3);
            let text = random_hierarchy(q, leaves, height, branching);
            columns.push(ColumnSchema {
                name,
                role: ColumnRole::Quasi(QuasiKind::Categorical(
                    Hierarchy::parse("h.csv", &text).unwrap(),
                )),
            });
            quasi.push((
                header.len() - 1,
                CheckQuasi::Categorical(hierarchy_lines(&text)),
            ));
            // Use a random subset of the leaves.
            let used = rng.random_range(1..=leaves);
            generators.push(Box::new(move |r: &mut ChaCha8Rng| {
                format!("c{q}v{}", r.random_range(0..used))
            }));
        }
    }
    header.push("s".into());
    columns.push(ColumnSchema::new(
        "s",
        ColumnRole::Sensitive {
            numeric: sensitive_numeric,
        },
    ));
    let sensitive = header.len() - 1;
    let skew = rng.random_bool(0.5);
    let mut table_rows = Vec::new();
    for row in 0..rows {
        let mut values = vec![format!("r{row}")];
        for g in &generators {
            values.push(g(&mut rng));
        }
        let s = if skew {
            rng.random_range(0..sensitive_values)
                .min(rng.random_range(0..sensitive_values))
        } else {
            rng.random_range(0..sensitive_values)
        };
        values.push(if sensitive_numeric {
            (s * 10).to_string()
        } else {
            format!("s{s}")
        });
        table_rows.push(values);
    }
    let mut csv = header.join(",");
    csv.push('\n');
    for r in &table_rows {
        csv.push_str(&r.join(","));
        csv.push('\n');
    }
    Generated {
        csv,
        schema: TableSchema {
            columns,
            unlisted: Unlisted::Drop,
        },
        original: Original {
            header,
            rows: table_rows,
            quasi,
            sensitive,
            sensitive_numeric,
            id: Some(0),
        },
    }
}

/// The release's classes as sensitive-value multisets, read from the released values alone: rows
/// grouped by their released QI values, or bucketization's groups with their sensitive entries.
pub(super) fn released_classes(release: &Release) -> Vec<Multiset> {
    let mut classes: BTreeMap<Vec<String>, Multiset> = BTreeMap::new();
    match release {
        Release::Generalized(t) => {
            let sensitive = t
                .columns
                .iter()
                .position(|c| matches!(c.role, ReleasedRole::Sensitive { .. }))
                .unwrap();
            for row in 0..t.rows {
                let key = t
                    .columns
                    .iter()
                    .filter(|c| c.role == ReleasedRole::Quasi)
                    .map(|c| c.value(row).to_string())
                    .collect();
                *classes
                    .entry(key)
                    .or_default()
                    .entry(t.columns[sensitive].value(row).to_string())
                    .or_default() += 1;
            }
        }
        Release::Bucketized {
            sensitive_table, ..
        } => {
            for e in &sensitive_table.entries {
                *classes
                    .entry(vec![e.group.to_string()])
                    .or_default()
                    .entry(e.value.clone())
                    .or_default() += e.count;
            }
        }
    }
    classes.into_values().collect()
}

pub(super) fn random_privacy(rng: &mut ChaCha8Rng) -> PrivacySpec {
    loop {
        let mut p = PrivacySpec::default();
        if rng.random_bool(0.6) {
            p.k = Some(rng.random_range(1..=6));
        }
        if rng.random_bool(0.4) {
            let l = rng.random_range(1..=4);
            p.l = Some(match rng.random_range(0..4) {
                0 => LDiversity::Distinct(l as f64),
                1 => LDiversity::Entropy(l as f64 * 0.8),
                2 => LDiversity::Probabilistic(l as f64),
                _ => LDiversity::Recursive {
                    l,
                    c: rng.random_range(1..=3) as f64,
                },
            });
        }
        if rng.random_bool(0.3) {
            p.t = Some(TCloseness {
                t: rng.random_range(0.05..1.0),
                distance: if rng.random_bool(0.5) {
                    Distance::Emd
                } else {
                    Distance::Js
                },
            });
        }
        if rng.random_bool(0.25) {
            p.delta = Some(rng.random_range(0.2..3.0));
        }
        if p.validate().is_ok() {
            return p;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Every release satisfies every requested model (checked from the released rows) and covers the
    /// original rows; the engine refuses only when the whole table violates a model.
    #[test]
    fn releases_satisfy_the_requested_models(seed in any::<u64>(), method in 0..3usize) {
        let generated = generate(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let privacy = random_privacy(&mut rng);
        let method = [ReleaseMethod::Generalization, ReleaseMethod::Bucketization, ReleaseMethod::Trivial][method];
        let table = read_csv(generated.schema, generated.csv.as_bytes(), "gen.csv", b',').unwrap();
        match anonymize(&table, &privacy, method, seed) {
            Ok((release, report)) => {
                check_release(&generated.original, &privacy, &release);
                prop_assert!(report.satisfied());
                prop_assert_eq!(report.rows as usize, generated.original.rows.len());
                // The report's class measures, recomputed from the released values.
                let classes = released_classes(&release);
                let size = |c: &Multiset| c.values().sum::<u64>();
                prop_assert_eq!(report.classes, classes.len() as u64);
                prop_assert_eq!(report.k, classes.iter().map(size).min().unwrap());
                prop_assert_eq!(
                    report.l_distinct,
                    classes.iter().map(|c| c.len() as u64).min().unwrap()
                );
                prop_assert_eq!(
                    report.discernibility,
                    classes.iter().map(|c| (size(c) * size(c)) as f64).sum::<f64>()
                );
                if method == ReleaseMethod::Trivial {
                    prop_assert_eq!(report.classes, 1);
                }
            }
            Err(e) => {
                let o = &generated.original;
                let whole = multiset(o.rows.iter().map(|r| &r[o.sensitive]));
                prop_assert!(
                    brute_violation(&privacy, &whole, &whole, o.sensitive_numeric).is_some(),
                    "engine refused a satisfiable job: {}", e
                );
            }
        }
    }
}

#[test]
fn same_seed_same_release_other_seed_other_order() {
    let generated = generate(42);
    let table = read_csv(generated.schema, generated.csv.as_bytes(), "g.csv", b',').unwrap();
    let privacy = PrivacySpec {
        k: Some(2),
        ..Default::default()
    };
    let text = |seed| {
        let (release, _) =
            anonymize(&table, &privacy, ReleaseMethod::Generalization, seed).unwrap();
        let Release::Generalized(t) = release else {
            panic!()
        };
        let mut out = Vec::new();
        write_csv(&t, Formulas::default(), &mut out).unwrap();
        out
    };
    assert_eq!(text(1), text(1));
    assert_ne!(text(1), text(2));
}

// ------------------------------------------------------------------------------------------------
// Golden tests: Wiegand & Schallner, tables 1-4
// ------------------------------------------------------------------------------------------------

/// A paper's table from CSV text with the given column roles (unlisted columns dropped).
pub(super) fn load(csv: &str, columns: Vec<(&str, ColumnRole)>) -> crate::relational::table::Table {
    let schema = TableSchema {
        columns: columns
            .into_iter()
            .map(|(name, role)| ColumnSchema {
                name: name.to_string(),
                role,
            })
            .collect(),
        unlisted: Unlisted::Drop,
    };
    read_csv(schema, csv.as_bytes(), "paper.csv", b',').unwrap()
}

fn run(
    csv: &str,
    columns: Vec<(&str, ColumnRole)>,
    privacy: PrivacySpec,
) -> BTreeMap<Vec<String>, Multiset> {
    let table = load(csv, columns);
    let (release, _) = anonymize(&table, &privacy, ReleaseMethod::Generalization, 1).unwrap();
    let Release::Generalized(t) = release else {
        panic!("generalization expected")
    };
    let sensitive = t
        .columns
        .iter()
        .position(|c| matches!(c.role, ReleasedRole::Sensitive { .. }))
        .unwrap();
    let mut classes: BTreeMap<Vec<String>, Multiset> = BTreeMap::new();
    for row in 0..t.rows {
        let key: Vec<String> = t
            .columns
            .iter()
            .filter(|c| c.role == ReleasedRole::Quasi)
            .map(|c| c.value(row).to_string())
            .collect();
        *classes
            .entry(key)
            .or_default()
            .entry(t.columns[sensitive].value(row).to_string())
            .or_default() += 1;
    }
    classes
}

pub(super) fn categorical(text: &str) -> ColumnRole {
    ColumnRole::Quasi(QuasiKind::Categorical(
        Hierarchy::parse("h.csv", text).unwrap(),
    ))
}

fn expected(classes: &[(&[&str], &[&str])]) -> BTreeMap<Vec<String>, Multiset> {
    classes
        .iter()
        .map(|(key, values)| {
            (
                key.iter().map(|s| s.to_string()).collect(),
                multiset(
                    values
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .iter(),
                ),
            )
        })
        .collect()
}

const TABLE_1: &str = "SSN,Age,Postcode,Problem
680-90-2665,25,4568,procrastination
008-07-4179,34,4567,stress
391-05-7998,48,4569,stomach cancer
078-36-3853,39,4568,obesity
411-71-9290,42,4561,stomach ulcers
527-59-1948,27,4568,stress
";
const AGE_DECADES: &str = "25;2*;*\n27;2*;*\n34;3*;*\n39;3*;*\n42;4*;*\n48;4*;*\n";
const POSTCODE: &str = "4561;456*;*\n4567;456*;*\n4568;456*;*\n4569;456*;*\n";

/// Table 1 -> 2-anonymous with decade hierarchies: the partition of the paper's Table 2 (2*, 3*, 4*),
/// but Mondrian recodes locally, so the 2* class keeps its common postcode 4568 instead of 456*.
#[test]
fn golden_table_1_decades_k2() {
    let classes = run(
        TABLE_1,
        vec![
            ("SSN", ColumnRole::Identifier),
            ("Age", categorical(AGE_DECADES)),
            ("Postcode", categorical(POSTCODE)),
            ("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        PrivacySpec {
            k: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(
        classes,
        expected(&[
            (&["2*", "4568"], &["procrastination", "stress"]),
            (&["3*", "456*"], &["stress", "obesity"]),
            (&["4*", "456*"], &["stomach cancer", "stomach ulcers"]),
        ])
    );
}

/// Table 1 with a numeric age: ages and postcodes both span their whole range (tie -> Age first);
/// the median cut at 34 gives two classes of 3 that neither attribute can split further for k = 2.
#[test]
fn golden_table_1_numeric_age_k2() {
    let classes = run(
        TABLE_1,
        vec![
            ("SSN", ColumnRole::Identifier),
            ("Age", ColumnRole::Quasi(QuasiKind::Numeric)),
            ("Postcode", categorical(POSTCODE)),
            ("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        PrivacySpec {
            k: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(
        classes,
        expected(&[
            (&["25-34", "456*"], &["procrastination", "stress", "stress"]),
            (
                &["39-48", "456*"],
                &["obesity", "stomach ulcers", "stomach cancer"]
            ),
        ])
    );
}

/// The paper's Table 2 as a published release: 2-anonymous, but its 2* class is homogeneous.
#[test]
fn golden_table_2_report() {
    let rows: Vec<Vec<&str>> = vec![
        vec!["2*", "456*", "stress"],
        vec!["3*", "456*", "stress"],
        vec!["4*", "456*", "stomach cancer"],
        vec!["3*", "456*", "obesity"],
        vec!["4*", "456*", "stomach ulcers"],
        vec!["2*", "456*", "stress"],
    ];
    let table = ReleasedTable::from_rows(
        &["Age", "Postcode", "Problem"],
        &[
            ReleasedRole::Quasi,
            ReleasedRole::Quasi,
            ReleasedRole::Sensitive { numeric: false },
        ],
        &rows,
    );
    let models = PrivacySpec {
        k: Some(2),
        l: Some(LDiversity::Distinct(2.0)),
        ..Default::default()
    }
    .models();
    let report = evaluate(&Release::Generalized(table), "paper", &models).unwrap();
    assert_eq!((report.rows, report.classes, report.k), (6, 3, 2));
    assert_eq!(report.l_distinct, 1);
    assert_eq!(report.models[0].violating_classes, 0);
    assert_eq!(report.models[1].violating_classes, 1);
    assert_eq!(report.discernibility, 12.0);
}

const TABLE_3A: &str = "Birthday,Gender,Problem
13.08.1962,male,stress
28.10.1967,male,obesity
20.01.1977,male,stress
15.09.1973,female,obesity
15.03.1985,female,stress
28.05.1986,female,obesity
";
/// Birthday hierarchy {D/M/Y, M/Y, Y, 10Y, C/T/G/P, *} of the paper (everyone is a grown-up).
const BIRTHDAY: &str = "13.08.1962;08.1962;1962;196*;Grownup;*
28.10.1967;10.1967;1967;196*;Grownup;*
20.01.1977;01.1977;1977;197*;Grownup;*
15.09.1973;09.1973;1973;197*;Grownup;*
15.03.1985;03.1985;1985;198*;Grownup;*
28.05.1986;05.1986;1986;198*;Grownup;*
";
const GENDER: &str = "male;*\nfemale;*\n";

/// Table 3a with k = 2 gives the partition of the paper's domain generalization (Table 3c: decades),
/// keeping the gender where a class has only one.
#[test]
fn golden_table_3_birthday_first() {
    let classes = run(
        TABLE_3A,
        vec![
            ("Birthday", categorical(BIRTHDAY)),
            ("Gender", categorical(GENDER)),
            ("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        PrivacySpec {
            k: Some(2),
            l: Some(LDiversity::Distinct(2.0)),
            ..Default::default()
        },
    );
    assert_eq!(
        classes,
        expected(&[
            (&["196*", "male"], &["stress", "obesity"]),
            (&["197*", "*"], &["stress", "obesity"]),
            (&["198*", "female"], &["stress", "obesity"]),
        ])
    );
}

/// With gender first (tie on the normalized width), the first cut is by gender, and no birthday cut
/// of either half leaves 2 records on each side.
#[test]
fn golden_table_3_gender_first() {
    let csv = "Gender,Birthday,Problem\nmale,13.08.1962,stress\nmale,28.10.1967,obesity\nmale,20.01.1977,stress\nfemale,15.09.1973,obesity\nfemale,15.03.1985,stress\nfemale,28.05.1986,obesity\n";
    let classes = run(
        csv,
        vec![
            ("Gender", categorical(GENDER)),
            ("Birthday", categorical(BIRTHDAY)),
            ("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        PrivacySpec {
            k: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(
        classes,
        expected(&[
            (&["male", "Grownup"], &["stress", "obesity", "stress"]),
            (&["female", "Grownup"], &["obesity", "stress", "obesity"]),
        ])
    );
}

/// Tables 3b (local recoding) and 3c (domain generalization) as published releases: 3b leaves four
/// unique records (k = 1), 3c is 2-anonymous and 2-diverse.
#[test]
fn golden_table_3_reports() {
    let roles = [
        ReleasedRole::Quasi,
        ReleasedRole::Quasi,
        ReleasedRole::Sensitive { numeric: false },
    ];
    let b: Vec<Vec<&str>> = vec![
        vec!["male", "13.08.1962", "stress"],
        vec!["male", "28.10.1967", "obesity"],
        vec!["*", "197*", "stress"],
        vec!["*", "197*", "obesity"],
        vec!["female", "15.03.1985", "stress"],
        vec!["female", "28.05.1986", "obesity"],
    ];
    let c: Vec<Vec<&str>> = vec![
        vec!["*", "196*", "stress"],
        vec!["*", "196*", "obesity"],
        vec!["*", "197*", "stress"],
        vec!["*", "197*", "obesity"],
        vec!["*", "198*", "stress"],
        vec!["*", "198*", "obesity"],
    ];
    let models = PrivacySpec {
        k: Some(2),
        ..Default::default()
    }
    .models();
    let header = ["Gender", "Birthday", "Problem"];
    let rb = evaluate(
        &Release::Generalized(ReleasedTable::from_rows(&header, &roles, &b)),
        "3b",
        &models,
    )
    .unwrap();
    assert_eq!((rb.classes, rb.k), (5, 1));
    assert_eq!(rb.models[0].violating_classes, 4);
    let rc = evaluate(
        &Release::Generalized(ReleasedTable::from_rows(&header, &roles, &c)),
        "3c",
        &models,
    )
    .unwrap();
    assert_eq!((rc.classes, rc.k, rc.l_distinct), (3, 2, 2));
    assert!(
        (rc.t_emd).abs() < 1e-12,
        "each class has the table's distribution"
    );
    assert_eq!(rc.delta, Some(0.0));
}

pub(super) const TABLE_4: &str = "Nationality,Age,ZIP,Problem
American,42,02135,Viral Infect
Japanese,41,02133,Hearth disease
Germany,38,02238,Hearth disease
Japanese,29,02139,Fever
Indina,37,02232,Viral Infection
Native-american,34,02236,Cancer
Russia,53,02138,Viral Infection
China,23,02139,Cancer
American,23,02141,Short of breath
Indian,46,02139,Viral Infection
American,31,02239,Vomiting
American,28,02130,Viral Infection
";
pub(super) const ZIP: &str = "02135;0213*;021**;*
02133;0213*;021**;*
02139;0213*;021**;*
02138;0213*;021**;*
02130;0213*;021**;*
02141;0214*;021**;*
02238;0223*;022**;*
02232;0223*;022**;*
02236;0223*;022**;*
02239;0223*;022**;*
";

/// The paper's Table 4 (right) as published (Nationality `*` left out), transcribed with its typos.
pub(super) fn table_4_published() -> Vec<Vec<&'static str>> {
    vec![
        vec![">= 40", "021**", "Viral Infect"],
        vec![">= 40", "021**", "Hearth disease"],
        vec!["3*", "0223*", "Cancer"],
        vec!["<= 30", "021**", "Fever"],
        vec!["3*", "0223*", "Cancer"],
        vec!["3*", "0223*", "Cancer"],
        vec![">= 40", "021**", "Viral Infection"],
        vec!["<= 30", "021**", "Cancer"],
        vec!["<= 30", "021**", "Short of breath"],
        vec![">= 40", "021**", "Viral Infection"],
        vec!["3*", "0223*", "Cancer"],
        vec!["<= 30", "021**", "Viral Infection"],
    ]
}

/// The paper's Table 4 (right) as published: 4-anonymous, yet the 3* class is all Cancer — the
/// homogeneity attack; the report shows l_distinct = 1 and distinct 2-diversity flags that class.
#[test]
fn golden_table_4_homogeneity_report() {
    let published = table_4_published();
    let models = PrivacySpec {
        k: Some(4),
        l: Some(LDiversity::Distinct(2.0)),
        ..Default::default()
    }
    .models();
    let report = evaluate(
        &Release::Generalized(ReleasedTable::from_rows(
            &["Age", "ZIP", "Problem"],
            &[
                ReleasedRole::Quasi,
                ReleasedRole::Quasi,
                ReleasedRole::Sensitive { numeric: false },
            ],
            &published,
        )),
        "table 4",
        &models,
    )
    .unwrap();
    assert_eq!((report.classes, report.k, report.l_distinct), (3, 4, 1));
    assert_eq!(report.models[1].violating_classes, 1);
    assert_eq!(report.delta, None, "a class lacks a value of the table");
}

/// Table 4 (left) with k = 4 over Age and ZIP (nationality suppressed as in the paper): the median
/// age cut (34) gives two halves of 6; in each, the ZIP cut (021** / 022**) leaves 2 on one side and
/// the age cut leaves 3, so both halves are final.
#[test]
fn golden_table_4_k4() {
    let classes = run(
        TABLE_4,
        vec![
            ("Nationality", ColumnRole::Identifier),
            ("Age", ColumnRole::Quasi(QuasiKind::Numeric)),
            ("ZIP", categorical(ZIP)),
            ("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        PrivacySpec {
            k: Some(4),
            l: Some(LDiversity::Distinct(3.0)),
            ..Default::default()
        },
    );
    assert_eq!(
        classes,
        expected(&[
            (
                &["23-34", "*"],
                &[
                    "Cancer",
                    "Short of breath",
                    "Viral Infection",
                    "Fever",
                    "Vomiting",
                    "Cancer"
                ]
            ),
            (
                &["37-53", "*"],
                &[
                    "Viral Infection",
                    "Hearth disease",
                    "Hearth disease",
                    "Viral Infect",
                    "Viral Infection",
                    "Viral Infection"
                ]
            ),
        ])
    );
}

/// A model the whole table cannot meet is refused with the reason.
#[test]
fn unsatisfiable_models_are_refused_with_the_reason() {
    let schema = TableSchema {
        columns: vec![
            ColumnSchema::new("SSN", ColumnRole::Identifier),
            ColumnSchema::new("Age", ColumnRole::Quasi(QuasiKind::Numeric)),
            ColumnSchema::new("Problem", ColumnRole::Sensitive { numeric: false }),
        ],
        unlisted: Unlisted::Drop,
    };
    let table = read_csv(schema, TABLE_1.as_bytes(), "t1.csv", b',').unwrap();
    let too_big = PrivacySpec {
        k: Some(7),
        ..Default::default()
    };
    let err = anonymize(&table, &too_big, ReleaseMethod::Generalization, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("k-anonymity (k=7) cannot be met") && err.contains("6 records"),
        "{err}"
    );
    let too_diverse = PrivacySpec {
        l: Some(LDiversity::Distinct(6.0)),
        ..Default::default()
    };
    let err = anonymize(&table, &too_diverse, ReleaseMethod::Trivial, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("5 distinct sensitive values < l=6"), "{err}");
}

/// A raised cancellation flag stops the work with a typed error and releases nothing, whatever the
/// method; a flag nobody raises gives exactly the uncancellable release.
#[test]
fn a_cancelled_job_releases_nothing() {
    use std::sync::atomic::AtomicBool;

    use crate::relational::{AnonymizeError, anonymize_unless, mondrian};

    let generated = generate(7);
    let table = read_csv(generated.schema, generated.csv.as_bytes(), "g.csv", b',').unwrap();
    let privacy = PrivacySpec {
        k: Some(1),
        ..Default::default()
    };
    let raised = AtomicBool::new(true);
    for method in [
        ReleaseMethod::Generalization,
        ReleaseMethod::Bucketization,
        ReleaseMethod::Trivial,
    ] {
        assert_eq!(
            anonymize_unless(&table, &privacy, method, 1, &raised).unwrap_err(),
            AnonymizeError::Cancelled,
            "{method}"
        );
        let lowered = AtomicBool::new(false);
        let (release, report) = anonymize_unless(&table, &privacy, method, 1, &lowered).unwrap();
        let (expected, expected_report) = anonymize(&table, &privacy, method, 1).unwrap();
        assert_eq!(report, expected_report);
        let csv = |r: &Release| {
            let (Release::Generalized(t) | Release::Bucketized { quasi_table: t, .. }) = r;
            let mut out = Vec::new();
            write_csv(t, Formulas::default(), &mut out).unwrap();
            out
        };
        assert_eq!(csv(&release), csv(&expected));
    }
    assert_eq!(
        mondrian::partition_unless(&table, &privacy.models(), &raised).unwrap_err(),
        mondrian::PartitionError::Cancelled
    );
}
