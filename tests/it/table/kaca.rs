//! `cloakd table anonymize --algorithm kaca` end to end (the real binary) on the Adult sample with
//! age through its hierarchy: the release keeps every row, every class (rows with one released QI
//! tuple) has at least k rows and, with `--l distinct:3`, three occupations; nothing is suppressed;
//! the report names the algorithm and carries the distortion measures; one seed gives one release;
//! KACA's limits (generalization only, no suppression) are refused naming the flag and the rule.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::{cloakd, repo};

/// A KACA job over the Adult sample: age (through the ARX age hierarchy), workclass, education,
/// marital-status and sex; sensitive occupation.
fn job(dir: &Path) -> PathBuf {
    let sample = repo().join("tests/data/adult-sample");
    let h = |name: &str| sample.join(format!("{name}.csv")).display().to_string();
    let age = repo().join("examples/data/hierarchies/age.csv");
    let text = format!(
        "input = {:?}\n[columns]\nage = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         workclass = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         education = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         marital-status = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         sex = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         occupation = {{ role = \"sensitive\" }}\n[privacy]\nk = 10\n\
         [release]\nalgorithm = \"kaca\"\nseed = 3\n",
        sample.join("adult-2000.csv.gz").display().to_string(),
        age.display().to_string(),
        h("workclass"),
        h("education"),
        h("marital-status"),
        h("sex"),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const QUASI: [&str; 5] = ["age", "workclass", "education", "marital-status", "sex"];

/// Runs `cloakd table anonymize` on the job with extra flags, writing `out.csv` and `report.json`.
fn run(dir: &Path, extra: &[&str]) -> Output {
    let job = job(dir);
    let (out, report) = (dir.join("out.csv"), dir.join("report.json"));
    let mut args = vec!["table", "anonymize", job.to_str().unwrap()];
    args.extend_from_slice(&["--output", out.to_str().unwrap()]);
    args.extend_from_slice(&["--report", report.to_str().unwrap()]);
    args.extend_from_slice(extra);
    cloakd(&args)
}

/// Runs the job with extra flags; returns the released rows (header first) and the report.
fn anonymize(dir: &Path, extra: &[&str]) -> (Vec<Vec<String>>, serde_json::Value) {
    let result = run(dir, extra);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_path(dir.join("out.csv"))
        .unwrap();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    let report = std::fs::read_to_string(dir.join("report.json")).unwrap();
    (rows, serde_json::from_str(&report).unwrap())
}

/// Released classes: QI tuple -> occupations of its rows.
fn classes(rows: &[Vec<String>]) -> HashMap<Vec<String>, Vec<String>> {
    let header = &rows[0];
    let quasi: Vec<usize> = QUASI
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let sensitive = header.iter().position(|h| h == "occupation").unwrap();
    let mut classes: HashMap<Vec<String>, Vec<String>> = HashMap::new();
    for row in &rows[1..] {
        classes
            .entry(quasi.iter().map(|&q| row[q].clone()).collect())
            .or_default()
            .push(row[sensitive].clone());
    }
    classes
}

#[test]
fn kaca_release_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, report) = anonymize(dir.path(), &[]);
    assert_eq!(rows.len(), 2001);
    let released = classes(&rows);
    assert!(released.values().all(|c| c.len() >= 10));
    // Local recoding: some age cells stay exact while others are generalized.
    let ages: BTreeSet<&str> = released.keys().map(|k| k[0].as_str()).collect();
    assert!(ages.iter().any(|a| a.parse::<u32>().is_ok()), "{ages:?}");
    assert!(ages.iter().any(|a| a.parse::<u32>().is_err()), "{ages:?}");
    assert_eq!(report["algorithm"], "kaca");
    assert_eq!(report["classes"], released.len() as u64);
    assert!(report.get("lattice").is_none());
    let distortion = &report["distortion"];
    assert_eq!(distortion["suppressed_rows"], 0);
    for key in [
        "modification_rate",
        "whd_uniform",
        "whd_height",
        "precision",
        "discernibility",
        "non_uniform_entropy",
    ] {
        let x = distortion[key].as_f64().unwrap();
        assert!(x > 0.0, "{key} = {x}");
    }
    let dm: u64 = released.values().map(|c| (c.len() * c.len()) as u64).sum();
    assert_eq!(distortion["discernibility"].as_f64().unwrap(), dm as f64);
    // One seed, one release.
    let again = tempfile::tempdir().unwrap();
    assert_eq!(anonymize(again.path(), &[]).0, rows);
}

#[test]
fn kaca_merges_until_l_diversity_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, report) = anonymize(dir.path(), &["--k", "4", "--l", "distinct:3"]);
    let released = classes(&rows);
    for (key, occupations) in &released {
        let distinct: BTreeSet<&String> = occupations.iter().collect();
        assert!(occupations.len() >= 4, "{key:?}");
        assert!(distinct.len() >= 3, "{key:?}: {occupations:?}");
    }
    assert!(report["l_distinct"].as_u64().unwrap() >= 3);
}

#[test]
fn kaca_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |extra: &[&str]| {
        let result = run(dir.path(), extra);
        assert!(!result.status.success());
        String::from_utf8_lossy(&result.stderr).to_string()
    };
    let err = refused(&["--release", "bucketization"]);
    assert!(
        err.contains("kaca releases by generalization only"),
        "{err}"
    );
    let err = refused(&["--max-suppression", "0.1"]);
    assert!(err.contains("ola only"), "{err}");
    let err = refused(&["--k", "5000"]);
    assert!(err.contains("cannot be met"), "{err}");
    assert!(!dir.path().join("out.csv").exists());
}
