//! SIGHUP against the real `cloakd` binary: the file it was started with is re-read; reloadable keys
//! (k bounds, services, a stream's rho and window size) apply to requests and windows from then on,
//! while a window closed before keeps its parameters; a change to a restart-only key refuses the
//! whole reload with a log line naming the key, and an invalid file is refused; in both cases the
//! running configuration stays and the daemon keeps serving. Reloads are counted by outcome.
use std::time::Duration;

use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{LocationEvent, Transaction, location_event};

use crate::support::process::DaemonProcess;
use crate::support::{
    MobileClient, next_cloaked, released_windows, request_at, subscribe_provider,
};

const CONFIG: &str = r#"
[location]
services = ["poi"]
min_k = 2
max_k = 10
answer_ttl_ms = 300

[transactions.defaults]
rho = 0.5
window_records = 2
window_ms = 600000
"#;

/// Rewrites the daemon's config file: `edit` changes the parsed document.
fn edit_config(daemon: &DaemonProcess, edit: impl FnOnce(&mut toml::Table)) {
    let text = std::fs::read_to_string(&daemon.config_path).unwrap();
    let mut doc: toml::Table = toml::from_str(&text).unwrap();
    edit(&mut doc);
    std::fs::write(&daemon.config_path, toml::to_string(&doc).unwrap()).unwrap();
}

fn section<'a>(doc: &'a mut toml::Table, name: &str) -> &'a mut toml::Table {
    doc.get_mut(name).unwrap().as_table_mut().unwrap()
}

/// Sends SIGHUP and waits for the `nth` (1-based) reload log line; returns it.
fn hangup(daemon: &mut DaemonProcess, nth: usize) -> serde_json::Value {
    daemon.signal("HUP");
    let is_reload_line = |l: &serde_json::Value| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("configuration "))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lines: Vec<serde_json::Value> =
            daemon.logs().into_iter().filter(is_reload_line).collect();
        if lines.len() >= nth {
            return lines[nth - 1].clone();
        }
        assert!(std::time::Instant::now() < deadline, "no reload log line");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The outcome of one request with `k` on service `service` (a lonely request expires after 200 ms).
async fn outcome_of(
    client: &mut MobileClient,
    request_no: u64,
    k: u32,
    service: &str,
) -> location_event::Outcome {
    let mut request = request_at("alice", request_no, 0.0, k);
    request.dt_ms = Some(200);
    request.service = service.into();
    client.send(request).await;
    let LocationEvent {
        request_no: answered,
        outcome,
    } = client.next_event(30).await;
    assert_eq!(answered, request_no);
    outcome.unwrap()
}

fn rejected_field(outcome: &location_event::Outcome) -> Option<&str> {
    match outcome {
        location_event::Outcome::Rejected(r) => Some(r.field.as_str()),
        _ => None,
    }
}

