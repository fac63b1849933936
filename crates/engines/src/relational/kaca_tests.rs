//! KACA against the independent brute-force model checker of the pipeline tests
//! ([`crate::relational::tests::check_release_with`], which reads only the released CSV text and
//! the original rows): on random tables with random model combinations and on Adult (first 2,000
//! rows, six QIs through their ARX hierarchies, age included), every release covers each original
//! row with its own released row and every released class satisfies every requested model; the
//! engine refuses only jobs the whole table cannot satisfy. Golden: the paper's Table 3 at k = 2.
use std::io::Read;
use std::sync::atomic::AtomicBool;

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::relational::hierarchy::Hierarchy;
use crate::relational::kaca::{KacaError, kaca};
use crate::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
use crate::relational::recoding::label;
use crate::relational::release::ReleaseMethod;
use crate::relational::table::{
    ColumnRole, ColumnSchema, QuasiKind, Table, TableSchema, Unlisted, read_csv,
};
use crate::relational::tests::{
    CheckQuasi, Original, brute_violation, check_release_with, generate_categorical,
    hierarchy_lines, multiset, parse_csv, random_privacy,
};
use crate::relational::{Algorithm, AlgorithmOptions, AnonymizeError, anonymize_with};

fn options() -> AlgorithmOptions {
    AlgorithmOptions {
        algorithm: Algorithm::Kaca,
        ..Default::default()
    }
}

