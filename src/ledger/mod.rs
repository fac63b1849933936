//! The privacy budget ledger: per user and per budget window, the epsilon (per km) that user's
//! GEO_IND answers have spent, kept durably so that no restart, kill -9 or failover lets a user
//! spend more than `location.geo_ind.budget` in one window of `budget_window_ms`.
//!
//! A stateful layer of its own (beside `store` and `cluster`): the broker asks it to [`Ledger::charge`]
//! before it releases an answer, and releases the answer only once the charge is granted.
//!
//! # Invariants
//! 1. **No position, no user id.** An entry is a [`UserHash`] (HMAC-SHA256 of the user id under a
//!    secret key, [`key`]), a window index and the amount spent in it. Nothing else is stored.
//! 2. **Durable before granted.** [`Ledger::charge`] returns a grant only after the backend made it
//!    durable: the file backend ([`file`]) after the batch's one append and `fdatasync`, the
//!    key-value backend ([`kv`]) after JetStream acknowledged the revision-checked update. An answer
//!    paid by a charge is released after the grant, so a crash can lose an unreleased charge (the
//!    user is then charged for an answer never seen: safe) but never a released one.
//! 3. **Never past the budget.** A charge is granted only if the window's spent amount plus the
//!    charge stays at most the budget ([`decide`]), decided against the durable state by the one
//!    writer of the data directory (file) or by compare-and-set on the user's key (key-value: a
//!    concurrent change by another replica makes the update fail, and it is decided again).
//! 4. **Group commit.** One writer (a thread of its own for the file, a task for the bucket) takes every charge waiting (at most `max_batch`), decides
//!    them in order, makes them durable together (one append and one fsync for the file backend)
//!    and then answers them all: each on its own channel, or, for charges queued with
//!    [`Ledger::try_charge_tagged`], in one message per receiver per commit.
//! 5. **Windows.** Window `w` is `[w × window_ms, (w + 1) × window_ms)` in Unix milliseconds; what a
//!    user spent in an earlier window no longer counts. An entry from a *later* window than the
//!    caller's clock (clocks of two replicas differ) still counts: the ledger errs towards charging.
//! 6. **Reservations are spent.** A charge may set aside more than it pays ([`Charge::reserve`]); the
//!    durable entry counts what was set aside as spent, so the caller may spend it later without a
//!    commit, and a crash (or a failover to another replica) loses what it had not spent yet: the
//!    user is charged for answers never released (safe, at most one reservation per user and
//!    replica), never the other way round.
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::telemetry::catalog;

pub mod file;
pub mod key;
pub mod kv;

pub use key::{KeyedHash, UserHash};

/// The budget every user has per window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Epsilon (per km) a user may spend per window.
    pub budget: f64,
    /// Length of a window (ms); the budget refills at each window's end.
    pub window_ms: i64,
}

impl Policy {
    /// The index of the window holding `now_ms`.
    pub fn window(&self, now_ms: i64) -> i64 {
        now_ms.div_euclid(self.window_ms.max(1))
    }

    /// When window `window` ends (Unix ms): the budget refills then.
    pub fn refill_at_ms(&self, window: i64) -> i64 {
        window
            .saturating_add(1)
            .saturating_mul(self.window_ms.max(1))
    }
}

/// What one user has spent in one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spent {
    pub window: i64,
    pub amount: f64,
}

/// One charge: `amount` if it fits in what is left, otherwise `fallback` (if set and it fits),
/// otherwise nothing. When `amount` is paid, up to `reserve` more is set aside for the caller in the
/// same durable update (as much of it as fits): the caller may spend it later without asking again
/// ([`Charged::reserved`]; the broker's holds, `broker::geo_budget`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charge {
    pub user: UserHash,
    pub amount: f64,
    pub fallback: Option<f64>,
    /// The caller's clock (Unix ms), which picks the window.
    pub now_ms: i64,
    /// How much more to set aside when `amount` is paid (0: nothing).
    pub reserve: f64,
}

/// Which part of a [`Charge`] was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paid {
    Amount,
    Fallback,
    Nothing,
}

/// The answer to a [`Charge`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charged {
    pub paid: Paid,
    /// What is left of the budget in the window after this charge (and its reservation).
    pub left: f64,
    /// What was set aside besides the charge ([`Charge::reserve`], or less where the budget ends):
    /// counted as spent in the durable entry, the caller's to spend.
    pub reserved: f64,
    /// When the budget refills (Unix ms).
    pub refill_at_ms: i64,
}

