//! Risk bounds as fields of TableAnonymizer's `PrivacySpec`, over the real daemon on the shipped
//! Adult sample: each bound gives a release whose risk, recomputed here from the released rows
//! (class sizes by brute force, the rows whose every QI is `*` left out), is within the bound, and
//! which is the very release the `cloakd` binary writes for the same job; a bound the release cannot
//! meet ends the stream with FAILED_PRECONDITION naming the model, the bound and the measured value,
//! before any row; bad bounds are INVALID_ARGUMENT naming the proto field and the rule.
use std::collections::HashMap;

use cloakd::proto::anonymize_response::Part as ResponsePart;
use cloakd::proto::table_anonymizer_client::TableAnonymizerClient;
use cloakd::proto::{PopulationUniquenessBound, PrivacySpec, TableJob};
use cloakd::risk::Histogram;
use cloakd::risk::population::{Estimate, population_uniqueness};

use super::grpc_jobs::{QUASI, requests, run, run_cli, structured_job};
use crate::support::TestDaemon;

/// The class sizes of released rows on the four QIs, by brute force.
fn class_sizes(header: &[String], rows: &[Vec<String>]) -> Vec<u64> {
    let at: Vec<usize> = QUASI
        .iter()
        .map(|q| header.iter().position(|h| h == q).unwrap())
        .collect();
    let mut sizes: HashMap<Vec<&str>, u64> = HashMap::new();
    for row in rows {
        let key: Vec<&str> = at.iter().map(|&i| row[i].as_str()).collect();
        if key.iter().all(|v| *v == "*") {
            continue;
        }
        *sizes.entry(key).or_default() += 1;
    }
    sizes.into_values().collect()
}

