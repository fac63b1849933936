//! `cloakd table risk --population-table`, k-map, δ-presence and QI discovery end to end: the real
//! binary on the shipped Adult sample, against a population CSV written here (the sample, some of
//! its rows again, and rows of values the sample lacks), every figure recomputed here from the CSV
//! text, independently of the engine: exact classes by string, a released class's population
//! records by reading its ranges and the hierarchy files, pairs compared one by one for separation.
use std::collections::HashMap;
use std::io::Read;

use super::{ADULT_SAMPLE_QIS as QIS, adult_sample_job as job, read_report as report};
use crate::support::{cloakd, repo};

fn sample_dir() -> std::path::PathBuf {
    repo().join("tests/data/adult-sample")
}

/// The header and the rows of a CSV (plain text).
fn rows_of(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(|c| c.trim().to_string()).collect())
        .collect();
    (header, rows)
}

pub(super) fn sample_text() -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(sample_dir().join("adult-2000.csv.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    text
}

/// The QI values of each row.
fn qi_rows(text: &str) -> Vec<Vec<String>> {
    let (header, rows) = rows_of(text);
    let at: Vec<usize> = QIS
        .iter()
        .map(|q| header.iter().position(|h| h == q).unwrap())
        .collect();
    rows.iter()
        .map(|r| at.iter().map(|&i| r[i].clone()).collect())
        .collect()
}

/// The population: the sample, its first 300 rows twice more, and 50 rows aged 95 (no sample row is).
pub(super) fn population_text(sample: &str) -> String {
    let mut lines: Vec<&str> = sample.lines().collect();
    let body: Vec<&str> = lines[1..].to_vec();
    for _ in 0..2 {
        lines.extend(&body[..300]);
    }
    let mut text = lines.join("\n");
    for _ in 0..50 {
        text.push_str("\n95,Private,Bachelors,Never-married,White,Female,Sales");
    }
    text.push('\n');
    text
}

fn classes(rows: &[Vec<String>]) -> HashMap<Vec<String>, u64> {
    let mut out = HashMap::new();
    for r in rows {
        *out.entry(r.clone()).or_default() += 1;
    }
    out
}

/// Every hierarchy's rows (leaf first): a categorical label covers a leaf when it is in its row.
fn hierarchies() -> HashMap<&'static str, HashMap<String, Vec<String>>> {
    QIS[1..]
        .iter()
        .map(|&q| {
            let text = std::fs::read_to_string(sample_dir().join(format!("{q}.csv"))).unwrap();
            let rows = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let cells: Vec<String> = l.split(';').map(|c| c.trim().to_string()).collect();
                    (cells[0].clone(), cells)
                })
                .collect();
            (q, rows)
        })
        .collect()
}

fn covers(
    h: &HashMap<&'static str, HashMap<String, Vec<String>>>,
    column: usize,
    label: &str,
    value: &str,
) -> bool {
    if label == "*" {
        return true;
    }
    if column == 0 {
        let v: f64 = value.parse().unwrap();
        let (lo, hi) = match label.split_once('-') {
            Some((lo, hi)) => (lo.parse::<f64>().unwrap(), hi.parse::<f64>().unwrap()),
            None => {
                let x = label.parse::<f64>().unwrap();
                (x, x)
            }
        };
        return lo <= v && v <= hi;
    }
    h[QIS[column]][value].iter().any(|l| l == label)
}

