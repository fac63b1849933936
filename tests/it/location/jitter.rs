//! `location.forward_jitter_ms`: a formed group is forwarded after a random delay within every
//! member's deadline; clients and providers still get every request exactly once, and a group whose
//! members are shut down while it waits is reported as not forwarded.
use cloakd::proto::location_event::Outcome;

use crate::support::{
    MobileClient, TestDaemon, config_with, next_cloaked, request_at, subscribe_provider,
};

#[tokio::test]
async fn jittered_groups_are_forwarded_once_within_their_deadlines() {
    let daemon = TestDaemon::start(config_with(|c| c.location.forward_jitter_ms = 300)).await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut clients = Vec::new();
    for round in 0..5u64 {
        let mut a = MobileClient::connect(daemon.channel().await).await;
        let mut b = MobileClient::connect(daemon.channel().await).await;
        a.send(request_at("a", round, 0.0, 2)).await;
        b.send(request_at("b", round, 15.0, 2)).await;
        for client in [&mut a, &mut b] {
            let event = client.next_event(10).await;
            let Some(Outcome::Cloaked(cloaked)) = event.outcome else {
                panic!("{event:?}")
            };
            assert_eq!(cloaked.group_size, 2);
        }
        clients.push((a, b));
    }
    let mut pseudonyms = std::collections::HashSet::new();
    for _ in 0..10 {
        pseudonyms.insert(next_cloaked(&mut provider, 10).await.pseudonym);
    }
    assert_eq!(pseudonyms.len(), 10);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_group_waiting_out_its_jitter_at_shutdown_is_not_forwarded() {
    // A jitter far beyond the test: the group waits (up to its 60 s deadline) when shutdown comes.
    let daemon = TestDaemon::start(config_with(|c| c.location.forward_jitter_ms = 3_600_000)).await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    let mut first = request_at("a", 1, 0.0, 2);
    let mut second = request_at("b", 1, 15.0, 2);
    first.dt_ms = Some(60_000);
    second.dt_ms = Some(60_000);
    a.send(first).await;
    b.send(second).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stopping = tokio::spawn(daemon.shutdown());
    let mut outcomes = Vec::new();
    for client in [&mut a, &mut b] {
        let event = client.next_event(30).await;
        outcomes.push(event.outcome);
    }
    stopping.await.unwrap().unwrap();
    // With probability 1 - 2/60,000 the delay outlasted the 300 ms; either way every request got
    // exactly one outcome, and Rejected ones say they were not forwarded.
    for outcome in outcomes {
        match outcome {
            Some(Outcome::Cloaked(_)) => {}
            Some(Outcome::Rejected(r)) => assert!(r.reason.contains("not forwarded"), "{r:?}"),
            other => panic!("{other:?}"),
        }
    }
}
