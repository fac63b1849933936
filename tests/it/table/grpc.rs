//! TableAnonymizer over the real daemon: the Adult example job (TOML text with its hierarchies
//! inline) and the Adult rows streamed in chunks; the released rows are re-grouped here and checked
//! for k, and the limit on concurrent jobs / rows answers RESOURCE_EXHAUSTED.
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

use cloakd::proto::anonymize_request::Part as RequestPart;
use cloakd::proto::anonymize_response::Part as ResponsePart;
use cloakd::proto::table_anonymizer_client::TableAnonymizerClient;
use cloakd::proto::{AnonymizeRequest, HierarchyText, Row, RowChunk, TableJob};

use crate::support::TestDaemon;

fn examples() -> PathBuf {
    crate::support::repo().join("examples")
}

/// The Adult job and rows as requests (first `limit` rows).
fn adult_requests(limit: usize) -> Vec<AnonymizeRequest> {
    let job_toml = std::fs::read_to_string(examples().join("adult.toml")).unwrap();
    let hierarchies = ["workclass", "education", "marital-status", "race", "sex"]
        .iter()
        .map(|name| {
            let path = format!("data/hierarchies/{name}.csv");
            HierarchyText {
                csv: std::fs::read_to_string(examples().join(&path)).unwrap(),
                name: path,
            }
        })
        .collect();
    let mut csv = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(examples().join("data/adult.csv.gz")).unwrap(),
    )
    .read_to_string(&mut csv)
    .unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows: Vec<Row> = reader
        .records()
        .take(limit)
        .map(|r| Row {
            values: r.unwrap().iter().map(String::from).collect(),
        })
        .collect();
    let mut requests = vec![AnonymizeRequest {
        part: Some(RequestPart::Job(TableJob {
            job_toml,
            hierarchies,
            header,
            ..Default::default()
        })),
    }];
    for chunk in rows.chunks(5000) {
        requests.push(AnonymizeRequest {
            part: Some(RequestPart::Rows(RowChunk {
                rows: chunk.to_vec(),
            })),
        });
    }
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adult_job_streams_a_k_anonymous_release() {
    let daemon = TestDaemon::start_default().await;
    let mut client = TableAnonymizerClient::new(daemon.channel().await);
    let mut responses = client
        .anonymize(tokio_stream::iter(adult_requests(usize::MAX)))
        .await
        .unwrap()
        .into_inner();
    let mut header = Vec::new();
    let mut classes: HashMap<Vec<String>, u64> = HashMap::new();
    let mut rows = 0u64;
    let mut report = None;
    while let Some(m) = responses.message().await.unwrap() {
        match m.part.unwrap() {
            ResponsePart::Header(h) => header = h.columns,
            ResponsePart::Rows(chunk) => {
                for r in chunk.rows {
                    rows += 1;
                    // Every column but the sensitive one is a QI in this job.
                    let key = header
                        .iter()
                        .zip(r.values)
                        .filter(|(name, _)| *name != "occupation")
                        .map(|(_, v)| v)
                        .collect();
                    *classes.entry(key).or_default() += 1;
                }
            }
            ResponsePart::Sensitive(_) => panic!("generalization has no sensitive table"),
            ResponsePart::Report(r) => report = Some(r),
        }
    }
    assert_eq!(
        header,
        [
            "age",
            "workclass",
            "education",
            "marital-status",
            "occupation",
            "race",
            "sex"
        ]
    );
    assert_eq!(rows, 45_222);
    assert!(classes.values().all(|&s| s >= 10));
    let report = report.expect("report last");
    assert_eq!(report.rows, 45_222);
    assert_eq!(report.classes, classes.len() as u64);
    assert!(report.k >= 10);
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_rows_is_resource_exhausted() {
    let mut config = cloakd::config::Config::embedded_defaults();
    config.tables.max_rows = 1000;
    let daemon = TestDaemon::start(config).await;
    let mut client = TableAnonymizerClient::new(daemon.channel().await);
    let status = match client
        .anonymize(tokio_stream::iter(adult_requests(2000)))
        .await
    {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Err(status) => break status,
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("expected RESOURCE_EXHAUSTED"),
                }
            }
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("more than 1000 rows"),
        "{}",
        status.message()
    );
    daemon.shutdown().await.unwrap();
}