/// Decides one charge against what the user has spent (`stored`, if anything): the answer and the
/// new entry to make durable (`None` when nothing was paid).
pub fn decide(policy: Policy, stored: Option<Spent>, charge: &Charge) -> (Charged, Option<Spent>) {
    let window = policy.window(charge.now_ms);
    let current = match stored {
        Some(s) if s.window >= window => s,
        _ => Spent {
            window,
            amount: 0.0,
        },
    };
    let fits = |amount: f64| {
        amount.is_finite() && amount >= 0.0 && current.amount + amount <= policy.budget
    };
    let (paid, amount) = if fits(charge.amount) {
        (Paid::Amount, charge.amount)
    } else if let Some(fallback) = charge.fallback.filter(|f| fits(*f)) {
        (Paid::Fallback, fallback)
    } else {
        (Paid::Nothing, 0.0)
    };
    let paid_total = current.amount + amount;
    // What is set aside: only beside a paid amount, and never past the budget (the sum is rounded
    // down to the budget, so the entry cannot exceed it by a rounding either).
    let after_amount = if paid == Paid::Amount && charge.reserve.is_finite() && charge.reserve > 0.0
    {
        (paid_total + charge.reserve)
            .min(policy.budget)
            .max(paid_total)
    } else {
        paid_total
    };
    let reserved = after_amount - paid_total;
    let after = Spent {
        window: current.window,
        amount: after_amount,
    };
    let charged = Charged {
        paid,
        left: (policy.budget - after.amount).max(0.0),
        reserved,
        refill_at_ms: policy.refill_at_ms(current.window),
    };
    (charged, (paid != Paid::Nothing).then_some(after))
}

/// A ledger failure. Cloneable: one failed group commit fails every charge of the batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// The writer's queue is full (`location.geo_ind.ledger_queue`).
    #[error(
        "the budget ledger is busy: {queued} charges already wait (location.geo_ind.ledger_queue)"
    )]
    Busy { queued: usize },
    /// The ledger's writer stopped (the daemon is shutting down, or a failure stopped it).
    #[error("the budget ledger has stopped")]
    Stopped,
    #[error("budget ledger I/O error on {path} while {action}: {detail}")]
    Io {
        path: Arc<str>,
        action: &'static str,
        detail: Arc<str>,
    },
    #[error("budget ledger file {path} is damaged at byte {offset}: {rule}")]
    Damaged {
        path: Arc<str>,
        offset: u64,
        rule: Arc<str>,
    },
    /// The key-value bucket failed or did not answer.
    #[error("budget ledger bucket unavailable while {action}: {detail}")]
    Unavailable {
        action: &'static str,
        detail: Arc<str>,
    },
}

impl LedgerError {
    pub(crate) fn io(
        path: &std::path::Path,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> LedgerError {
        let path: Arc<str> = path.display().to_string().into();
        move |e| LedgerError::Io {
            path,
            action,
            detail: e.to_string().into(),
        }
    }
}

/// Where charges are made durable.
#[async_trait]
pub trait Backend: Send + 'static {
    /// Decides the charges in order and makes every granted one durable before returning: one
    /// answer per charge, in order.
    async fn apply(
        &mut self,
        policy: Policy,
        batch: Vec<Charge>,
    ) -> Vec<Result<Charged, LedgerError>>;
}

struct Pending {
    charge: Charge,
    reply: Reply,
}

/// The answers of tagged charges ([`Ledger::try_charge_tagged`]): one message per group commit,
/// each answer with the tag its charge was given, in the order of the charges.
pub type Answers = Vec<(u64, Result<Charged, LedgerError>)>;

/// Where a charge's answer goes.
enum Reply {
    One(oneshot::Sender<Result<Charged, LedgerError>>),
    /// Sent with the other answers of its commit for the same receiver, in one message.
    Tagged {
        tag: u64,
        to: mpsc::Sender<Answers>,
    },
}

/// The handle the broker charges through; cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    tx: mpsc::Sender<Pending>,
    policy: Policy,
    hash: Arc<KeyedHash>,
    queue: usize,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How the writer batches.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// Most charges waiting for the writer; past it [`Ledger::try_charge`] is [`LedgerError::Busy`].
    pub queue: usize,
    /// Most charges made durable together.
    pub max_batch: usize,
}

