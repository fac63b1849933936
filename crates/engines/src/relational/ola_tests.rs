//! OLA against an independent exhaustive checker: every node of the lattice is released row by row
//! (no distinct-tuple grouping, no packed keys, no tagging, no bounds), its violating classes
//! suppressed, its anonymity decided from the definition and its loss measured by
//! [`crate::relational::distortion`] on the recoding; OLA's node must be anonymous and of the minimum
//! loss over all anonymous nodes, for every metric, on random tables and on Adult attributes. Every
//! OLA release also passes the brute-force model checker of the pipeline tests.
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::AtomicBool;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::relational::distortion::distortion;
use crate::relational::hierarchy::{Hierarchy, NodeId};
use crate::relational::models::{
    ClassCounts, LDiversity, PrivacySpec, RiskBounds, UniquenessBound, UniquenessModel,
};
use crate::relational::ola::{Metric, OlaError, ola};
use crate::relational::population::{Estimate, Histogram, population_uniqueness};
use crate::relational::recoding::{Cell, Recoding};
use crate::relational::release::ReleaseMethod;
use crate::relational::table::{
    ColumnRole, ColumnSchema, QuasiAttribute, QuasiKind, Table, TableSchema, Unlisted, read_csv,
};
use crate::relational::tests::{random_hierarchy, random_privacy};
use crate::relational::{Algorithm, AlgorithmOptions, anonymize_with};

