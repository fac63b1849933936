//! TableAnonymizer's `algorithm`, `metric` and `max_suppression` over the real daemon
//! (`daemon::serve` on 127.0.0.1:0): an OLA job on the Adult sample streams the very release the
//! `cloakd` binary writes for the same job and flags (one job configuration for both), its report
//! carries OLA's search and the attacks; bad fields are INVALID_ARGUMENT naming the field and the
//! rule; a TOML job's `[release] algorithm` is honoured.
use std::io::Read;
use std::path::PathBuf;

use cloakd::proto::anonymize_request::Part as RequestPart;
use cloakd::proto::anonymize_response::Part as ResponsePart;
use cloakd::proto::table_anonymizer_client::TableAnonymizerClient;
use cloakd::proto::{
    AnonymizeRequest, ColumnSpec, HierarchyText, PrivacySpec, Row, RowChunk, TableJob, TableReport,
};

use crate::support::TestDaemon;

fn sample() -> PathBuf {
    crate::support::repo().join("tests/data/adult-sample")
}

const QUASI: [&str; 4] = ["workclass", "education", "marital-status", "sex"];

/// The sample's header and rows.
fn sample_rows() -> (Vec<String>, Vec<Row>) {
    let mut csv = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(sample().join("adult-2000.csv.gz")).unwrap())
        .read_to_string(&mut csv)
        .unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| Row {
            values: r.unwrap().iter().map(String::from).collect(),
        })
        .collect();
    (header, rows)
}

/// The structured job: the four categorical QIs, sensitive occupation, k = 10, seed 3.
fn structured_job(algorithm: &str, metric: &str, max_suppression: Option<f64>) -> TableJob {
    let (header, _) = sample_rows();
    let mut columns: Vec<ColumnSpec> = QUASI
        .iter()
        .map(|name| ColumnSpec {
            name: name.to_string(),
            role: "quasi".into(),
            kind: String::new(),
            hierarchy: name.to_string(),
        })
        .collect();
    columns.push(ColumnSpec {
        name: "occupation".into(),
        role: "sensitive".into(),
        kind: String::new(),
        hierarchy: String::new(),
    });
    TableJob {
        header,
        columns,
        privacy: Some(PrivacySpec {
            k: 10,
            ..Default::default()
        }),
        seed: 3,
        hierarchies: QUASI
            .iter()
            .map(|name| HierarchyText {
                name: name.to_string(),
                csv: std::fs::read_to_string(sample().join(format!("{name}.csv"))).unwrap(),
            })
            .collect(),
        algorithm: algorithm.into(),
        metric: metric.into(),
        max_suppression,
        ..Default::default()
    }
}

fn requests(job: TableJob) -> Vec<AnonymizeRequest> {
    let (_, rows) = sample_rows();
    let mut requests = vec![AnonymizeRequest {
        part: Some(RequestPart::Job(job)),
    }];
    for chunk in rows.chunks(500) {
        requests.push(AnonymizeRequest {
            part: Some(RequestPart::Rows(RowChunk {
                rows: chunk.to_vec(),
            })),
        });
    }
    requests
}

/// Runs one job: (header, rows, report) or the status.
async fn run(
    daemon: &TestDaemon,
    job: TableJob,
) -> Result<(Vec<String>, Vec<Vec<String>>, TableReport), tonic::Status> {
    let mut client = TableAnonymizerClient::new(daemon.channel().await);
    let mut responses = client
        .anonymize(tokio_stream::iter(requests(job)))
        .await?
        .into_inner();
    let (mut header, mut rows, mut report) = (Vec::new(), Vec::new(), None);
    while let Some(m) = responses.message().await? {
        match m.part.unwrap() {
            ResponsePart::Header(h) => header = h.columns,
            ResponsePart::Rows(chunk) => rows.extend(chunk.rows.into_iter().map(|r| r.values)),
            ResponsePart::Sensitive(_) => panic!("generalization has no sensitive table"),
            ResponsePart::Report(r) => report = Some(r),
        }
    }
    Ok((header, rows, report.expect("the report comes last")))
}

/// The same job through the `cloakd` binary: (header, rows, report JSON).
fn run_cli(flags: &[&str]) -> (Vec<String>, Vec<Vec<String>>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let h = |name: &str| sample().join(format!("{name}.csv")).display().to_string();
    let mut text = format!(
        "input = {:?}\n[columns]\n",
        sample().join("adult-2000.csv.gz").display().to_string()
    );
    for name in QUASI {
        text.push_str(&format!(
            "{name} = {{ role = \"quasi\", hierarchy = {:?} }}\n",
            h(name)
        ));
    }
    text.push_str(
        "occupation = { role = \"sensitive\" }\n[privacy]\nk = 10\n[release]\nseed = 3\n",
    );
    let job = dir.path().join("job.toml");
    std::fs::write(&job, text).unwrap();
    let out = dir.path().join("out.csv");
    let report = dir.path().join("report.json");
    let mut args = vec![
        "table",
        "anonymize",
        job.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let result = crate::support::bin().args(&args).output().unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let mut reader = csv::Reader::from_path(&out).unwrap();
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    let json = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    (header, rows, json)
}

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
    let (cli_header, cli_rows, cli_report) = run_cli(&[
        "--algorithm",
        "ola",
        "--metric",
        "prec",
        "--max-suppression",
        "0.02",
    ]);
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