impl Ledger {
    /// Starts the writer task over `backend` (on the current tokio runtime).
    pub fn start(
        backend: impl Backend,
        policy: Policy,
        hash: KeyedHash,
        batching: Batching,
    ) -> Ledger {
        let queue = batching.queue.max(1);
        let (tx, rx) = mpsc::channel(queue);
        tokio::spawn(write(backend, policy, rx, batching.max_batch.max(1)));
        Ledger {
            tx,
            policy,
            hash: Arc::new(hash),
            queue,
        }
    }

    /// Starts the file ledger's writer on a thread of its own: it blocks in the append and the
    /// `fdatasync` of each group commit itself, so a commit costs no hop to tokio's blocking pool
    /// and no task wake-up on the runtime the broker's streams share. The thread ends once every
    /// handle is dropped.
    pub fn start_file(
        file: file::FileLedger,
        policy: Policy,
        hash: KeyedHash,
        batching: Batching,
    ) -> Result<Ledger, LedgerError> {
        let queue = batching.queue.max(1);
        let (tx, rx) = mpsc::channel(queue);
        let max_batch = batching.max_batch.max(1);
        std::thread::Builder::new()
            .name("cloakd-ledger".into())
            .spawn(move || write_file(&file, policy, rx, max_batch))
            .map_err(|e| LedgerError::Io {
                path: "budget ledger".into(),
                action: "starting the writer thread",
                detail: e.to_string().into(),
            })?;
        Ok(Ledger {
            tx,
            policy,
            hash: Arc::new(hash),
            queue,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The keyed hash of a user id: the only form in which the ledger knows a user.
    pub fn user(&self, user_id: &str) -> UserHash {
        self.hash.user(user_id)
    }

    /// Queues a charge without waiting; its answer comes on the returned receiver once it is
    /// durable. A full queue is [`LedgerError::Busy`].
    pub fn try_charge(
        &self,
        charge: Charge,
    ) -> Result<oneshot::Receiver<Result<Charged, LedgerError>>, LedgerError> {
        let (reply, rx) = oneshot::channel();
        self.try_queue(Pending {
            charge,
            reply: Reply::One(reply),
        })
        .map(|()| rx)
    }

    /// Queues a charge without waiting; its answer comes on `to`, tagged `tag`, in one message with
    /// the other answers of its group commit for `to` (a caller charging many at once is woken once
    /// per commit, not once per charge). A full queue is [`LedgerError::Busy`]. `to` should hold
    /// room for as many messages as the caller may have charges waiting: the writer waits for room,
    /// holding up the commits after it.
    pub fn try_charge_tagged(
        &self,
        charge: Charge,
        tag: u64,
        to: &mpsc::Sender<Answers>,
    ) -> Result<(), LedgerError> {
        self.try_queue(Pending {
            charge,
            reply: Reply::Tagged {
                tag,
                to: to.clone(),
            },
        })
    }

    fn try_queue(&self, pending: Pending) -> Result<(), LedgerError> {
        match self.tx.try_send(pending) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                Err(LedgerError::Busy { queued: self.queue })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(LedgerError::Stopped),
        }
    }

    /// Most charges that wait for the writer at once (`ledger_queue`).
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Charges and waits until the charge is durable (or refused).
    pub async fn charge(&self, charge: Charge) -> Result<Charged, LedgerError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                charge,
                reply: Reply::One(reply),
            })
            .await
            .map_err(|_| LedgerError::Stopped)?;
        rx.await.map_err(|_| LedgerError::Stopped)?
    }
}

