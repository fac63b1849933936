//! The workbench's HTTP API against the real daemon (`daemon::serve_reporting` on 127.0.0.1:0 with
//! `ui.listen = "127.0.0.1:0"`): a sweep's points equal `cloakd table frontier`'s frontier.csv for
//! the same job and sweep (the real binary), a release's downloads equal what `cloakd table
//! anonymize` writes from the exported job.toml and pass the independent relational checker
//! (`tests/it/support/relational_checker.rs`: classes recomputed from the released CSV), cancelling
//! frees the job place, bad input gets the error shape naming the field (a body past
//! tables.max_bytes is 413 before it is read), auth and the security headers hold, a
//! non-loopback ui.listen is refused, and the risk of a table and of a release (its record-risk
//! histogram and riskiest classes) equal a brute-force count of the CSV's rows grouped by their
//! quasi-identifier values, without a value of those in the answer, within the limits.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use cloakd::config::Config;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::relational_checker::{check_generalized_csv, parse_csv};
use crate::support::security::{secured_config, token_of};
use crate::support::workbench::{RawReply, Workbench, adult_original, parse_reply, spec_of};
use crate::support::{cloakd, repo};

// ------------------------------------------------------------------------------------------------
// A plain HTTP/1.1 client (no client crate: the test also needs to send a request whose body never
// comes); the daemon is `crate::support::workbench`'s.
// ------------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }

    /// Asserts the status, showing the body when it differs.
    fn status_is(&self, status: u16) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
    }

    /// The error object, checked for the contract's shape.
    fn error(&self, status: u16, code: &str, field: Option<&str>) -> String {
        self.status_is(status);
        let e = &self.json()["error"];
        assert_eq!(e["code"], code, "{e}");
        let message = e["message"].as_str().unwrap().to_string();
        if let Some(field) = field {
            assert_eq!(e["field"], field, "{e}");
            assert!(message.contains(field), "{message}");
        }
        message
    }
}

/// One request on a fresh connection (`Connection: close`); `body` is sent with its length.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    if let Some(body) = body {
        stream.write_all(body).await.unwrap();
    }
    read_reply(&mut stream).await
}

async fn read_reply(stream: &mut tokio::net::TcpStream) -> Reply {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(600), stream.read_to_end(&mut raw))
        .await
        .expect("a reply in time")
        .unwrap();
    let RawReply {
        status,
        headers,
        body,
    } = parse_reply(&raw);
    Reply {
        status,
        headers,
        body,
    }
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    call(addr, "GET", path, None, None).await
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    call(
        addr,
        "POST",
        path,
        None,
        Some(&serde_json::to_vec(body).unwrap()),
    )
    .await
}

/// Runs `cloakd ARGS`, failing the test unless it succeeds.
fn cloakd_succeeds(args: &[&str]) {
    let out = cloakd(args);
    assert!(
        out.status.success(),
        "cloakd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory where a job saved from the page runs as it would in `examples/`: `data/` is the
/// examples' data.
fn job_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo().join("examples/data"), dir.path().join("data")).unwrap();
    dir
}

