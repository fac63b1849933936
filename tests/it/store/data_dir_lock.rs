//! One daemon per data directory: a second `cloakd serve` on a directory in use exits non-zero naming
//! the directory and the holder's pid (it used to start, and half of the records acknowledged through
//! the two daemons were lost at the next restart); the first daemon is unaffected, and once it stops
//! the directory can be used again.
use std::time::Duration;

use crate::support::transactions::{next_windows, publish, random_records, subscribe};
use crate::support::{TestDaemon, config_with};

#[tokio::test]
async fn a_second_daemon_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = config_with(|c| {
        c.transactions.data_dir = path.clone();
        c.transactions.defaults.window_records = 100;
    });
    let first = TestDaemon::start(config.clone()).await;
    let outcome = publish(first.channel().await, random_records("s", "a", 100, 1)).await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);

    let second = tokio::task::spawn_blocking({
        let path = path.clone();
        move || {
            crate::support::bin()
                .args(["serve", "--listen", "127.0.0.1:0"])
                .env("CLOAKD_TRANSACTIONS__DATA_DIR", &path)
                // Not the default 9464, which a daemon running beside the tests may hold: the
                // refusal must come from the data directory's lock.
                .env("CLOAKD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(!second.status.success(), "the second daemon started");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );

    // The first daemon still serves, and every acknowledged record is released.
    let mut feed = subscribe(first.channel().await, "s", 0).await.unwrap();
    assert_eq!(next_windows(&mut feed, 1).await[0].records.len(), 100);
    first.shutdown().await.unwrap();

    // The kernel released the lock with the first daemon: the directory is usable again.
    let again = TestDaemon::start(config).await;
    let mut feed = subscribe(again.channel().await, "s", 0).await.unwrap();
    let window = tokio::time::timeout(Duration::from_secs(30), async {
        next_windows(&mut feed, 1).await
    })
    .await
    .unwrap();
    assert_eq!(window[0].records.len(), 100);
    again.shutdown().await.unwrap();
}
