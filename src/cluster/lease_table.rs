//! Many leases of one kind (the transaction streams, the location cells) contended by this replica,
//! each followed by its own task, with a table of who holds what as far as this replica knows.
//!
//! [`LeaseTable::contend`] starts following a key (once; later calls do nothing): the task takes the
//! lease whenever it can (absent, released, or unchanged for a whole lease duration, see
//! [`super::lease`]), renews it while held, and contends again once it is lost. Meanwhile it records
//! the holder it last saw, so that a replica that does not hold a key knows where to send the work
//! that key's holder does. [`LeaseTable::owner`] answers from that table without waiting.
//!
//! [`LeaseTable::changes`] counts every gain and loss of this replica: whoever acts on what it holds
//! (the window writer rebuilding a stream's state from the log after taking it over) watches it.
//! Invariant: [`Owner::Local`] is reported only while the underlying [`Lease`] is held (its renewal
//! task reports the loss, and the table drops the entry before announcing the change).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::watch;

use super::lease::{Contender, Lease};

/// Who holds a key, as far as this replica knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This replica holds the lease now.
    Local,
    /// Another replica held it when this one last looked.
    Remote(String),
    /// Nobody is known to hold it (never looked, just released, or being taken over).
    Vacant,
}

#[derive(Debug)]
struct Shared {
    kv: kv::Store,
    holder: String,
    duration: Duration,
    /// Key prefix in the bucket, e.g. `stream.`.
    kind: String,
    owners: Mutex<HashMap<String, Owner>>,
    /// Gains and losses of this replica, counted.
    changes: watch::Sender<u64>,
    /// Set by [`LeaseTable::stop`]: held leases are released and nothing is contended any more.
    stopping: watch::Sender<bool>,
}

/// The leases of one kind this replica contends for (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct LeaseTable {
    shared: Arc<Shared>,
    tasks: Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>,
}