/// Opens the ledger a daemon uses: with a cluster, the bucket `<prefix>_budget` shared by every
/// replica ([`kv`]); alone, the file under `data_dir/budget/` ([`file`]). Starts its writer.
pub async fn open(
    policy: Policy,
    batching: Batching,
    data_dir: &std::path::Path,
    cluster: Option<&crate::cluster::Cluster>,
) -> Result<Ledger, LedgerError> {
    if let Some(cluster) = cluster {
        // JetStream may not answer yet while its servers elect the bucket's leader (a replica
        // starting beside a restarting server sees "no responders"): tried again for a while, as
        // the transaction stores are.
        let mut pause = std::time::Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            match open_bucket(cluster).await {
                Ok((backend, hash)) => return Ok(Ledger::start(backend, policy, hash, batching)),
                Err(e) if attempt < OPEN_ATTEMPTS => {
                    tracing::warn!(
                        error = %e,
                        attempt,
                        "opening the privacy budget bucket on JetStream failed; trying again"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(8));
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
    let dir = data_dir.to_path_buf();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let (backend, hash, opened) =
        tokio::task::spawn_blocking(move || file::FileLedger::open(&dir, policy, now_ms))
            .await
            .map_err(|_| LedgerError::Stopped)??;
    tracing::info!(
        users = opened.users,
        torn_bytes = opened.torn_bytes,
        compacted = opened.compacted,
        "privacy budget ledger opened"
    );
    Ledger::start_file(backend, policy, hash, batching)
}

/// Attempts at opening the budget bucket before the daemon gives up (about 30 s in all).
const OPEN_ATTEMPTS: u32 = 6;

/// The budget bucket and the hash secret every replica shares.
async fn open_bucket(
    cluster: &crate::cluster::Cluster,
) -> Result<(kv::KvLedger, key::KeyedHash), LedgerError> {
    let bucket = cluster
        .bucket(
            "budget",
            "cloakd privacy budget: per user (keyed hash), the window and the epsilon spent",
        )
        .await
        .map_err(|e| LedgerError::Unavailable {
            action: "opening the budget bucket",
            detail: e.to_string().into(),
        })?;
    kv::KvLedger::open(bucket).await
}

/// The writer of an asynchronous backend (the key-value bucket): group commit of every charge
/// waiting.
async fn write(
    mut backend: impl Backend,
    policy: Policy,
    mut rx: mpsc::Receiver<Pending>,
    max_batch: usize,
) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, max_batch).await > 0 {
        let charges: Vec<Charge> = batch.iter().map(|p| p.charge).collect();
        let started = std::time::Instant::now();
        let result = backend.apply(policy, charges).await;
        for (to, group) in settle(&mut batch, result, started) {
            // A receiver that is gone has nobody left to tell.
            let _ = to.send(group).await;
        }
    }
}

/// The file ledger's writer, on its own thread ([`Ledger::start_file`]): takes every charge
/// waiting (at most `max_batch`), makes them durable with one append and one `fdatasync`, answers
/// them, and waits for the next.
fn write_file(
    ledger: &file::FileLedger,
    policy: Policy,
    mut rx: mpsc::Receiver<Pending>,
    max_batch: usize,
) {
    let mut batch = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(pending) => batch.push(pending),
                Err(_) => break,
            }
        }
        let charges: Vec<Charge> = batch.iter().map(|p| p.charge).collect();
        let started = std::time::Instant::now();
        let result = match ledger.apply_now(policy, &charges) {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e); charges.len()],
        };
        for (to, group) in settle(&mut batch, result, started) {
            let _ = to.blocking_send(group);
        }
    }
}

/// Answers a committed batch (emptying it): each charge on its own channel, and the tagged ones
/// returned grouped by receiver, for the caller to send in one message each. Records the commit's
/// metrics (`started` is when its backend was called).
fn settle(
    batch: &mut Vec<Pending>,
    result: Vec<Result<Charged, LedgerError>>,
    started: std::time::Instant,
) -> Vec<(mpsc::Sender<Answers>, Answers)> {
    let size = batch.len();
    metrics::histogram!(catalog::GEO_BUDGET_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
    metrics::histogram!(catalog::GEO_BUDGET_BATCH_SIZE).record(size as f64);
    if result.len() != size {
        tracing::error!(
            charges = size,
            answers = result.len(),
            "the budget ledger's backend answered a batch wrongly"
        );
    }
    let mut answers = result.into_iter();
    // Tagged answers grouped by receiver (in practice one: the broker).
    let mut tagged: Vec<(mpsc::Sender<Answers>, Answers)> = Vec::new();
    for pending in batch.drain(..) {
        let answer = answers.next().unwrap_or(Err(LedgerError::Stopped));
        let outcome = match &answer {
            Ok(Charged {
                paid: Paid::Nothing,
                ..
            }) => "refused",
            Ok(_) => "granted",
            Err(e) => {
                tracing::error!(error = %e, "a budget charge failed; it is refused");
                "failed"
            }
        };
        metrics::counter!(catalog::GEO_BUDGET_CHARGES, "outcome" => outcome).increment(1);
        match pending.reply {
            Reply::One(reply) => {
                let _ = reply.send(answer);
            }
            Reply::Tagged { tag, to } => {
                match tagged.iter_mut().find(|(sink, _)| sink.same_channel(&to)) {
                    Some((_, group)) => group.push((tag, answer)),
                    None => tagged.push((to, vec![(tag, answer)])),
                }
            }
        }
    }
    tagged
}

#[cfg(test)]
mod tests;
