//! TableEvaluator's learning workload against the real daemon (`daemon::serve` on 127.0.0.1:0): the
//! figures equal those of the real `cloakd table evaluate --workload` binary for the same release
//! (a generalization and a bucketization of an Adult sample); bad options are INVALID_ARGUMENT naming
//! the field and the rule, before any work; only analysts and operators may ask; a workload past `tables.max_job_ms` is
//! stopped between folds and frees its job slot.
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use cloakd::proto::table_evaluator_client::TableEvaluatorClient;
use cloakd::proto::{EvaluateRequest, EvaluateResponse, HierarchyFile};
use tonic::Code;

use crate::support::bin;
use crate::support::security::{as_principal, secured_config};
use crate::support::{TestDaemon, config_with, evaluate_once_a_slot_frees};

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/adult-sample");
const HIERARCHIES: [&str; 5] = ["workclass", "education", "marital-status", "race", "sex"];

fn job() -> String {
    format!("{SAMPLE}/job.toml")
}

/// The header and first `rows` rows of the Adult sample.
fn sample_csv(rows: usize) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(format!("{SAMPLE}/adult-2000.csv.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    text.lines()
        .take(rows + 1)
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The sample's job, hierarchies and `original` inline, `release` as the release, 10 queries.
fn request(original: &[u8], release: &[u8], sensitive: &[u8]) -> EvaluateRequest {
    EvaluateRequest {
        job_toml: std::fs::read_to_string(job()).unwrap(),
        hierarchies: HIERARCHIES
            .iter()
            .map(|h| HierarchyFile {
                path: format!("{h}.csv"),
                text: std::fs::read_to_string(format!("{SAMPLE}/{h}.csv")).unwrap(),
            })
            .collect(),
        original_csv: original.to_vec(),
        release_csv: release.to_vec(),
        sensitive_csv: sensitive.to_vec(),
        queries: Some(10),
        ..EvaluateRequest::default()
    }
}

/// `cloakd table evaluate --workload ...` of `release` against `input`: the JSON report.
fn cli_evaluate(
    input: &Path,
    release: &Path,
    sensitive: Option<&Path>,
    workload: &[&str],
) -> serde_json::Value {
    let mut command = bin();
    command
        .args(["table", "evaluate", &job(), "--queries", "10", "--input"])
        .arg(input)
        .arg("--release")
        .arg(release)
        .args(workload);
    if let Some(sensitive) = sensitive {
        command.arg("--sensitive-table").arg(sensitive);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `figure` equals the report's `json` number: serde_json (without `float_roundtrip`) may parse a
/// printed f64 into its neighbour, so "equal" is within a few units in the last place.
fn assert_same(figure: f64, json: &serde_json::Value, what: &str) {
    let reported = json.as_f64().unwrap();
    assert!(
        (figure - reported).abs() <= 4.0 * f64::EPSILON * figure.abs().max(reported.abs()),
        "{what}: {figure} over gRPC, {reported} from the command line"
    );
}

/// The response's workload equals the report's, figure for figure.
fn assert_same_workload(response: &EvaluateResponse, json: &serde_json::Value) {
    let w = response
        .workload
        .as_ref()
        .expect("a workload in the response");
    let j = &json["workload"];
    assert_eq!(w.attribute, j["attribute"].as_str().unwrap());
    assert_eq!(w.folds, j["folds"].as_u64().unwrap());
    assert_eq!(w.seed, j["seed"].as_u64().unwrap());
    assert_same(w.u_max, &j["u_max"], "u_max");
    assert_same(w.u_base, &j["u_base"], "u_base");
    assert_eq!(
        w.u_base_sanitization,
        j["u_base_sanitization"].as_str().unwrap()
    );
    assert_eq!(
        w.u_base_classifier,
        j["u_base_classifier"].as_str().unwrap()
    );
    let classifiers = j["classifiers"].as_array().unwrap();
    assert_eq!(w.classifiers.len(), classifiers.len());
    for (c, j) in w.classifiers.iter().zip(classifiers) {
        assert_eq!(c.classifier, j["classifier"].as_str().unwrap());
        assert_same(c.u_max, &j["u_max"], "classifier u_max");
        assert_same(c.u_san, &j["u_san"], "u_san");
        assert_same(
            c.u_san_minus_u_base,
            &j["u_san_minus_u_base"],
            "u_san_minus_u_base",
        );
    }
    // The privacy side of the same release, beside it.
    assert_same(response.a_acc, &json["a_acc"], "a_acc");
    assert_same(response.ploss, &json["ploss"], "ploss");
}

#[tokio::test]
async fn the_workload_over_grpc_equals_the_clis() {
    let dir = tempfile::tempdir().unwrap();
    let original = sample_csv(400);
    let input = dir.path().join("original.csv");
    std::fs::write(&input, &original).unwrap();
    let daemon = TestDaemon::start_default().await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);

    // A k = 20 generalization, every classifier, 3 folds.
    let generalized = dir.path().join("generalized.csv");
    let status = bin()
        .args(["table", "anonymize", &job(), "--k", "20", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&generalized)
        .status()
        .unwrap();
    assert!(status.success());
    let json = cli_evaluate(
        &input,
        &generalized,
        None,
        &[
            "--workload",
            "workclass",
            "--classifiers",
            "j48,rf,nb",
            "--folds",
            "3",
            "--seed",
            "5",
        ],
    );
    let response = client
        .evaluate(EvaluateRequest {
            workload: Some("workclass".into()),
            classifiers: vec!["j48".into(), "rf".into(), "nb".into()],
            folds: Some(3),
            workload_seed: Some(5),
            ..request(
                original.as_bytes(),
                &std::fs::read(&generalized).unwrap(),
                &[],
            )
        })
        .await
        .unwrap()
        .into_inner();
    assert_same_workload(&response, &json);
    let w = response.workload.as_ref().unwrap();
    assert_eq!((w.attribute.as_str(), w.folds, w.seed), ("workclass", 3, 5));
    assert_eq!(
        w.classifiers
            .iter()
            .map(|c| c.classifier.as_str())
            .collect::<Vec<_>>(),
        ["j48", "rf", "nb"]
    );

    // A bucketization (its sensitive column dealt from the workload seed), the defaults but the
    // classifier and folds: the CLI's defaults are the service's.
    let bucketized = dir.path().join("bucketized.csv");
    let status = bin()
        .args([
            "table",
            "anonymize",
            &job(),
            "--k",
            "20",
            "--release",
            "bucketization",
            "--input",
        ])
        .arg(&input)
        .arg("--output")
        .arg(&bucketized)
        .status()
        .unwrap();
    assert!(status.success());
    let sensitive = dir.path().join("bucketized.sensitive.csv");
    let json = cli_evaluate(
        &input,
        &bucketized,
        Some(&sensitive),
        &[
            "--workload",
            "occupation",
            "--classifiers",
            "nb",
            "--folds",
            "4",
        ],
    );
    let response = client
        .evaluate(EvaluateRequest {
            workload: Some("occupation".into()),
            classifiers: vec!["nb".into()],
            folds: Some(4),
            ..request(
                original.as_bytes(),
                &std::fs::read(&bucketized).unwrap(),
                &std::fs::read(&sensitive).unwrap(),
            )
        })
        .await
        .unwrap()
        .into_inner();
    assert_same_workload(&response, &json);
    assert_eq!(
        response.workload.as_ref().unwrap().u_base_sanitization,
        "quasi-identifiers removed"
    );

    // Without `workload`, no workload comes back.
    let plain = client
        .evaluate(request(original.as_bytes(), original.as_bytes(), &[]))
        .await
        .unwrap()
        .into_inner();
    assert!(plain.workload.is_none());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_workload_options_are_invalid_naming_the_field_and_the_rule() {
    let daemon = TestDaemon::start_default().await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    let original = sample_csv(50);
    let base = || request(original.as_bytes(), original.as_bytes(), &[]);
    let workclass = || Some("workclass".to_string());
    for (request, expected) in [
        (
            EvaluateRequest {
                workload: workclass(),
                classifiers: vec!["j48".into(), "svm".into()],
                ..base()
            },
            &["classifiers", "\"svm\"", "one of j48, rf, nb"][..],
        ),
        (
            EvaluateRequest {
                workload: workclass(),
                classifiers: vec!["nb".into(), "nb".into()],
                ..base()
            },
            &["classifiers", "at most once"],
        ),
        (
            EvaluateRequest {
                workload: workclass(),
                folds: Some(1),
                ..base()
            },
            &["folds", "2 <= folds <= 100"],
        ),
        (
            EvaluateRequest {
                workload: workclass(),
                folds: Some(101),
                ..base()
            },
            &["folds", "2 <= folds <= 100"],
        ),
        (
            EvaluateRequest {
                classifiers: vec!["nb".into()],
                ..base()
            },
            &["classifiers", "without workload"],
        ),
        (
            EvaluateRequest {
                folds: Some(3),
                ..base()
            },
            &["folds", "without workload"],
        ),
        (
            EvaluateRequest {
                workload_seed: Some(3),
                ..base()
            },
            &["workload_seed", "without workload"],
        ),
        (
            EvaluateRequest {
                workload: Some("salary".into()),
                ..base()
            },
            &["workload", "\"salary\"", "rule:"],
        ),
    ] {
        let status = client.evaluate(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        for part in expected {
            assert!(
                status.message().contains(part),
                "{part:?} not in {:?}",
                status.message()
            );
        }
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn only_analysts_and_operators_ask_for_a_workload() {
    let daemon = TestDaemon::start(secured_config()).await;
    let original = sample_csv(100);
    let workload = EvaluateRequest {
        workload: Some("sex".into()),
        classifiers: vec!["nb".into()],
        folds: Some(2),
        ..request(original.as_bytes(), original.as_bytes(), &[])
    };
    for name in [Some("reader"), Some("app-a"), None] {
        let status = TableEvaluatorClient::new(as_principal(daemon.channel().await, name))
            .evaluate(workload.clone())
            .await
            .expect_err("refused");
        let expected = match name {
            Some(_) => Code::PermissionDenied,
            None => Code::Unauthenticated,
        };
        assert_eq!(status.code(), expected, "{name:?}: {status:?}");
    }
    let response = TableEvaluatorClient::new(as_principal(daemon.channel().await, Some("analyst")))
        .evaluate(workload)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.workload.unwrap().attribute, "sex");
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_workload_past_the_servers_budget_stops_and_frees_its_slot() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.max_concurrent_jobs = 1;
        c.tables.max_job = Duration::from_secs(1);
    }))
    .await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    // The privacy measures of 2,000 rows fit the budget (tens of milliseconds); the forest's 100
    // folds on the original table, two trivial sanitizations and the release do not (seconds), so
    // the budget passes in the learning.
    let original = sample_csv(2_000);
    let plain = client
        .evaluate(request(original.as_bytes(), original.as_bytes(), &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.rows, 2_000);
    let status = client
        .evaluate(EvaluateRequest {
            workload: Some("education".into()),
            classifiers: vec!["rf".into()],
            folds: Some(100),
            ..request(original.as_bytes(), original.as_bytes(), &[])
        })
        .await
        .expect_err("over budget");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("tables.max_job_ms"),
        "{}",
        status.message()
    );
    // The learning stops at its next fold and frees the only slot: a small evaluation gets it.
    let small = sample_csv(50);
    let response = evaluate_once_a_slot_frees(&mut client, || {
        request(small.as_bytes(), small.as_bytes(), &[])
    })
    .await;
    assert_eq!(response.rows, 50);
    daemon.shutdown().await.unwrap();
}
