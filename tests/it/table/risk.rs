//! `cloakd table risk` end to end: the real binary on the shipped Adult sample, on the table and on
//! a k-anonymous release of it (whose classes are recomputed here from the released CSV,
//! independently of the engine), checking the JSON report's names and figures, and the same risk
//! in `cloakd table evaluate`'s report; and a refused option naming itself.
use std::collections::HashMap;

use super::{adult_sample_job as job, read_report as report};
use crate::support::cloakd;

#[test]
fn risk_of_the_adult_sample_has_every_model_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let rep = dir.path().join("risk.json");
    let o = cloakd(&[
        "table",
        "risk",
        &job(),
        "--population",
        "318900000",
        "--suda-max-size",
        "3",
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("prosecutor: highest"), "{stdout}");
    assert!(stdout.contains("population uniqueness: pitman"), "{stdout}");
    let r = &report(&rep)["risk"];
    assert_eq!(r["records"], 2000);
    for model in ["prosecutor", "journalist"] {
        for field in ["highest", "average", "records_at_risk"] {
            let v = r[model][field].as_f64().unwrap_or(-1.0);
            assert!((0.0..=1.0).contains(&v), "{model}.{field} = {v}");
        }
    }
    assert_eq!(r["journalist"]["against"], "sample");
    assert!(r["marketer"]["average"].as_f64().unwrap() > 0.0);
    assert_eq!(r["marketer"]["average"], r["prosecutor"]["average"]);
    assert_eq!(
        r["prosecutor_wildcard"], r["prosecutor"],
        "no cell is suppressed"
    );
    let unique = r["sample_uniqueness"]["unique_records"].as_u64().unwrap();
    assert!(unique > 0);
    assert_eq!(
        r["sample_uniqueness"]["share"].as_f64().unwrap(),
        unique as f64 / 2000.0
    );
    let population = &r["population_uniqueness"];
    assert_eq!(population["population_size"], 318900000.0);
    for model in ["pitman", "zayatz", "snb", "dankar"] {
        let m = &population[model];
        assert!(
            m["uniques"].is_number() || m["unavailable"].is_string(),
            "{model}: {m}"
        );
    }
    assert!(population["dankar"]["model"].is_string());
    let suda = &r["suda"];
    let by_size = suda["msus_by_size"].as_array().unwrap();
    assert_eq!(by_size.len(), 3);
    // Every sample unique has an MSU of some size ≤ 6, but not necessarily ≤ 3; a record with an
    // MSU is a sample unique.
    let with_msu = suda["records_with_msu"].as_u64().unwrap();
    assert!(with_msu > 0 && with_msu <= unique, "{with_msu} vs {unique}");
    assert_eq!(suda["attribute_contributions"].as_array().unwrap().len(), 6);
}