fn close(a: &serde_json::Value, b: f64) -> bool {
    (a.as_f64().unwrap_or(f64::NAN) - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn a_table_against_a_population_table() {
    let dir = tempfile::tempdir().unwrap();
    let sample = sample_text();
    let population = population_text(&sample);
    let population_csv = dir.path().join("population.csv");
    std::fs::write(&population_csv, &population).unwrap();
    let rep = dir.path().join("risk.json");
    let o = cloakd(&[
        "table",
        "risk",
        &job(),
        "--population-table",
        population_csv.to_str().unwrap(),
        "--no-suda",
        "--k-map",
        "3",
        "--delta-min",
        "0.3",
        "--qi-discovery",
        "2",
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("delta-presence"), "{stdout}");
    let r = &report(&rep)["risk"];
    let s_rows = qi_rows(&sample);
    let p_rows = qi_rows(&population);
    let s = classes(&s_rows);
    let p = classes(&p_rows);
    let n = s_rows.len() as f64;
    let pairs: Vec<(u64, u64)> = s.iter().map(|(k, &f)| (f, p[k])).collect();
    // Journalist and marketer risk against the population's class sizes.
    assert_eq!(r["journalist"]["against"], "population table");
    let smallest = pairs.iter().map(|p| p.1).min().unwrap();
    assert_eq!(r["journalist"]["highest"], 1.0 / smallest as f64);
    let expected: f64 = pairs
        .iter()
        .map(|&(f, pp)| f as f64 / pp as f64)
        .sum::<f64>()
        / n;
    assert!(
        close(&r["marketer"]["average"], expected),
        "{}",
        r["marketer"]
    );
    // The population table's size is the population's when no other is given.
    assert_eq!(
        r["population_uniqueness"]["population_size"],
        p_rows.len() as f64
    );
    // k-map against the table: classes standing for fewer than 3 population records.
    let exact = &r["k_map"]["population_table"];
    let below: Vec<&(u64, u64)> = pairs.iter().filter(|p| p.1 < 3).collect();
    assert_eq!(exact["classes_violating"], below.len() as u64);
    assert_eq!(exact["satisfied"], below.is_empty());
    assert_eq!(exact["smallest_population_class"], smallest);
    let share = below.iter().map(|p| p.0).sum::<u64>() as f64 / n;
    assert!(close(&exact["records_violating"], share));
    // The estimators, with the population table's size: the violating classes are those below k'.
    for estimator in ["d3", "d4"] {
        let e = &r["k_map"][estimator];
        let derived = e["derived_k"].as_u64().unwrap();
        assert!((1..=3).contains(&derived), "{estimator}: {e}");
        let violating = pairs.iter().filter(|p| p.0 < derived).count() as u64;
        assert_eq!(e["classes_violating"], violating, "{estimator}");
    }
    // δ-presence: f / F per class; 50 population rows aged 95 match no class.
    let d = &r["delta_presence"];
    let deltas: Vec<f64> = pairs.iter().map(|&(f, pp)| f as f64 / pp as f64).collect();
    let min = deltas.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(d["delta_min"], min);
    assert_eq!(d["delta_max"], 1.0);
    assert_eq!(d["population_unmatched"], 50);
    let outside = deltas.iter().filter(|&&x| x < 0.3).count() as u64;
    assert_eq!(d["classes_outside"], outside);
    assert_eq!(d["within_bounds"], outside == 0);
    // QI discovery: every combination of at most 2 QIs, recomputed pair by pair.
    let combos = r["qi_discovery"]["combinations"].as_array().unwrap();
    assert_eq!(combos.len(), 6 + 15);
    for c in combos {
        let at: Vec<usize> = c["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| QIS.iter().position(|q| q == a).unwrap())
            .collect();
        let project = |r: &Vec<String>| -> String {
            at.iter()
                .map(|&i| r[i].as_str())
                .collect::<Vec<_>>()
                .join("\u{1f}")
        };
        let projected: Vec<String> = s_rows.iter().map(project).collect();
        let distinct: HashMap<&String, ()> = projected.iter().map(|p| (p, ())).collect();
        let mut separated = 0u64;
        for i in 0..projected.len() {
            for j in i + 1..projected.len() {
                separated += u64::from(projected[i] != projected[j]);
            }
        }
        let all = n * (n - 1.0) / 2.0;
        assert!(close(&c["distinction"], distinct.len() as f64 / n), "{c}");
        assert!(close(&c["separation"], separated as f64 / all), "{c}");
    }
    let separations: Vec<f64> = combos
        .iter()
        .map(|c| c["separation"].as_f64().unwrap())
        .collect();
    assert!(separations.windows(2).all(|w| w[0] >= w[1]));
}

#[test]
fn a_release_against_a_population_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("released.csv");
    let o = cloakd(&[
        "table",
        "anonymize",
        &job(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sample = sample_text();
    let population = population_text(&sample);
    let population_csv = dir.path().join("population.csv");
    std::fs::write(&population_csv, &population).unwrap();
    let rep = dir.path().join("risk.json");
    let o = cloakd(&[
        "table",
        "risk",
        &job(),
        "--release",
        out.to_str().unwrap(),
        "--population-table",
        population_csv.to_str().unwrap(),
        "--no-suda",
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = &report(&rep)["risk"];
    // Each released class stands for the population rows whose every value its labels cover.
    let released = classes(&qi_rows(&std::fs::read_to_string(&out).unwrap()));
    let p_rows = qi_rows(&population);
    let h = hierarchies();
    let mut pairs = Vec::new();
    let mut matched = vec![false; p_rows.len()];
    for (labels, &f) in &released {
        let mut count = 0u64;
        for (i, row) in p_rows.iter().enumerate() {
            if (0..QIS.len()).all(|c| covers(&h, c, &labels[c], &row[c])) {
                count += 1;
                matched[i] = true;
            }
        }
        pairs.push((f, count));
    }
    let n = 2000.0;
    // k-map with the job's k = 10.
    assert_eq!(r["k_map"]["k"], 10);
    let exact = &r["k_map"]["population_table"];
    let smallest = pairs.iter().map(|p| p.1).min().unwrap();
    assert_eq!(exact["smallest_population_class"], smallest);
    assert_eq!(exact["satisfied"], smallest >= 10);
    let d = &r["delta_presence"];
    let deltas: Vec<f64> = pairs.iter().map(|&(f, p)| f as f64 / p as f64).collect();
    assert_eq!(
        d["delta_min"],
        deltas.iter().copied().fold(f64::INFINITY, f64::min)
    );
    assert_eq!(d["delta_max"], deltas.iter().copied().fold(0.0, f64::max));
    assert_eq!(
        d["population_unmatched"],
        matched.iter().filter(|&&m| !m).count() as u64
    );
    let expected: f64 = pairs.iter().map(|&(f, p)| f as f64 / p as f64).sum::<f64>() / n;
    assert!(close(&r["marketer"]["average"], expected));
    assert_eq!(r["journalist"]["highest"], 1.0 / smallest as f64);
}

#[test]
fn refusals_name_the_flag_and_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = |args: &[&str]| {
        let o = cloakd(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    // A population missing most of the sample.
    let sample = sample_text();
    let small: String = sample.lines().take(11).collect::<Vec<_>>().join("\n") + "\n";
    let small_csv = dir.path().join("small.csv");
    std::fs::write(&small_csv, small).unwrap();
    let e = stderr(&[
        "table",
        "risk",
        &job(),
        "--population-table",
        small_csv.to_str().unwrap(),
    ]);
    assert!(
        e.contains("--population-table") && e.contains("the population contains the sample"),
        "{e}"
    );
    // A population without a quasi-identifier column.
    let missing = dir.path().join("missing.csv");
    std::fs::write(&missing, "age,workclass,occupation\n39,Private,Sales\n").unwrap();
    let e = stderr(&[
        "table",
        "risk",
        &job(),
        "--population-table",
        missing.to_str().unwrap(),
    ]);
    assert!(e.contains("--population-table"), "{e}");
    let e = stderr(&[
        "table",
        "risk",
        &job(),
        "--population-table",
        small_csv.to_str().unwrap(),
        "--delta-min",
        "1.5",
    ]);
    assert!(e.contains("delta_min = 1.5"), "{e}");
    // δ-presence's bounds need a population table.
    let e = stderr(&["table", "risk", &job(), "--delta-max", "0.5"]);
    assert!(e.contains("--population-table"), "{e}");
    let e = stderr(&["table", "risk", &job(), "--qi-discovery", "0"]);
    assert!(e.contains("qi_discovery = 0"), "{e}");
    let e = stderr(&["table", "risk", &job(), "--k-map", "0"]);
    assert!(e.contains("k_map = 0"), "{e}");
    let e = stderr(&["table", "risk", &job(), "--k-map-significance", "2"]);
    assert!(e.contains("k_map_significance = 2"), "{e}");
}
