//! The workbench's defences against other web pages and against local processes that would starve
//! the daemon, against the real daemon (`daemon::serve_reporting` with `ui.listen =
//! "127.0.0.1:0"`): a spoofed `Host` (DNS rebinding) is refused, a cross-origin state-changing request
//! is refused, a JSON body not sent as `application/json` is refused (what a `no-cors` fetch sends),
//! a connection that sends its headers too slowly or its body not at all is closed, connections past
//! `ui.max_connections` are closed at once while gRPC health still answers, one principal's uploads
//! and sweeps never evict another's (per-principal quotas), and a release download neutralizes
//! formula-like cells exactly as `cloakd table anonymize` does with the exported job.
use std::net::SocketAddr;
use std::time::Duration;

use cloakd::auth::Role;
use cloakd::config::Config;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::bin;
use crate::support::security::{principal, token_of};
use crate::support::workbench::{RawReply, Workbench, parse_reply};

/// A generous upper bound for anything the daemon must do (never a timing threshold).
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Reply {
    status: u16,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts the status and the error shape; returns the message.
    fn error(&self, status: u16, code: &str, field: &str) -> String {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        let e = &self.json()["error"];
        assert_eq!(e["code"], code, "{e}");
        assert_eq!(e["field"], field, "{e}");
        e["message"].as_str().unwrap().to_string()
    }
}

/// A request as raw HTTP/1.1: `headers` are `Name: value` lines (Host included by the caller).
async fn raw(addr: SocketAddr, method: &str, path: &str, headers: &[String], body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
        .await
        .expect("a reply in time")
        .unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let RawReply { status, body, .. } = parse_reply(raw);
    Reply { status, body }
}

fn host(addr: SocketAddr) -> String {
    format!("Host: {addr}")
}

const JSON: &str = "Content-Type: application/json";

/// A call as the page makes it: its own Host and Origin, JSON, and a token when given.
async fn page(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> Reply {
    let mut headers = vec![host(addr), format!("Origin: http://{addr}")];
    if let Some(token) = token {
        headers.push(format!("Authorization: Bearer {token}"));
    }
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        headers.push(JSON.to_string());
        serde_json::to_vec(body).unwrap()
    };
    raw(addr, method, path, &headers, &bytes).await
}

/// Whether the server closes `stream` (end of stream or reset) within [`PATIENCE`]; bytes it sends
/// before are returned.
async fn closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| got)
}

const SMALL_CSV: &str = "age,sex,disease\n30,Male,flu\n31,Female,cold\n32,Male,flu\n33,Female,cough\n34,Male,cold\n35,Female,flu\n";
const SEX: &str = "Male;*\nFemale;*\n";
const SMALL_JOB: &str = "input = \"small.csv\"\n[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nsex = { role = \"quasi\", hierarchy = \"sex.csv\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 2\n";

fn small_table(csv: &str) -> Value {
    json!({"name": "small.csv", "csv": csv, "hierarchies": {"sex.csv": SEX}})
}

fn small_sweep(table: &Value, job: &str) -> Value {
    json!({"table": table, "job": job, "k": [2], "l": [], "t": [], "delta": [],
           "methods": ["generalization"], "algorithms": ["mondrian"], "queries": 10})
}

