//! A lease on one key of a JetStream key-value bucket, by compare-and-set: how exactly one replica
//! at a time owns a location cell or seals a stream's windows.
//!
//! The key holds `{"holder": <node id>, "tenure": <random>}`; its revision (the bucket's sequence
//! number of the last write) changes on every write.
//! - **Acquire**: create the key if it is absent or deleted; otherwise watch it, and once the same
//!   revision has been seen unchanged for a whole lease duration on the contender's own clock, replace
//!   it with an update that expects exactly that revision.
//! - **Renew**: every `lease / 3` the holder rewrites the key expecting the revision it last wrote.
//!   A renewal unanswered after `lease / 3` (a JetStream leader being elected) is given up and made
//!   again at once, expecting the same revision.
//! - **Lost**: a renewal that finds another revision (someone took over), or no successful renewal
//!   for `lease × (1 − DRIFT)` since the last one was sent, ends the tenure. **Release**: stop
//!   renewing and wait for a renewal in flight to be answered (one landing after the delete would
//!   write the key again, and the next holder would wait a whole lease for it to lapse), then delete
//!   the key if it still holds this tenure, expecting the revision it holds, so others may create
//!   it at once.
//!
//! Invariant: at most one holder whose lease is unexpired. A holder counts its lease from the moment
//! it *sent* its last successful write, a contender from the moment it first *saw* that write, which
//! is later; so as long as the two clocks' rates differ by less than [`DRIFT`] the holder stops
//! holding before any contender may take over. All time is tokio's clock; nothing compares the
//! clocks of two machines.
//!
//! Fencing: [`Lease::fencing_token`] is the revision at which the tenure began. Revisions only grow,
//! so a later tenure has a larger token; whatever a holder writes elsewhere should carry it, so that
//! a store may refuse a write whose token is smaller than one it has already seen (a holder paused
//! past its lease, then resuming, is refused instead of overwriting its successor).
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::ClusterError;

/// The largest relative difference between two replicas' clock rates the invariant tolerates: a
/// holder gives its lease up this fraction of a lease before a contender may take it.
pub const DRIFT: f64 = 0.1;

/// What the key holds while leased.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LeaseValue {
    holder: String,
    tenure: String,
}

/// The outcome of one attempt to acquire a lease.
#[derive(Debug)]
pub enum LeaseAttempt {
    /// The lease is ours.
    Acquired(Lease),
    /// Someone else holds it (as far as this contender can tell); try again later.
    HeldBy {
        holder: String,
        /// How long at most until this contender may take it over, if nobody renews it.
        takeover_in: Duration,
    },
}

/// One replica contending for the lease of one key; remembers what it saw so an abandoned lease can
/// be taken over once it has stayed unchanged for a whole lease duration.
#[derive(Debug)]
pub struct Contender {
    kv: kv::Store,
    key: String,
    holder: String,
    duration: Duration,
    /// The last revision seen on the key, and when this contender first saw it.
    seen: Option<(u64, Instant)>,
}

impl Contender {
    pub fn new(kv: &kv::Store, key: &str, holder: &str, duration: Duration) -> Contender {
        Contender {
            kv: kv.clone(),
            key: key.to_string(),
            holder: holder.to_string(),
            duration,
            seen: None,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// One attempt: create the key if absent, take it over if it has not changed for a lease
    /// duration, report the holder otherwise.
    pub async fn try_acquire(&mut self) -> Result<LeaseAttempt, ClusterError> {
        let tenure = format!("{:016x}", rand::random::<u64>());
        let value = LeaseValue {
            holder: self.holder.clone(),
            tenure,
        };
        let bytes = Bytes::from(serde_json::to_vec(&value).expect("a lease value serializes"));
        let entry = leader_entry(&self.kv, &self.key)
            .await
            .map_err(|e| self.error(e))?;
        let live = entry
            .as_ref()
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| (e.revision, holder_of(&e.value)));
        let sent = Instant::now();
        let written = match live {
            None => match create(&self.kv, &self.key, bytes)
                .await
                .map_err(|e| self.error(e))?
            {
                Some(revision) => revision,
                // Someone created it since we looked: it is theirs for now.
                None => return Ok(self.observe(0, "(unknown)".into())),
            },
            Some((revision, holder)) => {
                let first_seen = match self.seen {
                    Some((r, at)) if r == revision => at,
                    _ => {
                        self.seen = Some((revision, Instant::now()));
                        return Ok(LeaseAttempt::HeldBy {
                            holder,
                            takeover_in: self.duration,
                        });
                    }
                };
                let unchanged = first_seen.elapsed();
                if unchanged < self.duration {
                    return Ok(LeaseAttempt::HeldBy {
                        holder,
                        takeover_in: self.duration - unchanged,
                    });
                }
                match self.kv.update(&self.key, bytes, revision).await {
                    Ok(revision) => {
                        tracing::info!(key = %self.key, previous = %holder, "lease taken over after it was not renewed");
                        revision
                    }
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        // Renewed (or taken) meanwhile.
                        return Ok(self.observe(0, holder));
                    }
                    Err(e) => return Err(self.error(e)),
                }
            }
        };
        self.seen = None;
        Ok(LeaseAttempt::Acquired(Lease::start(
            self.kv.clone(),
            self.key.clone(),
            value,
            written,
            sent,
            self.duration,
        )))
    }