#[test]
fn risk_of_a_k_anonymous_release_matches_its_classes() {
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
    let rep = dir.path().join("risk.json");
    let o = cloakd(&[
        "table",
        "risk",
        &job(),
        "--release",
        out.to_str().unwrap(),
        "--sampling-fraction",
        "0.01",
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The classes of the released QIs, recomputed from the CSV.
    let mut reader = csv::Reader::from_path(&out).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let qis = [
        "age",
        "workclass",
        "education",
        "marital-status",
        "race",
        "sex",
    ];
    let at: Vec<usize> = qis
        .iter()
        .map(|q| header.iter().position(|h| h == q).unwrap())
        .collect();
    let mut classes: HashMap<Vec<String>, u64> = HashMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        *classes
            .entry(at.iter().map(|&i| row[i].to_string()).collect())
            .or_default() += 1;
    }
    let smallest = *classes.values().min().unwrap();
    assert!(smallest >= 10);
    let r = &report(&rep)["risk"];
    assert_eq!(r["classes"], classes.len() as u64);
    assert_eq!(r["prosecutor"]["highest"], 1.0 / smallest as f64);
    assert_eq!(r["prosecutor"]["average"], classes.len() as f64 / 2000.0);
    // k = 10 leaves no record above a 0.2 threshold, no sample unique and no MSU.
    assert_eq!(r["prosecutor"]["records_at_risk"], 0.0);
    assert_eq!(r["sample_uniqueness"]["unique_records"], 0);
    assert_eq!(r["population_uniqueness"]["population_size"], 200000.0);
    assert_eq!(r["population_uniqueness"]["pitman"]["uniques"], 0.0);
    assert_eq!(r["suda"]["records_with_msu"], 0);
    // `table evaluate` reports the same sample risk beside the utility measures.
    let eval = dir.path().join("eval.json");
    let o = cloakd(&[
        "table",
        "evaluate",
        &job(),
        "--release",
        out.to_str().unwrap(),
        "--queries",
        "10",
        "--report",
        eval.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = &report(&eval)["risk"];
    assert_eq!(e["prosecutor"], r["prosecutor"]);
    assert_eq!(e["suda"]["unavailable"], "not requested");
}

/// The Adult sample with cell (i, j) of the 2,000 data rows and 6 QIs suppressed to `*` when
/// (31·i + 17·j) mod 23 = 0: 522 cells, no record suppressed whole.
fn partly_suppressed_sample() -> String {
    let text = std::io::read_to_string(flate2::read::GzDecoder::new(
        std::fs::File::open(
            crate::support::repo().join("tests/data/adult-sample/adult-2000.csv.gz"),
        )
        .unwrap(),
    ))
    .unwrap();
    let mut out = String::new();
    for (line, row) in text.lines().enumerate() {
        if line == 0 {
            out.push_str(row);
        } else {
            let i = line - 1;
            let cells: Vec<&str> = row
                .split(',')
                .enumerate()
                .map(|(j, v)| {
                    if j < 6 && (31 * i + 17 * j) % 23 == 0 {
                        "*"
                    } else {
                        v
                    }
                })
                .collect();
            out.push_str(&cells.join(","));
        }
        out.push('\n');
    }
    out
}

#[test]
fn a_suppressed_cell_matches_any_value_in_the_wildcard_prosecutor_risk() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("suppressed.csv");
    let text = partly_suppressed_sample();
    std::fs::write(&release, &text).unwrap();
    let rep = dir.path().join("risk.json");
    let o = cloakd(&[
        "table",
        "risk",
        &job(),
        "--release",
        release.to_str().unwrap(),
        "--no-suda",
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("prosecutor, * any value"),
        "the readable table shows the wildcard risk when it differs"
    );
    let r = &report(&rep)["risk"];
    let wild = &r["prosecutor_wildcard"];
    // Record by record: the records each could be (every QI equal or `*` on either side).
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').take(6).collect())
        .collect();
    let risks: Vec<f64> = rows
        .iter()
        .map(|a| {
            let m = rows
                .iter()
                .filter(|b| {
                    a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x == y || *x == "*" || *y == "*")
                })
                .count();
            1.0 / m as f64
        })
        .collect();
    let n = risks.len() as f64;
    let close = |v: &serde_json::Value, expected: f64| {
        (v.as_f64().unwrap() - expected).abs() <= 1e-12 * expected.abs().max(1.0)
    };
    let highest = risks.iter().copied().fold(0.0, f64::max);
    let lowest = risks.iter().copied().fold(1.0, f64::min);
    let average = risks.iter().sum::<f64>() / n;
    let at_risk = risks.iter().filter(|&&r| r > 0.2).count() as f64 / n;
    assert!(close(&wild["highest"], highest), "{wild}");
    assert!(close(&wild["lowest"], lowest), "{wild}");
    assert!(close(&wild["average"], average), "{wild}");
    assert!(close(&wild["records_at_risk"], at_risk), "{wild}");
    // ARX 3.9.2's RiskModelSampleWildcard (getSampleBasedRiskSummaryWildcard(0.2)) on this file
    // gives 1, 0.005128205128205128, 0.4590109841103532 and 0.592 (docs/risk.md), and its
    // RiskModelSampleSummary, where `*` is a value, 0.7785 average and 0.931 at risk.
    assert!(close(&wild["lowest"], 0.005128205128205128), "{wild}");
    assert!(close(&wild["average"], 0.4590109841103532), "{wild}");
    assert!(close(&wild["records_at_risk"], 0.592), "{wild}");
    assert!(close(&r["prosecutor"]["average"], 0.7785), "{r}");
    assert!(close(&r["prosecutor"]["records_at_risk"], 0.931), "{r}");
}

#[test]
fn a_refused_option_names_itself() {
    let o = cloakd(&["table", "risk", &job(), "--suda-max-size", "0"]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("suda_max_size = 0"), "{stderr}");
    let o = cloakd(&["table", "risk", &job(), "--sampling-fraction", "1.5"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("sampling_fraction = 1.5"));
}
