//! `cloakd table evaluate --workload` end to end: the real binary on the Adult sample. The original
//! table measured as its own release gives U_san = U_max for every classifier (the same dataset and
//! folds); a k = 20 generalization reports U_max, U_base with its sanitization and classifier, and
//! U_san − U_base per classifier beside the privacy measures; bad options are refused naming the
//! option and the rule.

use crate::support::bin;

const JOB: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/adult-sample/job.toml"
);
const INPUT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/adult-sample/adult-2000.csv.gz"
);

fn evaluate(release: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let output = bin()
        .args(["table", "evaluate", JOB, "--release"])
        .arg(release)
        .args(["--queries", "10"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn the_original_table_is_worth_u_max() {
    let json = evaluate(
        std::path::Path::new(INPUT),
        &["--workload", "workclass", "--classifiers", "nb,rf"],
    );
    let w = &json["workload"];
    assert_eq!(w["attribute"], "workclass");
    assert_eq!(w["folds"], 10);
    let classifiers = w["classifiers"].as_array().unwrap();
    assert_eq!(classifiers.len(), 2);
    for c in classifiers {
        assert_eq!(c["u_san"], c["u_max"], "{c}");
        let gain = c["u_san"].as_f64().unwrap() - w["u_base"].as_f64().unwrap();
        assert!((c["u_san_minus_u_base"].as_f64().unwrap() - gain).abs() < 1e-12);
    }
    assert!(w["u_base"].as_f64().unwrap() <= w["u_max"].as_f64().unwrap() + 0.05);
    assert!(
        ["quasi-identifiers removed", "sensitive removed"]
            .contains(&w["u_base_sanitization"].as_str().unwrap())
    );
    assert!(["nb", "rf"].contains(&w["u_base_classifier"].as_str().unwrap()));
    assert!(json["a_acc"].is_number() && json["ploss"].is_number());
}

#[test]
fn a_generalization_reports_the_workload_beside_the_privacy_measures() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.csv");
    let status = bin()
        .args(["table", "anonymize", JOB, "--k", "20", "--output"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let json = evaluate(&out, &["--workload", "occupation", "--classifiers", "nb"]);
    let w = &json["workload"];
    // occupation is the sensitive attribute: only "quasi-identifiers removed" is a baseline.
    assert_eq!(w["u_base_sanitization"], "quasi-identifiers removed");
    assert_eq!(w["u_base_classifier"], "nb");
    let u_san = w["classifiers"][0]["u_san"].as_f64().unwrap();
    assert!(u_san > 0.0 && u_san <= 1.0, "{w}");
    for key in ["ploss", "uloss", "a_know", "a_acc"] {
        assert!(json[key].is_number(), "{key} missing in {json}");
    }
    let plain = evaluate(&out, &[]);
    assert!(plain.get("workload").is_none());
}

#[test]
fn bad_workload_options_are_refused_naming_the_rule() {
    for (args, expected) in [
        (
            &["--workload", "workclass", "--classifiers", "svm"][..],
            "one of j48, rf, nb",
        ),
        (
            &["--workload", "workclass", "--folds", "1"][..],
            "2 <= folds <= 100",
        ),
        (&["--workload", "salary"][..], "\"salary\""),
    ] {
        let output = bin()
            .args(["table", "evaluate", JOB, "--release", INPUT])
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
