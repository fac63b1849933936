//! TableEvaluator's risk section through the real daemon, on the shipped Adult sample released as
//! itself: the figures equal the classes recomputed here from the CSV and the `risk` object of
//! `cloakd table risk`'s JSON report (the same names), population uniqueness says why it is
//! unavailable without a population, and bad risk options are refused with INVALID_ARGUMENT naming
//! the field before any work.
use std::collections::HashMap;
use std::io::Read;

use cloakd::proto::table_evaluator_client::TableEvaluatorClient;
use cloakd::proto::{EvaluateRequest, HierarchyFile};
use tonic::Code;

use super::ADULT_SAMPLE_QIS as QIS;
use crate::support::{TestDaemon, cloakd, repo};

fn request() -> EvaluateRequest {
    let dir = repo().join("tests/data/adult-sample");
    let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    let hierarchies = QIS[1..]
        .iter()
        .map(|q| HierarchyFile {
            path: format!("{q}.csv"),
            text: std::fs::read_to_string(dir.join(format!("{q}.csv"))).unwrap(),
        })
        .collect();
    let csv = std::fs::read(dir.join("adult-2000.csv.gz")).unwrap();
    EvaluateRequest {
        job_toml: job,
        hierarchies,
        original_csv: csv.clone(),
        release_csv: csv,
        queries: Some(10),
        ..EvaluateRequest::default()
    }
}

/// The class sizes of the sample on the six QIs, from the CSV.
fn classes() -> Vec<u64> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(repo().join("tests/data/adult-sample/adult-2000.csv.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let at: Vec<usize> = QIS
        .iter()
        .map(|q| header.iter().position(|h| h == q).unwrap())
        .collect();
    let mut sizes: HashMap<Vec<String>, u64> = HashMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        *sizes
            .entry(at.iter().map(|&i| row[i].to_string()).collect())
            .or_default() += 1;
    }
    sizes.into_values().collect()
}

