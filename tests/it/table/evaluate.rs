//! `cloakd table evaluate` and the measures behind it: hand-computed values on a 4-row table (the
//! original table, the trivial release, a bucketization), bounds and Ploss = brute-force maximum over
//! proptest-generated tables and releases, and the CLI on a sample of Adult.
use std::collections::HashMap;
use std::f64::consts::LN_2;

use cloakd::measures::evaluate::{Baseline, EvaluationOptions, evaluate};
use cloakd::measures::queries::{
    CountQuery, QueryWorkload, Selection, actual_count, estimated_count,
};
use cloakd::measures::released::read_release;
use cloakd::measures::view::ReleaseView;
use cloakd::relational::hierarchy::Hierarchy;
use cloakd::relational::models::PrivacySpec;
use cloakd::relational::release::{
    Formulas, Release, ReleaseMethod, write_csv, write_sensitive_csv,
};
use cloakd::relational::table::{
    ColumnRole, ColumnSchema, QuasiKind, Table, TableSchema, Unlisted, read_csv,
};
use proptest::prelude::*;

use crate::support::bin;

/// Independent JS divergence (natural log), written out from the definition.
fn js(p: &[f64], q: &[f64]) -> f64 {
    let mut total = 0.0;
    for i in 0..p.len() {
        let m = (p[i] + q[i]) / 2.0;
        if p[i] > 0.0 {
            total += 0.5 * p[i] * (p[i] / m).ln();
        }
        if q[i] > 0.0 {
            total += 0.5 * q[i] * (q[i] / m).ln();
        }
    }
    total
}

fn schema() -> TableSchema {
    let sex = Hierarchy::parse("sex", "M;*\nF;*\n").unwrap();
    TableSchema {
        columns: vec![
            ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric)),
            ColumnSchema::new("sex", ColumnRole::Quasi(QuasiKind::Categorical(sex))),
            ColumnSchema::new("disease", ColumnRole::Sensitive { numeric: false }),
        ],
        unlisted: Unlisted::Drop,
    }
}

const ORIGINAL: &str = "age,sex,disease\n30,M,flu\n30,M,cold\n40,F,flu\n40,F,flu\n";

fn table() -> Table {
    read_csv(schema(), ORIGINAL.as_bytes(), "t.csv", b',').unwrap()
}

fn release(table: &Table, csv: &str, sensitive: Option<&str>) -> Release {
    let mut s = sensitive.map(|s| s.as_bytes());
    read_release(
        table,
        csv.as_bytes(),
        "r.csv",
        s.as_mut().map(|r| (r as &mut dyn std::io::Read, "s.csv")),
        b',',
    )
    .unwrap()
}

fn options() -> EvaluationOptions {
    EvaluationOptions {
        min_support: 0.5,
        queries: 50,
        qd: 1,
        sel: 0.5,
        seed: 3,
    }
}

// Q = (cold 1/4, flu 3/4) over the sorted domain [cold, flu].
const Q: [f64; 2] = [0.25, 0.75];

#[test]
fn original_table_hand_computed() {
    let t = table();
    let baseline = Baseline::new(&t, options()).unwrap();
    // Populations with support >= 2: age=30, age=40, sex=M, sex=F, {30,M}, {40,F}.
    assert_eq!(baseline.populations.len(), 6);
    let e = evaluate(&t, &baseline, &release(&t, ORIGINAL, None)).unwrap();
    let ploss = js(&Q, &[0.5, 0.5]).max(js(&Q, &[0.0, 1.0]));
    assert!((e.ploss - ploss).abs() < 1e-12, "{e:?}");
    // A_know = 1/4 (2 * 1/4 + 2 * 1/4); A_acc = 1/4 (2 * 1/2 + 2 * 1) - 3/4 = 0.
    assert!((e.a_know - 0.25).abs() < 1e-12);
    assert!(e.a_acc.abs() < 1e-12);
    assert!(e.uloss.unwrap().abs() < 1e-12);
    assert!(e.query_error.abs() < 1e-12);
    assert_eq!(e.discernibility, 8.0);
    assert_eq!(e.avg_class_size, 2.0);
    assert_eq!(e.classes, 2);
}