impl LeaseTable {
    /// Leases on keys `<kind>.<name>` of `kv`, held under the name `holder` for `duration`.
    pub fn new(kv: kv::Store, kind: &str, holder: &str, duration: Duration) -> LeaseTable {
        LeaseTable {
            shared: Arc::new(Shared {
                kv,
                holder: holder.to_string(),
                duration,
                kind: kind.to_string(),
                owners: Mutex::new(HashMap::new()),
                changes: watch::channel(0).0,
                stopping: watch::channel(false).0,
            }),
            tasks: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// This replica's name, as it appears as a holder.
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }

    /// The bucket key of `name` (a NATS key token: the caller passes a safe name, e.g. hex).
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.shared.kind)
    }

    /// Who holds `name` as far as this replica knows ([`Owner::Vacant`] if it does not follow it).
    pub fn owner(&self, name: &str) -> Owner {
        lock(&self.shared.owners)
            .get(name)
            .cloned()
            .unwrap_or(Owner::Vacant)
    }

    /// Whether this replica holds `name` now.
    pub fn holds(&self, name: &str) -> bool {
        self.owner(name) == Owner::Local
    }

    /// The names this replica follows.
    pub fn followed(&self) -> Vec<String> {
        lock(&self.tasks)
            .keys()
            .filter(|name| !name.is_empty())
            .cloned()
            .collect()
    }

    /// Counts every gain and loss of a lease by this replica.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Starts contending for `name` (idempotent). Its task runs until the table is dropped.
    pub fn contend(&self, name: &str) {
        let mut tasks = lock(&self.tasks);
        if tasks.contains_key(name) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let name = name.to_string();
        tasks.insert(name.clone(), tokio::spawn(follow(shared, name)));
    }

    /// Contends for every key of this kind any replica has created, now and later: a replica
    /// then takes over what a failed replica held even if it never saw the key itself. Runs until
    /// the table stops; a broken watch is opened again.
    pub fn follow_all(&self) {
        let table = self.clone();
        let task = tokio::spawn(async move {
            let filter = format!("{}.>", table.shared.kind);
            let prefix = format!("{}.", table.shared.kind);
            let mut stopping = table.shared.stopping.subscribe();
            loop {
                match table.shared.kv.watch_with_history(&filter).await {
                    Ok(mut keys) => loop {
                        tokio::select! {
                            entry = keys.next() => match entry {
                                Some(Ok(entry)) => {
                                    if let Some(name) = entry.key.strip_prefix(&prefix) {
                                        table.contend(name);
                                    }
                                }
                                Some(Err(err)) => {
                                    tracing::warn!(%err, "watching the lease bucket failed; watching again");
                                    break;
                                }
                                None => break,
                            },
                            _ = stopping.wait_for(|stop| *stop) => return,
                        }
                    },
                    Err(err) => tracing::warn!(%err, "cannot watch the lease bucket; retrying"),
                }
                tokio::select! {
                    () = tokio::time::sleep(table.shared.duration / 3) => {}
                    _ = stopping.wait_for(|stop| *stop) => return,
                }
            }
        });
        lock(&self.tasks).insert(String::new(), task);
    }

    /// Waits until someone (this replica or another) is known to hold `name`, at most `timeout`;
    /// starts contending for it first. The owner then, possibly still [`Owner::Vacant`].
    pub async fn resolve(&self, name: &str, timeout: Duration) -> Owner {
        self.contend(name);
        let mut changes = self.shared.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let owner = self.owner(name);
            if owner != Owner::Vacant {
                return owner;
            }
            // Remote holders are recorded without a change being announced: poll them too.
            let poll = tokio::time::sleep(Duration::from_millis(20));
            tokio::select! {
                _ = changes.changed() => {}
                () = poll => {}
                () = tokio::time::sleep_until(deadline) => return self.owner(name),
            }
        }
    }

    /// Whether `name`'s key exists in the bucket (held now, or held once and released).
    pub async fn ever_leased(&self, name: &str) -> Result<bool, super::ClusterError> {
        let key = self.key(name);
        match super::lease::leader_entry(&self.shared.kv, &key).await {
            Ok(entry) => Ok(entry.is_some()),
            Err(message) => Err(super::ClusterError::KeyValue { key, message }),
        }
    }

    /// Releases every lease this replica holds and stops contending (a graceful shutdown: others
    /// take over at once instead of after a lease duration). Returns once every lease is released
    /// or given up.
    pub async fn stop(&self) {
        self.shared.stopping.send_replace(true);
        let tasks: Vec<_> = lock(&self.tasks).drain().map(|(_, task)| task).collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for LeaseTable {
    fn drop(&mut self) {
        // The last handle gone: stop every follower (held leases lapse after a lease duration).
        if Arc::strong_count(&self.tasks) == 1 {
            for (_, task) in lock(&self.tasks).drain() {
                task.abort();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn set_owner(shared: &Shared, name: &str, owner: Owner) {
    let local_before = {
        let mut owners = lock(&shared.owners);
        let before = owners.insert(name.to_string(), owner.clone());
        before == Some(Owner::Local)
    };
    let local_now = owner == Owner::Local;
    if local_before != local_now {
        let held = metrics::gauge!(crate::telemetry::catalog::CLUSTER_LEASES_HELD, "kind" => shared.kind.clone());
        if local_now {
            held.increment(1.0);
        } else {
            held.decrement(1.0);
        }
        shared.changes.send_modify(|n| *n += 1);
    }
}

/// Follows one key until the table stops: acquire, hold until lost, contend again.
async fn follow(shared: Arc<Shared>, name: String) {
    let key = format!("{}.{name}", shared.kind);
    let mut contender = Contender::new(&shared.kv, &key, &shared.holder, shared.duration);
    let mut stopping = shared.stopping.subscribe();
    loop {
        let lease = tokio::select! {
            lease = acquire(&shared, &name, &mut contender) => lease,
            _ = stopping.wait_for(|stop| *stop) => return,
        };
        tracing::info!(lease = %key, fencing_token = lease.fencing_token(), "lease taken");
        set_owner(&shared, &name, Owner::Local);
        let stopped = tokio::select! {
            () = lease.lost() => false,
            _ = stopping.wait_for(|stop| *stop) => true,
        };
        // Not ours any more from here on, whatever the release does.
        set_owner(&shared, &name, Owner::Vacant);
        if stopped {
            if let Err(err) = lease.release().await {
                tracing::warn!(lease = %key, %err, "cannot release the lease; it lapses");
            }
            return;
        }
        tracing::warn!(lease = %key, "lease lost");
    }
}

/// As [`Contender::acquire`], recording each holder seen on the way.
async fn acquire(shared: &Shared, name: &str, contender: &mut Contender) -> Lease {
    contender
        .acquire_observing(|holder| {
            let owner = match holder {
                // Our own earlier tenure (lost, not yet taken over), unknown, or a failed attempt:
                // nobody to send work to.
                Some(holder) if holder != shared.holder && !holder.starts_with('(') => {
                    Owner::Remote(holder.to_string())
                }
                _ => Owner::Vacant,
            };
            set_owner(shared, name, owner);
        })
        .await
}
