//! The store suite ([`store_support`]) against the JetStream stores, on real `nats-server`
//! processes (`common::nats`): each check gets its own server; the model test's cases get a fresh
//! subject prefix (an independent deployment) each on one server. Opening the same prefix again is
//! a restart. Also: a 3-node cluster with replication 3 loses nothing acknowledged when a node is
//! killed and restarted.
mod common;
mod store_support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cloakd::store::jetstream::{JetStreamRecordLog, JetStreamReleases, Layout};
use cloakd::store::{LogPosition, RecordLog};
use common::nats::NatsCluster;
use store_support::{Opened, Stores, close, record};

/// Upper bound on a failover (liveness, not timing).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// A deployment: a subject prefix on a shared server.
struct JetStreamStores {
    nats: Arc<NatsCluster>,
    prefix: String,
}

fn next_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("suite{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl JetStreamStores {
    async fn fresh() -> JetStreamStores {
        JetStreamStores {
            nats: Arc::new(NatsCluster::single().await),
            prefix: next_prefix(),
        }
    }
}

/// Connects to the comma-separated servers of `url`.
async fn connect(url: &str) -> async_nats::jetstream::Context {
    let servers: Vec<async_nats::ServerAddr> = url.split(',').map(|u| u.parse().unwrap()).collect();
    let client = async_nats::connect(servers)
        .await
        .expect("nats-server answers");
    async_nats::jetstream::new(client)
}

impl Stores for JetStreamStores {
    fn open(&self) -> Pin<Box<dyn Future<Output = Opened> + Send + '_>> {
        Box::pin(async move {
            let js = connect(&self.nats.url()).await;
            let layout = Layout {
                prefix: self.prefix.clone(),
                replicas: 1,
            };
            let log = JetStreamRecordLog::open(js.clone(), layout.clone())
                .await
                .unwrap();
            let releases = JetStreamReleases::open(js, layout).await.unwrap();
            Opened {
                log: Arc::new(log),
                releases: Arc::new(releases),
            }
        })
    }

    fn another(&self) -> JetStreamStores {
        JetStreamStores {
            nats: self.nats.clone(),
            prefix: next_prefix(),
        }
    }
}

store_suite!(JetStreamStores::fresh());

#[tokio::test]
async fn a_restarted_node_of_three_loses_nothing_acknowledged() {
    let mut nats = NatsCluster::three().await;
    let layout = Layout {
        prefix: "replicated".into(),
        replicas: 3,
    };
    let js = connect(&nats.url()).await;
    let log = JetStreamRecordLog::open(js, layout.clone()).await.unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..40u64 {
        if i == 15 {
            nats.kill(1);
        }
        if i == 30 {
            nats.restart(1).await;
        }
        let batch = vec![record("s", i, &format!("r{i}"), &["x"]), close("s", i, 1)];
        // While the stream's leader moves an append may fail (nothing acknowledged); the producer
        // publishes again, and ids keep a retry from storing anything twice.
        let started = std::time::Instant::now();
        while let Err(e) = log.append(batch.clone()).await {
            assert!(started.elapsed() < PATIENCE, "appends fail for good: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        acknowledged.extend(batch);
    }
    // Read back through the restarted node alone.
    let js = connect(&nats.node_url(1)).await;
    let log = JetStreamRecordLog::open(js, layout).await.unwrap();
    assert_eq!(
        log.replay(LogPosition::START).await.unwrap().entries,
        acknowledged
    );
}