#[test]
fn trivial_release_hand_computed() {
    let t = table();
    let baseline = Baseline::new(&t, options()).unwrap();
    let trivial = "age,sex,disease\n*,*,flu\n*,*,flu\n*,*,cold\n*,*,flu\n";
    let e = evaluate(&t, &baseline, &release(&t, trivial, None)).unwrap();
    assert_eq!((e.ploss, e.a_know, e.a_acc), (0.0, 0.0, 0.0));
    // Three populations have P = (1/2, 1/2), three P = (0, 1); each estimated as Q.
    let uloss = (js(&[0.5, 0.5], &Q) + js(&[0.0, 1.0], &Q)) / 2.0;
    assert!(
        (e.uloss.unwrap() - uloss).abs() < 1e-12,
        "{:?} vs {uloss}",
        e.uloss
    );
    assert_eq!(e.discernibility, 16.0);
    assert_eq!(e.avg_class_size, 4.0);
    // COUNT(age = 30 AND disease = flu): actual 1; estimate 4 rows * 1/2 (of {30, 40}) * 3/4 = 1.5.
    let query = CountQuery {
        predicates: vec![(0, Selection::Range { lo: 0, hi: 0 })],
        sensitive: vec![false, true],
    };
    let view = ReleaseView::new(&t, &release(&t, trivial, None)).unwrap();
    assert!((estimated_count(&t, &view, &query) - 1.5).abs() < 1e-12);
    let workload = QueryWorkload {
        queries: vec![query],
        actual: vec![1.0],
        qd: 1,
        sel: 0.5,
    };
    assert!((workload.relative_error(&t, &view) - 0.5).abs() < 1e-12);
}

#[test]
fn generalized_ranges_and_hierarchy_nodes_hand_computed() {
    let t = table();
    // One class with age 30-40 and sex *: the trivial release written with a range.
    let csv = "age,sex,disease\n30-40,*,flu\n30-40,*,flu\n30-40,*,cold\n30-40,*,flu\n";
    let view = ReleaseView::new(&t, &release(&t, csv, None)).unwrap();
    // COUNT(sex = F AND disease = cold): actual 0 rows; estimate 4 * 1/2 * 1/4 = 0.5.
    let query = CountQuery {
        predicates: vec![(1, Selection::Leaves(vec![false, true]))],
        sensitive: vec![true, false],
    };
    assert!((estimated_count(&t, &view, &query) - 0.5).abs() < 1e-12);
}

#[test]
fn bucketization_hand_computed() {
    let t = table();
    let baseline = Baseline::new(&t, options()).unwrap();
    // Groups: 1 = {30M flu, 40F flu}, 2 = {30M cold, 40F flu}.
    let quasi = "age,sex,group\n30,M,1\n40,F,1\n30,M,2\n40,F,2\n";
    let sensitive = "group,disease,count\n1,flu,2\n2,cold,1\n2,flu,1\n";
    let r = release(&t, quasi, Some(sensitive));
    let e = evaluate(&t, &baseline, &r).unwrap();
    let ploss = js(&Q, &[0.0, 1.0]).max(js(&Q, &[0.5, 0.5]));
    assert!((e.ploss - ploss).abs() < 1e-12);
    assert!((e.a_know - 0.25).abs() < 1e-12);
    // Every population mixes both groups: age=30 -> 1/2 (0,1) + 1/2 (1/2,1/2) = (1/4, 3/4) = Q.
    // P(age=30) = P(M) = P(30,M) = (1/2,1/2); P(age=40) = ... = (0,1); all estimated as Q.
    let uloss = (js(&[0.5, 0.5], &Q) + js(&[0.0, 1.0], &Q)) / 2.0;
    assert!(
        (e.uloss.unwrap() - uloss).abs() < 1e-12,
        "{:?} vs {uloss}",
        e.uloss
    );
    // COUNT(age = 30 AND flu): 1 (group 1) + 1/2 (group 2) = 1.5 against 1.
    let query = CountQuery {
        predicates: vec![(0, Selection::Range { lo: 0, hi: 0 })],
        sensitive: vec![false, true],
    };
    let view = ReleaseView::new(&t, &r).unwrap();
    assert!((estimated_count(&t, &view, &query) - 1.5).abs() < 1e-12);
}

