//! The privacy budget through the real daemon: a user who keeps asking for GEO_IND answers is never
//! charged more than `location.geo_ind.budget`, across a kill -9 of the real `cloakd` binary (and no
//! charge the client saw acknowledged is lost: `budget_left` only ever goes down), and across two
//! replicas sharing a real `nats-server` (their charges meet in one key-value bucket by
//! compare-and-set). Past the budget a request is refused with RESOURCE_EXHAUSTED naming
//! `epsilon_per_km`, the budget key and the refill time, and no user id.
use std::time::Duration;

use cloakd::proto::location_event::Outcome;
use cloakd::proto::{CloakModel, LocationRequest};
use tonic::Code;

use crate::support::nats::NatsCluster;
use crate::support::process::DaemonProcess;
use crate::support::{MobileClient, TestDaemon};

/// Every answer is a fresh draw at 5 per km (the requests are 55 km apart, so the reuse test fails
/// with probability 1 - e^(-54)/2), charged 5 the first time on a daemon and 6 (the test's 1 and
/// the draw's 5) afterwards: at most 10 answers fit in 50.
const BUDGET: f64 = 50.0;
const EPSILON: f64 = 5.0;
/// One window for the whole test (about ten years: no refill while it runs).
const WINDOW_MS: u64 = 315_360_000_000;

fn budget_toml() -> String {
    format!(
        "[location.geo_ind]\nbudget = {BUDGET:?}\nbudget_window_ms = {WINDOW_MS}\nreuse_test_epsilon_per_km = 1.0\nreuse_threshold_m = 500.0\n"
    )
}

/// GEO_IND request `request_no` of `user`, each half a degree (about 55 km) from the one before.
fn geo_request(user: &str, request_no: u64) -> LocationRequest {
    let mut request = crate::support::request_at(user, request_no, 0.0, 2);
    request.lat = 40.0 + (request_no % 20) as f64 * 0.5;
    request.model = Some(CloakModel::GeoInd as i32);
    request.epsilon_per_km = Some(EPSILON);
    request
}

/// What one client saw.
#[derive(Debug, Default)]
struct Tally {
    /// `budget_left` of every answer, in arrival order.
    left: Vec<f64>,
    refused: usize,
}

impl Tally {
    fn note(&mut self, outcome: Option<Outcome>, user: &str) {
        match outcome {
            Some(Outcome::Cloaked(c)) => {
                let left = c
                    .budget_left
                    .expect("every GEO_IND answer carries budget_left");
                self.left.push(left);
            }
            Some(Outcome::Rejected(r)) => {
                assert_eq!(r.code, Code::ResourceExhausted as i32, "{r:?}");
                assert_eq!(r.field, "epsilon_per_km", "{r:?}");
                assert!(r.reason.contains("location.geo_ind.budget"), "{r:?}");
                assert!(r.refill_at_ms.is_some_and(|t| t > 0), "{r:?}");
                assert!(
                    !r.reason.contains(user),
                    "a refusal names no user id: {r:?}"
                );
                self.refused += 1;
            }
            _ => {}
        }
    }
}