    /// Waits until this contender holds the lease (retrying on NATS errors, which are logged).
    pub async fn acquire(&mut self) -> Lease {
        self.acquire_observing(|_| {}).await
    }

    /// As [`Self::acquire`], telling `held_by` after each attempt who holds the lease meanwhile:
    /// `Some(holder)` as the key names it (`"(unknown)"` when another contender created it just
    /// before), `None` after a failed attempt.
    pub async fn acquire_observing(&mut self, mut held_by: impl FnMut(Option<&str>)) -> Lease {
        let mut changes = self.kv.watch(&self.key).await.ok();
        loop {
            let wait = match self.try_acquire().await {
                Ok(LeaseAttempt::Acquired(lease)) => return lease,
                Ok(LeaseAttempt::HeldBy {
                    holder,
                    takeover_in,
                }) => {
                    held_by(Some(&holder));
                    takeover_in
                }
                Err(err) => {
                    tracing::warn!(%err, "lease acquisition failed; retrying");
                    held_by(None);
                    changes = self.kv.watch(&self.key).await.ok();
                    self.duration / 3
                }
            };
            // Wake when the key changes (a release is taken at once) or the takeover is due.
            let sleep = tokio::time::sleep(wait.max(Duration::from_millis(1)));
            match changes.as_mut() {
                Some(watch) => {
                    tokio::select! {
                        _ = sleep => {}
                        change = watch.next() => if change.is_none() { changes = None },
                    }
                }
                None => sleep.await,
            }
        }
    }

    fn observe(&mut self, revision: u64, holder: String) -> LeaseAttempt {
        if revision != 0 {
            self.seen = Some((revision, Instant::now()));
        } else {
            self.seen = None;
        }
        LeaseAttempt::HeldBy {
            holder,
            takeover_in: self.duration,
        }
    }

    fn error(&self, err: impl std::fmt::Display) -> ClusterError {
        ClusterError::KeyValue {
            key: self.key.clone(),
            message: err.to_string(),
        }
    }
}

/// The key's last entry as the bucket's stream leader has it.
///
/// `kv::Store::entry` is a direct get, which any replica of the bucket may answer, and a replica
/// that has not yet applied the latest write answers with the one before it. A contender woken by a
/// release's delete then read the released tenure, believed the key held, and waited a whole lease
/// before trying again (seen once in `cluster::lease`'s restart test). Every read a lease decides
/// by goes to the leader, which answers only what is committed.
pub(crate) async fn leader_entry(kv: &kv::Store, key: &str) -> Result<Option<kv::Entry>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{}", kv.prefix, key);
    let message = match kv.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let operation = match message.headers.get("KV-Operation") {
        Some(op) => op
            .as_str()
            .parse::<kv::Operation>()
            .map_err(|e| e.to_string())?,
        None => kv::Operation::Put,
    };
    Ok(Some(kv::Entry {
        bucket: kv.name.clone(),
        key: key.to_string(),
        value: message.payload,
        revision: message.sequence,
        delta: 0,
        created: message.time,
        operation,
        seen_current: false,
    }))
}

