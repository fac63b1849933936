//! cloakd's Random Forest is pinned: the same rows and seed give the same forest, so the same
//! accuracy to the row. The counts below were recorded before the forest's builder was rewritten
//! for speed (flat count buffers, in-place partitioning); a change that alters a single draw, sum
//! or tie-break moves them. Adult subsets (one numeric attribute, nominal ones of up to 41 values)
//! and a synthetic table with several numeric attributes full of ties.
use cloakd::learning::{Dataset, RandomForest, cross_validate};

use crate::support::learning::adult;

/// A table of 2,000 rows: two nominal attributes (5 and 41 values), three numeric ones (integers
/// 0..60 with many ties, a continuous one, a constant), and a 3-valued class decided noisily by them.
fn synthetic() -> Dataset {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    };
    let rows: Vec<[String; 6]> = (0..2000)
        .map(|_| {
            let a = next() % 5;
            let b = next() % 41;
            let x = next() % 60;
            let y = f64::from(next() % 100_000) / 997.0;
            let noise = next() % 10;
            let class = match (a + b % 3 + u32::from(x > 30) + u32::from(y > 50.0) + noise / 7) % 3
            {
                0 => "p",
                1 => "q",
                _ => "r",
            };
            [
                format!("a{a}"),
                format!("b{b}"),
                x.to_string(),
                y.to_string(),
                "7".to_string(),
                class.to_string(),
            ]
        })
        .collect();
    Dataset::from_rows(
        &["a", "b", "x", "y", "c", "class"],
        &[false, false, true, true, true, false],
        rows.iter().map(|r| r.iter().map(String::as_str)),
    )
    .expect("the synthetic table loads")
}

fn correct(data: &Dataset, class: &str, folds: usize, seed: u64) -> u64 {
    let class = data.index_of(class).expect("an attribute");
    cross_validate(&RandomForest::default(), data, class, folds, seed)
        .expect("valid")
        .correct
}

#[test]
fn the_forest_is_pinned_on_adult() {
    let data = adult(3000);
    let got = [
        correct(&data, "marital-status", 10, 1),
        correct(&data, "income", 10, 1),
        correct(&data, "occupation", 5, 7),
    ];
    println!("adult {got:?}");
    assert_eq!(got, [1823, 2351, 733]);
}

#[test]
fn the_forest_is_pinned_on_numeric_ties() {
    let data = synthetic();
    let got = [
        correct(&data, "class", 10, 1),
        correct(&data, "class", 3, 42),
        correct(&data, "a", 10, 5),
    ];
    println!("synthetic {got:?}");
    assert_eq!(got, [866, 834, 569]);
}