fn kill_9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Sends requests `from..to` of `user` and reads until each has its outcome.
async fn ask(client: &mut MobileClient, user: &str, from: u64, to: u64, tally: &mut Tally) {
    for n in from..to {
        client.send(geo_request(user, n)).await;
    }
    let mut outcomes = 0;
    while outcomes < to - from {
        let event = client.next_event(60).await;
        if matches!(
            event.outcome,
            Some(Outcome::Cloaked(_)) | Some(Outcome::Rejected(_))
        ) {
            outcomes += 1;
        }
        tally.note(event.outcome, user);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_never_lets_a_user_spend_more_than_the_budget() {
    let data = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[transactions]\ndata_dir = '{}'\n",
        budget_toml(),
        data.path().display()
    );
    let user = "budget-crash-user";
    let mut tally = Tally::default();
    let daemon = DaemonProcess::start(&config);
    let mut client = MobileClient::connect(daemon.channel().await).await;
    ask(&mut client, user, 0, 3, &mut tally).await;
    assert_eq!(tally.left.len(), 3, "{tally:?}");
    // The client keeps asking; the daemon is killed in the middle of it.
    for n in 3..40 {
        client.send(geo_request(user, n)).await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    kill_9(daemon.pid());
    while let Ok(Ok(Some(event))) =
        tokio::time::timeout(Duration::from_secs(10), client.events.message()).await
    {
        tally.note(event.outcome, user);
    }
    drop(daemon);
    let before_restart = tally.left.len();
    let daemon = DaemonProcess::start(&config);
    let mut client = MobileClient::connect(daemon.channel().await).await;
    ask(&mut client, user, 100, 115, &mut tally).await;
    assert!(
        tally.refused > 0,
        "past the budget requests are refused: {tally:?}"
    );
    // No acknowledged charge lost: what is left only ever goes down, across the restart too.
    for pair in tally.left.windows(2) {
        assert!(
            pair[1] < pair[0],
            "budget_left went up (a charge was lost): {tally:?}"
        );
    }
    assert!(tally.left.iter().all(|l| *l >= 0.0), "{tally:?}");
    // Every answer cost at least 5: never more than 10 of them.
    assert!(
        tally.left.len() as f64 * EPSILON <= BUDGET,
        "{} answers ({before_restart} before the kill) spent more than the budget: {tally:?}",
        tally.left.len()
    );
}

/// With `budget_reserve_share = 0.2` (10 of the 50), a charge that waits for the ledger sets 10
/// aside, and the next answers are paid from it with no commit: six answers, three frames in the
/// ledger file, and each answer's `budget_left` exactly what its charge leaves, as without a
/// reserve. A kill -9 forfeits the unspent part: the ledger counts it as spent, so the next
/// request is refused though the client last saw 15 left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_paid_from_the_reserve_need_no_commit_and_a_kill_9_forfeits_it() {
    let data = tempfile::tempdir().unwrap();
    let config = format!(
        "{}budget_reserve_share = 0.2\n[transactions]\ndata_dir = '{}'\n",
        budget_toml(),
        data.path().display()
    );
    let ledger_file = data
        .path()
        .join(cloakd::ledger::file::DIR)
        .join(cloakd::ledger::file::LEDGER_FILE);
    let user = "budget-reserve-user";
    let mut tally = Tally::default();
    let daemon = DaemonProcess::start(&config);
    let mut client = MobileClient::connect(daemon.channel().await).await;
    // One at a time, so that the order of charges is the order of requests.
    for n in 0..6 {
        ask(&mut client, user, n, n + 1, &mut tally).await;
    }
    // 5 (a first draw), then 6 each (the test and a draw): 50 less 5, 11, 17, 23, 29, 35.
    let expected = [45.0, 39.0, 33.0, 27.0, 21.0, 15.0];
    assert_eq!(tally.left.len(), 6, "{tally:?}");
    for (got, want) in tally.left.iter().zip(expected) {
        assert!((got - want).abs() < 1e-9, "{tally:?}");
    }
    // Commits: the first (5 + 10 set aside), the third (6 + 10) and the sixth (6 + 10); the
    // others were paid from what was set aside.
    let frames = std::fs::metadata(&ledger_file).unwrap().len()
        / (8 + cloakd::ledger::file::PAYLOAD_BYTES as u64);
    assert_eq!(frames, 3, "{tally:?}");
    kill_9(daemon.pid());
    drop(client);
    drop(daemon);
    let daemon = DaemonProcess::start(&config);
    let mut client = MobileClient::connect(daemon.channel().await).await;
    // 47 counted as spent (35 paid, 12 set aside and forfeited): a first draw of 5 no longer fits.
    ask(&mut client, user, 100, 101, &mut tally).await;
    assert_eq!(tally.left.len(), 6, "{tally:?}");
    assert_eq!(tally.refused, 1, "{tally:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_let_one_user_spend_more_than_the_budget_together() {
    let nats = NatsCluster::single().await;
    let replica = |node: &str| {
        let mut config: cloakd::config::Config =
            cloakd::config::Config::load_with_env(None, budget_env()).expect("valid config");
        config.cluster = nats.cluster_config(&[0], node, 1, 1500);
        config
    };
    let a = TestDaemon::start(replica("a")).await;
    let b = TestDaemon::start(replica("b")).await;
    let user = "budget-replica-user";
    let mut on_a = MobileClient::connect(a.channel().await).await;
    let mut on_b = MobileClient::connect(b.channel().await).await;
    // Both replicas asked at once, each 12 times: together far past what the budget allows.
    let (mut ta, mut tb) = (Tally::default(), Tally::default());
    tokio::join!(
        ask(&mut on_a, user, 0, 12, &mut ta),
        ask(&mut on_b, user, 1000, 1012, &mut tb)
    );
    let answers = ta.left.len() + tb.left.len();
    assert!(ta.refused + tb.refused > 0, "{ta:?} {tb:?}");
    assert!(
        answers as f64 * EPSILON <= BUDGET,
        "{answers} answers together spent more than the budget: {ta:?} {tb:?}"
    );
    // Each replica's view only goes down too.
    for t in [&ta, &tb] {
        for pair in t.left.windows(2) {
            assert!(pair[1] < pair[0], "{t:?}");
        }
    }
}

fn budget_env() -> Vec<(String, String)> {
    [
        ("CLOAKD_LOCATION__GEO_IND__BUDGET", format!("{BUDGET:?}")),
        (
            "CLOAKD_LOCATION__GEO_IND__BUDGET_WINDOW_MS",
            WINDOW_MS.to_string(),
        ),
        (
            "CLOAKD_LOCATION__GEO_IND__REUSE_TEST_EPSILON_PER_KM",
            "1.0".to_string(),
        ),
        (
            "CLOAKD_LOCATION__GEO_IND__REUSE_THRESHOLD_M",
            "500.0".to_string(),
        ),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec()
}
