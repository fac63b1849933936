//! TableAnonymizer's `algorithm`, `metric` and `max_suppression` over the real daemon
//! (`daemon::serve` on 127.0.0.1:0): an OLA job on the Adult sample streams the very release the
//! `cloakd` binary writes for the same job and flags (one job configuration for both), its report
//! carries OLA's search and the attacks; bad fields are INVALID_ARGUMENT naming the field and the
//! rule; a TOML job's `[release] algorithm` is honoured.
use cloakd::proto::{ColumnSpec, TableJob};

use super::grpc_jobs::{QUASI, run, run_cli, structured_job};
use crate::support::TestDaemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ola_job_releases_what_the_cli_releases() {
    let daemon = TestDaemon::start_default().await;
    let (header, rows, report) = run(&daemon, structured_job("ola", "prec", Some(0.02)))
        .await
        .unwrap();
    assert_eq!(report.algorithm, "ola");
    let json: serde_json::Value = serde_json::from_str(&report.json).unwrap();
    assert_eq!(json["lattice"]["metric"], "prec");
    assert_eq!(json["lattice"]["max_suppression"], 0.02);
    // The attacks are in the typed fields and the JSON.
    assert_eq!(
        json["attacks"]["homogeneity"]["classes"],
        report.homogeneous_classes
    );
    assert_eq!(
        json["attacks"]["unsorted_matching"]["rows_at_input_position"],
        report.rows_at_input_position
    );
    assert!(report.row_order_p_value > 1e-9);
    assert!(report.background_posterior > 0.0 && report.background_posterior <= 1.0);
    // k = 10 on every class but the suppressed rows (every QI `*`).
    let quasi: Vec<usize> = QUASI
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let mut classes: std::collections::HashMap<Vec<&str>, u64> = Default::default();
    for row in &rows {
        *classes
            .entry(quasi.iter().map(|&q| row[q].as_str()).collect())
            .or_default() += 1;
    }
    let suppressed = classes.get(&vec!["*"; 4]).copied().unwrap_or(0);
    assert!(suppressed as f64 <= 0.02 * 2000.0 || classes.len() == 1);
    assert!(
        classes
            .iter()
            .all(|(key, &n)| n >= 10 || key.iter().all(|v| *v == "*"))
    );
    // One job configuration: the binary with the same job and flags writes the same release.
    let (cli_header, cli_rows, cli_report) = run_cli(
        "k = 10",
        &[
            "--algorithm",
            "ola",
            "--metric",
            "prec",
            "--max-suppression",
            "0.02",
        ],
    );
    assert_eq!(cli_header, header);
    assert_eq!(cli_rows, rows);
    assert_eq!(cli_report["lattice"], json["lattice"]);
    // Mondrian (the default) is another release of the same table.
    let (_, mondrian_rows, mondrian) = run(&daemon, structured_job("", "", None)).await.unwrap();
    assert_eq!(mondrian.algorithm, "mondrian");
    assert_ne!(mondrian_rows, rows);
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_algorithm_fields_are_refused_naming_the_field() {
    let daemon = TestDaemon::start_default().await;
    let refused = |job: TableJob| {
        let daemon = &daemon;
        async move {
            let status = run(daemon, job).await.expect_err("refused");
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{}",
                status.message()
            );
            status.message().to_string()
        }
    };
    let m = refused(structured_job("incognito", "", None)).await;
    assert!(m.starts_with("job.algorithm: unknown algorithm"), "{m}");
    let m = refused(structured_job("ola", "loss", None)).await;
    assert!(m.starts_with("job.metric: unknown metric"), "{m}");
    let m = refused(structured_job("ola", "dm", Some(1.5))).await;
    assert!(
        m.starts_with("job.max_suppression:") && m.contains("[0, 1]"),
        "{m}"
    );
    let m = refused(structured_job("mondrian", "", Some(0.1))).await;
    assert!(
        m.starts_with("job.max_suppression:") && m.contains("ola only"),
        "{m}"
    );
    let mut bucket = structured_job("ola", "", None);
    bucket.release = "bucketization".into();
    let m = refused(bucket).await;
    assert!(
        m.starts_with("job.algorithm:") && m.contains("generalization only"),
        "{m}"
    );
    // OLA needs a hierarchy on every QI: the engine's refusal is the status.
    let mut numeric = structured_job("ola", "", None);
    numeric.columns.push(ColumnSpec {
        name: "age".into(),
        role: "quasi".into(),
        kind: "numeric".into(),
        hierarchy: String::new(),
    });
    let m = refused(numeric).await;
    assert!(m.contains("\"age\"") && m.contains("hierarchy"), "{m}");
    // KACA is passed through to the engine, never silently replaced by Mondrian.
    let (_, _, report) = run(&daemon, structured_job("kaca", "", None))
        .await
        .expect("KACA runs through TableAnonymizer");
    assert_eq!(report.algorithm, "kaca");
    daemon.shutdown().await.unwrap();
}

/// A TOML job's `[release] algorithm = "ola"` runs OLA (the service used to run Mondrian whatever
/// the job said), and the structured `algorithm` field overrides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toml_job_algorithm_is_honoured_and_overridden() {
    let daemon = TestDaemon::start_default().await;
    let mut job = structured_job("", "", None);
    let mut toml = String::from("[columns]\n");
    for name in QUASI {
        toml.push_str(&format!(
            "{name} = {{ role = \"quasi\", hierarchy = \"{name}\" }}\n"
        ));
    }
    toml.push_str(
        "occupation = { role = \"sensitive\" }\n[privacy]\nk = 10\n[release]\nalgorithm = \"ola\"\nseed = 3\n",
    );
    job.job_toml = toml;
    job.columns.clear();
    job.privacy = None;
    let (_, _, report) = run(&daemon, job.clone()).await.unwrap();
    assert_eq!(report.algorithm, "ola");
    job.algorithm = "mondrian".into();
    let (_, _, report) = run(&daemon, job).await.unwrap();
    assert_eq!(report.algorithm, "mondrian");
    daemon.shutdown().await.unwrap();
}
