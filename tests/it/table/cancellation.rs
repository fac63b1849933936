//! TableAnonymizer jobs are stopped when nobody wants their result, against the real daemon binary
//! with one table-job slot (`tables.max_concurrent_jobs = 1`): a long Mondrian job whose caller's
//! deadline passes, whose call is dropped, or which runs past `tables.max_job_ms` stops computing —
//! the engine itself reports the stop (`cloakd_table_jobs_stopped_total`), its slot is given back
//! (`cloakd_table_jobs_running` returns to 0, which happens only when the computing thread has
//! returned) — and the next job is then served at its first try.
use std::time::Duration;

use cloakd::proto::anonymize_request::Part as RequestPart;
use cloakd::proto::anonymize_response::Part as ResponsePart;
use cloakd::proto::table_anonymizer_client::TableAnonymizerClient;
use cloakd::proto::{AnonymizeRequest, ColumnSpec, PrivacySpec, Row, RowChunk, TableJob};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::process::{DaemonProcess, Metrics};

const STOPPED: &str = "cloakd_table_jobs_stopped_total";
const RUNNING: &str = "cloakd_table_jobs_running";

/// A job of `rows` rows: two numeric quasi-identifiers with all-distinct values and a sensitive
/// column of `sensitive_values` values, under k = 1 with entropy 1-diversity and JS 1-closeness
/// (every split is admitted, and each admission test costs a pass over the sensitive domain). With
/// 30,000 rows and 3,000 values the upload is under 1 MB and the anonymization takes seconds.
fn job(rows: usize, sensitive_values: usize, k: u64) -> Vec<AnonymizeRequest> {
    let numeric = |name: &str| ColumnSpec {
        name: name.into(),
        role: "quasi".into(),
        kind: "numeric".into(),
        hierarchy: String::new(),
    };
    let mut requests = vec![AnonymizeRequest {
        part: Some(RequestPart::Job(TableJob {
            header: vec!["a".into(), "b".into(), "s".into()],
            columns: vec![
                numeric("a"),
                numeric("b"),
                ColumnSpec {
                    name: "s".into(),
                    role: "sensitive".into(),
                    kind: String::new(),
                    hierarchy: String::new(),
                },
            ],
            privacy: Some(PrivacySpec {
                k,
                l: "entropy:1".into(),
                t: "js:1".into(),
                ..Default::default()
            }),
            seed: 1,
            ..Default::default()
        })),
    }];
    let all: Vec<Row> = (0..rows)
        .map(|i| Row {
            values: vec![
                i.to_string(),
                ((i * 7919) % rows).to_string(),
                format!("v{}", i % sensitive_values),
            ],
        })
        .collect();
    for chunk in all.chunks(5000) {
        requests.push(AnonymizeRequest {
            part: Some(RequestPart::Rows(RowChunk {
                rows: chunk.to_vec(),
            })),
        });
    }
    requests
}

fn long_job() -> Vec<AnonymizeRequest> {
    job(30_000, 3_000, 1)
}

fn client(channel: &Channel) -> TableAnonymizerClient<Channel> {
    TableAnonymizerClient::new(channel.clone()).max_encoding_message_size(64 << 20)
}

/// Runs a small job to its end: it must be served at once (the slot is free) and release every row.
async fn small_job_is_served(channel: &Channel) {
    let mut stream = client(channel)
        .anonymize(tokio_stream::iter(job(40, 4, 2)))
        .await
        .expect("the slot of the stopped job is free")
        .into_inner();
    let mut released = 0;
    while let Some(message) = stream.message().await.unwrap() {
        if let Some(ResponsePart::Rows(chunk)) = message.part {
            released += chunk.rows.len();
        }
    }
    assert_eq!(released, 40);
}

/// Waits until the engine has reported `stopped` stopped anonymizations and no job holds a slot.
fn wait_until_stopped(daemon: &DaemonProcess, stopped: f64) -> Metrics {
    daemon.eventually(|m| {
        m.sum(STOPPED, &[("kind", "anonymize")]) == stopped && m.sum(RUNNING, &[]) == 0.0
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_caller_leaves_stops_and_frees_its_slot() {
    let daemon = DaemonProcess::start("[tables]\nmax_concurrent_jobs = 1\n");
    let channel = daemon.channel().await;

    // 1. A client deadline: tonic drops the call when it passes.
    let mut request = tonic::Request::new(tokio_stream::iter(long_job()));
    request.set_timeout(Duration::from_secs(2));
    let status = client(&channel)
        .anonymize(request)
        .await
        .expect_err("the deadline passes first");
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    wait_until_stopped(&daemon, 1.0);
    small_job_is_served(&channel).await;

    // 2. A dropped call (no deadline sent): the client resets the stream.
    let mut dropping = client(&channel);
    let call = dropping.anonymize(tokio_stream::iter(long_job()));
    assert!(
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .is_err(),
        "the job was still computing when its call was dropped"
    );
    wait_until_stopped(&daemon, 2.0);
    small_job_is_served(&channel).await;

    let m = daemon.scrape();
    let outcome = |o| {
        m.sum(
            "cloakd_table_jobs_total",
            &[("kind", "anonymize"), ("outcome", o)],
        )
    };
    assert_eq!(
        (outcome("cancelled"), outcome("ok")),
        (2.0, 2.0),
        "{}",
        m.text
    );
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_the_servers_budget_stops_and_frees_its_slot() {
    let daemon = DaemonProcess::start("[tables]\nmax_concurrent_jobs = 1\nmax_job_ms = 1000\n");
    let channel = daemon.channel().await;
    // No client deadline: the server's budget alone stops the job. The budget starts once the
    // upload is complete, so this status proves the anonymization itself was running.
    let status = client(&channel)
        .anonymize(tokio_stream::iter(long_job()))
        .await
        .expect_err("the budget passes first");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("tables.max_job_ms") && status.message().contains("1000 ms"),
        "{}",
        status.message()
    );
    wait_until_stopped(&daemon, 1.0);
    small_job_is_served(&channel).await;
    daemon.stop();
}
