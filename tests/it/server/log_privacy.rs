//! No token, user id or exact position in any log line, at the most verbose level: the real binary runs
//! with `RUST_LOG=trace` while clients authenticate (and fail to), submit, get cloaked, get answers,
//! forge answers, pose as other users and run into the rate limit; then its whole stderr is searched.
use std::process::{Command, Stdio};
use std::time::Duration;

use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_broker_client::LocationBrokerClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LbsAnswer, LbsSubscription, LocationRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::support::security::{Bearer, connect_when_listening, token_of};

const USERS: [&str; 3] = ["ulrike-zq7x", "ulf-kv3m", "mallory-pw9t"];
const FORGED_TOKEN: &str = "forged-token-ghj7u2";

fn location(i: usize) -> (f64, f64) {
    (
        53.1412345678 + i as f64 * 0.000_071_3,
        8.2134567891 + i as f64 * 0.000_052_9,
    )
}

fn request(user: &str, i: usize, request_no: u64) -> LocationRequest {
    let (lat, lon) = location(i);
    LocationRequest {
        user_id: user.into(),
        request_no,
        lat,
        lon,
        k: Some(2),
        dx_m: Some(500.0),
        dy_m: Some(500.0),
        dt_ms: Some(10_000),
        payload: b"restaurants".to_vec(),
        service: "poi".into(),
        ..Default::default()
    }
}

fn client(channel: &Channel, token: Option<String>) -> InterceptedService<Channel, Bearer> {
    InterceptedService::new(channel.clone(), Bearer(token))
}