/// Writes `value` to `key` if the key is absent or deleted (`kv::Store::create`, deciding by the
/// leader's entry): the revision written, or `None` when someone else's write is there.
async fn create(kv: &kv::Store, key: &str, value: Bytes) -> Result<Option<u64>, String> {
    let first = match kv.update(key, value.clone(), 0).await {
        Ok(revision) => return Ok(Some(revision)),
        Err(e) => e,
    };
    match leader_entry(kv, key).await? {
        Some(entry) if entry.operation != kv::Operation::Put => {
            match kv.update(key, value, entry.revision).await {
                Ok(revision) => Ok(Some(revision)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        }
        Some(_) => Ok(None),
        None => Err(first.to_string()),
    }
}

pub(crate) fn holder_of(value: &[u8]) -> String {
    serde_json::from_slice::<LeaseValue>(value)
        .map(|v| v.holder)
        .unwrap_or_else(|_| "(unreadable)".into())
}

/// Whether the tenure goes on, and until when at the latest without another renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Held { until: Instant },
    Lost,
}

#[derive(Debug)]
struct Tenure {
    kv: kv::Store,
    key: String,
    value: LeaseValue,
    bytes: Bytes,
    duration: Duration,
    /// The revision this tenure last wrote.
    revision: Mutex<u64>,
    state: watch::Sender<LeaseState>,
    /// Stops the renewals, after the one in flight ([`Lease::release`]).
    stop: tokio::sync::Notify,
}

impl Tenure {
    /// Whether `entry` holds this tenure (written by it, at whatever revision).
    fn holds(&self, entry: &kv::Entry) -> bool {
        entry.operation == kv::Operation::Put
            && serde_json::from_slice::<LeaseValue>(&entry.value)
                .ok()
                .as_ref()
                == Some(&self.value)
    }

    fn error(&self, err: impl std::fmt::Display) -> ClusterError {
        ClusterError::KeyValue {
            key: self.key.clone(),
            message: err.to_string(),
        }
    }
}

/// A held lease. It renews itself in the background until lost, released, or dropped (dropping
/// stops renewing without releasing: others take over after a lease duration).
#[derive(Debug)]
pub struct Lease {
    tenure: Arc<Tenure>,
    fencing_token: u64,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl Lease {
    /// Waits until `holder` holds the lease on `key` of `kv` (see [`Contender::acquire`]).
    pub async fn acquire(kv: &kv::Store, key: &str, holder: &str, duration: Duration) -> Lease {
        Contender::new(kv, key, holder, duration).acquire().await
    }

    fn start(
        kv: kv::Store,
        key: String,
        value: LeaseValue,
        revision: u64,
        sent: Instant,
        duration: Duration,
    ) -> Lease {
        let bytes = Bytes::from(serde_json::to_vec(&value).expect("a lease value serializes"));
        let (state, _) = watch::channel(LeaseState::Held {
            until: valid_until(sent, duration),
        });
        let tenure = Arc::new(Tenure {
            kv,
            key,
            value,
            bytes,
            duration,
            revision: Mutex::new(revision),
            state,
            stop: tokio::sync::Notify::new(),
        });
        let renewer = tokio::spawn(renew_until_lost(Arc::clone(&tenure)));
        Lease {
            tenure,
            fencing_token: revision,
            renewer,
        }
    }

    /// The key leased.
    pub fn key(&self) -> &str {
        &self.tenure.key
    }

    /// The revision at which this tenure began: larger than any earlier tenure's.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The revision this tenure wrote last.
    pub fn revision(&self) -> u64 {
        *self.tenure.revision.lock().expect("lease revision lock")
    }

    /// Whether the lease is held now (renewed recently enough and not lost).
    pub fn is_held(&self) -> bool {
        match *self.tenure.state.borrow() {
            LeaseState::Held { until } => Instant::now() < until,
            LeaseState::Lost => false,
        }
    }

    /// Follows the state; it turns [`LeaseState::Lost`] once, for good.
    pub fn watch(&self) -> watch::Receiver<LeaseState> {
        self.tenure.state.subscribe()
    }

    /// Completes when the lease is lost (never, while it is renewed), so the owner can step down.
    pub async fn lost(&self) {
        lost(self.watch()).await
    }

    /// Renews now (besides the background renewals); false if the lease is lost.
    pub async fn renew(&self) -> bool {
        renew_once(&self.tenure).await;
        self.is_held()
    }

    /// Gives the lease up: stops renewing, waits for a renewal in flight (so that none lands after
    /// the delete and writes the key again), and deletes the key if it still holds this tenure, so
    /// another replica may take it at once.
    pub async fn release(mut self) -> Result<(), ClusterError> {
        self.tenure.stop.notify_one();
        // Ends at once between renewals, else once the renewal in flight is answered or given up.
        let _ = (&mut self.renewer).await;
        let was_held = self.is_held();
        self.tenure.state.send_replace(LeaseState::Lost);
        if !was_held {
            return Ok(());
        }
        delete_tenure(&self.tenure).await
    }
}

/// Deletes `tenure`'s key if it still holds the tenure: expecting the revision the tenure wrote
/// last, or, when a renewal whose answer was lost wrote a later one, the revision the key holds.
async fn delete_tenure(tenure: &Tenure) -> Result<(), ClusterError> {
    let revision = *tenure.revision.lock().expect("lease revision lock");
    let first = match tenure
        .kv
        .delete_expect_revision(&tenure.key, Some(revision))
        .await
    {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    match leader_entry(&tenure.kv, &tenure.key).await {
        Ok(Some(entry)) if tenure.holds(&entry) => tenure
            .kv
            .delete_expect_revision(&tenure.key, Some(entry.revision))
            .await
            .map_err(|e| tenure.error(e)),
        // Someone else's now, or already deleted: nothing of ours to release.
        Ok(_) => Ok(()),
        Err(_) => Err(tenure.error(first)),
    }
}

/// Completes when the lease `state` follows is lost (see [`Lease::lost`]).
pub async fn lost(mut state: watch::Receiver<LeaseState>) {
    loop {
        let until = match *state.borrow_and_update() {
            LeaseState::Lost => return,
            LeaseState::Held { until } => until,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(until) => if Instant::now() >= until { return },
            changed = state.changed() => if changed.is_err() { return },
        }
    }
}

fn valid_until(sent: Instant, duration: Duration) -> Instant {
    sent + duration.mul_f64(1.0 - DRIFT)
}

async fn renew_until_lost(tenure: Arc<Tenure>) {
    let period = tenure.duration / 3;
    let mut next = Instant::now() + period;
    loop {
        let until = match *tenure.state.borrow() {
            LeaseState::Lost => return,
            LeaseState::Held { until } => until,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = tokio::time::sleep_until(until) => {}
            () = tenure.stop.notified() => return,
        }
        if Instant::now() >= until {
            mark_lost(&tenure, "not renewed in time");
            return;
        }
        next = Instant::now() + period;
        renew_once(&tenure).await;
    }
}

/// One renewal: rewrite the key expecting our last revision, within what is left of the lease.
async fn renew_once(tenure: &Tenure) {
    let until = match *tenure.state.borrow() {
        LeaseState::Lost => return,
        LeaseState::Held { until } => until,
    };
    let expected = *tenure.revision.lock().expect("lease revision lock");
    let sent = Instant::now();
    let update = tenure
        .kv
        .update(&tenure.key, tenure.bytes.clone(), expected);
    // Unanswered after a third of the lease (a leader being elected), the renewal is made again at
    // once by the caller, expecting the same revision.
    let result = match tokio::time::timeout_at(until.min(sent + tenure.duration / 3), update).await
    {
        Ok(result) => result,
        Err(_) if Instant::now() >= until => {
            mark_lost(tenure, "renewal did not complete within the lease");
            return;
        }
        Err(_) => {
            tracing::warn!(key = %tenure.key, "lease renewal unanswered; renewing again");
            return;
        }
    };
    match result {
        Ok(revision) => renewed(tenure, revision, sent),
        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
            // Our own earlier renewal may have been written although its acknowledgement was lost:
            // the key then still holds our tenure under a newer revision.
            match leader_entry(&tenure.kv, &tenure.key).await {
                Ok(Some(entry)) if tenure.holds(&entry) => {
                    *tenure.revision.lock().expect("lease revision lock") = entry.revision;
                }
                _ => mark_lost(tenure, "another replica holds it now"),
            }
        }
        Err(err) => {
            tracing::warn!(key = %tenure.key, %err, "lease renewal failed; retrying until the lease runs out");
        }
    }
}

fn renewed(tenure: &Tenure, revision: u64, sent: Instant) {
    *tenure.revision.lock().expect("lease revision lock") = revision;
    tenure.state.send_if_modified(|state| match state {
        LeaseState::Held { until } => {
            *until = (*until).max(valid_until(sent, tenure.duration));
            true
        }
        LeaseState::Lost => false,
    });
}

fn mark_lost(tenure: &Tenure, why: &str) {
    let was_held = matches!(*tenure.state.borrow(), LeaseState::Held { .. });
    tenure.state.send_replace(LeaseState::Lost);
    if was_held {
        tracing::warn!(key = %tenure.key, holder = %tenure.value.holder, why, "lease lost");
    }
}
