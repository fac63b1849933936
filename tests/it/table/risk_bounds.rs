//! Risk-bounded releases and the release's risk in `table anonymize --report`, through the real
//! binary on the shipped Adult sample: the bounds given as flags are honoured by the release as
//! measured here from the released CSV (independently of the engine), the report's `risk` object
//! matches those classes, and a job whose release exceeds its population-uniqueness bound is refused
//! naming the model, the bound and the measured value, writing nothing.
use std::collections::HashMap;
use std::path::Path;

use super::{ADULT_SAMPLE_QIS as QIS, adult_sample_job as job};
use crate::support::{cloakd, repo};

/// The class sizes of a released CSV on the six QIs (rows whose every QI is `*` left out).
fn classes(path: &Path) -> Vec<u64> {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let at: Vec<usize> = QIS
        .iter()
        .map(|q| header.iter().position(|h| h == q).unwrap())
        .collect();
    let mut sizes: HashMap<Vec<String>, u64> = HashMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        let key: Vec<String> = at.iter().map(|&i| row[i].to_string()).collect();
        if key.iter().all(|v| v == "*") {
            continue;
        }
        *sizes.entry(key).or_default() += 1;
    }
    sizes.into_values().collect()
}

#[test]
fn bounded_releases_honour_their_bounds_and_report_their_risk() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("released.csv");
    let rep = dir.path().join("report.json");
    let job = job();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "table",
            "anonymize",
            &job,
            "--output",
            out.to_str().unwrap(),
            "--report",
            rep.to_str().unwrap(),
            "--k",
            "2",
        ];
        args.extend_from_slice(extra);
        let o = cloakd(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
        (classes(&out), report)
    };
    // Unbounded (k = 2) first: its average risk is above the bound used next.
    let (free, _) = run(&[]);
    let free_average = free.len() as f64 / 2000.0;
    let bound = 0.02;
    assert!(free_average > bound, "{free_average}");
    let (sizes, report) = run(&["--max-risk-average", "0.02", "--max-risk-highest", "0.05"]);
    let average = sizes.len() as f64 / 2000.0;
    assert!(average <= bound, "{average} > {bound}");
    let smallest = *sizes.iter().min().unwrap();
    assert!(smallest >= 20, "{smallest}");
    // The report's risk object carries the release's risk under `table evaluate`'s names.
    let r = &report["risk"];
    assert_eq!(r["classes"], sizes.len() as u64);
    assert_eq!(r["prosecutor"]["highest"], 1.0 / smallest as f64);
    assert_eq!(r["prosecutor"]["average"], average);
    assert_eq!(r["marketer"]["average"], average);
    assert_eq!(r["sample_uniqueness"]["unique_records"], 0);
    assert_eq!(r["suda"]["unavailable"], "not requested");
    assert!(report["models"].is_array());
}

#[test]
fn a_release_above_its_population_uniqueness_bound_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = std::fs::read_to_string(job()).unwrap();
    let data = repo().join("tests/data/adult-sample");
    let text = source
        .replace(
            "input = \"adult-2000.csv.gz\"",
            &format!(
                "input = {:?}",
                data.join("adult-2000.csv.gz").display().to_string()
            ),
        )
        .replace(
            "hierarchy = \"",
            &format!("hierarchy = \"{}/", data.display()),
        )
        .replace(
            "k = 10",
            "k = 1\npopulation_uniqueness = { model = \"zayatz\", population = 1000000, max = 0 }",
        );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, text).unwrap();
    let out = dir.path().join("released.csv");
    let o = cloakd(&[
        "table",
        "anonymize",
        path.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr
            .contains("release refused: population uniqueness (zayatz, population=1000000, max=0)")
            && stderr.contains("bound 0"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written");
    // A bound out of range names its flag.
    let o = cloakd(&[
        "table",
        "anonymize",
        &job(),
        "--output",
        out.to_str().unwrap(),
        "--max-risk-average",
        "0",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-risk-average 0"));
}