#[test]
fn malformed_releases_are_rejected_with_the_rule() {
    let t = table();
    let read = |csv: &str| {
        let r = read_release(&t, csv.as_bytes(), "r.csv", None, b',');
        match r {
            Err(e) => e.to_string(),
            Ok(r) => match ReleaseView::new(&t, &r) {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            },
        }
    };
    assert!(read("age,disease\n30,flu\n").contains("quasi-identifier \"sex\" is missing"));
    assert!(read("age,sex,disease\n50-60,M,flu\n").contains("contains no value"));
    assert!(read("age,sex,disease\n30,X,flu\n").contains("not a node of its hierarchy"));
    assert!(read("age,sex,disease\n30,M,plague\n").contains("does not occur"));
    assert!(read("age,sex,disease\n30,M\n").contains("r.csv:2: 2 fields"));
    let baseline = Baseline::new(&t, options()).unwrap();
    let short = release(&t, "age,sex,disease\n30,M,flu\n", None);
    let err = evaluate(&t, &baseline, &short).unwrap_err().to_string();
    assert!(err.contains("1 rows but the original table 4"), "{err}");
}

/// Brute-force Ploss of a generalized release from its CSV text: group rows on their QI strings.
fn brute_force_ploss(csv: &str) -> f64 {
    let mut classes: HashMap<(String, String), Vec<String>> = HashMap::new();
    let mut all = Vec::new();
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        classes
            .entry((f[0].to_string(), f[1].to_string()))
            .or_default()
            .push(f[2].to_string());
        all.push(f[2].to_string());
    }
    let mut domain = all.clone();
    domain.sort();
    domain.dedup();
    let dist = |values: &[String]| -> Vec<f64> {
        domain
            .iter()
            .map(|d| values.iter().filter(|v| *v == d).count() as f64 / values.len() as f64)
            .collect()
    };
    let q = dist(&all);
    let mut worst: f64 = 0.0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let class = &classes[&(f[0].to_string(), f[1].to_string())];
        worst = worst.max(js(&q, &dist(class)));
    }
    worst
}

fn table_text(rows: &[(u8, bool, u8)]) -> String {
    let mut csv = String::from("age,sex,disease\n");
    for (age, male, d) in rows {
        csv.push_str(&format!("{age},{},d{d}\n", if *male { "M" } else { "F" }));
    }
    csv
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn measures_lie_in_their_bounds_and_ploss_is_the_brute_force_max(
        rows in prop::collection::vec((20u8..30, any::<bool>(), 0u8..4), 1..40),
        k in 1u64..6,
        bucketize in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let t = read_csv(schema(), table_text(&rows).as_bytes(), "t.csv", b',').unwrap();
        let spec = PrivacySpec { k: Some(k), ..PrivacySpec::default() };
        let method = if bucketize { ReleaseMethod::Bucketization } else { ReleaseMethod::Generalization };
        let Ok((released, _)) = cloakd::relational::anonymize(&t, &spec, method, seed) else {
            prop_assume!(false);
            unreachable!();
        };
        // Round trip through the files, as `cloakd table evaluate` reads them.
        let (r, generalized_csv) = match &released {
            Release::Generalized(table) => {
                let mut out = Vec::new();
                write_csv(table, Formulas::default(), &mut out).unwrap();
                let text = String::from_utf8(out).unwrap();
                (release(&t, &text, None), Some(text))
            }
            Release::Bucketized { quasi_table, sensitive_table } => {
                let mut q = Vec::new();
                write_csv(quasi_table, Formulas::default(), &mut q).unwrap();
                let mut s = Vec::new();
                write_sensitive_csv(sensitive_table, Formulas::default(), &mut s).unwrap();
                (release(&t, &String::from_utf8(q).unwrap(), Some(&String::from_utf8(s).unwrap())), None)
            }
        };
        let baseline = Baseline::new(&t, EvaluationOptions { min_support: 0.1, queries: 20, qd: 2, sel: 0.3, seed }).unwrap();
        let e = evaluate(&t, &baseline, &r).unwrap();
        prop_assert!((0.0..=LN_2 + 1e-12).contains(&e.ploss), "{e:?}");
        prop_assert!((0.0..=LN_2 + 1e-12).contains(&e.uloss.unwrap()), "{e:?}");
        prop_assert!((0.0..=1.0).contains(&e.a_know), "{e:?}");
        prop_assert!((0.0..=1.0).contains(&e.a_acc), "{e:?}");
        prop_assert!(e.query_error >= 0.0);
        prop_assert!(e.avg_class_size >= k as f64 - 1e-9);
        if let Some(text) = generalized_csv {
            let brute = brute_force_ploss(&text);
            prop_assert!((e.ploss - brute).abs() < 1e-9, "{} vs brute force {}", e.ploss, brute);
        }
        // The workload's fast paths compute exactly the definitions, to the last bit: every actual
        // answer, and the mean relative error of the per-query estimates.
        let workload = &baseline.workload;
        for (query, &actual) in workload.queries.iter().zip(&workload.actual) {
            prop_assert_eq!(actual, actual_count(&t, query) as f64);
        }
        let view = ReleaseView::new(&t, &r).unwrap();
        let mut sum = 0.0;
        for (query, &actual) in workload.queries.iter().zip(&workload.actual) {
            sum += (estimated_count(&t, &view, query) - actual).abs() / actual;
        }
        let defined = if workload.queries.is_empty() { 0.0 } else { sum / workload.queries.len() as f64 };
        prop_assert_eq!(e.query_error.to_bits(), defined.to_bits(), "{} vs {}", e.query_error, defined);
        // The original table as its own release: no utility lost, every query answered exactly.
        let original = evaluate(&t, &baseline, &release(&t, &table_text(&rows), None)).unwrap();
        prop_assert!(original.uloss.unwrap().abs() < 1e-9, "{original:?}");
        prop_assert!(original.query_error.abs() < 1e-9, "{original:?}");
        prop_assert!((original.ploss - brute_force_ploss(&table_text(&rows))).abs() < 1e-9);
        // Generalization never beats the original on utility nor loses more privacy.
        prop_assert!(e.ploss <= original.ploss + 1e-9);
    }
}

