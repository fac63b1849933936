use super::stats::{add_errs, normal_inverse};
use super::*;
use crate::learning::cross_validate;
use proptest::prelude::*;

/// Weka's weather data (numeric version), the textbook example.
fn weather() -> Dataset {
    let rows = [
        "sunny,85,85,FALSE,no",
        "sunny,80,90,TRUE,no",
        "overcast,83,86,FALSE,yes",
        "rainy,70,96,FALSE,yes",
        "rainy,68,80,FALSE,yes",
        "rainy,65,70,TRUE,no",
        "overcast,64,65,TRUE,yes",
        "sunny,72,95,FALSE,no",
        "sunny,69,70,FALSE,yes",
        "rainy,75,80,FALSE,yes",
        "sunny,75,70,TRUE,yes",
        "overcast,72,90,TRUE,yes",
        "overcast,81,75,FALSE,yes",
        "rainy,71,91,TRUE,no",
    ];
    Dataset::from_rows(
        &["outlook", "temperature", "humidity", "windy", "play"],
        &[false, true, true, false, false],
        rows.iter().map(|r| r.split(',')),
    )
    .unwrap()
}

fn all_rows(data: &Dataset) -> Vec<u32> {
    (0..data.rows() as u32).collect()
}

/// Weka 3.6.14 prints this tree for the weather data: outlook at the root (gain ratio 0.156 beats
/// humidity's and windy's among the splits of at least average gain), humidity <= 75 under sunny
/// (the threshold 77.5 between 70 and 85 moved down to the greatest value not above it), windy
/// under rainy; 8 nodes, 5 leaves.
#[test]
fn grows_wekas_tree_on_the_weather_data() {
    let data = weather();
    let model = J48::default().fit(&data, 4, &all_rows(&data), 1);
    assert_eq!((model.size(), model.leaves()), (8, 5), "{model:?}");
    // Class values in order of first appearance: the first row is a "no".
    let (no, yes) = (0, 1);
    assert_eq!(
        model.nodes,
        vec![
            Compiled::Test {
                test: Test::Nominal {
                    attribute: 0,
                    values: 3
                },
                first: 1
            },
            Compiled::Test {
                test: Test::Numeric {
                    attribute: 2,
                    point: 75.0
                },
                first: 4
            },
            Compiled::Answer(yes),
            Compiled::Test {
                test: Test::Nominal {
                    attribute: 3,
                    values: 2
                },
                first: 6
            },
            Compiled::Answer(yes),
            Compiled::Answer(no),
            // windy's values in order of appearance: FALSE, then TRUE.
            Compiled::Answer(yes),
            Compiled::Answer(no),
        ]
    );
    for row in 0..14 {
        assert_eq!(
            model.predict(&data, row),
            data.nominal_codes(4)[row as usize]
        );
    }
}

/// `Stats.addErrs(N, e, 0.25f)` as Weka 3.6.14 computes it (printed by a Java program).
#[test]
fn pessimistic_errors_match_weka() {
    let weka = [
        (1.0, 0.0, 0.75),
        (2.0, 0.0, 1.0),
        (6.0, 0.0, 1.2377968440954012),
        (6.0, 0.5, 1.2706517010318281),
        (6.0, 1.0, 1.3035065579682552),
        (6.0, 2.0, 1.321325709462255),
        (14.0, 0.0, 1.319868700305306),
        (14.0, 5.0, 1.7611198072729675),
        (100.0, 3.0, 1.9651535234865074),
        (100.0, 49.6, 3.86434400250031),
        (100.0, 99.6, 0.4000000000000057),
        (45222.0, 12000.0, 63.936552489763926),
        (3.0, 2.6, 0.3999999999999999),
        (0.5, 0.0, 0.46875),
    ];
    for (n, e, expected) in weka {
        let ours = add_errs(n, e, 0.25);
        assert!(
            (ours - expected).abs() <= 1e-12 * expected.abs().max(1.0),
            "addErrs({n}, {e}) = {ours}, Weka {expected}"
        );
    }
    assert!((add_errs(20.0, 3.0, 0.1) - 3.144028576084045).abs() < 1e-12);
    assert_eq!(add_errs(20.0, 3.0, 0.6), 0.0);
    assert!((normal_inverse(0.75) - 0.6744897501960816).abs() < 1e-15);
    assert!((normal_inverse(0.9) - 1.2815515655446004).abs() < 1e-15);
    assert!((normal_inverse(0.01) + 2.326_347_874_040_841).abs() < 1e-13);
    assert!((normal_inverse(1e-20) + 9.262_340_089_798_408).abs() < 1e-9);
    assert!(normal_inverse(0.0).is_nan() && normal_inverse(1.0).is_nan());
}