async fn publish(daemon: &DaemonProcess, ids: &[&str]) {
    let mut ingest = TransactionIngestClient::new(daemon.channel().await);
    let records: Vec<Transaction> = ids
        .iter()
        .map(|id| Transaction {
            stream: "orders".into(),
            record_id: id.to_string(),
            items: vec!["bread".into(), "beer".into()],
            sensitive_items: vec!["beer".into()],
        })
        .collect();
    let mut acks = ingest
        .publish(tokio_stream::iter(records))
        .await
        .unwrap()
        .into_inner();
    let mut acked = 0;
    while acks.message().await.unwrap().is_some() {
        acked += 1;
    }
    assert_eq!(acked, ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_reloadable_keys_and_refuses_restart_only_ones() {
    let mut daemon = DaemonProcess::start(CONFIG);
    let mut client = MobileClient::connect(daemon.channel().await).await;
    assert_eq!(
        rejected_field(&outcome_of(&mut client, 1, 20, "poi").await),
        Some("k")
    );
    assert_eq!(
        rejected_field(&outcome_of(&mut client, 2, 3, "weather").await),
        Some("service")
    );
    // A window closed under rho = 0.5.
    publish(&daemon, &["r1", "r2"]).await;

    // ---- Reloadable keys: k bounds, a new service, rho and the window size.
    edit_config(&daemon, |doc| {
        let location = section(doc, "location");
        location.insert("max_k".into(), 30.into());
        location.insert(
            "services".into(),
            toml::Value::Array(vec!["poi".into(), "weather".into()]),
        );
        let defaults = section(section(doc, "transactions"), "defaults");
        defaults.insert("rho".into(), 0.3.into());
        defaults.insert("window_records".into(), 3.into());
    });
    let applied = hangup(&mut daemon, 1);
    assert_eq!(applied["message"], "configuration reloaded", "{applied}");
    assert_eq!(
        applied["changed"],
        "location.max_k,location.services,transactions.defaults.rho,transactions.defaults.window_records",
        "{applied}"
    );
    // The same stream: k = 20 is admitted now (and expires alone); the new service is served.
    assert!(matches!(
        outcome_of(&mut client, 3, 20, "poi").await,
        location_event::Outcome::Expired(_)
    ));
    let mut provider = subscribe_provider(daemon.channel().await, "weather").await;
    let mut other = MobileClient::connect(daemon.channel().await).await;
    for (client, user, no) in [(&mut client, "alice", 4), (&mut other, "bob", 5)] {
        let mut request = request_at(user, no, 10.0, 2);
        request.service = "weather".into();
        client.send(request).await;
    }
    for client in [&mut client, &mut other] {
        let event = client.next_event(30).await;
        assert!(
            matches!(event.outcome, Some(location_event::Outcome::Cloaked(_))),
            "{event:?}"
        );
    }
    for _ in 0..2 {
        assert_eq!(next_cloaked(&mut provider, 30).await.service, "weather");
    }
    // The provider neither acknowledges nor answers: once answer_ttl_ms passes, each client is told.
    for client in [&mut client, &mut other] {
        let event = client.next_event(30).await;
        assert!(
            matches!(event.outcome, Some(location_event::Outcome::Undelivered(_))),
            "{event:?}"
        );
    }
    // Windows from now on: three records, rho 0.3; the window closed before keeps rho 0.5.
    publish(&daemon, &["r3", "r4", "r5"]).await;
    let windows = released_windows(daemon.channel().await, "orders", 2).await;
    let summary: Vec<(u64, usize, f64)> = windows
        .iter()
        .map(|w| (w.window_id, w.records.len(), w.report.as_ref().unwrap().rho))
        .collect();
    assert_eq!(summary, [(0, 2, 0.5), (1, 3, 0.3)]);

    // ---- A restart-only key: the whole reload is refused (max_k stays 30).
    edit_config(&daemon, |doc| {
        section(doc, "location").insert("max_k".into(), 40.into());
        section(doc, "transactions").insert("data_dir".into(), "/elsewhere".into());
    });
    let refused = hangup(&mut daemon, 2);
    assert!(
        refused["message"].as_str().unwrap().starts_with(
            "configuration not reloaded: transactions.data_dir only take(s) effect at a restart"
        ),
        "{refused}"
    );
    assert_eq!(refused["keys"], "transactions.data_dir", "{refused}");
    assert_eq!(refused["level"], "ERROR");
    assert_eq!(
        rejected_field(&outcome_of(&mut client, 6, 35, "poi").await),
        Some("k")
    );
    assert!(matches!(
        outcome_of(&mut client, 7, 25, "poi").await,
        location_event::Outcome::Expired(_)
    ));
    let m = daemon.scrape();
    assert_eq!(
        m.sum("cloakd_config_last_reload_successful", &[]),
        0.0,
        "{}",
        m.text
    );

    // ---- An invalid file: refused, the running configuration stays, the daemon keeps serving.
    // (data_dir as the daemon runs with it: the test harness put it beside the config file.)
    let running_dir = daemon.config_path.parent().unwrap().join("data");
    edit_config(&daemon, |doc| {
        section(doc, "transactions")
            .insert("data_dir".into(), running_dir.display().to_string().into());
        section(doc, "location").insert("max_k".into(), 1.into());
    });
    let invalid = hangup(&mut daemon, 3);
    assert_eq!(
        invalid["message"], "configuration not reloaded: invalid; the running configuration stays",
        "{invalid}"
    );
    assert!(
        invalid["error"].as_str().unwrap().starts_with("location."),
        "{invalid}"
    );
    assert!(matches!(
        outcome_of(&mut client, 8, 25, "poi").await,
        location_event::Outcome::Expired(_)
    ));

    // ---- Back to a valid file with a reloadable change only: applied again.
    edit_config(&daemon, |doc| {
        section(doc, "location").insert("max_k".into(), 12.into());
    });
    let again = hangup(&mut daemon, 4);
    assert_eq!(again["changed"], "location.max_k", "{again}");
    assert_eq!(
        rejected_field(&outcome_of(&mut client, 9, 25, "poi").await),
        Some("k")
    );

    let m = daemon.scrape();
    let reloads = |outcome: &str| m.sum("cloakd_config_reloads_total", &[("outcome", outcome)]);
    assert_eq!(
        (
            reloads("applied"),
            reloads("refused"),
            reloads("invalid"),
            reloads("unchanged")
        ),
        (2.0, 1.0, 1.0, 0.0),
        "{}",
        m.text
    );
    assert_eq!(m.sum("cloakd_config_last_reload_successful", &[]), 1.0);
    // No reload line carries a value: key names only.
    for line in daemon.logs() {
        let text = line.to_string();
        assert!(!text.contains("/elsewhere"), "{text}");
    }
    drop((client, other, provider));
    daemon.stop();
}
