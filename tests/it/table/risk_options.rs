//! The risk options of `cloakd table risk` in `table evaluate` and `table anonymize --report`: the
//! real binary on the shipped Adult sample, a k-anonymous release of it measured by the three
//! commands with the same flags (a population size, SUDA, k-map; a population table written here),
//! whose `risk` objects must agree field by field; and a refused flag naming itself.
use super::risk_population::{population_text, sample_text};
use super::{adult_sample_job as job, read_report as report};
use crate::support::cloakd;

/// Every leaf of two JSON values, by path, equal (numbers to a relative 1e-12: the same classes
/// summed in the same order give the same bits, this only spares a reordering's last bit).
fn assert_same(a: &serde_json::Value, b: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let (mut kx, mut ky): (Vec<_>, Vec<_>) = (x.keys().collect(), y.keys().collect());
            kx.sort();
            ky.sort();
            assert_eq!(kx, ky, "{path}: keys");
            for k in kx {
                assert_same(&x[k], &y[k], &format!("{path}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: length");
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                assert_same(u, v, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            let (u, v) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                u == v || (u - v).abs() <= 1e-12 * u.abs().max(v.abs()),
                "{path}: {u} != {v}"
            );
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

/// Anonymizes the sample with `flags` and `--report`, then measures the release with `table
/// evaluate` and `table risk` and the same flags; the three `risk` objects, and the first.
fn three_risks(dir: &std::path::Path, flags: &[&str]) -> serde_json::Value {
    let out = dir.join("released.csv");
    let run = |args: Vec<&str>| {
        let o = cloakd(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (anonymized, evaluated, measured) = (
        dir.join("anonymize.json"),
        dir.join("evaluate.json"),
        dir.join("risk.json"),
    );
    let job = job();
    let mut args = vec![
        "table",
        "anonymize",
        &job,
        "--output",
        out.to_str().unwrap(),
    ];
    args.extend(["--report", anonymized.to_str().unwrap()]);
    args.extend(flags);
    run(args);
    for (command, report) in [("evaluate", &evaluated), ("risk", &measured)] {
        let mut args = vec!["table", command, &job, "--release", out.to_str().unwrap()];
        args.extend(["--report", report.to_str().unwrap()]);
        args.extend(flags);
        run(args);
    }
    let risk = report(&measured)["risk"].clone();
    assert_same(&report(&anonymized)["risk"], &risk, "anonymize.risk");
    assert_same(&report(&evaluated)["risk"], &risk, "evaluate.risk");
    risk
}

#[test]
fn evaluate_and_anonymize_measure_a_population_suda_and_k_map_as_table_risk() {
    let dir = tempfile::tempdir().unwrap();
    let risk = three_risks(
        dir.path(),
        &[
            "--population",
            "318900000",
            "--suda-max-size",
            "3",
            "--k-map",
            "5",
        ],
    );
    assert_eq!(
        risk["population_uniqueness"]["population_size"], 318900000.0,
        "{risk}"
    );
    assert_eq!(risk["suda"]["max_size"], 3, "{risk}");
    assert_eq!(risk["k_map"]["k"], 5, "{risk}");
    assert!(risk["k_map"]["d3"]["satisfied"].is_boolean(), "{risk}");
    assert_eq!(risk["journalist"]["against"], "sample", "{risk}");
}

#[test]
fn evaluate_and_anonymize_measure_against_a_population_table_as_table_risk() {
    let dir = tempfile::tempdir().unwrap();
    let population = dir.path().join("population.csv");
    std::fs::write(&population, population_text(&sample_text())).unwrap();
    let risk = three_risks(
        dir.path(),
        &[
            "--population-table",
            population.to_str().unwrap(),
            "--suda-max-size",
            "3",
            "--k-map",
            "5",
            "--delta-max",
            "0.9",
        ],
    );
    assert_eq!(risk["journalist"]["against"], "population table", "{risk}");
    // The population table's records are the population's size: the sample, 600 rows again, 50 more.
    assert_eq!(
        risk["population_uniqueness"]["population_size"], 2650.0,
        "{risk}"
    );
    assert!(
        risk["k_map"]["population_table"]["satisfied"].is_boolean(),
        "{risk}"
    );
    assert_eq!(risk["delta_presence"]["population_unmatched"], 50, "{risk}");
}

#[test]
fn a_refused_risk_flag_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("released.csv");
    let job = job();
    let stderr = |args: &[&str]| {
        let o = cloakd(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    // Without --report, anonymize measures no risk: its risk flags make no sense.
    let e = stderr(&[
        "table",
        "anonymize",
        &job,
        "--output",
        out.to_str().unwrap(),
        "--population",
        "1000",
    ]);
    assert!(e.contains("--population") && e.contains("--report"), "{e}");
    assert!(!out.exists());
    let o = cloakd(&[
        "table",
        "anonymize",
        &job,
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let release = out.to_str().unwrap();
    // SUDA's size above the job's six quasi-identifiers, in every command.
    for command in ["risk", "evaluate"] {
        let e = stderr(&[
            "table",
            command,
            &job,
            "--release",
            release,
            "--suda-max-size",
            "7",
        ]);
        assert!(
            e.contains("--suda-max-size 7") && e.contains("6 quasi-identifiers"),
            "{command}: {e}"
        );
    }
    // k-map's significance without k-map: a report measures k-map only with --k-map.
    let e = stderr(&[
        "table",
        "evaluate",
        &job,
        "--release",
        release,
        "--k-map-significance",
        "0.05",
    ]);
    assert!(
        e.contains("--k-map-significance") && e.contains("--k-map K"),
        "{e}"
    );
    let e = stderr(&[
        "table",
        "evaluate",
        &job,
        "--release",
        release,
        "--threshold",
        "2",
    ]);
    assert!(
        e.contains("--threshold") && e.contains("threshold = 2"),
        "{e}"
    );
    let e = stderr(&[
        "table",
        "anonymize",
        &job,
        "--output",
        out.to_str().unwrap(),
        "--report",
        dir.path().join("r.json").to_str().unwrap(),
        "--k-map",
        "0",
    ]);
    assert!(e.contains("--k-map") && e.contains("k_map = 0"), "{e}");
}