async fn wait_done(addr: SocketAddr, token: Option<&str>, sweep: &str) -> Value {
    for _ in 0..3000 {
        let status = page(
            addr,
            "GET",
            &format!("/api/v1/sweeps/{sweep}"),
            token,
            &Value::Null,
        )
        .await
        .json();
        if status["state"] != "running" {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sweep did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_host_is_refused() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;
    let port = ui.port();
    for path in ["/api/v1/session", "/"] {
        for spoofed in [
            format!("Host: evil.example:{port}"),
            "Host: 127.0.0.1".to_string(),
            format!("Host: 127.0.0.1:{}", port.wrapping_add(1)),
        ] {
            let message = raw(ui, "GET", path, std::slice::from_ref(&spoofed), b"")
                .await
                .error(403, "permission_denied", "host");
            assert!(message.contains("host:"), "{message}");
        }
    }
    for good in [
        host(ui),
        format!("Host: localhost:{port}"),
        format!("Host: [::1]:{port}"),
    ] {
        let reply = raw(
            ui,
            "GET",
            "/api/v1/session",
            std::slice::from_ref(&good),
            b"",
        )
        .await;
        assert_eq!(reply.status, 200, "{good}");
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_and_non_json_requests_are_refused() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;
    let body = serde_json::to_vec(&small_table(SMALL_CSV)).unwrap();
    // Another page's POST (Origin is its own) and an opaque origin.
    for origin in ["http://evil.example", "null", "http://localhost:1"] {
        let headers = [host(ui), format!("Origin: {origin}"), JSON.to_string()];
        raw(ui, "POST", "/api/v1/tables", &headers, &body)
            .await
            .error(403, "permission_denied", "origin");
    }
    let headers = [host(ui), "Origin: http://evil.example".to_string()];
    raw(ui, "DELETE", "/api/v1/sweeps/feedface", &headers, b"")
        .await
        .error(403, "permission_denied", "origin");
    // What a no-cors fetch can send: JSON as text/plain (or a form), with or without Origin.
    for content_type in [
        Some("Content-Type: text/plain;charset=UTF-8"),
        Some("Content-Type: application/x-www-form-urlencoded"),
        Some("Content-Type: multipart/form-data; boundary=x"),
        None,
    ] {
        let mut headers = vec![host(ui)];
        headers.extend(content_type.map(str::to_string));
        let message = raw(ui, "POST", "/api/v1/tables", &headers, &body)
            .await
            .error(415, "invalid_argument", "content-type");
        assert!(message.contains("application/json"), "{message}");
        let sweep = serde_json::to_vec(&small_sweep(&json!("x"), SMALL_JOB)).unwrap();
        raw(ui, "POST", "/api/v1/sweeps", &headers, &sweep)
            .await
            .error(415, "invalid_argument", "content-type");
    }
    // The page itself, and a client without Origin that sends JSON, are served.
    let table = page(ui, "POST", "/api/v1/tables", None, &small_table(SMALL_CSV)).await;
    assert_eq!(
        table.status,
        200,
        "{}",
        String::from_utf8_lossy(&table.body)
    );
    let headers = [host(ui), JSON.to_string()];
    assert_eq!(
        raw(ui, "POST", "/api/v1/tables", &headers, &body)
            .await
            .status,
        200
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_stalled_bodies_are_cut_off() {
    let mut config = Config::embedded_defaults();
    config.ui.header_timeout = Duration::from_millis(300);
    config.ui.idle_timeout = Duration::from_millis(300);
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    // Slowloris: part of a request head, then nothing.
    let mut stream = TcpStream::connect(ui).await.unwrap();
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {ui}\r\nX-Slow: ").as_bytes())
        .await
        .unwrap();
    assert!(
        closed(&mut stream).await.is_some(),
        "a connection without its full head within ui.header_timeout_ms is closed"
    );
    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(ui).await.unwrap();
    assert!(
        closed(&mut silent).await.is_some(),
        "a silent connection is closed"
    );
    // A body that stops arriving: 408 naming the body.
    let mut stream = TcpStream::connect(ui).await.unwrap();
    let head = format!(
        "POST /api/v1/tables HTTP/1.1\r\nHost: {ui}\r\n{JSON}\r\nContent-Length: 1000\r\n\r\n{{\"name\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let got = closed(&mut stream)
        .await
        .expect("a stalled body's connection is closed");
    let message = parse(&got).error(408, "deadline_exceeded", "body");
    assert!(message.contains("ui.idle_timeout_ms"), "{message}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_while_grpc_answers() {
    let mut config = Config::embedded_defaults();
    config.ui.max_connections = 3;
    config.ui.header_timeout = Duration::from_secs(600);
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    // Three idle connections hold every place (each served: a request answered, kept alive).
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(ui).await.unwrap();
        stream
            .write_all(format!("GET /app.css HTTP/1.1\r\nHost: {ui}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        held.push(stream);
    }
    // A flood past the limit: each closed at once, none served.
    for _ in 0..50 {
        let mut stream = TcpStream::connect(ui).await.unwrap();
        let _ = stream
            .write_all(format!("GET /app.css HTTP/1.1\r\nHost: {ui}\r\n\r\n").as_bytes())
            .await;
        let got = closed(&mut stream)
            .await
            .expect("a connection past ui.max_connections is closed");
        assert!(
            got.is_empty(),
            "served past the limit: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // The gRPC listener still answers health.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // A place freed is a place taken again.
    drop(held.pop());
    let mut served = false;
    for _ in 0..600 {
        let mut stream = TcpStream::connect(ui).await.unwrap();
        let _ = stream
            .write_all(
                format!("GET /app.css HTTP/1.1\r\nHost: {ui}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        let got = closed(&mut stream).await.unwrap_or_default();
        if got.starts_with(b"HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "a freed place serves again");
    drop(held);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principals_work_never_evicts_anothers() {
    let mut config = Config::embedded_defaults();
    config.auth.required = true;
    config.auth.principals = vec![
        principal("alice", Role::Analyst, &[]),
        principal("bob", Role::Analyst, &[]),
    ];
    config.ui.max_tables = 2;
    config.ui.max_sweeps = 2;
    let daemon = Workbench::start(config).await;
    let ui = daemon.ui;
    let (alice, bob) = (token_of("alice"), token_of("bob"));
    let upload = |token: String| async move {
        let reply = page(
            ui,
            "POST",
            "/api/v1/tables",
            Some(&token),
            &small_table(SMALL_CSV),
        )
        .await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.json()["table"].clone()
    };
    let sweep = |token: String, table: Value| async move {
        let reply = page(
            ui,
            "POST",
            "/api/v1/sweeps",
            Some(&token),
            &small_sweep(&table, SMALL_JOB),
        )
        .await;
        assert_eq!(
            reply.status,
            202,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let id = reply.json()["sweep"].as_str().unwrap().to_string();
        assert_eq!(wait_done(ui, Some(&token), &id).await["state"], "done");
        id
    };
    let alices_table = upload(alice.clone()).await;
    let alices_sweep = sweep(alice.clone(), alices_table.clone()).await;
    // Bob goes well past his quotas.
    let mut bobs_tables = Vec::new();
    for _ in 0..5 {
        bobs_tables.push(upload(bob.clone()).await);
    }
    let mut bobs_sweeps = Vec::new();
    for _ in 0..4 {
        bobs_sweeps.push(sweep(bob.clone(), bobs_tables[4].clone()).await);
    }
    // Alice's table and finished sweep are still hers.
    let status = page(
        ui,
        "GET",
        &format!("/api/v1/sweeps/{alices_sweep}"),
        Some(&alice),
        &Value::Null,
    )
    .await;
    assert_eq!(
        status.status,
        200,
        "{}",
        String::from_utf8_lossy(&status.body)
    );
    sweep(alice.clone(), alices_table).await;
    // Bob's own oldest went first.
    page(
        ui,
        "POST",
        "/api/v1/sweeps",
        Some(&bob),
        &small_sweep(&bobs_tables[0], SMALL_JOB),
    )
    .await
    .error(404, "not_found", "table");
    page(
        ui,
        "GET",
        &format!("/api/v1/sweeps/{}", bobs_sweeps[0]),
        Some(&bob),
        &Value::Null,
    )
    .await
    .error(404, "not_found", "id");
    let newest = page(
        ui,
        "GET",
        &format!("/api/v1/sweeps/{}", bobs_sweeps[3]),
        Some(&bob),
        &Value::Null,
    )
    .await;
    assert_eq!(newest.status, 200);
    daemon.shutdown().await;
}

/// The formula-like cells of the upload, as CSV fields.
const FORMULAS: [&str; 4] = ["=cmd|' /C calc'!A0", "+SUM(1;2)", "@HYPERLINK(x)", "-2+3"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_downloads_neutralize_formulas_as_the_cli_does() {
    let daemon = Workbench::start(Config::embedded_defaults()).await;
    let ui = daemon.ui;
    let mut csv = String::from("age,sex,disease\n");
    for (i, cell) in FORMULAS.iter().chain(&["-5", "flu"]).enumerate() {
        csv.push_str(&format!(
            "{},{},{cell}\n",
            30 + i,
            if i % 2 == 0 { "Male" } else { "Female" }
        ));
    }
    let table = page(ui, "POST", "/api/v1/tables", None, &small_table(&csv))
        .await
        .json()["table"]
        .clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("small.csv"), &csv).unwrap();
    std::fs::write(dir.path().join("sex.csv"), SEX).unwrap();
    let keep_job = SMALL_JOB.replace("[privacy]", "[release]\nformulas = \"keep\"\n\n[privacy]");
    for (job, neutralized) in [(SMALL_JOB.to_string(), true), (keep_job, false)] {
        let reply = page(
            ui,
            "POST",
            "/api/v1/sweeps",
            None,
            &small_sweep(&table, &job),
        )
        .await;
        assert_eq!(
            reply.status,
            202,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let id = reply.json()["sweep"].as_str().unwrap().to_string();
        assert_eq!(wait_done(ui, None, &id).await["state"], "done");
        let download = page(
            ui,
            "GET",
            &format!("/api/v1/sweeps/{id}/releases/0/release.csv"),
            None,
            &Value::Null,
        )
        .await;
        assert_eq!(download.status, 200);
        let text = String::from_utf8(download.body.clone()).unwrap();
        for cell in FORMULAS {
            let expected = if neutralized {
                format!(",\"'{cell}\"\n")
            } else {
                format!(",{cell}\n")
            };
            assert!(text.contains(&expected), "{expected:?} not in {text}");
        }
        // A number stays a number.
        assert!(text.contains(",-5\n"), "{text}");
        // The exported job makes the same bytes with the CLI.
        let exported = page(
            ui,
            "GET",
            &format!("/api/v1/sweeps/{id}/releases/0/job.toml"),
            None,
            &Value::Null,
        )
        .await;
        let job_path = dir.path().join("release.toml");
        std::fs::write(&job_path, &exported.body).unwrap();
        let out = dir.path().join("out.csv");
        let run = bin()
            .args(["table", "anonymize"])
            .arg(&job_path)
            .arg("--output")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    }
    daemon.shutdown().await;
}
