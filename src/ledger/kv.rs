//! The ledger's backend between replicas: a JetStream key-value bucket (`<cluster.prefix>_budget`,
//! file storage, `cluster.replicas` replicas) with one key per user, `u.<hex of the UserHash>`,
//! holding the window and the amount spent in it (16 bytes: i64 LE, f64 LE).
//!
//! # Invariants
//! 1. **Compare-and-set.** A user's charges are decided against the key as last read, and written
//!    with an update that expects exactly that revision (or a create, if the key is absent). When
//!    another replica wrote in between, the write fails, the key is read again and the charges are
//!    decided again; so two replicas can never both grant the last of a user's budget.
//! 2. **Durable before granted.** A grant is returned only after JetStream acknowledged the write
//!    (stored on its replicas). A write that fails or goes unanswered grants nothing (if it did land,
//!    the user is charged for an answer never released: safe).
//! 3. **One secret for all.** The hash secret is the bucket's key [`SECRET_KEY`], created by the
//!    first replica (create fails if it exists; then it is read), so every replica hashes a user id
//!    alike, and no user id is ever a key or a value in clear.
//! 4. **Group commit.** A batch's charges are grouped by user; users are written concurrently, one
//!    write per user per batch.
use std::collections::HashMap;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use bytes::Bytes;

use super::key::SECRET_BYTES;
use super::{Backend, Charge, Charged, KeyedHash, LedgerError, Policy, Spent, UserHash, decide};

/// The bucket's key holding the hash secret.
pub const SECRET_KEY: &str = "hash-secret";
/// Compare-and-set attempts on one user's key before the charges fail.
const ATTEMPTS: usize = 32;

fn unavailable(action: &'static str) -> impl FnOnce(String) -> LedgerError {
    move |detail| LedgerError::Unavailable {
        action,
        detail: detail.into(),
    }
}

/// The ledger on a key-value bucket.
#[derive(Debug, Clone)]
pub struct KvLedger {
    store: kv::Store,
}

impl KvLedger {
    /// The ledger on `store`, and the hash secret every replica shares (created if absent).
    pub async fn open(store: kv::Store) -> Result<(KvLedger, KeyedHash), LedgerError> {
        let secret = match store
            .get(SECRET_KEY)
            .await
            .map_err(|e| unavailable("reading the hash secret")(e.to_string()))?
        {
            Some(bytes) => bytes,
            None => {
                let fresh = KeyedHash::random_secret()?;
                match store
                    .create(SECRET_KEY, Bytes::copy_from_slice(&fresh))
                    .await
                {
                    Ok(_) => Bytes::copy_from_slice(&fresh),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => store
                        .get(SECRET_KEY)
                        .await
                        .map_err(|e| unavailable("reading the hash secret")(e.to_string()))?
                        .ok_or_else(|| {
                            unavailable("reading the hash secret")("it vanished".into())
                        })?,
                    Err(e) => return Err(unavailable("creating the hash secret")(e.to_string())),
                }
            }
        };
        let secret: [u8; SECRET_BYTES] =
            secret
                .as_ref()
                .try_into()
                .map_err(|_| LedgerError::Damaged {
                    path: format!("bucket key {SECRET_KEY}").into(),
                    offset: 0,
                    rule: format!(
                        "the hash secret must be {SECRET_BYTES} bytes, it has {}",
                        secret.len()
                    )
                    .into(),
                })?;
        Ok((KvLedger { store }, KeyedHash::new(secret)))
    }

    fn key(user: &UserHash) -> String {
        format!("u.{}", user.hex())
    }

    /// One user's charges, in order, by compare-and-set.
    async fn charge_user(
        store: kv::Store,
        policy: Policy,
        user: UserHash,
        charges: Vec<Charge>,
    ) -> Result<Vec<Charged>, LedgerError> {
        let key = Self::key(&user);
        for _ in 0..ATTEMPTS {
            let entry = store
                .entry(&key)
                .await
                .map_err(|e| unavailable("reading a user's budget")(e.to_string()))?;
            let (revision, stored) = match entry {
                Some(e) if e.operation == kv::Operation::Put => {
                    (Some(e.revision), Some(decode(&key, &e.value)?))
                }
                Some(e) => (Some(e.revision), None),
                None => (None, None),
            };
            let mut state = stored;
            let mut changed = false;
            let mut answers = Vec::with_capacity(charges.len());
            for charge in &charges {
                let (answer, after) = decide(policy, state, charge);
                if let Some(after) = after {
                    state = Some(after);
                    changed = true;
                }
                answers.push(answer);
            }
            let Some(state) = state.filter(|_| changed) else {
                return Ok(answers);
            };
            let value = encode(state);
            let written = match revision {
                Some(revision) => match store.update(&key, value, revision).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => false,
                    Err(e) => return Err(unavailable("writing a user's budget")(e.to_string())),
                },
                None => match store.create(&key, value).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => false,
                    Err(e) => return Err(unavailable("writing a user's budget")(e.to_string())),
                },
            };
            if written {
                return Ok(answers);
            }
        }
        Err(unavailable("writing a user's budget")(format!(
            "another replica changed it {ATTEMPTS} times in a row"
        )))
    }
}

fn encode(spent: Spent) -> Bytes {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&spent.window.to_le_bytes());
    out.extend_from_slice(&spent.amount.to_le_bytes());
    Bytes::from(out)
}

fn decode(key: &str, value: &[u8]) -> Result<Spent, LedgerError> {
    let damaged = |rule: &str| LedgerError::Damaged {
        path: format!("bucket key {key}").into(),
        offset: 0,
        rule: rule.into(),
    };
    if value.len() != 16 {
        return Err(damaged("a user's entry must be 16 bytes"));
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&value[..8]);
    let window = i64::from_le_bytes(word);
    word.copy_from_slice(&value[8..16]);
    let amount = f64::from_le_bytes(word);
    if !(amount.is_finite() && amount >= 0.0) {
        return Err(damaged("an amount spent is not a finite number at least 0"));
    }
    Ok(Spent { window, amount })
}

#[async_trait]
impl Backend for KvLedger {
    async fn apply(
        &mut self,
        policy: Policy,
        batch: Vec<Charge>,
    ) -> Vec<Result<Charged, LedgerError>> {
        // Group by user, keeping each user's order and every charge's place in the batch.
        let mut users: HashMap<UserHash, (Vec<usize>, Vec<Charge>)> = HashMap::new();
        for (i, charge) in batch.iter().enumerate() {
            let slot = users.entry(charge.user).or_default();
            slot.0.push(i);
            slot.1.push(*charge);
        }
        let work = users.into_iter().map(|(user, (places, charges))| {
            let store = self.store.clone();
            async move {
                (
                    places,
                    Self::charge_user(store, policy, user, charges).await,
                )
            }
        });
        let done = futures::future::join_all(work).await;
        let mut out: Vec<Result<Charged, LedgerError>> =
            vec![Err(LedgerError::Stopped); batch.len()];
        for (places, result) in done {
            match result {
                Ok(answers) => {
                    for (place, answer) in places.into_iter().zip(answers) {
                        out[place] = Ok(answer);
                    }
                }
                Err(e) => {
                    for place in places {
                        out[place] = Err(e.clone());
                    }
                }
            }
        }
        out
    }
}