async fn workload(channel: Channel) {
    // Failed authentication: an unknown token, and a malformed header.
    let _ = LbsGatewayClient::new(client(&channel, Some(FORGED_TOKEN.into())))
        .subscribe(LbsSubscription {
            service: "poi".into(),
        })
        .await;
    let mut provider = LbsGatewayClient::new(client(&channel, Some(token_of("lbs-poi"))))
        .subscribe(LbsSubscription {
            service: "poi".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut a = LocationBrokerClient::new(client(&channel, Some(token_of("app-a"))));
    let mut b = LocationBrokerClient::new(client(&channel, Some(token_of("app-b"))));
    let (a_tx, a_rx) = tokio::sync::mpsc::channel(16);
    let (b_tx, b_rx) = tokio::sync::mpsc::channel(16);
    let mut a_events = a
        .submit(tokio_stream::wrappers::ReceiverStream::new(a_rx))
        .await
        .unwrap()
        .into_inner();
    let mut b_events = b
        .submit(tokio_stream::wrappers::ReceiverStream::new(b_rx))
        .await
        .unwrap()
        .into_inner();
    // app-a poses as app-b's user; then both submit for their own users and are cloaked together.
    a_tx.send(request(USERS[1], 0, 1)).await.unwrap();
    a_tx.send(request(USERS[0], 1, 2)).await.unwrap();
    b_tx.send(request(USERS[1], 2, 1)).await.unwrap();
    // An invalid position (out of range) is rejected without repeating it.
    let mut bad = request(USERS[1], 3, 2);
    bad.lat = 91.234567;
    b_tx.send(bad).await.unwrap();
    let mut outcomes = Vec::new();
    for events in [&mut a_events, &mut b_events] {
        for _ in 0..2 {
            let event = tokio::time::timeout(Duration::from_secs(10), events.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            outcomes.push(event.outcome);
        }
    }
    let cloaked = outcomes
        .iter()
        .filter(|o| matches!(o, Some(Outcome::Cloaked(_))))
        .count();
    assert_eq!(cloaked, 2, "{outcomes:?}");
    let mut pseudonyms = Vec::new();
    for _ in 0..2 {
        let cloaked = tokio::time::timeout(Duration::from_secs(10), provider.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        pseudonyms.push(cloaked.pseudonym);
    }
    // A forged answer from another provider, then the genuine ones.
    let forged = LbsGatewayClient::new(client(&channel, Some(token_of("lbs-poi-2"))))
        .answer(tokio_stream::iter(vec![LbsAnswer {
            pseudonym: pseudonyms[0].clone(),
            payload: b"forged".to_vec(),
            ack: false,
        }]))
        .await;
    assert!(forged.is_err());
    let answers: Vec<LbsAnswer> = pseudonyms
        .iter()
        .map(|p| LbsAnswer {
            pseudonym: p.clone(),
            payload: b"pizza".to_vec(),
            ack: false,
        })
        .collect();
    LbsGatewayClient::new(client(&channel, Some(token_of("lbs-poi"))))
        .answer(tokio_stream::iter(answers))
        .await
        .unwrap();
    // Past the rate (2 requests/s): app-a sends a burst.
    for n in 10..20 {
        a_tx.send(request(USERS[0], 4, n)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop((a_tx, b_tx));
}

#[tokio::test]
async fn no_token_user_id_or_position_in_trace_logs() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::support::free_port();
    let mut config = format!(
        "[telemetry]\nmetrics_listen = \"127.0.0.1:0\"\n[server]\nlisten = \"127.0.0.1:{port}\"\n[transactions]\ndata_dir = {:?}\n[location]\nmax_requests_per_s_per_principal = 2\n[auth]\nrequired = true\n",
        dir.path().join("data")
    );
    for (name, role, scope) in [
        ("app-a", "mobile", format!("user_ids = [{:?}]", USERS[0])),
        ("app-b", "mobile", format!("user_ids = [{:?}]", USERS[1])),
        ("lbs-poi", "provider", "services = [\"poi\"]".to_string()),
        ("lbs-poi-2", "provider", "services = [\"poi\"]".to_string()),
    ] {
        config.push_str(&format!(
            "[[auth.principals]]\nname = {name:?}\nrole = {role:?}\ntoken_sha256 = {:?}\n{scope}\n",
            cloakd::auth::hash_token(&token_of(name))
        ));
    }
    let config_path = dir.path().join("cloakd.toml");
    std::fs::write(&config_path, config).unwrap();
    let log_path = dir.path().join("stderr.log");
    let mut child = crate::support::bin()
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    let channel = connect_when_listening(|| endpoint.connect()).await;
    workload(channel).await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    let log = std::fs::read_to_string(&log_path).unwrap();
    // The log is verbose and holds the security events, naming principals.
    assert!(log.lines().count() > 100, "suspiciously short log:\n{log}");
    assert!(log.contains("TRACE"), "not at trace level");
    for event in ["authentication_failed", "permission_denied", "rate_limited"] {
        assert!(log.contains(event), "no {event} event in the log");
    }
    assert!(log.contains("app-a") && log.contains("lbs-poi-2"));

    // Lines are searched less their leading timestamp, and only that is left out.
    let stamped = log
        .lines()
        .filter(|line| without_timestamp(line).len() + 20 <= line.len())
        .count();
    assert!(stamped > 100, "timestamps not recognised:\n{log}");
    assert_eq!(
        without_timestamp("\u{1b}[2m2026-11-27T00:39:08.213462Z\u{1b}[0m TRACE 8.21346"),
        "\u{1b}[0m TRACE 8.21346"
    );

    let mut secrets: Vec<String> = vec![FORGED_TOKEN.to_string()];
    for name in ["app-a", "app-b", "lbs-poi", "lbs-poi-2"] {
        secrets.push(token_of(name));
    }
    secrets.extend(USERS.iter().map(|u| u.to_string()));
    for i in 0..5 {
        let (lat, lon) = location(i);
        secrets.push(format!("{lat}"));
        secrets.push(format!("{lon}"));
        secrets.push(format!("{lat:.5}"));
        secrets.push(format!("{lon:.5}"));
    }
    secrets.push("91.234567".into());
    for secret in &secrets {
        if let Some(line) = log
            .lines()
            .find(|line| without_timestamp(line).contains(secret.as_str()))
        {
            panic!("the log leaks {secret:?}:\n{line}");
        }
    }
}

/// A log line less the timestamp it starts with (`ESC[2m2026-11-27T00:39:08.213462Z ESC[0m …`):
/// `…:08.213462Z` holds `8.21346` by chance, like a coordinate printed to five places. The rest of
/// the line is searched in full.
fn without_timestamp(line: &str) -> &str {
    let rest = line.strip_prefix("\u{1b}[2m").unwrap_or(line);
    let end = rest.find([' ', '\u{1b}']).unwrap_or(rest.len());
    let token = &rest[..end];
    let is_timestamp = token.len() >= 20
        && token.as_bytes()[4] == b'-'
        && token.contains('T')
        && token.ends_with('Z');
    if is_timestamp { &rest[end..] } else { line }
}