async fn wait_done(addr: SocketAddr, sweep: &str) -> Value {
    for _ in 0..6000 {
        let status = get(addr, &format!("/api/v1/sweeps/{sweep}")).await.json();
        if status["state"] != "running" {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the sweep did not finish");
}

fn adult_job() -> String {
    std::fs::read_to_string(repo().join("examples/adult.toml")).unwrap()
}

/// The report without its `seconds` (the wall time of one run), as text.
fn without_seconds(report: &[u8]) -> String {
    String::from_utf8(report.to_vec())
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("\"seconds\":"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------------------------------------------------------
// The tests
// ------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_equals_the_cli_frontier_and_its_releases_the_cli_anonymization() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;

    let examples = get(ui, "/api/v1/examples").await.json();
    assert_eq!(examples[0]["name"], "adult");
    assert_eq!(examples[0]["rows"], 45_222);
    let table = post(ui, "/api/v1/tables", &json!({"example": "adult"})).await;
    table.status_is(200);
    let table = table.json();
    assert_eq!(table["rows"], 45_222);
    assert_eq!(table["name"], "data/adult.csv.gz");
    assert_eq!(table["job"], adult_job());
    let age = &table["columns"][0];
    assert_eq!(age["name"], "age");
    assert_eq!(age["kind"], "numeric");
    assert_eq!(age["distinct"], 74);
    assert!(
        table["files"]
            .as_array()
            .unwrap()
            .contains(&json!("data/hierarchies/workclass.csv"))
    );

    // Few COUNT queries: the daemon and the CLI use the same, and debug builds are slow.
    let sweep = post(
        ui,
        "/api/v1/sweeps",
        &json!({"table": table["table"], "job": adult_job(), "k": [5, 10], "l": [2], "t": [],
                "delta": [], "methods": ["generalization"], "algorithms": ["mondrian"],
                "queries": 50}),
    )
    .await;
    sweep.status_is(202);
    let sweep = sweep.json();
    assert_eq!(sweep["total"], 3);
    let id = sweep["sweep"].as_str().unwrap().to_string();
    let status = wait_done(ui, &id).await;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"], 3);
    let points = status["points"].as_array().unwrap();
    assert_eq!(points.len(), 3);

    // The CLI's frontier of the same job and sweep.
    let dir = job_dir();
    let job_path = dir.path().join("adult.toml");
    std::fs::write(&job_path, adult_job()).unwrap();
    let out = dir.path().join("frontier");
    cloakd_succeeds(&[
        "table",
        "frontier",
        job_path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--k",
        "5,10",
        "--l",
        "2",
        "--t",
        "--delta",
        "--methods",
        "generalization",
        "--algorithms",
        "mondrian",
        "--queries",
        "50",
    ]);
    let (header, rows) = parse_csv(&std::fs::read(out.join("frontier.csv")).unwrap());
    assert!(header.contains(&"whd".to_string()) && header.contains(&"dm".to_string()));
    assert_eq!(rows.len(), points.len());
    for (row, point) in rows.iter().zip(points) {
        for (name, value) in header.iter().zip(row) {
            if name == "seconds" {
                continue;
            }
            let got = &point[name.as_str()];
            match got {
                Value::Null => assert_eq!(value, "", "{name}"),
                Value::Bool(b) => assert_eq!(value, &b.to_string(), "{name}"),
                Value::String(s) => assert_eq!(value, s, "{name}"),
                Value::Number(n) => assert_eq!(
                    value.parse::<f64>().unwrap(),
                    n.as_f64().unwrap(),
                    "{name} of {point}"
                ),
                other => panic!("{name}: {other}"),
            }
        }
    }

    // Release 2 (probabilistic l = 2): the page's view, its downloads, and the CLI on job.toml.
    let release = get(ui, &format!("/api/v1/sweeps/{id}/releases/2")).await;
    release.status_is(200);
    let release = release.json();
    assert!(
        release["job"]
            .as_str()
            .unwrap()
            .contains("l = \"probabilistic:2\"")
    );
    assert_eq!(release["preview"]["rows"].as_array().unwrap().len(), 100);
    let classes = release["classes"].as_u64().unwrap();
    assert_eq!(release["report"]["classes"], classes);
    let sizes: u64 = release["class_sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["size"].as_u64().unwrap() * c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sizes, 45_222);
    let job = get(ui, &format!("/api/v1/sweeps/{id}/releases/2/job.toml")).await;
    assert_eq!(job.header("cache-control"), "no-store");
    assert!(job.header("content-disposition").starts_with("attachment"));
    assert_eq!(job.body, release["job"].as_str().unwrap().as_bytes());
    let csv = get(ui, &format!("/api/v1/sweeps/{id}/releases/2/release.csv")).await;
    assert_eq!(csv.status, 200);
    assert!(csv.header("content-disposition").starts_with("attachment"));
    assert_eq!(csv.header("cache-control"), "no-store");
    let report = get(ui, &format!("/api/v1/sweeps/{id}/releases/2/report.json")).await;
    assert_eq!(report.status, 200);
    let exported = dir.path().join("release.toml");
    std::fs::write(&exported, &job.body).unwrap();
    let (cli_csv, cli_report) = (dir.path().join("r.csv"), dir.path().join("r.json"));
    cloakd_succeeds(&[
        "table",
        "anonymize",
        exported.to_str().unwrap(),
        "--output",
        cli_csv.to_str().unwrap(),
        "--report",
        cli_report.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&cli_csv).unwrap() == csv.body,
        "release.csv differs from the CLI's"
    );
    assert_eq!(
        without_seconds(&std::fs::read(&cli_report).unwrap()),
        without_seconds(&report.body)
    );
    let mut page_report = release["report"].clone();
    let mut file_report: Value = serde_json::from_slice(&report.body).unwrap();
    page_report["seconds"] = json!(0);
    file_report["seconds"] = json!(0);
    assert_eq!(page_report, file_report);
    // The independent checker (tests/it/support/relational_checker.rs) on both downloads; Mondrian's
    // regions are checked for containment in the browser test, here each class against its model.
    let adult = adult_original();
    check_generalized_csv(&adult, &spec_of("l-diversity", 2.0), &csv.body, false);
    let k10 = get(ui, &format!("/api/v1/sweeps/{id}/releases/1/release.csv")).await;
    check_generalized_csv(&adult, &spec_of("k-anonymity", 10.0), &k10.body, false);

    // One class's sensitive distribution against the table's.
    let class = get(ui, &format!("/api/v1/sweeps/{id}/releases/1/classes/0"))
        .await
        .json();
    let s = &class["sensitive"];
    assert_eq!(s["attribute"], "occupation");
    let in_class: u64 = s["class"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(in_class, class["size"].as_u64().unwrap());
    assert!(in_class >= 10);
    let in_table: u64 = s["table"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(in_table, 45_222);
    get(
        ui,
        &format!("/api/v1/sweeps/{id}/releases/1/classes/{}", u32::MAX),
    )
    .await
    .error(404, "not_found", Some("c"));
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_sweep_frees_its_job_place() {
    let mut config = Config::embedded_defaults();
    config.tables.max_concurrent_jobs = 1;
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    let table = post(ui, "/api/v1/tables", &json!({"example": "adult"}))
        .await
        .json();
    // The default sweep: dozens of releases, far from done when cancelled.
    let body = json!({"table": table["table"], "job": adult_job(), "queries": 50});
    let first = post(ui, "/api/v1/sweeps", &body).await;
    assert_eq!(first.status, 202);
    let id = first.json()["sweep"].as_str().unwrap().to_string();
    let busy = post(ui, "/api/v1/sweeps", &body).await;
    let message = busy.error(429, "resource_exhausted", None);
    assert!(message.contains("tables.max_concurrent_jobs"), "{message}");
    let cancelled = call(ui, "DELETE", &format!("/api/v1/sweeps/{id}"), None, None).await;
    assert_eq!(cancelled.status, 200);
    assert_eq!(cancelled.json()["state"], "cancelled");
    // The place comes back once the releases have seen the flag.
    let mut started = None;
    for _ in 0..600 {
        let again = post(ui, "/api/v1/sweeps", &body).await;
        if again.status == 202 {
            started = Some(again.json()["sweep"].as_str().unwrap().to_string());
            break;
        }
        assert_eq!(again.status, 429);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = started.expect("the cancelled sweep's place was freed");
    let status = get(ui, &format!("/api/v1/sweeps/{id}")).await.json();
    assert_eq!(status["state"], "cancelled");
    assert!(status["done"].as_u64().unwrap() < status["total"].as_u64().unwrap());
    call(ui, "DELETE", &format!("/api/v1/sweeps/{again}"), None, None).await;
    daemon.shutdown().await;
}

const SMALL_CSV: &str = "age,sex,disease\n30,Male,flu\n31,Female,cold\n32,Male,flu\n33,Female,cough\n34,Male,cold\n35,Female,flu\n";
const SMALL_JOB: &str = "input = \"small.csv\"\n[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nsex = { role = \"quasi\", hierarchy = \"sex.csv\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_error_shape_naming_the_field() {
    let mut config = Config::embedded_defaults();
    config.tables.max_bytes = 4096;
    config.tables.max_rows = 10;
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;

    // A body past tables.max_bytes: refused by its declared length before any of it is sent...
    let mut stream = tokio::net::TcpStream::connect(ui).await.unwrap();
    let head = format!(
        "POST /api/v1/tables HTTP/1.1\r\nHost: {ui}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let reply = read_reply(&mut stream).await;
    reply.error(413, "resource_exhausted", Some("body"));
    // ... and, without a length, as soon as it passes the limit.
    let mut stream = tokio::net::TcpStream::connect(ui).await.unwrap();
    let head = format!(
        "POST /api/v1/tables HTTP/1.1\r\nHost: {ui}\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 1024];
    for _ in 0..8 {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break;
        }
    }
    read_reply(&mut stream)
        .await
        .error(413, "resource_exhausted", Some("body"));

    let too_many: String = std::iter::once("age,sex,disease\n".to_string())
        .chain((0..11).map(|i| format!("{},Male,flu\n", 20 + i)))
        .collect();
    post(
        ui,
        "/api/v1/tables",
        &json!({"name": "t.csv", "csv": too_many}),
    )
    .await
    .error(413, "resource_exhausted", Some("csv"));
    post(ui, "/api/v1/tables", &json!({"example": "nope"}))
        .await
        .error(400, "invalid_argument", Some("example"));
    post(
        ui,
        "/api/v1/tables",
        &json!({"name": "t.csv", "csv": "a,b\n1,2\n", "bogus": 1}),
    )
    .await
    .error(400, "invalid_argument", Some("body"));

    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "small.csv", "csv": SMALL_CSV, "hierarchies": {"sex.csv": "Male;*\nFemale;*\n"}}),
    )
    .await;
    table.status_is(200);
    let table = table.json();
    assert_eq!(table["columns"][1]["hierarchies"], json!(["sex.csv"]));
    assert_eq!(table["columns"][0]["kind"], "numeric");
    let id = table["table"].clone();
    let sweep = |extra: Value| {
        let mut body = json!({"table": id, "job": SMALL_JOB, "k": [2], "l": [], "t": [], "delta": [], "queries": 10});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    // Each bad field is refused by name.
    for (extra, field) in [
        (json!({"k": [0]}), "k"),
        (json!({"t_distance": "hamming"}), "t_distance"),
        (json!({"algorithms": ["incognito"]}), "algorithms"),
        (json!({"job": "[columns\nage = 1"}), "job"),
    ] {
        post(ui, "/api/v1/sweeps", &sweep(extra))
            .await
            .error(400, "invalid_argument", Some(field));
    }
    let unknown = SMALL_JOB.replace("disease = ", "illness = ");
    let message = post(ui, "/api/v1/sweeps", &sweep(json!({"job": unknown})))
        .await
        .error(400, "invalid_argument", Some("job"));
    assert!(message.contains("illness"), "{message}");
    let elsewhere = SMALL_JOB.replace("\"sex.csv\"", "\"/etc/passwd\"");
    post(ui, "/api/v1/sweeps", &sweep(json!({"job": elsewhere})))
        .await
        .error(400, "invalid_argument", Some("job"));
    post(ui, "/api/v1/sweeps", &sweep(json!({"table": "0123"})))
        .await
        .error(404, "not_found", Some("table"));
    get(ui, "/api/v1/sweeps/feedface")
        .await
        .error(404, "not_found", Some("id"));

    // A good sweep on the small table runs, and a release it cannot make is left out.
    let ok = post(
        ui,
        "/api/v1/sweeps",
        &sweep(json!({"k": [2, 50], "methods": ["generalization"]})),
    )
    .await;
    ok.status_is(202);
    let sid = ok.json()["sweep"].as_str().unwrap().to_string();
    let status = wait_done(ui, &sid).await;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["points"].as_array().unwrap().len(), 1);
    assert_eq!(status["left_out"][0]["release"], 1);
    get(ui, &format!("/api/v1/sweeps/{sid}/releases/7"))
        .await
        .error(404, "not_found", Some("n"));
    get(ui, &format!("/api/v1/sweeps/{sid}/releases/1"))
        .await
        .error(409, "failed_precondition", None);
    daemon.shutdown().await;
}

/// An analyst's own files: the delimiter detected or chosen, hierarchies with either separator, and
/// a file that is not a table refused in plain words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_tables_are_read_with_their_delimiter_and_non_tables_are_refused() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;
    // `;` is detected from the header; the suggested job names it, and a sweep reads the table with it.
    let semicolons = SMALL_CSV.replace(',', ";");
    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "small.csv", "csv": semicolons, "hierarchies": {"sex.csv": "Male,*\nFemale,*\n"}}),
    )
    .await;
    table.status_is(200);
    let table = table.json();
    assert_eq!(table["columns"].as_array().unwrap().len(), 3, "{table}");
    assert_eq!(table["columns"][0]["kind"], "numeric");
    let suggested = table["job"].as_str().unwrap();
    assert!(suggested.contains("delimiter = \";\""), "{suggested}");
    let job = SMALL_JOB.replace("[columns]", "delimiter = \";\"\n[columns]");
    let started = post(
        ui,
        "/api/v1/sweeps",
        &json!({"table": table["table"], "job": job, "k": [2], "l": [], "t": [], "delta": [], "methods": ["generalization"]}),
    )
    .await;
    started.status_is(202);
    let status = wait_done(ui, started.json()["sweep"].as_str().unwrap()).await;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["points"].as_array().unwrap().len(), 1, "{status}");

    // A chosen delimiter wins over detection; a bad one is refused by name.
    let tabs = SMALL_CSV.replace(',', "\t");
    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "t.tsv", "csv": tabs, "delimiter": "\t"}),
    )
    .await;
    table.status_is(200);
    assert_eq!(table.json()["columns"].as_array().unwrap().len(), 3);
    post(
        ui,
        "/api/v1/tables",
        &json!({"name": "t.csv", "csv": SMALL_CSV, "delimiter": "ab"}),
    )
    .await
    .error(400, "invalid_argument", Some("delimiter"));

    // Prose is one column: refused, saying why and what to change.
    let message = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "letter.txt", "csv": "Dear analyst\nthis is not a table\nat all\n"}),
    )
    .await
    .error(400, "invalid_argument", Some("delimiter"));
    assert!(message.contains("one column found"), "{message}");
    // Binary data (what a browser makes of an image or an archive) is not a table.
    let message = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "photo.csv", "csv": "PK\u{3}\u{4}\u{0}\u{0}\u{fffd}\u{fffd},x\n1,2\n"}),
    )
    .await
    .error(400, "invalid_argument", Some("csv"));
    assert!(message.contains("not a text table"), "{message}");
    // A header alone has no rows to anonymize.
    let message = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "h.csv", "csv": "age,sex,disease\n"}),
    )
    .await
    .error(400, "invalid_argument", Some("csv"));
    assert!(message.contains("no rows"), "{message}");

    // The hierarchy builder's two calls: a column's distinct values, and adding a hierarchy that
    // must cover them to the table (a new version under the same id).
    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "small.csv", "csv": SMALL_CSV}),
    )
    .await;
    table.status_is(200);
    let id = table.json()["table"].as_str().unwrap().to_string();
    let values = get(ui, &format!("/api/v1/tables/{id}/columns/sex/values")).await;
    values.status_is(200);
    assert_eq!(
        values.json()["values"],
        json!([{"value": "Male", "count": 3}, {"value": "Female", "count": 3}])
    );
    get(ui, &format!("/api/v1/tables/{id}/columns/nope/values"))
        .await
        .error(400, "invalid_argument", Some("column"));
    let message = post(
        ui,
        &format!("/api/v1/tables/{id}/hierarchies"),
        &json!({"path": "hierarchies/sex-built.csv", "text": "Male;*\n", "column": "sex"}),
    )
    .await
    .error(400, "invalid_argument", Some("text"));
    assert!(message.contains("\"Female\""), "{message}");
    post(
        ui,
        &format!("/api/v1/tables/{id}/hierarchies"),
        &json!({"path": "small.csv", "text": "Male;*\nFemale;*\n"}),
    )
    .await
    .error(400, "invalid_argument", Some("path"));
    let added = post(
        ui,
        &format!("/api/v1/tables/{id}/hierarchies"),
        &json!({"path": "hierarchies/sex-built.csv", "text": "Male,person,*\nFemale,person,*\n", "column": "sex"}),
    )
    .await;
    added.status_is(200);
    let added = added.json();
    assert_eq!(added["table"], id.as_str());
    assert_eq!(
        added["files"],
        json!(["small.csv", "hierarchies/sex-built.csv"])
    );
    let job = SMALL_JOB.replace("sex.csv", "hierarchies/sex-built.csv");
    let started = post(
        ui,
        "/api/v1/sweeps",
        &json!({"table": id, "job": job, "k": [2], "l": [], "t": [], "delta": [], "methods": ["generalization"]}),
    )
    .await;
    started.status_is(202);
    let sid = started.json()["sweep"].as_str().unwrap().to_string();
    let status = wait_done(ui, &sid).await;
    assert_eq!(status["points"].as_array().unwrap().len(), 1, "{status}");

    // One attribute's distribution in the input against the release (the comparison view).
    let d = get(
        ui,
        &format!("/api/v1/sweeps/{sid}/releases/0/distribution/sex"),
    )
    .await;
    d.status_is(200);
    let d = d.json();
    assert_eq!(
        d["input"],
        json!({"values": [{"value": "Female", "count": 3}, {"value": "Male", "count": 3}], "other": 0})
    );
    let released: u64 = d["release"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["count"].as_u64().unwrap())
        .sum::<u64>()
        + d["release"]["other"].as_u64().unwrap();
    assert_eq!(released, 6, "{d}");
    get(
        ui,
        &format!("/api/v1/sweeps/{sid}/releases/0/distribution/nope"),
    )
    .await
    .error(400, "invalid_argument", Some("column"));
    daemon.shutdown().await;
}