/// The numeric split: the threshold with the most information gain among those leaving at least
/// `max(2, min(25, 0.1 N / classes))` rows on each side, its gain less log2(candidates) / N.
#[test]
fn numeric_split_takes_the_best_threshold_less_the_mdl_correction() {
    // x: 1..=12; class a below 7, b from 7 on, except row x = 3 (b).
    let rows: Vec<[String; 2]> = (1..=12)
        .map(|x| {
            let class = if x >= 7 || x == 3 { "b" } else { "a" };
            [x.to_string(), class.to_string()]
        })
        .collect();
    let data = Dataset::from_rows(
        &["x", "class"],
        &[true, false],
        rows.iter().map(|r| r.iter().map(String::as_str)),
    )
    .unwrap();
    let column = split::NumericColumn::new(data.numeric_values(0), &all_rows(&data));
    let labels = data.nominal_codes(1);
    let entropy = split::Entropy::new(12);
    let counts = [5u32, 7];
    let node = split::NodeStats {
        class_counts: &counts,
        total: 12,
        old_ent: entropy.old_ent(&counts, 12),
        min_leaf: 2.0,
    };
    let mut scratch = split::Scratch::default();
    let cells: Vec<u32> = all_rows(&data)
        .iter()
        .map(|&r| split::cell(column.rank[r as usize], labels[r as usize], 2))
        .collect();
    let best = split::numeric(&entropy, &node, &cells, &column, &mut scratch).unwrap();
    assert_eq!(best.split_point, 6.5);
    // Gain of x <= 6.5: H(5/12) - 6/12 H(1/6) - 0; 9 thresholds leave two rows on both sides.
    let h = |p: f64| -(p * p.log2() + (1.0 - p) * (1.0 - p).log2());
    let gain = h(5.0 / 12.0) - 0.5 * h(1.0 / 6.0) - 9f64.log2() / 12.0;
    assert!((best.info_gain - gain).abs() < 1e-12, "{best:?} vs {gain}");
    assert!(
        (best.gain_ratio - gain).abs() < 1e-12,
        "split info of 6/6 is 1 bit"
    );
    assert_eq!(column.actual_split_point(6.5), 6.0);
}