/// Runs KACA through the pipeline and checks the release with the brute-force checker; a refusal
/// must be a job the whole table violates.
fn run_and_check(table: &Table, original: &Original, privacy: &PrivacySpec, seed: u64) {
    match anonymize_with(
        table,
        privacy,
        ReleaseMethod::Generalization,
        seed,
        &options(),
        &AtomicBool::new(false),
    ) {
        Ok((release, report)) => {
            check_release_with(original, privacy, &release, false);
            assert!(report.satisfied());
            assert_eq!(report.algorithm, "kaca");
            let d = report.distortion.unwrap();
            assert_eq!(d.suppressed_rows, 0);
            assert!((0.0..=1.0).contains(&d.whd_height));
            assert!((0.0..=1.0).contains(&d.modification_rate));
        }
        Err(e) => {
            assert!(matches!(e, AnonymizeError::Unsatisfiable(_)), "{e}");
            let whole = multiset(original.rows.iter().map(|r| &r[original.sensitive]));
            assert!(
                brute_violation(privacy, &whole, &whole, original.sensitive_numeric).is_some(),
                "KACA refused a job the whole table satisfies: {e}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Every KACA release passes the independent model checker, whatever the model combination.
    #[test]
    fn kaca_releases_pass_the_model_checker(seed in any::<u64>()) {
        let generated = generate_categorical(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0ca4a);
        let privacy = random_privacy(&mut rng);
        let table = read_csv(generated.schema.clone(), generated.csv.as_bytes(), "g.csv", b',').unwrap();
        run_and_check(&table, &generated.original, &privacy, seed);
    }
}

/// The first 2,000 rows of Adult with a row id, six QIs through the ARX hierarchies of
/// `examples/data/hierarchies` (age included), sensitive occupation; with the checker's view.
fn adult_sample() -> (Table, Original) {
    let root = crate::test_files::repo("");
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(root.join("tests/data/adult-sample/adult-2000.csv.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    let mut csv = String::new();
    for (i, line) in text.lines().enumerate() {
        csv.push_str(&if i == 0 {
            "id".to_string()
        } else {
            format!("r{i}")
        });
        csv.push(',');
        csv.push_str(line);
        csv.push('\n');
    }
    let (header, rows) = parse_csv(csv.as_bytes());
    let names = [
        "age",
        "workclass",
        "education",
        "marital-status",
        "race",
        "sex",
    ];
    let mut columns = vec![ColumnSchema::new("id", ColumnRole::Insensitive)];
    let mut quasi = Vec::new();
    for name in names {
        let path = root.join(format!("examples/data/hierarchies/{name}.csv"));
        let hierarchy = std::fs::read_to_string(path).unwrap();
        columns.push(ColumnSchema {
            name: name.into(),
            role: ColumnRole::Quasi(QuasiKind::Categorical(
                Hierarchy::parse(name, &hierarchy).unwrap(),
            )),
        });
        let index = header.iter().position(|h| h == name).unwrap();
        quasi.push((index, CheckQuasi::Categorical(hierarchy_lines(&hierarchy))));
    }
    columns.push(ColumnSchema::new(
        "occupation",
        ColumnRole::Sensitive { numeric: false },
    ));
    let schema = TableSchema {
        columns,
        unlisted: Unlisted::Drop,
    };
    let table = read_csv(schema, csv.as_bytes(), "adult-2000.csv", b',').unwrap();
    let original = Original {
        sensitive: header.iter().position(|h| h == "occupation").unwrap(),
        header,
        rows,
        quasi,
        sensitive_numeric: false,
        id: Some(0),
    };
    (table, original)
}

#[test]
fn kaca_releases_of_adult_pass_the_model_checker() {
    let (table, original) = adult_sample();
    let k = |k| PrivacySpec {
        k: Some(k),
        ..Default::default()
    };
    for privacy in [
        k(2),
        k(10),
        k(50),
        PrivacySpec {
            l: Some(LDiversity::Distinct(3.0)),
            ..k(5)
        },
        PrivacySpec {
            l: Some(LDiversity::Entropy(2.5)),
            ..k(5)
        },
        PrivacySpec {
            t: Some(TCloseness {
                t: 0.2,
                distance: Distance::Emd,
            }),
            ..k(5)
        },
        PrivacySpec {
            delta: Some(1.5),
            ..k(5)
        },
    ] {
        run_and_check(&table, &original, &privacy, 11);
    }
}

/// Wiegand & Schallner's Table 3 (birthday and gender of six people) at k = 2: whichever class is
/// drawn first, the nearest one is its partner in the same month (or, for the 1991/1993 pair, the
/// same decade), so every seed gives the three classes below and 6 of the 12 cells modified.
#[test]
fn golden_table_3_k2() {
    let table = crate::relational::distortion::tests::table3();
    let privacy = PrivacySpec {
        k: Some(2),
        ..Default::default()
    };
    for seed in 0..24 {
        let found = kaca(&table, &privacy, 1.0, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
        let released: Vec<(String, String)> = (0..6)
            .map(|r| {
                (
                    label(&table.quasi[0].attribute, found.recoding.cells[0][r]),
                    label(&table.quasi[1].attribute, found.recoding.cells[1][r]),
                )
            })
            .collect();
        let expected = [
            ("03.1982", "Male"),
            ("03.1982", "Male"),
            ("07.1985", "Female"),
            ("07.1985", "Female"),
            ("1990-1999", "Male"),
            ("1990-1999", "Male"),
        ];
        for (got, want) in released.iter().zip(expected) {
            assert_eq!((got.0.as_str(), got.1.as_str()), want, "seed {seed}");
        }
        assert_eq!(
            (found.initial_classes, found.classes, found.merges),
            (6, 3, 3)
        );
        let d = crate::relational::distortion::distortion(&table, &found.recoding, 1.0);
        assert!((d.modification_rate - 0.5).abs() < 1e-12);
    }
}

#[test]
fn kaca_refuses_numeric_columns_without_hierarchy_and_unsatisfiable_models() {
    let schema = TableSchema {
        columns: vec![
            ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric)),
            ColumnSchema::new("s", ColumnRole::Sensitive { numeric: false }),
        ],
        unlisted: Unlisted::Drop,
    };
    let t = read_csv(schema, "age,s\n1,a\n2,b\n".as_bytes(), "n.csv", b',').unwrap();
    let k2 = PrivacySpec {
        k: Some(2),
        ..Default::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let err = kaca(&t, &k2, 1.0, &mut rng).unwrap_err();
    assert!(matches!(err, KacaError::NeedsHierarchy(_)));
    assert!(err.to_string().contains("\"age\" is numeric"), "{err}");
    let generated = generate_categorical(5);
    let table = read_csv(generated.schema, generated.csv.as_bytes(), "g.csv", b',').unwrap();
    let too_many = PrivacySpec {
        k: Some(table.rows() as u64 + 1),
        ..Default::default()
    };
    let err = kaca(&table, &too_many, 1.0, &mut rng).unwrap_err();
    assert!(matches!(err, KacaError::Unsatisfiable(_)), "{err}");
}