/// The minimum loss over every anonymous node, by brute force: (loss, node) or None.
fn exhaustive(
    table: &Table,
    privacy: &PrivacySpec,
    metric: Metric,
    max_suppression: f64,
) -> Option<(f64, Vec<usize>)> {
    let hierarchies: Vec<&Hierarchy> = table
        .quasi
        .iter()
        .map(|q| match &q.attribute {
            QuasiAttribute::Categorical(h) => h,
            QuasiAttribute::Numeric(_) => panic!("numeric"),
        })
        .collect();
    let n = table.rows();
    let models = privacy.models();
    let q_all = table.sensitive_distribution();
    let m = table.sensitive.domain.len();
    let allowed = (max_suppression * n as f64 + 1e-9).floor() as usize;
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut node = vec![0usize; hierarchies.len()];
    loop {
        // Release every row at `node`, group rows by released nodes.
        let mut classes: BTreeMap<Vec<NodeId>, Vec<usize>> = BTreeMap::new();
        for r in 0..n {
            let key = hierarchies
                .iter()
                .enumerate()
                .map(|(q, h)| h.ancestor(table.quasi[q].codes[r], node[q]))
                .collect();
            classes.entry(key).or_default().push(r);
        }
        let histogram = |rows: &[usize]| {
            let mut counts = vec![0u32; m];
            for &r in rows {
                counts[table.sensitive.codes[r] as usize] += 1;
            }
            counts
        };
        let mut suppressed_rows = Vec::new();
        for rows in classes.values() {
            let counts = histogram(rows);
            let class = ClassCounts {
                size: rows.len() as u64,
                counts: &counts,
            };
            if !models.admits(&class, &q_all) {
                suppressed_rows.extend_from_slice(rows);
            }
        }
        let union = histogram(&suppressed_rows);
        // The risk bounds, from the definitions: on the kept classes only.
        let kept: Vec<u64> = classes
            .values()
            .filter(|rows| !rows.iter().any(|r| suppressed_rows.contains(r)))
            .map(|rows| rows.len() as u64)
            .collect();
        let kept_records: u64 = kept.iter().sum();
        let highest_ok = privacy
            .risk
            .highest
            .is_none_or(|r| kept.iter().all(|&s| 1.0 / s as f64 <= r + 1e-9));
        let average_ok = privacy.risk.average.is_none_or(|a| {
            kept_records == 0 || kept.len() as f64 / kept_records as f64 <= a + 1e-9
        });
        let uniqueness_ok = privacy.risk.population_uniqueness.is_none_or(|u| {
            if kept_records == 0 {
                return true;
            }
            if u.population < kept_records as f64 {
                return false;
            }
            let all = population_uniqueness(&Histogram::from_sizes(kept.clone()), u.population);
            let estimate = match u.model {
                UniquenessModel::Pitman => all.pitman,
                UniquenessModel::Zayatz => all.zayatz,
                UniquenessModel::Snb => all.snb,
                UniquenessModel::Dankar => all.dankar.estimate,
            };
            matches!(estimate, Estimate::Estimated { share, .. } if share <= u.max + 1e-9)
        });
        let anonymous = highest_ok
            && average_ok
            && uniqueness_ok
            && suppressed_rows.len() <= allowed
            && (suppressed_rows.is_empty()
                || models.admits(
                    &ClassCounts {
                        size: suppressed_rows.len() as u64,
                        counts: &union,
                    },
                    &q_all,
                ));
        if anonymous {
            let mut recoding = Recoding::identity(table);
            for (q, h) in hierarchies.iter().enumerate() {
                for r in 0..n {
                    recoding.cells[q][r] = Cell::Node(h.ancestor(table.quasi[q].codes[r], node[q]));
                }
            }
            for &r in &suppressed_rows {
                recoding.suppressed[r] = true;
            }
            let d = distortion(table, &recoding, 1.0);
            let loss = match metric {
                Metric::Dm => d.discernibility,
                Metric::Prec => 1.0 - d.precision,
                Metric::Entropy => d.non_uniform_entropy,
            };
            if best
                .as_ref()
                .is_none_or(|(b, _)| loss < *b - 1e-9 * b.abs().max(1.0))
            {
                best = Some((loss, node.clone()));
            }
        }
        // Next node (odometer).
        let mut j = 0;
        loop {
            if j == node.len() {
                return best;
            }
            node[j] += 1;
            if node[j] < hierarchies[j].height() {
                break;
            }
            node[j] = 0;
            j += 1;
        }
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// A random table of 1-4 categorical QIs with random hierarchies.
fn random_table(seed: u64) -> Table {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rows = rng.random_range(1..70);
    let quasi = rng.random_range(1..=4);
    let sensitive_values = rng.random_range(1..=5);
    let mut columns = Vec::new();
    let mut used = Vec::new();
    let mut header = Vec::new();
    for q in 0..quasi {
        let leaves = rng.random_range(1..10);
        let height = rng.random_range(2..=4);
        let branching = rng.random_range(2..=3);
        let text = random_hierarchy(q, leaves, height, branching);
        columns.push(ColumnSchema {
            name: format!("q{q}"),
            role: ColumnRole::Quasi(QuasiKind::Categorical(
                Hierarchy::parse("h.csv", &text).unwrap(),
            )),
        });
        used.push(rng.random_range(1..=leaves));
        header.push(format!("q{q}"));
    }
    columns.push(ColumnSchema::new(
        "s",
        ColumnRole::Sensitive { numeric: false },
    ));
    header.push("s".into());
    let mut csv = header.join(",");
    csv.push('\n');
    for _ in 0..rows {
        let mut values: Vec<String> = used
            .iter()
            .enumerate()
            .map(|(q, &u)| format!("c{q}v{}", rng.random_range(0..u)))
            .collect();
        values.push(format!("s{}", rng.random_range(0..sensitive_values)));
        csv.push_str(&values.join(","));
        csv.push('\n');
    }
    let schema = TableSchema {
        columns,
        unlisted: Unlisted::Drop,
    };
    read_csv(schema, csv.as_bytes(), "random.csv", b',').unwrap()
}

/// OLA's answer agrees with the exhaustive checker, and its recoding measures as OLA says.
fn agree(table: &Table, privacy: &PrivacySpec, metric: Metric, max_suppression: f64) {
    let expected = exhaustive(table, privacy, metric, max_suppression);
    match (ola(table, privacy, metric, max_suppression), expected) {
        (Ok(found), Some((best, node))) => {
            assert!(
                close(found.loss, best),
                "{metric} {privacy:?} supp {max_suppression}: OLA {:?} loss {} but {node:?} has {best}",
                found.levels,
                found.loss
            );
            let d = distortion(table, &found.recoding, 1.0);
            let measured = match metric {
                Metric::Dm => d.discernibility,
                Metric::Prec => 1.0 - d.precision,
                Metric::Entropy => d.non_uniform_entropy,
            };
            assert!(close(found.loss, measured), "{} vs {measured}", found.loss);
            assert!(found.nodes_checked <= found.lattice_size);
            let allowed = (max_suppression * table.rows() as f64 + 1e-9).floor() as u64;
            assert!(d.suppressed_rows <= allowed);
        }
        (Err(OlaError::NoAnonymousNode { .. }), None) => {}
        (found, expected) => panic!(
            "{metric} {privacy:?} supp {max_suppression}: OLA {:?} but checker {expected:?}",
            found.map(|f| (f.levels, f.loss))
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// OLA returns a node of minimum loss among all anonymous nodes, for every metric, with and
    /// without suppression.
    #[test]
    fn ola_is_optimal_on_random_tables(seed in any::<u64>(), supp in 0..4usize) {
        let table = random_table(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x01a);
        let privacy = random_privacy(&mut rng);
        let max_suppression = [0.0, 0.05, 0.2, 0.5][supp];
        for metric in [Metric::Dm, Metric::Prec, Metric::Entropy] {
            agree(&table, &privacy, metric, max_suppression);
        }
    }

    /// Under risk bounds (alone or with the other models), OLA's node is of minimum loss among the
    /// nodes whose kept classes honour every bound, and its release honours them.
    #[test]
    fn ola_is_optimal_under_risk_bounds(seed in any::<u64>(), supp in 0..3usize) {
        let table = random_table(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x215c);
        let mut privacy = if rng.random_bool(0.5) {
            random_privacy(&mut rng)
        } else {
            PrivacySpec::default()
        };
        privacy.risk = random_bounds(&mut rng, table.rows());
        let max_suppression = [0.0, 0.1, 0.4][supp];
        for metric in [Metric::Dm, Metric::Prec, Metric::Entropy] {
            agree(&table, &privacy, metric, max_suppression);
        }
        let options = AlgorithmOptions {
            algorithm: Algorithm::Ola,
            max_suppression,
            ..Default::default()
        };
        if let Ok((crate::relational::release::Release::Generalized(released), _)) =
            anonymize_with(&table, &privacy, ReleaseMethod::Generalization, seed, &options, &AtomicBool::new(false))
        {
            let sizes = crate::relational::released_class_sizes(&released);
            let records: u64 = sizes.iter().sum();
            if let Some(r) = privacy.risk.highest {
                prop_assert!(sizes.iter().all(|&s| 1.0 / s as f64 <= r + 1e-9));
            }
            if let (Some(a), true) = (privacy.risk.average, records > 0) {
                prop_assert!(sizes.len() as f64 / records as f64 <= a + 1e-9);
            }
        }
    }

    /// Every OLA release passes the independent model checker of the pipeline tests and carries
    /// its distortion; suppressed rows are released with every QI `*`.
    #[test]
    fn ola_releases_pass_the_model_checker(seed in any::<u64>()) {
        let generated = crate::relational::tests::generate_categorical(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc0ffee);
        let privacy = random_privacy(&mut rng);
        let table = read_csv(generated.schema.clone(), generated.csv.as_bytes(), "g.csv", b',').unwrap();
        let options = AlgorithmOptions {
            algorithm: Algorithm::Ola,
            max_suppression: [0.0, 0.1, 0.3][(seed % 3) as usize],
            ..Default::default()
        };
        match anonymize_with(&table, &privacy, ReleaseMethod::Generalization, seed, &options, &AtomicBool::new(false)) {
            Ok((release, report)) => {
                crate::relational::tests::check_release_with(&generated.original, &privacy, &release, false);
                prop_assert!(report.satisfied());
                prop_assert_eq!(report.algorithm.as_str(), "ola");
                let d = report.distortion.unwrap();
                let lattice = report.lattice.unwrap();
                prop_assert!(close(lattice.loss, d.discernibility));
            }
            Err(crate::relational::AnonymizeError::Ola(OlaError::NoAnonymousNode { .. })) => {
                prop_assert!(exhaustive(&table, &privacy, Metric::Dm, options.max_suppression).is_none());
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}

/// Random risk bounds (at least one), the population at least the table's rows.
fn random_bounds(rng: &mut ChaCha8Rng, rows: usize) -> RiskBounds {
    loop {
        let mut b = RiskBounds::default();
        if rng.random_bool(0.5) {
            b.highest = Some([1.0, 0.5, 0.34, 0.25][rng.random_range(0..4)]);
        }
        if rng.random_bool(0.5) {
            b.average = Some(rng.random_range(0.05..0.8));
        }
        if rng.random_bool(0.5) {
            b.population_uniqueness = Some(UniquenessBound {
                model: [
                    UniquenessModel::Pitman,
                    UniquenessModel::Zayatz,
                    UniquenessModel::Snb,
                    UniquenessModel::Dankar,
                ][rng.random_range(0..4)],
                population: (rows * rng.random_range(1..50)) as f64,
                max: rng.random_range(0.0..0.3),
            });
        }
        if !b.is_empty() {
            return b;
        }
    }
}

/// Average risk alone, without suppression (the case where OLA tags with it): the same optimum as
/// the exhaustive search; a bound of 0 is refused naming the key.
#[test]
fn average_risk_bound_by_hand() {
    let table = random_table(7);
    let privacy = PrivacySpec {
        risk: RiskBounds {
            average: Some(0.2),
            ..RiskBounds::default()
        },
        ..PrivacySpec::default()
    };
    agree(&table, &privacy, Metric::Dm, 0.0);
    let bad = PrivacySpec {
        risk: RiskBounds {
            average: Some(0.0),
            ..RiskBounds::default()
        },
        ..PrivacySpec::default()
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("max_risk_average")
    );
}

/// The first 2,000 rows of Adult with 4 QIs (workclass, education, marital-status, sex).
fn adult_sample() -> Table {
    let dir = crate::test_files::repo("tests/data/adult-sample");
    let hierarchy = |name: &str| {
        let text = std::fs::read_to_string(dir.join(format!("{name}.csv"))).unwrap();
        ColumnRole::Quasi(QuasiKind::Categorical(
            Hierarchy::parse(name, &text).unwrap(),
        ))
    };
    let mut columns: Vec<ColumnSchema> = ["workclass", "education", "marital-status", "sex"]
        .iter()
        .map(|name| ColumnSchema::new(*name, hierarchy(name)))
        .collect();
    columns.push(ColumnSchema::new(
        "occupation",
        ColumnRole::Sensitive { numeric: false },
    ));
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(dir.join("adult-2000.csv.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let schema = TableSchema {
        columns,
        unlisted: Unlisted::Drop,
    };
    read_csv(schema, text.as_bytes(), "adult-2000.csv", b',').unwrap()
}

#[test]
fn ola_is_optimal_on_adult_attributes() {
    let table = adult_sample();
    for (privacy, supp) in [
        (
            PrivacySpec {
                k: Some(10),
                ..Default::default()
            },
            0.0,
        ),
        (
            PrivacySpec {
                k: Some(25),
                ..Default::default()
            },
            0.02,
        ),
        (
            PrivacySpec {
                k: Some(5),
                l: Some(LDiversity::Distinct(3.0)),
                ..Default::default()
            },
            0.01,
        ),
        (
            PrivacySpec {
                k: Some(5),
                l: Some(LDiversity::Entropy(2.0)),
                ..Default::default()
            },
            0.05,
        ),
    ] {
        for metric in [Metric::Dm, Metric::Prec, Metric::Entropy] {
            agree(&table, &privacy, metric, supp);
        }
    }
}

#[test]
fn ola_refuses_numeric_columns_and_bad_limits() {
    let generated = crate::relational::tests::generate_categorical(3);
    let table = read_csv(generated.schema, generated.csv.as_bytes(), "g.csv", b',').unwrap();
    let k2 = PrivacySpec {
        k: Some(2),
        ..Default::default()
    };
    assert!(matches!(
        ola(&table, &k2, Metric::Dm, 1.5),
        Err(OlaError::MaxSuppression(_))
    ));
    let numeric = ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric));
    let schema = TableSchema {
        columns: vec![
            numeric,
            ColumnSchema::new("s", ColumnRole::Sensitive { numeric: false }),
        ],
        unlisted: Unlisted::Drop,
    };
    let t = read_csv(schema, "age,s\n1,a\n2,b\n".as_bytes(), "n.csv", b',').unwrap();
    let err = ola(&t, &k2, Metric::Dm, 0.0).unwrap_err();
    assert!(err.to_string().contains("\"age\" is numeric"), "{err}");
}

/// The shipped example `examples/adult-ola.toml`: Adult, 45,222 rows, 8 QIs through their hierarchies.
fn adult_ola() -> Table {
    let examples = crate::test_files::repo("examples");
    let text = std::fs::read_to_string(examples.join("adult-ola.toml")).unwrap();
    let job = crate::relational::job::JobSpec::parse("adult-ola.toml", &text).unwrap();
    let schema = job
        .schema(|path, _| -> Result<Hierarchy, String> {
            let text = std::fs::read_to_string(examples.join(path)).map_err(|e| e.to_string())?;
            Hierarchy::parse(path, &text).map_err(|e| e.to_string())
        })
        .unwrap();
    let mut csv = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(examples.join("data/adult.csv.gz")).unwrap())
        .read_to_end(&mut csv)
        .unwrap();
    read_csv(schema, csv.as_slice(), "adult.csv", b',').unwrap()
}

/// The eight optimal nodes of k 5/10 × suppression 0/2 % × DM/entropy on Adult with 8 QIs, and
/// their suppressed rows: ARX 3.9.2's Flash returns the same nodes with the same counts.
#[test]
fn ola_pins_the_adult_optima() {
    let table = adult_ola();
    let pinned: [(u64, f64, Metric, [usize; 8], usize); 8] = [
        (5, 0.0, Metric::Dm, [1, 2, 2, 2, 1, 1, 2, 1], 0),
        (10, 0.0, Metric::Dm, [1, 2, 3, 1, 1, 1, 2, 1], 0),
        (5, 0.02, Metric::Dm, [0, 2, 3, 1, 1, 0, 2, 1], 66),
        (10, 0.02, Metric::Dm, [0, 2, 3, 1, 1, 0, 2, 1], 176),
        (5, 0.0, Metric::Entropy, [1, 2, 2, 2, 1, 1, 2, 1], 0),
        (10, 0.0, Metric::Entropy, [1, 2, 3, 1, 1, 1, 2, 1], 0),
        (5, 0.02, Metric::Entropy, [0, 2, 2, 1, 1, 0, 2, 0], 840),
        (10, 0.02, Metric::Entropy, [0, 2, 3, 1, 1, 0, 2, 0], 556),
    ];
    for (k, supp, metric, levels, suppressed) in pinned {
        let privacy = PrivacySpec {
            k: Some(k),
            ..Default::default()
        };
        let found = ola(&table, &privacy, metric, supp).unwrap();
        let rows = found.recoding.suppressed.iter().filter(|&&s| s).count();
        assert_eq!(
            (found.levels.as_slice(), rows),
            (levels.as_slice(), suppressed),
            "k {k}, suppression {supp}, {metric}"
        );
    }
}