#[test]
fn cli_evaluates_a_release_of_an_adult_sample() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let out = dir.path().join("out.csv");
    let status = bin()
        .args([
            "table",
            "anonymize",
            job,
            "--release",
            "bucketization",
            "--k",
            "20",
            "--output",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let report = dir.path().join("eval.json");
    let output = bin()
        .args(["table", "evaluate", job, "--release"])
        .arg(&out)
        .arg("--sensitive-table")
        .arg(dir.path().join("out.sensitive.csv"))
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for key in [
        "ploss",
        "uloss",
        "a_know",
        "a_acc",
        "query_error",
        "discernibility",
        "avg_class_size",
    ] {
        assert!(json[key].is_number(), "{key} missing in {json}");
    }
    assert!(json["avg_class_size"].as_f64().unwrap() >= 20.0);
    assert!(json["large_populations"].as_u64().unwrap() > 0);

    // A bucketized release without its sensitive table is refused with the reason.
    let output = bin()
        .args(["table", "evaluate", job, "--release"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--sensitive-table"));
}

#[tokio::test]
async fn grpc_evaluate_measures_the_original_table() {
    use cloakd::proto::table_evaluator_client::TableEvaluatorClient;
    use cloakd::proto::{EvaluateRequest, HierarchyFile};
    let config = cloakd::config::Config::load(None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(cloakd::service::evaluation::table_evaluator(
            &config.tables,
            cloakd::jobs::TableJobs::new(&config.tables),
        ))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let handle = tokio::spawn(server);
    let mut client = TableEvaluatorClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let job = "[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nsex = { role = \"quasi\", hierarchy = \"sex.csv\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 1\n";
    let request = EvaluateRequest {
        job_toml: job.into(),
        hierarchies: vec![HierarchyFile {
            path: "sex.csv".into(),
            text: "M;*\nF;*\n".into(),
        }],
        original_csv: ORIGINAL.as_bytes().to_vec(),
        release_csv: ORIGINAL.as_bytes().to_vec(),
        sensitive_csv: Vec::new(),
        min_support: Some(0.5),
        queries: Some(20),
        qd: Some(1),
        sel: Some(0.5),
        query_seed: Some(3),
        ..EvaluateRequest::default()
    };
    let response = client.evaluate(request.clone()).await.unwrap().into_inner();
    let ploss = js(&Q, &[0.5, 0.5]).max(js(&Q, &[0.0, 1.0]));
    assert!((response.ploss - ploss).abs() < 1e-12);
    assert_eq!(response.uloss, Some(0.0));
    assert_eq!(response.large_populations, 6);
    assert!((response.a_know - 0.25).abs() < 1e-12);
    // A release naming a value outside the hierarchy is INVALID_ARGUMENT with the rule.
    let bad = EvaluateRequest {
        release_csv: b"age,sex,disease\n30,X,flu\n30,M,cold\n40,F,flu\n40,F,flu\n".to_vec(),
        ..request
    };
    let status = client.evaluate(bad).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("not a node of its hierarchy"),
        "{}",
        status.message()
    );
    handle.abort();
}
