//! Node ids are unique across running replicas (`cloakd::cluster::registration`), with the real
//! `cloakd` binary on a real `nats-server`: a second replica started under the id of a running one
//! refuses to start naming `cluster.node_id` and the holder; a replica killed with SIGKILL and
//! started again at once under its explicit id waits for its old registration to lapse, then
//! serves; after a graceful stop the id is free at once; replicas left with the default id each get
//! their own.
use std::time::Duration;

use crate::support::nats::NatsCluster;
use crate::support::process::DaemonProcess;

fn config(nats: &NatsCluster, node_id: &str) -> String {
    format!(
        "[cluster]\nnats_url = {:?}\nnode_id = {node_id:?}\nlease_ms = 1500\n",
        nats.url()
    )
}

/// Runs `cloakd serve` on `config_path` until it exits (it must, within 60 s): exit success and stderr.
async fn run_to_exit(config_path: std::path::PathBuf) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let mut child = crate::support::bin()
            .args(["serve", "--config"])
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
                return (status.success(), stderr);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("a replica with a node id in use did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap()
}

fn logged(daemon: &DaemonProcess, message: &str) -> bool {
    daemon.logs().iter().any(|l| l["message"] == message)
}

const WAITING: &str = "cluster.node_id is registered by a replica that may have crashed; waiting at most this long for its registration to lapse (a live replica renewing it makes this one refuse to start)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_with_a_running_replicas_id_refuses_to_start() {
    let nats = NatsCluster::single().await;
    let a = DaemonProcess::start(&config(&nats, "shared-name"));
    // The same configuration file: same node id, its own ephemeral ports.
    let (ok, stderr) = run_to_exit(a.config_path.clone()).await;
    assert!(!ok, "the second replica started: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("cluster.node_id \"shared-name\" is in use by another running replica")
            && last.contains(&format!("pid {} on host", a.pid())),
        "{stderr}"
    );
    // The first replica was not disturbed: it still serves and holds its registration.
    let health = tonic_health::pb::health_client::HealthClient::new(a.channel().await)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("the running replica still serves");
    assert_eq!(health.into_inner().status, 1);
    assert!(
        a.logs().iter().all(|l| l["level"] != "ERROR"),
        "{:#?}",
        a.logs()
    );

    // A graceful stop releases the id: the next replica under it starts without waiting (the
    // release waits for a renewal in flight, so none lands after the delete).
    a.stop();
    let again = DaemonProcess::start(&config(&nats, "shared-name"));
    assert!(logged(&again, "cluster.node_id registered"));
    assert!(!logged(&again, WAITING), "{:#?}", again.logs());
    again.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_started_again_waits_for_its_old_registration() {
    let nats = NatsCluster::single().await;
    let a = DaemonProcess::start(&config(&nats, "a"));
    a.signal("KILL");
    drop(a);
    // At once, under the same explicit id: the old registration is still live. The replica waits
    // for it to lapse (nobody renews it), takes it over and serves.
    let again = DaemonProcess::start(&config(&nats, "a"));
    assert!(logged(&again, WAITING), "{:#?}", again.logs());
    let waiting = again
        .logs()
        .into_iter()
        .find(|l| l["message"] == WAITING)
        .unwrap();
    assert_eq!(waiting["node_id"], "a");
    assert!(
        waiting["holder"].as_str().unwrap().starts_with("pid "),
        "{waiting}"
    );
    assert!(logged(&again, "cluster.node_id registered"));
    again.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_the_default_id_each_get_their_own() {
    let nats = NatsCluster::single().await;
    let a = DaemonProcess::start(&config(&nats, ""));
    let b = DaemonProcess::start(&config(&nats, ""));
    let name = |d: &DaemonProcess| {
        d.logs()
            .into_iter()
            .find(|l| l["message"] == "cloakd listening")
            .unwrap()["cluster"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (na, nb) = (name(&a), name(&b));
    assert_ne!(na, nb);
    for n in [&na, &nb] {
        assert!(
            n.len() <= 64
                && n.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
            "{n} is not a subject token"
        );
    }
    a.stop();
    b.stop();
}
