//! A property of the workbench's JSON surface: random and mutated JSON bodies (and bytes that are
//! not JSON) for the table, table-risk, sweep and session endpoints, sent through the real router
//! (`workbench::router` with `tower::ServiceExt::oneshot`: the guard, authentication,
//! deserialization and validation the listener runs), never panic and are always answered with a
//! 2xx or a 4xx carrying the JSON error shape (`error.code`, `error.message`).
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use cloakd::auth::Authenticator;
use cloakd::config::Config;
use cloakd::jobs::TableJobs;
use cloakd::workbench::{Workbench, router};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt;

const ADDR: &str = "127.0.0.1:8080";
const SMALL_CSV: &str =
    "age,sex,disease\n30,Male,flu\n31,Female,cold\n32,Male,flu\n33,Female,cough\n";
const SMALL_JOB: &str = "input = \"small.csv\"\n[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nsex = { role = \"quasi\", hierarchy = \"sex.csv\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 2\n";

/// One runtime and one workbench for every case, with a table uploaded (so sweep bodies that name
/// it get past the table lookup).
fn fixture() -> &'static (tokio::runtime::Runtime, Arc<Workbench>, String) {
    static FIXTURE: OnceLock<(tokio::runtime::Runtime, Arc<Workbench>, String)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut config = Config::embedded_defaults();
        config.tables.max_bytes = 64 * 1024;
        config.tables.max_rows = 100;
        config.tables.max_queries = 50;
        config.ui.max_tables = 100_000;
        let workbench = Workbench::new(
            ADDR.parse().unwrap(),
            &config.ui,
            &config.tables,
            Arc::new(Authenticator::new(&config.auth)),
            TableJobs::new(&config.tables),
        );
        let table = runtime.block_on(async {
            let body = json!({"name": "small.csv", "csv": SMALL_CSV, "hierarchies": {"sex.csv": "Male;*\nFemale;*\n"}});
            let (status, reply) = send(&workbench, "POST", "/api/v1/tables", body.to_string().into_bytes()).await;
            assert_eq!(status, 200, "{reply}");
            reply["table"].as_str().unwrap().to_string()
        });
        (runtime, workbench, table)
    })
}

async fn send(workbench: &Arc<Workbench>, method: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", ADDR)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = router(Arc::clone(workbench))
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json)
}

/// Any JSON value, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            ".{0,12}",
            Just("generalization".to_string()),
            Just("mondrian".to_string()),
            Just("adult".to_string()),
            Just(SMALL_JOB.to_string()),
            Just(SMALL_CSV.to_string()),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(field(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field name of the request types (or another).
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "example",
            "name",
            "csv",
            "hierarchies",
            "table",
            "job",
            "k",
            "l",
            "t",
            "delta",
            "t_distance",
            "methods",
            "algorithms",
            "metric",
            "max_suppression",
            "seed",
            "min_support",
            "queries",
            "qd",
            "sel",
            "query_seed",
            "workload",
            "attribute",
            "classifiers",
            "folds",
            "population",
            "sampling_fraction",
            "suda_max_size",
            "threshold",
        ])
        .prop_map(str::to_string),
        "[a-z_]{1,8}",
    ]
}

/// A valid body of `path`, then some of its fields replaced by any value or removed.
fn mutated(valid: Value) -> impl Strategy<Value = Value> {
    let keys: Vec<String> = valid.as_object().unwrap().keys().cloned().collect();
    prop::collection::vec(
        (prop::sample::select(keys), prop::option::of(any_json())),
        0..4,
    )
    .prop_map(move |edits| {
        let mut body = valid.clone();
        let object = body.as_object_mut().unwrap();
        for (key, value) in edits {
            match value {
                Some(v) => object.insert(key, v),
                None => object.remove(&key),
            };
        }
        body
    })
}

fn valid_sweep(table: &str) -> Value {
    json!({"table": table, "job": SMALL_JOB, "k": [2], "l": [], "t": [], "delta": [],
           "methods": ["generalization"], "algorithms": ["mondrian"], "queries": 10,
           "workload": null})
}

/// A request: the endpoint and its body bytes.
fn request() -> impl Strategy<Value = (&'static str, &'static str, Vec<u8>)> {
    let table = fixture().2.clone();
    let risk: &'static str = Box::leak(format!("/api/v1/tables/{table}/risk").into_boxed_str());
    let bytes = |v: Value| v.to_string().into_bytes();
    prop_oneof![
        any_json().prop_map(move |v| ("POST", "/api/v1/tables", bytes(v))),
        any_json().prop_map(move |v| ("POST", "/api/v1/sweeps", bytes(v))),
        mutated(json!({"name": "t.csv", "csv": SMALL_CSV, "hierarchies": {"sex.csv": "Male;*\nFemale;*\n"}}))
            .prop_map(move |v| ("POST", "/api/v1/tables", bytes(v))),
        mutated(json!({"example": "adult"})).prop_map(move |v| ("POST", "/api/v1/tables", bytes(v))),
        mutated(valid_sweep(&table)).prop_map(move |v| ("POST", "/api/v1/sweeps", bytes(v))),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| ("POST", "/api/v1/sweeps", b)),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| ("POST", "/api/v1/tables", b)),
        any_json().prop_map(move |v| ("GET", "/api/v1/session", bytes(v))),
        any_json().prop_map(move |v| ("POST", risk, bytes(v))),
        mutated(json!({"job": SMALL_JOB, "population": 1000, "sampling_fraction": null, "suda_max_size": 2, "threshold": 0.2}))
            .prop_map(move |v| ("POST", risk, bytes(v))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_body_gets_a_2xx_or_a_4xx_with_the_error_shape((method, path, body) in request()) {
        let (runtime, workbench, _) = fixture();
        let (status, reply) = runtime.block_on(send(workbench, method, path, body));
        prop_assert!((200..300).contains(&status) || (400..500).contains(&status), "{status} {reply}");
        if status >= 400 {
            prop_assert!(reply["error"]["code"].is_string(), "{status} {reply}");
            prop_assert!(reply["error"]["message"].is_string(), "{status} {reply}");
        }
    }
}
