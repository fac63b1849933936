//! The shipped Adult sample as a structured `TableJob` (its four categorical QIs, sensitive
//! occupation, k = 10, seed 3), run over gRPC and, for comparison, through the `cloakd` binary with
//! the same columns and seed.
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

pub(super) const QUASI: [&str; 4] = ["workclass", "education", "marital-status", "sex"];

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
pub(super) fn structured_job(
    algorithm: &str,
    metric: &str,
    max_suppression: Option<f64>,
) -> TableJob {
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

pub(super) fn requests(job: TableJob) -> Vec<AnonymizeRequest> {
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
pub(super) async fn run(
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

/// The same job through the `cloakd` binary, `privacy` the body of its `[privacy]` (TOML): (header,
/// rows, report JSON).
pub(super) fn run_cli(
    privacy: &str,
    flags: &[&str],
) -> (Vec<String>, Vec<Vec<String>>, serde_json::Value) {
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
    text.push_str(&format!(
        "occupation = {{ role = \"sensitive\" }}\n[privacy]\n{privacy}\n[release]\nseed = 3\n"
    ));
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
