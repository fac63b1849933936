//! TableEvaluator against the real daemon: a `queries` far past `tables.max_queries` is refused with
//! RESOURCE_EXHAUSTED before anything is allocated (it used to abort the process allocating 206 GB),
//! and an evaluation whose caller's deadline (or the server's `tables.max_job_ms`) passes is
//! cancelled, freeing its job slot at once; a learning workload whose models would pass
//! `tables.max_bytes` is refused with RESOURCE_EXHAUSTED naming the limit; large populations or
//! sensitive histograms past `tables.max_job_bytes` (once allocations of gigabytes that aborted the
//! daemon) leave Uloss unavailable with the reason, the other measures there and the daemon serving.
use std::time::Duration;

use cloakd::proto::table_evaluator_client::TableEvaluatorClient;
use cloakd::proto::{EvaluateRequest, HierarchyFile};
use tonic::Code;

use crate::support::{TestDaemon, config_with, evaluate_once_a_slot_frees};

const QIS: [&str; 5] = ["workclass", "education", "marital-status", "race", "sex"];

fn adult_request(queries: u32) -> EvaluateRequest {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut job = String::from(
        "unlisted = \"drop\"\n[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\noccupation = { role = \"sensitive\" }\n",
    );
    let mut hierarchies = Vec::new();
    for qi in QIS {
        job.push_str(&format!(
            "{qi} = {{ role = \"quasi\", hierarchy = \"{qi}.csv\" }}\n"
        ));
        hierarchies.push(HierarchyFile {
            path: format!("{qi}.csv"),
            text: std::fs::read_to_string(format!("{root}/examples/data/hierarchies/{qi}.csv"))
                .unwrap(),
        });
    }
    job.push_str("[privacy]\nk = 1\n");
    let adult = std::fs::read(format!("{root}/examples/data/adult.csv.gz")).unwrap();
    EvaluateRequest {
        job_toml: job,
        hierarchies,
        original_csv: adult.clone(),
        release_csv: adult,
        sensitive_csv: Vec::new(),
        min_support: Some(0.2),
        queries: Some(queries),
        qd: Some(2),
        sel: Some(0.5),
        query_seed: Some(1),
        ..EvaluateRequest::default()
    }
}

#[tokio::test]
async fn a_huge_query_count_is_refused_and_the_daemon_lives() {
    let daemon = TestDaemon::start_default().await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    for _ in 0..2 {
        let status = client
            .evaluate(adult_request(u32::MAX))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status.message().contains("queries") && status.message().contains("tables.max_queries"),
            "{}",
            status.message()
        );
    }
    // The daemon is alive and evaluates a reasonable request.
    let response = client
        .evaluate(adult_request(10))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.rows, 45_222);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_abandoned_evaluation_is_cancelled_and_frees_its_slot() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.max_queries = 3_000_000;
        c.tables.max_concurrent_jobs = 2;
    }))
    .await;
    let channel = daemon.channel().await;
    // Two calls that would run for minutes, with a 2 s client deadline each: both slots taken.
    let mut calls = Vec::new();
    for _ in 0..2 {
        let mut client =
            TableEvaluatorClient::new(channel.clone()).max_encoding_message_size(64 << 20);
        let mut request = tonic::Request::new(adult_request(3_000_000));
        request.set_timeout(Duration::from_secs(2));
        calls.push(tokio::spawn(async move { client.evaluate(request).await }));
    }
    for call in calls {
        let status = call.await.unwrap().expect_err("deadline");
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{status:?}"
        );
    }
    // The abandoned work stops: a new job gets a slot (before, both slots stayed busy for the
    // whole computation and every other job got RESOURCE_EXHAUSTED).
    let mut client = TableEvaluatorClient::new(channel).max_encoding_message_size(64 << 20);
    let response = evaluate_once_a_slot_frees(&mut client, || adult_request(10)).await;
    assert_eq!(response.rows, 45_222);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_evaluation_past_the_servers_budget_is_stopped() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.max_queries = 3_000_000;
        c.tables.max_concurrent_jobs = 1;
        c.tables.max_job = Duration::from_secs(1);
    }))
    .await;
    let mut client =
        TableEvaluatorClient::new(daemon.channel().await).max_encoding_message_size(64 << 20);
    // No client deadline: tables.max_job_ms stops the measurement.
    let status = client
        .evaluate(adult_request(3_000_000))
        .await
        .expect_err("over budget");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("tables.max_job_ms"),
        "{}",
        status.message()
    );
    daemon.shutdown().await.unwrap();
}