/// The probe's table of about 250 bytes: 16 numeric QIs (every one row % 3) and `s` = row % 2, 6 rows.
fn many_qis_csv() -> (String, String) {
    let names: Vec<String> = (0..16).map(|i| format!("q{i}")).collect();
    let mut csv = format!("{},s\n", names.join(","));
    for row in 0..6 {
        let qs = vec![(row % 3).to_string(); 16];
        csv.push_str(&format!("{},{}\n", qs.join(","), row % 2));
    }
    let mut job = String::from("input = \"q.csv\"\n[columns]\ns = { role = \"sensitive\" }\n");
    for name in &names {
        job.push_str(&format!(
            "{name} = {{ role = \"quasi\", kind = \"numeric\" }}\n"
        ));
    }
    job.push_str("[privacy]\nk = 2\n");
    (csv, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_and_uploads_stay_within_the_memory_budget_and_the_sweep_limits() {
    let mut config = Config::embedded_defaults();
    config.tables.max_job_bytes = 16 << 20;
    config.tables.max_sweep_points = 10;
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    let (csv, job) = many_qis_csv();
    assert!(csv.len() < 300, "{}", csv.len());
    let table = post(ui, "/api/v1/tables", &json!({"name": "q.csv", "csv": csv})).await;
    table.status_is(200);
    let id = table.json()["table"].clone();

    // Its Mondrian sweep once aborted the daemon allocating 3 GB for the large populations: the
    // sweep completes, every point's Uloss unavailable with the reason.
    let sweep = |extra: Value| {
        let mut body = json!({"table": id, "job": job, "k": [2], "l": [], "t": [], "delta": [], "queries": 10});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let started = post(ui, "/api/v1/sweeps", &sweep(json!({}))).await;
    started.status_is(202);
    let sid = started.json()["sweep"].as_str().unwrap().to_string();
    let status = wait_done(ui, &sid).await;
    assert_eq!(status["state"], "done", "{status}");
    let points = status["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{status}");
    for point in points {
        assert_eq!(point["uloss"], Value::Null, "{point}");
        let reason = point["uloss_unavailable"].as_str().unwrap_or_default();
        assert!(
            reason.contains("tables.max_job_bytes") && reason.contains("large populations"),
            "{point}"
        );
        assert!(point["ploss"].is_number(), "{point}");
    }

    // A k listing one value 100,000 times is refused before anything is made; duplicates of a
    // few values collapse into one release each.
    let message = post(
        ui,
        "/api/v1/sweeps",
        &sweep(json!({"k": vec![45223; 100_000]})),
    )
    .await
    .error(400, "invalid_argument", Some("k"));
    assert!(message.contains("tables.max_sweep_values"), "{message}");
    let twice = post(
        ui,
        "/api/v1/sweeps",
        &sweep(json!({"k": [3, 3, 3.0], "methods": ["generalization"]})),
    )
    .await;
    twice.status_is(202);
    assert_eq!(twice.json()["total"], 1);
    let twice = twice.json()["sweep"].as_str().unwrap().to_string();
    wait_done(ui, &twice).await;
    // More releases than tables.max_sweep_points (6 values x 2 methods = 12 > 10).
    let message = post(
        ui,
        "/api/v1/sweeps",
        &sweep(json!({"k": [2, 3, 4, 5, 6, 7]})),
    )
    .await
    .error(400, "invalid_argument", Some("sweep"));
    assert!(message.contains("tables.max_sweep_points"), "{message}");
    // l must be a finite number >= 1.
    for l in [json!(-1), json!(0.5)] {
        post(ui, "/api/v1/sweeps", &sweep(json!({"k": [], "l": [l]})))
            .await
            .error(400, "invalid_argument", Some("l"));
    }

    // A header naming a column twice is refused.
    let message = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "d.csv", "csv": "a,b,a\n1,2,3\n"}),
    )
    .await
    .error(400, "invalid_argument", Some("csv"));
    assert!(message.contains("more than once"), "{message}");
    // An upload past the job's memory is refused naming the limit (the body alone is 21 MB,
    // within tables.max_bytes).
    let big: String = std::iter::once("a,b\n".to_string())
        .chain((0..2_000_000).map(|i| format!("{i},{}\n", i % 7)))
        .collect();
    assert!(big.len() > 16 << 20);
    let message = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "big.csv", "csv": big}),
    )
    .await
    .error(413, "resource_exhausted", None);
    assert!(message.contains("tables.max_job_bytes"), "{message}");

    // The daemon still serves.
    get(ui, "/api/v1/session").await.status_is(200);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_roles_scopes_and_security_headers() {
    let daemon = Workbench::start(secured_config()).await;
    let ui = daemon.ui;
    // The page is public and every response carries the security headers.
    for path in ["/", "/app.js", "/app.css", "/LICENSES.txt"] {
        let reply = get(ui, path).await;
        assert_eq!(reply.status, 200, "{path}");
        assert!(
            reply
                .header("content-security-policy")
                .contains("default-src 'none'; script-src 'self'"),
            "{path}"
        );
        assert_eq!(reply.header("x-content-type-options"), "nosniff");
        assert_eq!(reply.header("referrer-policy"), "no-referrer");
        assert_eq!(reply.header("x-frame-options"), "DENY");
    }
    let index = String::from_utf8(get(ui, "/").await.body).unwrap();
    assert!(index.contains("app.js") && index.contains("app.css"));

    let none = get(ui, "/api/v1/session").await;
    none.error(401, "unauthenticated", Some("authorization"));
    assert_eq!(none.header("cache-control"), "no-store");
    assert!(
        none.header("content-security-policy")
            .contains("frame-ancestors 'none'")
    );
    call(ui, "GET", "/api/v1/session", Some("not-a-token"), None)
        .await
        .error(401, "unauthenticated", Some("authorization"));
    let consumer = call(
        ui,
        "GET",
        "/api/v1/examples",
        Some(&token_of("reader")),
        None,
    )
    .await;
    let message = consumer.error(403, "permission_denied", Some("role"));
    assert!(!message.contains(&token_of("reader")));
    let session = call(
        ui,
        "GET",
        "/api/v1/session",
        Some(&token_of("analyst")),
        None,
    )
    .await;
    assert_eq!(session.status, 200);
    assert_eq!(session.header("cache-control"), "no-store");
    let session = session.json();
    assert_eq!(session["principal"], "analyst");
    assert_eq!(session["role"], "analyst");
    assert_eq!(session["auth_required"], true);
    assert!(session["limits"]["max_rows"].as_u64().unwrap() > 0);

    // A principal sees only its own tables.
    let body = serde_json::to_vec(&json!({"name": "small.csv", "csv": SMALL_CSV, "hierarchies": {"sex.csv": "Male;*\nFemale;*\n"}})).unwrap();
    let table = call(
        ui,
        "POST",
        "/api/v1/tables",
        Some(&token_of("analyst")),
        Some(&body),
    )
    .await;
    assert_eq!(table.status, 200);
    let sweep = serde_json::to_vec(&json!({"table": table.json()["table"], "job": SMALL_JOB, "k": [2], "l": [], "t": [], "delta": [], "queries": 10})).unwrap();
    call(
        ui,
        "POST",
        "/api/v1/sweeps",
        Some(&token_of("ops")),
        Some(&sweep),
    )
    .await
    .error(404, "not_found", Some("table"));
    let mine = call(
        ui,
        "POST",
        "/api/v1/sweeps",
        Some(&token_of("analyst")),
        Some(&sweep),
    )
    .await;
    mine.status_is(202);
    let sid = mine.json()["sweep"].as_str().unwrap().to_string();
    call(
        ui,
        "GET",
        &format!("/api/v1/sweeps/{sid}"),
        Some(&token_of("ops")),
        None,
    )
    .await
    .error(404, "not_found", Some("id"));
    daemon.shutdown().await;
}