/// The structured job with `privacy` instead of k = 10.
fn bounded(algorithm: &str, privacy: PrivacySpec) -> TableJob {
    TableJob {
        privacy: Some(privacy),
        ..structured_job(algorithm, "", None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bound_gives_a_release_within_it_and_the_clis_release() {
    let daemon = TestDaemon::start_default().await;
    let (population, max) = (100_000.0, 0.001);
    let cases = [
        (
            "mondrian",
            PrivacySpec {
                max_risk_highest: Some(0.05),
                ..Default::default()
            },
            "max_risk_highest = 0.05",
        ),
        (
            "mondrian",
            PrivacySpec {
                max_risk_average: Some(0.01),
                ..Default::default()
            },
            "max_risk_average = 0.01",
        ),
        (
            "ola",
            PrivacySpec {
                population_uniqueness: Some(PopulationUniquenessBound {
                    model: "zayatz".into(),
                    population,
                    max,
                }),
                ..Default::default()
            },
            "population_uniqueness = { model = \"zayatz\", population = 100000, max = 0.001 }",
        ),
        (
            "ola",
            PrivacySpec {
                max_risk_highest: Some(0.1),
                max_risk_average: Some(0.02),
                ..Default::default()
            },
            "max_risk_highest = 0.1\nmax_risk_average = 0.02",
        ),
    ];
    // The release's risk from its rows: (highest, average, Zayatz's share of population uniques).
    let measure = |header: &[String], rows: &[Vec<String>]| {
        let sizes = class_sizes(header, rows);
        let records: u64 = sizes.iter().sum();
        assert!(records > 0);
        let smallest = *sizes.iter().min().unwrap();
        let average = sizes.len() as f64 / records as f64;
        // The model's estimate over the class sizes counted here.
        let all = population_uniqueness(&Histogram::from_sizes(sizes), population);
        let Estimate::Estimated { share, .. } = all.zayatz else {
            panic!("{:?}", all.zayatz)
        };
        (1.0 / smallest as f64, average, share)
    };
    let within = |privacy: &PrivacySpec, (highest, average, share): (f64, f64, f64)| {
        privacy.max_risk_highest.is_none_or(|b| highest <= b)
            && privacy.max_risk_average.is_none_or(|b| average <= b)
            && privacy
                .population_uniqueness
                .as_ref()
                .is_none_or(|u| share <= u.max)
    };
    for (algorithm, privacy, toml) in cases {
        let (header, rows, report) = run(&daemon, bounded(algorithm, privacy.clone()))
            .await
            .unwrap_or_else(|s| panic!("{algorithm} {toml}: {s:?}"));
        assert_eq!(report.algorithm, algorithm);
        let measured = measure(&header, &rows);
        assert!(within(&privacy, measured), "{toml}: {measured:?}");
        // The bound bites: the algorithm's release without it (a bound every release meets) is
        // over it.
        let unbounded = PrivacySpec {
            max_risk_highest: Some(1.0),
            ..Default::default()
        };
        let (free_header, free_rows, _) =
            run(&daemon, bounded(algorithm, unbounded)).await.unwrap();
        let free = measure(&free_header, &free_rows);
        assert!(!within(&privacy, free), "{toml}: {free:?}");
        // The binary with the same job writes the same release.
        let (cli_header, cli_rows, _) = run_cli(toml, &["--algorithm", algorithm]);
        assert_eq!(cli_header, header, "{toml}");
        assert_eq!(cli_rows, rows, "{toml}");
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_over_its_bound_ends_the_stream_before_any_row() {
    let daemon = TestDaemon::start_default().await;
    let job = bounded(
        "mondrian",
        PrivacySpec {
            k: 1,
            population_uniqueness: Some(PopulationUniquenessBound {
                model: "zayatz".into(),
                population: 1_000_000.0,
                max: 0.0,
            }),
            ..Default::default()
        },
    );
    let mut client = TableAnonymizerClient::new(daemon.channel().await);
    let mut rows = 0;
    let status = match client.anonymize(tokio_stream::iter(requests(job))).await {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Err(status) => break status,
                    Ok(Some(m)) => {
                        if let Some(ResponsePart::Rows(chunk)) = m.part {
                            rows += chunk.rows.len();
                        }
                    }
                    Ok(None) => panic!("the release was not refused"),
                }
            }
        }
    };
    assert_eq!(
        status.code(),
        tonic::Code::FailedPrecondition,
        "{}",
        status.message()
    );
    let m = status.message();
    assert!(
        m.starts_with(
            "release refused: population uniqueness (zayatz, population=1000000, max=0): measured "
        ) && m.contains(" > bound 0")
            && m.ends_with("nothing released"),
        "{m}"
    );
    assert_eq!(rows, 0, "no row is released");
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bounds_are_refused_naming_the_field() {
    let daemon = TestDaemon::start_default().await;
    let uniqueness = |model: &str, population: f64, max: f64| {
        Some(PopulationUniquenessBound {
            model: model.into(),
            population,
            max,
        })
    };
    let cases = [
        (
            PrivacySpec {
                max_risk_highest: Some(0.0),
                ..Default::default()
            },
            "job.privacy.max_risk_highest: max_risk_highest must lie in (0, 1]",
        ),
        (
            PrivacySpec {
                k: 5,
                max_risk_average: Some(1.5),
                ..Default::default()
            },
            "job.privacy.max_risk_average: max_risk_average must lie in (0, 1]",
        ),
        (
            PrivacySpec {
                population_uniqueness: uniqueness("poisson", 1e6, 0.1),
                ..Default::default()
            },
            "job.privacy.population_uniqueness.model: unknown population model \"poisson\" (known: pitman, zayatz, snb, dankar)",
        ),
        (
            PrivacySpec {
                population_uniqueness: uniqueness("dankar", 0.0, 0.1),
                ..Default::default()
            },
            "job.privacy.population_uniqueness.population: population must be a finite number >= 1",
        ),
        (
            PrivacySpec {
                population_uniqueness: uniqueness("pitman", 1e6, 2.0),
                ..Default::default()
            },
            "job.privacy.population_uniqueness.max: max must lie in [0, 1]",
        ),
    ];
    for (privacy, message) in cases {
        let status = run(&daemon, bounded("", privacy))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{message}");
        assert_eq!(status.message(), message);
    }
    // Bucketization publishes the exact QIs: bounds are refused, as from the command line.
    let mut bucket = bounded(
        "",
        PrivacySpec {
            k: 5,
            max_risk_highest: Some(0.2),
            ..Default::default()
        },
    );
    bucket.release = "bucketization".into();
    let status = run(&daemon, bucket).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("job.release: max_risk_highest, max_risk_average and population_uniqueness bound generalization and trivial releases"),
        "{}",
        status.message()
    );
    daemon.shutdown().await.unwrap();
}