/// `csv` (a table with a header) evaluated against itself as the release under `job_toml`.
fn inline_request(job_toml: &str, csv: String) -> EvaluateRequest {
    EvaluateRequest {
        job_toml: job_toml.into(),
        original_csv: csv.clone().into_bytes(),
        release_csv: csv.into_bytes(),
        min_support: Some(0.5),
        queries: Some(10),
        qd: Some(1),
        sel: Some(0.5),
        query_seed: Some(1),
        ..EvaluateRequest::default()
    }
}

/// A table of `rows` rows, every row with its own sensitive value, evaluated against itself as the
/// release: `rows` classes over `rows` sensitive values.
fn distinct_request(rows: usize) -> EvaluateRequest {
    let mut csv = String::from("a,s\n");
    for i in 0..rows {
        csv.push_str(&format!("{i},v{i}\n"));
    }
    inline_request(
        "[columns]\na = { role = \"quasi\", kind = \"numeric\" }\ns = { role = \"sensitive\" }\n[privacy]\nk = 1\n",
        csv,
    )
}

/// `rows` rows: a constant numeric quasi-identifier, a sensitive value of two, and an insensitive
/// value of its own per row; the release is the table itself (one class, small histograms), the
/// workload learns `workload` with Naive Bayes over 2 folds.
fn workload_request(rows: usize, workload: &str) -> EvaluateRequest {
    let mut csv = String::from("a,s,x\n");
    for i in 0..rows {
        csv.push_str(&format!("1,s{},x{i}\n", i % 2));
    }
    EvaluateRequest {
        workload: Some(workload.into()),
        classifiers: vec!["nb".into()],
        folds: Some(2),
        ..inline_request(
            "[columns]\na = { role = \"quasi\", kind = \"numeric\" }\ns = { role = \"sensitive\" }\nx = { role = \"insensitive\" }\n[privacy]\nk = 1\n",
            csv,
        )
    }
}