#[tokio::test]
async fn the_risk_section_matches_the_classes_and_the_cli() {
    let daemon = TestDaemon::start_default().await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let r = client
        .evaluate(request())
        .await
        .unwrap()
        .into_inner()
        .risk
        .unwrap();
    let sizes = classes();
    let smallest = *sizes.iter().min().unwrap();
    assert_eq!(r.records, 2000);
    assert_eq!(r.classes, sizes.len() as u64);
    assert_eq!(r.threshold, 0.2);
    let p = r.prosecutor.unwrap();
    assert_eq!(p.highest, 1.0 / smallest as f64);
    assert_eq!(p.average, sizes.len() as f64 / 2000.0);
    assert_eq!(p.unavailable, None);
    let uniques = sizes.iter().filter(|&&s| s == 1).count() as u64;
    assert_eq!(r.sample_uniqueness.unwrap().unique_records, uniques);
    assert_eq!(r.journalist.unwrap().against, "sample");
    let none = r.population_uniqueness.unwrap();
    assert!(
        none.unavailable
            .as_deref()
            .is_some_and(|u| u.contains("no population size")),
        "{none:?}"
    );
    // With a sampling fraction: the figures of `cloakd table risk`'s report, under its names.
    let mut with_population = request();
    with_population.sampling_fraction = Some(0.01);
    with_population.risk_threshold = Some(0.05);
    // The job's k (10) is `table risk`'s default k-map.
    with_population.k_map = Some(10);
    let r = client
        .evaluate(with_population)
        .await
        .unwrap()
        .into_inner()
        .risk
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("risk.json");
    let job = repo().join("tests/data/adult-sample/job.toml");
    let o = cloakd(&[
        "table",
        "risk",
        job.to_str().unwrap(),
        "--sampling-fraction",
        "0.01",
        "--threshold",
        "0.05",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let cli = &json["risk"];
    let p = r.prosecutor.unwrap();
    assert_eq!(cli["prosecutor"]["records_at_risk"], p.records_at_risk);
    let k = r.k_map.clone().expect("k_map asked for");
    assert_eq!(cli["k_map"]["k"], k.k);
    assert_eq!(cli["k_map"]["significance"], k.significance);
    assert_eq!(
        cli["k_map"]["sampling_fraction"],
        k.sampling_fraction.unwrap()
    );
    for (name, e) in [("d3", k.d3.unwrap()), ("d4", k.d4.unwrap())] {
        let c = &cli["k_map"][name];
        assert_eq!(c["derived_k"], e.derived_k, "{name}");
        assert_eq!(c["type1_error"], e.type1_error, "{name}");
        assert_eq!(c["satisfied"], e.satisfied, "{name}");
        assert_eq!(c["classes_violating"], e.classes_violating, "{name}");
        assert_eq!(c["records_violating"], e.records_violating, "{name}");
        assert_eq!(
            c["smallest_estimated_population_class"], e.smallest_estimated_population_class,
            "{name}"
        );
        assert_eq!(e.unavailable, None);
    }
    let w = r.prosecutor_wildcard.unwrap();
    for (field, value) in [
        ("highest", w.highest),
        ("lowest", w.lowest),
        ("average", w.average),
        ("records_at_risk", w.records_at_risk),
    ] {
        assert_eq!(cli["prosecutor_wildcard"][field], value, "{field}");
    }
    assert_eq!(cli["marketer"]["average"], r.marketer.unwrap().average);
    let u = r.population_uniqueness.unwrap();
    assert_eq!(
        cli["population_uniqueness"]["population_size"],
        u.population_size
    );
    for (name, e) in [
        ("pitman", &u.pitman),
        ("zayatz", &u.zayatz),
        ("snb", &u.snb),
    ] {
        let e = e.as_ref().unwrap();
        match &e.unavailable {
            None => assert_eq!(cli["population_uniqueness"][name]["uniques"], e.uniques),
            Some(why) => assert_eq!(cli["population_uniqueness"][name]["unavailable"], *why),
        }
    }
    assert_eq!(
        cli["population_uniqueness"]["dankar"]["model"],
        u.dankar_model
    );
    // Bad options name their field.
    for (field, edit) in [
        (
            "risk_threshold",
            (|r: &mut EvaluateRequest| r.risk_threshold = Some(1.5)) as fn(&mut EvaluateRequest),
        ),
        ("population", |r| r.population = Some(0.0)),
        ("sampling_fraction", |r| r.sampling_fraction = Some(2.0)),
    ] {
        let mut bad = request();
        edit(&mut bad);
        let status = client.evaluate(bad).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    daemon.shutdown().await.unwrap();
}

/// SUDA over gRPC (`suda_max_size`) is the `suda` object of `cloakd table risk --suda-max-size M`'s
/// JSON report, under its names; it is absent unless asked for, and a size of 0 or above the
/// release's quasi-identifiers is refused naming the field.
#[tokio::test]
async fn suda_matches_the_cli() {
    let daemon = TestDaemon::start_default().await;
    let mut client = TableEvaluatorClient::new(daemon.channel().await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let without = client.evaluate(request()).await.unwrap().into_inner();
    assert_eq!(
        without.risk.unwrap().suda,
        None,
        "not computed unless asked"
    );
    let dir = tempfile::tempdir().unwrap();
    let job = repo().join("tests/data/adult-sample/job.toml");
    for m in [2u32, 4] {
        let mut asked = request();
        asked.suda_max_size = Some(m);
        asked.sampling_fraction = Some(0.05);
        let s = client
            .evaluate(asked)
            .await
            .unwrap()
            .into_inner()
            .risk
            .unwrap()
            .suda
            .expect("asked for");
        let report = dir.path().join(format!("risk-{m}.json"));
        let o = cloakd(&[
            "table",
            "risk",
            job.to_str().unwrap(),
            "--suda-max-size",
            &m.to_string(),
            "--sampling-fraction",
            "0.05",
            "--report",
            report.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let cli = &super::read_report(&report)["risk"]["suda"];
        assert_eq!(s.unavailable, None);
        assert_eq!(cli["max_size"], s.max_size);
        assert_eq!(s.max_size, u64::from(m));
        assert_eq!(cli["msus_by_size"], serde_json::json!(s.msus_by_size));
        assert_eq!(cli["msus"], s.msus);
        assert_eq!(cli["records_with_msu"], s.records_with_msu);
        assert!(s.records_with_msu > 0);
        for (name, value) in [
            ("highest_score", s.highest_score),
            ("average_score", s.average_score),
            ("dis_fraction", s.dis_fraction),
            ("highest_dis_score", s.highest_dis_score),
            ("average_dis_score", s.average_dis_score),
        ] {
            assert_eq!(cli[name], value, "{name}");
        }
        let contributions: Vec<serde_json::Value> = s
            .attribute_contributions
            .iter()
            .map(|c| serde_json::json!({"attribute": c.attribute, "contribution": c.contribution}))
            .collect();
        assert_eq!(
            cli["attribute_contributions"],
            serde_json::json!(contributions)
        );
    }
    for (m, message) in [
        (0, "suda_max_size = 0: it must be at least 1"),
        (
            QIS.len() as u32 + 1,
            "suda_max_size = 7: more than the release's 6 quasi-identifiers",
        ),
    ] {
        let mut bad = request();
        bad.suda_max_size = Some(m);
        let status = client.evaluate(bad).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with(message),
            "{}",
            status.message()
        );
    }
    daemon.shutdown().await.unwrap();
}
