//! `cloakd table anonymize --algorithm ola` end to end (the real binary): the release has the
//! original row count, suppressed rows carry `*` in every QI, every class has at least k rows, and
//! the report carries the distortion measures and OLA's lattice search; bad flags are refused naming
//! the flag and the rule.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::support::{cloakd, repo};

/// A job over the Adult sample with its four categorical QIs.
fn job(dir: &Path) -> PathBuf {
    let sample = repo().join("tests/data/adult-sample");
    let h = |name: &str| sample.join(format!("{name}.csv")).display().to_string();
    let text = format!(
        "input = {:?}\n[columns]\nworkclass = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         education = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         marital-status = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         sex = {{ role = \"quasi\", hierarchy = {:?} }}\n\
         occupation = {{ role = \"sensitive\" }}\n[privacy]\nk = 10\n[release]\nseed = 3\n",
        sample.join("adult-2000.csv.gz").display().to_string(),
        h("workclass"),
        h("education"),
        h("marital-status"),
        h("sex"),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn ola_release_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let out = dir.path().join("out.csv");
    let report_path = dir.path().join("report.json");
    let result = cloakd(&[
        "table",
        "anonymize",
        job.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--report",
        report_path.to_str().unwrap(),
        "--algorithm",
        "ola",
        "--metric",
        "prec",
        "--max-suppression",
        "0.02",
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let mut reader = csv::Reader::from_path(&out).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let rows: Vec<Vec<String>> = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    assert_eq!(rows.len(), 2000);
    let quasi: Vec<usize> = ["workclass", "education", "marital-status", "sex"]
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let mut classes: HashMap<Vec<&str>, u64> = HashMap::new();
    for row in &rows {
        *classes
            .entry(quasi.iter().map(|&q| row[q].as_str()).collect())
            .or_default() += 1;
    }
    assert!(classes.values().all(|&size| size >= 10), "{classes:?}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["algorithm"], "ola");
    let distortion = &report["distortion"];
    let suppressed = distortion["suppressed_rows"].as_u64().unwrap();
    assert!(suppressed <= 40);
    let all_stars = rows
        .iter()
        .filter(|r| quasi.iter().all(|&q| r[q] == "*"))
        .count() as u64;
    assert!(all_stars >= suppressed);
    for key in [
        "modification_rate",
        "whd_uniform",
        "whd_height",
        "precision",
        "discernibility",
        "non_uniform_entropy",
    ] {
        assert!(distortion[key].is_number(), "{key}");
    }
    let lattice = &report["lattice"];
    assert_eq!(lattice["metric"], "prec");
    // workclass 3, education 4, marital-status 3, sex 2 levels.
    assert_eq!(lattice["lattice_size"], 72);
    assert!(lattice["nodes_checked"].as_u64().unwrap() <= 72);
    let loss = lattice["loss"].as_f64().unwrap();
    let precision = distortion["precision"].as_f64().unwrap();
    assert!((1.0 - precision - loss).abs() < 1e-9);
}

#[test]
fn bad_algorithm_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let out = dir.path().join("out.csv");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "table",
            "anonymize",
            job.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let result = cloakd(&args);
        assert!(!result.status.success());
        String::from_utf8_lossy(&result.stderr).to_string()
    };
    assert!(run(&["--algorithm", "incognito"]).contains("--algorithm: unknown algorithm"));
    assert!(run(&["--algorithm", "ola", "--metric", "gini"]).contains("--metric: unknown metric"));
    assert!(run(&["--algorithm", "ola", "--max-suppression", "2"]).contains("must lie in [0, 1]"));
    assert!(run(&["--max-suppression", "0.1"]).contains("ola only"));
    assert!(
        run(&["--algorithm", "ola", "--release", "bucketization"]).contains("generalization only")
    );
    assert!(!out.exists());
}