fn dataset(columns: Vec<(bool, Vec<&str>)>) -> Dataset {
    let names: Vec<String> = (0..columns.len()).map(|i| format!("a{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let numeric: Vec<bool> = columns.iter().map(|c| c.0).collect();
    let rows = columns.first().map_or(0, |c| c.1.len());
    Dataset::from_rows(
        &names,
        &numeric,
        (0..rows).map(|r| columns.iter().map(move |c| c.1[r])),
    )
    .unwrap()
}

#[test]
fn degenerate_data_never_panics() {
    let learner = J48::default();
    // One row; one class; the class alone; a constant attribute; no rows at all.
    let one = dataset(vec![(true, vec!["1"]), (false, vec!["a"])]);
    assert_eq!(learner.fit(&one, 1, &[0], 1).predict(&one, 0), 0);
    let single = dataset(vec![
        (false, vec!["x", "y", "x"]),
        (false, vec!["a", "a", "a"]),
    ]);
    assert_eq!(
        learner.fit(&single, 1, &[0, 1, 2], 1).predict(&single, 1),
        0
    );
    let alone = dataset(vec![(false, vec!["a", "b", "b", "a", "b"])]);
    let model = learner.fit(&alone, 0, &[0, 1, 2, 3, 4], 1);
    assert_eq!(model.predict(&alone, 0), 1, "the majority");
    let constant = dataset(vec![
        (true, vec!["5", "5", "5", "5", "5", "5"]),
        (false, vec!["k", "k", "k", "k", "k", "k"]),
        (false, vec!["a", "b", "a", "b", "a", "a"]),
    ]);
    let model = learner.fit(&constant, 2, &[0, 1, 2, 3, 4, 5], 1);
    assert_eq!(model.size(), 1);
    assert_eq!(model.predict(&constant, 1), 0);
    assert_eq!(
        learner.fit(&constant, 2, &[], 1).predict(&constant, 0),
        UNCLASSIFIED
    );
    let accuracy = cross_validate(&learner, &constant, 2, 2, 1).unwrap();
    assert_eq!(accuracy.total, 6);
    // A value never seen in training goes down its (empty) branch: the parent's majority.
    let unseen = dataset(vec![
        (false, vec!["p", "p", "p", "q", "q", "q", "r"]),
        (false, vec!["a", "a", "a", "b", "b", "b", "b"]),
    ]);
    let model = learner.fit(&unseen, 1, &[0, 1, 2, 3, 4, 5], 1);
    assert_eq!(model.predict(&unseen, 0), 0);
    assert_eq!(model.predict(&unseen, 3), 1);
    assert_eq!(
        model.predict(&unseen, 6),
        0,
        "an empty branch: first of the tied majority"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any small table of nominal and numeric attributes: fitting never panics, every prediction
    /// is a class or UNCLASSIFIED, and the unpruned tree fits its training rows at least as well as
    /// the majority class.
    #[test]
    fn fits_anything(
        rows in 1usize..40,
        kinds in proptest::collection::vec(any::<bool>(), 0..4),
        seed in any::<u64>(),
    ) {
        let mut state = seed | 1;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut columns: Vec<(bool, Vec<String>)> = kinds
            .iter()
            .map(|&numeric| {
                let values = next(5) + 1;
                let cells = (0..rows)
                    .map(|_| {
                        if numeric {
                            format!("{}", next(values * 3) as f64 / 2.0)
                        } else {
                            format!("v{}", next(values))
                        }
                    })
                    .collect();
                (numeric, cells)
            })
            .collect();
        let classes = next(3) + 1;
        columns.push((false, (0..rows).map(|_| format!("c{}", next(classes))).collect()));
        let data = dataset(
            columns
                .iter()
                .map(|(n, cells)| (*n, cells.iter().map(String::as_str).collect()))
                .collect(),
        );
        let class = columns.len() - 1;
        let all = all_rows(&data);
        let labels = data.nominal_codes(class);
        let values = data.attribute(class).values() as u32;
        for learner in [J48::default(), J48 { prune: false, ..J48::default() }] {
            let model = learner.fit(&data, class, &all, 1);
            let mut correct = 0;
            for row in 0..rows as u32 {
                let p = model.predict(&data, row);
                prop_assert!(p < values || p == UNCLASSIFIED);
                correct += usize::from(p == labels[row as usize]);
            }
            let mut counts = vec![0usize; values as usize];
            for &l in labels {
                counts[l as usize] += 1;
            }
            if !learner.prune {
                prop_assert!(correct >= *counts.iter().max().unwrap());
            }
        }
        if rows >= 2 {
            let accuracy = cross_validate(&J48::default(), &data, class, 2, seed).unwrap();
            prop_assert_eq!(accuracy.total, rows as u64);
        }
    }
}