#[tokio::test]
async fn a_release_whose_histograms_pass_the_limit_is_refused_before_allocation() {
    // 1 MiB: 131,072 histogram counts of 8 bytes.
    let daemon = TestDaemon::start(config_with(|c| c.tables.max_bytes = 1 << 20)).await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    // 20,000 rows: 20,000 classes x 20,000 values would be 3.2 GB of class and cell histograms.
    let status = client
        .evaluate(distinct_request(20_000))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("release_csv:")
            && status.message().contains("tables.max_bytes"),
        "{}",
        status.message()
    );
    // 200 rows: 2 x 200 x 200 = 80,000 counts, within the limit.
    let response = client
        .evaluate(distinct_request(200))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((response.rows, response.classes), (200, 200));
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_model_past_the_byte_limit_is_refused() {
    // 256 KiB: 32,768 model cells of 8 bytes.
    let daemon = TestDaemon::start(config_with(|c| c.tables.max_bytes = 256 << 10)).await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    // Learning x: 2,000 classes over more than 2,000 values, 4 million cells (32 MB).
    let status = client
        .evaluate(workload_request(2_000, "x"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("workload:")
            && status.message().contains("tables.max_bytes / 8 = 32768"),
        "{}",
        status.message()
    );
    // Learning s from the same table: 2 classes, within the limit.
    let response = client
        .evaluate(workload_request(2_000, "s"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.workload.unwrap().classifiers.len(), 1);
    daemon.shutdown().await.unwrap();
}

/// `rows` rows of `qis` numeric quasi-identifiers and a sensitive value (`q{i}` and `s` as
/// `values` says), with a release whose every QI is `*` (one class): evaluated with `min_support`.
fn qi_request(
    qis: usize,
    rows: usize,
    values: impl Fn(usize, usize) -> usize,
    sensitive: impl Fn(usize) -> usize,
) -> EvaluateRequest {
    let names: Vec<String> = (0..qis).map(|i| format!("q{i}")).collect();
    let mut job = String::from("[columns]\ns = { role = \"sensitive\" }\n");
    for name in &names {
        job.push_str(&format!(
            "{name} = {{ role = \"quasi\", kind = \"numeric\" }}\n"
        ));
    }
    job.push_str("[privacy]\nk = 1\n");
    let header = format!("{},s\n", names.join(","));
    let (mut original, mut release) = (header.clone(), header);
    for row in 0..rows {
        let qs: Vec<String> = (0..qis).map(|q| values(row, q).to_string()).collect();
        original.push_str(&format!("{},v{}\n", qs.join(","), sensitive(row)));
        release.push_str(&format!(
            "{},v{}\n",
            vec!["*"; qis].join(","),
            sensitive(row)
        ));
    }
    EvaluateRequest {
        job_toml: job,
        original_csv: original.into_bytes(),
        release_csv: release.into_bytes(),
        min_support: Some(0.05),
        queries: Some(10),
        qd: Some(1),
        sel: Some(0.5),
        query_seed: Some(1),
        ..EvaluateRequest::default()
    }
}

/// The daemon still answers: health, and a small evaluation.
async fn still_serves(daemon: &TestDaemon) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let health = HealthClient::new(daemon.channel().await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");
    let response = TableEvaluatorClient::new(daemon.channel().await)
        .evaluate(qi_request(2, 6, |row, _| row % 3, |row| row % 2))
        .await
        .unwrap()
        .into_inner();
    assert!(response.uloss.is_some(), "{response:?}");
}

fn assert_uloss_unavailable(response: &cloakd::proto::EvaluateResponse, what: &str) {
    assert_eq!(response.uloss, None, "{response:?}");
    let reason = response.uloss_unavailable.as_deref().unwrap_or_default();
    assert!(
        reason.contains("tables.max_job_bytes") && reason.contains(what),
        "{reason}"
    );
}

#[tokio::test]
async fn large_populations_past_the_memory_budget_leave_uloss_unavailable() {
    // 14 and 16 QIs of 6 rows (every QI row % 3): tens of millions of large populations, which
    // once took 2.35 GB and 5.2 GB (or aborted the daemon) before tables.max_job_ms stopped them.
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.max_job_bytes = 16 << 20;
    }))
    .await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    for qis in [14, 16] {
        let response = client
            .evaluate(qi_request(qis, 6, |row, _| row % 3, |row| row % 2))
            .await
            .unwrap_or_else(|e| panic!("{qis} QIs: {e:?}"))
            .into_inner();
        assert_uloss_unavailable(&response, "large populations");
        // The other measures are there.
        assert_eq!(response.rows, 6);
        assert!(response.ploss >= 0.0);
    }
    still_serves(&daemon).await;
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn many_sensitive_values_past_the_memory_budget_leave_uloss_unavailable() {
    // 8 independent QIs of 3 values, 20,000 rows, 20,000 sensitive values (once an abort
    // allocating 2.1 GB): 6,561 transactions of 20,000 sensitive counts each are 1 GB.
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.max_job_bytes = 64 << 20;
    }))
    .await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await);
    let request = qi_request(
        8,
        20_000,
        |row, q| (row / 3usize.pow(q as u32)) % 3,
        |row| row,
    );
    let response = client.evaluate(request).await.unwrap().into_inner();
    assert_uloss_unavailable(&response, "sensitive values");
    assert_eq!(response.rows, 20_000);
    still_serves(&daemon).await;
    daemon.shutdown().await.unwrap();
}