// ------------------------------------------------------------------------------------------------
// Risk: the table's before anonymization, a release's record-risk histogram
// ------------------------------------------------------------------------------------------------

/// A table of 400 rows: quasi-identifiers age (numeric), zip and sex (with hierarchies), sensitive
/// disease; classes of many sizes (skewed zips). Zips and sexes are words no figure can spell.
fn risk_table() -> (String, Value, String) {
    let mut csv = String::from("age,zip,sex,disease\n");
    for i in 0u64..400 {
        let x = (i * 7919 + 13) % 401;
        let zip = format!("Z1{:04}", (x * x) % 97 % 12);
        let age = 20 + (x % 9) * (1 + i % 3);
        let sex = if (x / 3) % 2 == 0 { "Male" } else { "Female" };
        let disease = ["flu", "cold", "cough", "asthma"][(i % 4) as usize];
        csv.push_str(&format!("{age},{zip},{sex},{disease}\n"));
    }
    let zips: String = (0..12)
        .map(|z| format!("Z1{z:04};Z1{:03}*;Z1{:02}**;*\n", z / 10, z / 100))
        .collect();
    let hierarchies =
        json!({"hierarchies/zip.csv": zips, "hierarchies/sex.csv": "Male;*\nFemale;*\n"});
    let job = "input = \"r.csv\"\n[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nzip = { role = \"quasi\", hierarchy = \"hierarchies/zip.csv\" }\nsex = { role = \"quasi\", hierarchy = \"hierarchies/sex.csv\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 2\n".to_string();
    (csv, hierarchies, job)
}

