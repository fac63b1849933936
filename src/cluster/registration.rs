//! One running replica per node id: a replica registers `cluster.node_id` as the lease `node.<id>`
//! in the leases bucket before it serves, keeps it renewed like any lease, and releases it when it
//! stops.
//!
//! Two replicas with one name would each believe they hold the cells and streams leased under that
//! name, and forwarded work would reach either of them, so the second one refuses to start:
//! - **Live holder.** A replica that holds the registration renews it every `lease_ms / 3`. A
//!   starting replica that finds the key held watches its revision; once it sees the revision
//!   change (a renewal, or another registration) it refuses to start with
//!   [`RegistrationError::Taken`], naming `cluster.node_id` and the holder (host name and process
//!   id, nothing secret). That takes about `lease_ms / 3`.
//! - **Crashed holder.** A replica killed without stopping (SIGKILL, a lost machine) leaves its
//!   registration behind until it lapses. A replica that starts again at once with the same
//!   explicit id finds it unchanged, waits (logging that it waits and for how long at most), and
//!   takes it over after one lease duration without a renewal (see [`super::lease`]), then starts.
//!   The default node id is new for every process, so this wait only concerns explicit ids.
//!
//! Invariant: while a replica serves, it holds the registration of its node id, or it lost the
//! lease (NATS unreachable longer than `lease_ms`) and logs an error until it holds it again;
//! no two replicas start with the same id while both are connected to NATS.
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use tokio::sync::Mutex;

use super::lease::{Contender, Lease, LeaseAttempt};
use super::{Cluster, ClusterError};

/// Why a replica does not start under its node id.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error(
        "cluster.node_id {node_id:?} is in use by another running replica ({holder}): give each replica its own cluster.node_id, or leave it empty for a name unique to each process"
    )]
    Taken { node_id: String, holder: String },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The held registration of this replica's node id; renewed in the background, re-taken if lost.
#[derive(Debug)]
pub struct Registration {
    lease: Arc<Mutex<Option<Lease>>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The bucket key registering `node_id`.
pub fn registration_key(node_id: &str) -> String {
    format!("node.{node_id}")
}

/// How this process names itself as the holder of its registration: host name and process id.
pub fn holder_description() -> String {
    format!(
        "pid {} on host {}",
        std::process::id(),
        super::connect::host_name().unwrap_or_else(|| "(unnamed)".into())
    )
}

impl Cluster {
    /// Registers this replica's node id (see the module doc): returns once it is held, or refuses
    /// when a live replica holds it.
    pub async fn register(&self) -> Result<Registration, RegistrationError> {
        // A fresh replicated bucket may not answer until JetStream has elected its leader (replicas
        // starting together): key-value errors are retried for about 30 s, as opening the bucket is.
        let mut pause = Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            match self.try_register().await {
                Err(RegistrationError::Cluster(e)) if attempt < 8 => {
                    tracing::warn!(error = %e, attempt, "cannot register cluster.node_id yet; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(8));
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn try_register(&self) -> Result<Registration, RegistrationError> {
        let kv = self.lease_bucket().await?;
        let key = registration_key(&self.node_id);
        let holder = holder_description();
        let lease = self.config.lease;
        let mut contender = Contender::new(&kv, &key, &holder, lease);
        let first_seen = live_revision(&kv, &key).await?;
        let mut warned = false;
        let acquired = loop {
            match contender.try_acquire().await? {
                LeaseAttempt::Acquired(lease) => break lease,
                LeaseAttempt::HeldBy {
                    holder: other,
                    takeover_in,
                } => {
                    let now = live_revision(&kv, &key).await?;
                    let renewed = match (&first_seen, &now) {
                        (Some((first, _)), Some((current, holder))) if first != current => {
                            Some(holder)
                        }
                        // Created by another replica between our two looks: one starting now.
                        (None, Some((_, holder))) => Some(holder),
                        _ => None,
                    };
                    if let Some(holder) = renewed {
                        return Err(RegistrationError::Taken {
                            node_id: self.node_id.clone(),
                            holder: holder.clone(),
                        });
                    }
                    if !warned {
                        warned = true;
                        tracing::warn!(
                            node_id = %self.node_id,
                            holder = %other,
                            wait_ms = (lease + lease / 3).as_millis() as u64,
                            "cluster.node_id is registered by a replica that may have crashed; waiting at most this long for its registration to lapse (a live replica renewing it makes this one refuse to start)"
                        );
                    }
                    tokio::time::sleep(takeover_in.min(lease / 6).max(Duration::from_millis(10)))
                        .await;
                }
            }
        };
        tracing::info!(node_id = %self.node_id, "cluster.node_id registered");
        let lease = Arc::new(Mutex::new(Some(acquired)));
        let keeper = tokio::spawn(keep(
            Arc::clone(&lease),
            contender,
            self.node_id.clone(),
            holder,
        ));
        Ok(Registration { lease, keeper })
    }
}

/// Takes the registration again whenever it is lost, until aborted.
async fn keep(
    registration: Arc<Mutex<Option<Lease>>>,
    mut contender: Contender,
    node_id: String,
    holder: String,
) {
    loop {
        let state = match registration.lock().await.as_ref() {
            Some(lease) => lease.watch(),
            None => return,
        };
        super::lease::lost(state).await;
        tracing::error!(
            node_id = %node_id,
            "the registration of cluster.node_id lapsed (NATS unreachable for longer than cluster.lease_ms); registering it again"
        );
        let mut reported = false;
        let again = contender
            .acquire_observing(|seen| {
                if let Some(other) = seen
                    && other != holder
                    && !other.starts_with('(')
                    && !reported
                {
                    reported = true;
                    tracing::error!(
                        node_id = %node_id,
                        holder = %other,
                        "another replica registered this cluster.node_id while this one's registration had lapsed: two replicas now run under one name; stop one of them"
                    );
                }
            })
            .await;
        tracing::info!(node_id = %node_id, "cluster.node_id registered again");
        *registration.lock().await = Some(again);
    }
}

/// The revision and holder of `key` if it holds a registration now.
async fn live_revision(kv: &kv::Store, key: &str) -> Result<Option<(u64, String)>, ClusterError> {
    let entry = super::lease::leader_entry(kv, key)
        .await
        .map_err(|message| ClusterError::KeyValue {
            key: key.to_string(),
            message,
        })?;
    Ok(entry
        .filter(|e| e.operation == kv::Operation::Put)
        .map(|e| (e.revision, super::lease::holder_of(&e.value))))
}

impl Registration {
    /// Gives the registration up (a graceful stop): the same node id may start again at once. The
    /// keeper is stopped first (so the release cannot look like a lapse to re-register after), then
    /// the lease is released, which waits for a renewal in flight before deleting the key
    /// ([`Lease::release`]): a renewal landing after the delete would make the next replica under
    /// this id wait for the registration to lapse.
    pub async fn release(mut self) {
        self.keeper.abort();
        let _ = (&mut self.keeper).await;
        if let Some(lease) = self.lease.lock().await.take()
            && let Err(err) = lease.release().await
        {
            tracing::warn!(%err, "cannot release the node id registration; it lapses");
        }
    }
}