/// Class sizes of `rows` grouped by the values of `columns`, rows whose every such value is `*`
/// left out (suppressed records count nowhere).
fn class_sizes(rows: &[Vec<String>], columns: &[usize]) -> Vec<u64> {
    let mut classes: HashMap<Vec<&str>, u64> = HashMap::new();
    for row in rows {
        let key: Vec<&str> = columns.iter().map(|&c| row[c].as_str()).collect();
        if key.iter().all(|v| *v == "*") {
            continue;
        }
        *classes.entry(key).or_default() += 1;
    }
    classes.into_values().collect()
}

/// (classes, records) per bin, or (size, classes) per class size.
type Counts = Vec<(u64, u64)>;

/// The record-risk histogram and the riskiest class sizes of `sizes`, counted here: classes of
/// 1, 2, 3-4, 5-9, 10-19, 20-49, 50-99 and 100+ records; the 10 smallest sizes.
fn expected_record_risk(sizes: &[u64]) -> (Counts, Counts) {
    let bounds = [
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 9),
        (10, 19),
        (20, 49),
        (50, 99),
        (100, u64::MAX),
    ];
    let bins = bounds
        .iter()
        .map(|&(lo, hi)| {
            let inside: Vec<u64> = sizes
                .iter()
                .copied()
                .filter(|&s| lo <= s && s <= hi)
                .collect();
            (inside.len() as u64, inside.iter().sum())
        })
        .collect();
    let mut distinct = sizes.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let riskiest = distinct
        .iter()
        .take(10)
        .map(|&size| (size, sizes.iter().filter(|&&s| s == size).count() as u64))
        .collect();
    (bins, riskiest)
}

/// Asserts that `record_risk` holds the expected bins and riskiest classes of `sizes`, and only
/// numbers (no value of any column can be in it).
fn assert_record_risk(record_risk: &Value, sizes: &[u64]) {
    let (bins, riskiest) = expected_record_risk(sizes);
    let got: Vec<(u64, u64)> = record_risk["bins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["classes"].as_u64().unwrap(),
                b["records"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, bins, "{record_risk}");
    let got: Vec<(u64, u64)> = record_risk["riskiest_classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let size = c["size"].as_u64().unwrap();
            assert_eq!(
                c["records"].as_u64().unwrap(),
                size * c["classes"].as_u64().unwrap()
            );
            // serde_json's parser may be off in the last bit.
            assert!(
                (c["risk"].as_f64().unwrap() - 1.0 / size as f64).abs() < 1e-15,
                "{c}"
            );
            (size, c["classes"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(got, riskiest, "{record_risk}");
    assert_eq!(
        record_risk["records"].as_u64().unwrap(),
        sizes.iter().sum::<u64>()
    );
    assert_eq!(record_risk["classes"].as_u64().unwrap(), sizes.len() as u64);
    fn only_numbers(v: &Value) -> bool {
        match v {
            Value::String(_) | Value::Bool(_) => false,
            Value::Array(a) => a.iter().all(only_numbers),
            Value::Object(o) => o.values().all(only_numbers),
            Value::Null | Value::Number(_) => true,
        }
    }
    assert!(only_numbers(record_risk), "{record_risk}");
}

/// SUDA's MSUs of sizes 1 and 2 by brute force: a record's set S of columns is an MSU when its
/// values on S occur in no other row while on each one-column part of S they do.
fn brute_force_msus(rows: &[Vec<String>], columns: &[usize]) -> (Vec<u64>, u64) {
    let unique = |r: usize, set: &[usize]| {
        rows.iter()
            .filter(|other| set.iter().all(|&c| other[c] == rows[r][c]))
            .count()
            == 1
    };
    let mut by_size = vec![0u64; 2];
    let mut records = 0;
    for r in 0..rows.len() {
        let mut any = false;
        for (i, &a) in columns.iter().enumerate() {
            if unique(r, &[a]) {
                by_size[0] += 1;
                any = true;
            }
            for &b in &columns[i + 1..] {
                if unique(r, &[a, b]) && !unique(r, &[a]) && !unique(r, &[b]) {
                    by_size[1] += 1;
                    any = true;
                }
            }
        }
        records += u64::from(any);
    }
    (by_size, records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_and_release_risk_equal_a_brute_force_count_and_show_no_value() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;
    let (csv, hierarchies, job) = risk_table();
    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "r.csv", "csv": csv, "hierarchies": hierarchies}),
    )
    .await;
    table.status_is(200);
    let id = table.json()["table"].as_str().unwrap().to_string();
    let (header, rows) = parse_csv(csv.as_bytes());
    let qi: Vec<usize> = ["age", "zip", "sex"]
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let sizes = class_sizes(&rows, &qi);
    let n = rows.len() as f64;
    let words: Vec<&str> = rows
        .iter()
        .flat_map(|r| [r[qi[1]].as_str(), r[qi[2]].as_str()])
        .collect();

    // The table before anonymization, with a population and SUDA up to size 2.
    let reply = post(
        ui,
        &format!("/api/v1/tables/{id}/risk"),
        &json!({"job": job, "population": 100000, "suda_max_size": 2}),
    )
    .await;
    reply.status_is(200);
    let body = String::from_utf8(reply.body.clone()).unwrap();
    for word in &words {
        assert!(!body.contains(word), "{word} in {body}");
    }
    let answer = reply.json();
    let risk = &answer["risk"];
    assert_eq!(risk["records"], rows.len());
    assert_eq!(risk["outliers"], 0);
    assert_eq!(risk["classes"], sizes.len());
    let p = &risk["prosecutor"];
    let smallest = *sizes.iter().min().unwrap() as f64;
    assert!(
        (p["highest"].as_f64().unwrap() - 1.0 / smallest).abs() < 1e-15,
        "{p}"
    );
    assert!(
        (p["average"].as_f64().unwrap() - sizes.len() as f64 / n).abs() < 1e-12,
        "{p}"
    );
    let at_risk: u64 = sizes.iter().filter(|&&s| 1.0 / s as f64 > 0.2).sum();
    assert!(
        (p["records_at_risk"].as_f64().unwrap() - at_risk as f64 / n).abs() < 1e-12,
        "{p}"
    );
    let uniques = sizes.iter().filter(|&&s| s == 1).count();
    assert!(uniques > 0 && sizes.iter().any(|&s| s >= 5), "{sizes:?}");
    assert_eq!(risk["sample_uniqueness"]["unique_records"], uniques);
    let population = &risk["population_uniqueness"];
    assert_eq!(population["population_size"], 100000.0, "{population}");
    assert!(
        population["pitman"].is_object() && population["dankar"]["model"].is_string(),
        "{population}"
    );
    let (msus, with_msu) = brute_force_msus(&rows, &qi);
    assert_eq!(
        risk["suda"]["msus_by_size"],
        json!(msus),
        "{}",
        risk["suda"]
    );
    assert_eq!(risk["suda"]["records_with_msu"], with_msu);
    assert_record_risk(&answer["record_risk"], &sizes);

    // Without a population or SUDA: unavailable, saying why; a sampling fraction stands for the size.
    let plain = post(
        ui,
        &format!("/api/v1/tables/{id}/risk"),
        &json!({"job": job}),
    )
    .await;
    plain.status_is(200);
    let plain = plain.json();
    assert!(
        plain["risk"]["population_uniqueness"]["unavailable"].is_string(),
        "{plain}"
    );
    assert!(plain["risk"]["suda"]["unavailable"].is_string(), "{plain}");
    let fraction = post(
        ui,
        &format!("/api/v1/tables/{id}/risk"),
        &json!({"job": job, "sampling_fraction": 0.004}),
    )
    .await
    .json();
    assert_eq!(
        fraction["risk"]["population_uniqueness"]["population_size"],
        100000.0
    );

    // A release: its record-risk histogram equals the classes of its released CSV.
    let started = post(
        ui,
        "/api/v1/sweeps",
        &json!({"table": id, "job": job, "k": [3], "l": [], "t": [], "delta": [],
                "methods": ["generalization"], "algorithms": ["mondrian"], "queries": 10}),
    )
    .await;
    started.status_is(202);
    let sid = started.json()["sweep"].as_str().unwrap().to_string();
    let status = wait_done(ui, &sid).await;
    assert_eq!(status["state"], "done", "{status}");
    let release = get(ui, &format!("/api/v1/sweeps/{sid}/releases/0")).await;
    release.status_is(200);
    let release = release.json();
    let released = get(ui, &format!("/api/v1/sweeps/{sid}/releases/0/release.csv")).await;
    released.status_is(200);
    let (header, rows) = parse_csv(&released.body);
    let qi: Vec<usize> = ["age", "zip", "sex"]
        .iter()
        .map(|n| header.iter().position(|h| h == n).unwrap())
        .collect();
    let released_sizes = class_sizes(&rows, &qi);
    assert!(released_sizes.iter().all(|&s| s >= 3), "{released_sizes:?}");
    let record_risk = &release["record_risk"];
    assert_record_risk(record_risk, &released_sizes);
    assert_eq!(record_risk["records"], release["report"]["risk"]["records"]);
    for word in &words {
        assert!(
            !record_risk.to_string().contains(word),
            "{word} in {record_risk}"
        );
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_risk_is_refused_past_its_limits_naming_them() {
    let mut config = Config::embedded_defaults();
    // Room for the upload, not for the risk profile's grouping (400 rows: 640 kB).
    config.tables.max_job_bytes = 200_000;
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    let (csv, hierarchies, job) = risk_table();
    let table = post(
        ui,
        "/api/v1/tables",
        &json!({"name": "r.csv", "csv": csv, "hierarchies": hierarchies}),
    )
    .await;
    table.status_is(200);
    let id = table.json()["table"].as_str().unwrap().to_string();
    let path = format!("/api/v1/tables/{id}/risk");
    let message =
        post(ui, &path, &json!({"job": job}))
            .await
            .error(413, "resource_exhausted", None);
    assert!(
        message.contains("tables.max_job_bytes") && message.contains("risk profile"),
        "{message}"
    );
    for (body, field) in [
        (json!({"job": job, "suda_max_size": 4}), "suda_max_size"),
        (json!({"job": job, "suda_max_size": 0}), "suda_max_size"),
        (
            json!({"job": job, "population": 10, "sampling_fraction": 0.5}),
            "sampling_fraction",
        ),
        (json!({"job": job, "population": -1}), "population"),
        (json!({"job": job, "threshold": 1.5}), "threshold"),
        (json!({"job": "[columns]\n"}), "job"),
        (json!({"job": job, "bogus": 1}), "body"),
    ] {
        post(ui, &path, &body)
            .await
            .error(400, "invalid_argument", Some(field));
    }
    let message = post(
        ui,
        &path,
        &json!({"job": job.replace("hierarchies/zip.csv", "zip.csv")}),
    )
    .await
    .error(400, "invalid_argument", Some("job"));
    assert!(message.contains("not a file of this table"), "{message}");
    post(ui, "/api/v1/tables/0123/risk", &json!({"job": job}))
        .await
        .error(404, "not_found", Some("table"));
    // A body past the request's bound (1 MiB) is refused by its declared length before it is sent.
    let mut stream = tokio::net::TcpStream::connect(ui).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {ui}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        2 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    read_reply(&mut stream)
        .await
        .error(413, "resource_exhausted", Some("body"));
    get(ui, "/api/v1/session").await.status_is(200);
    daemon.shutdown().await;
}

#[test]
fn a_non_loopback_ui_listen_is_refused_at_validation() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let err = Config::load_with_env(None, env(&[("CLOAKD_UI__LISTEN", "\"0.0.0.0:8080\"")]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ui.listen"), "{err}");
    assert!(
        err.contains("loopback") && err.contains("in clear"),
        "{err}"
    );
    let on =
        Config::load_with_env(None, env(&[("CLOAKD_UI__LISTEN", "\"127.0.0.1:8080\"")])).unwrap();
    assert_eq!(on.ui.listen, Some("127.0.0.1:8080".parse().unwrap()));
    assert_eq!(Config::embedded_defaults().ui.listen, None);
    let err = Config::load_with_env(None, env(&[("CLOAKD_UI__MAX_TABLES", "0")]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ui.max_tables"), "{err}");
}
