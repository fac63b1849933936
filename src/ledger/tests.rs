//! The ledger against a plain in-memory model: random charges, reopenings and torn tails, and the
//! file's damage rules.
use std::collections::HashMap;

use proptest::prelude::*;

use super::file::{DIR, FileLedger, LEDGER_FILE, LEDGER_TMP};
use super::*;

const POLICY: Policy = Policy {
    budget: 1.0,
    window_ms: 1_000,
};

fn user(n: u8) -> UserHash {
    UserHash([n; 32])
}

#[derive(Debug, Clone)]
enum Op {
    Charge {
        user: u8,
        amount: f64,
        fallback: Option<f64>,
        reserve: f64,
        advance_ms: i64,
    },
    Reopen,
    /// Appends part of a frame, as a crash in the middle of a write would leave it.
    Tear(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..4, 0.0f64..0.6, proptest::option::of(0.0f64..0.2), prop_oneof![Just(0.0), 0.0f64..0.5], 0i64..400).prop_map(
            |(user, amount, fallback, reserve, advance_ms)| Op::Charge { user, amount, fallback, reserve, advance_ms }
        ),
        1 => Just(Op::Reopen),
        1 => (1usize..56).prop_map(Op::Tear),
    ]
}

/// The model: per user, the window and the amount spent in it (what was set aside included).
#[derive(Default)]
struct Model(HashMap<u8, (i64, f64)>);

impl Model {
    fn charge(
        &mut self,
        user: u8,
        amount: f64,
        fallback: Option<f64>,
        reserve: f64,
        now_ms: i64,
    ) -> (Paid, f64, f64, i64) {
        let window = now_ms.div_euclid(POLICY.window_ms);
        let spent = match self.0.get(&user) {
            Some((w, s)) if *w >= window => (*w, *s),
            _ => (window, 0.0),
        };
        let (paid, more) = if spent.1 + amount <= POLICY.budget {
            (Paid::Amount, amount)
        } else if let Some(f) = fallback.filter(|f| spent.1 + f <= POLICY.budget) {
            (Paid::Fallback, f)
        } else {
            (Paid::Nothing, 0.0)
        };
        let set_aside = if paid == Paid::Amount {
            reserve.min(POLICY.budget - (spent.1 + more)).max(0.0)
        } else {
            0.0
        };
        let total = spent.1 + more + set_aside;
        if paid != Paid::Nothing {
            self.0.insert(user, (spent.0, total));
        }
        (
            paid,
            POLICY.budget - total,
            set_aside,
            (spent.0 + 1) * POLICY.window_ms,
        )
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the order of charges, reopenings (restarts) and torn writes, the file ledger grants
    /// exactly what the model does, so no user is ever granted more than the budget in a window.
    #[test]
    fn the_file_ledger_grants_what_the_model_does(ops in proptest::collection::vec(op(), 1..80)) {
        let dir = tempfile::tempdir().unwrap();
        let mut now = 10_000i64;
        let (mut ledger, _, _) = FileLedger::open(dir.path(), POLICY, now).unwrap();
        let mut model = Model::default();
        let mut granted: HashMap<(u8, i64), f64> = HashMap::new();
        for op in ops {
            match op {
                Op::Charge { user: u, amount, fallback, reserve, advance_ms } => {
                    now += advance_ms;
                    let charge = Charge { user: user(u), amount, fallback, now_ms: now, reserve };
                    let got = ledger.apply_now(POLICY, &[charge]).unwrap()[0];
                    let (paid, left, set_aside, refill) = model.charge(u, amount, fallback, reserve, now);
                    prop_assert_eq!(got.paid, paid);
                    prop_assert!((got.left - left.max(0.0)).abs() < 1e-9, "{} vs {}", got.left, left);
                    prop_assert!((got.reserved - set_aside).abs() < 1e-9, "{} vs {}", got.reserved, set_aside);
                    prop_assert_eq!(got.refill_at_ms, refill);
                    let paid_amount = match got.paid { Paid::Amount => amount, Paid::Fallback => fallback.unwrap_or(0.0), Paid::Nothing => 0.0 };
                    // What was set aside counts as spent: a reopening (a crash) loses it.
                    let spent = granted.entry((u, refill)).or_default();
                    *spent += paid_amount + got.reserved;
                    prop_assert!(*spent <= POLICY.budget + 1e-9);
                }
                Op::Reopen => {
                    drop(ledger);
                    ledger = FileLedger::open(dir.path(), POLICY, now).unwrap().0;
                }
                Op::Tear(bytes) => {
                    drop(ledger);
                    let path = dir.path().join(DIR).join(LEDGER_FILE);
                    let mut frame = std::fs::read(&path).unwrap();
                    // Part of a copy of a valid frame: the torn write of a batch never granted.
                    let whole = if frame.len() >= 56 { frame[..56].to_vec() } else { vec![48, 0, 0, 0, 1, 2, 3, 4] };
                    frame.extend_from_slice(&whole[..bytes.min(whole.len()).min(55)]);
                    std::fs::write(&path, frame).unwrap();
                    let (reopened, _, opened) = FileLedger::open(dir.path(), POLICY, now).unwrap();
                    prop_assert!(opened.torn_bytes > 0 || bytes >= 56);
                    ledger = reopened;
                }
            }
        }
    }
}

#[test]
fn a_complete_frame_with_a_wrong_checksum_is_damage_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let charge = |u: u8| Charge {
        user: user(u),
        amount: 0.25,
        fallback: None,
        now_ms: 0,
        reserve: 0.0,
    };
    ledger.apply_now(POLICY, &[charge(1), charge(2)]).unwrap();
    drop(ledger);
    let path = dir.path().join(DIR).join(LEDGER_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 2 * 56, "one frame per granted charge");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = FileLedger::open(dir.path(), POLICY, 0).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("damaged at byte 56"), "{text}");
    assert!(text.contains("CRC-32"), "{text}");
}

#[test]
fn a_wrong_length_field_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    drop(FileLedger::open(dir.path(), POLICY, 0).unwrap());
    let path = dir.path().join(DIR).join(LEDGER_FILE);
    std::fs::write(&path, [9u8, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
    let err = FileLedger::open(dir.path(), POLICY, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("length field is 9"), "{err}");
}

#[test]
fn a_restart_keeps_what_was_spent_and_compacts_past_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, hash, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let alice = hash.user("alice");
    let bob = hash.user("bob");
    let charge = |user, amount, now_ms| Charge {
        user,
        amount,
        fallback: None,
        now_ms,
        reserve: 0.0,
    };
    ledger
        .apply_now(
            POLICY,
            &[
                charge(alice, 0.5, 0),
                charge(alice, 0.25, 10),
                charge(bob, 0.5, 1_500),
            ],
        )
        .unwrap();
    drop(ledger);
    // A compaction's temporary file left by a crash (of this version or an older one) is replaced.
    let leftover = dir.path().join(DIR).join(LEDGER_TMP);
    std::fs::write(&leftover, vec![7u8; 1_000]).unwrap();
    let (ledger, hash2, opened) = FileLedger::open(dir.path(), POLICY, 1_600).unwrap();
    assert_eq!(
        hash2.user("alice"),
        alice,
        "the hash secret survives a restart"
    );
    assert_eq!(opened.users, 1, "alice's window is over, bob's is not");
    assert!(opened.compacted);
    assert!(!leftover.exists());
    assert_eq!(
        std::fs::metadata(dir.path().join(DIR).join(LEDGER_FILE))
            .unwrap()
            .len(),
        56,
        "one frame: bob's"
    );
    let got = ledger
        .apply_now(POLICY, &[charge(bob, 0.75, 1_700)])
        .unwrap()[0];
    assert_eq!(
        got.paid,
        Paid::Nothing,
        "bob spent 0.5 of 1.0 before the restart"
    );
    let got = ledger
        .apply_now(POLICY, &[charge(bob, 0.5, 1_700)])
        .unwrap()[0];
    assert_eq!(got.paid, Paid::Amount);
    assert_eq!(got.refill_at_ms, 2_000);
    assert!(got.left.abs() < 1e-12);
}

#[test]
fn the_ledger_file_holds_no_user_id() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, hash, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let charge = Charge {
        user: hash.user("alice-the-user"),
        amount: 0.1,
        fallback: None,
        now_ms: 0,
        reserve: 0.0,
    };
    ledger.apply_now(POLICY, &[charge]).unwrap();
    let bytes = std::fs::read(dir.path().join(DIR).join(LEDGER_FILE)).unwrap();
    assert!(!bytes.windows(5).any(|w| w == b"alice"));
}

#[tokio::test]
async fn charges_waiting_together_are_committed_together() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, hash, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let ledger = Ledger::start(
        backend,
        POLICY,
        hash,
        Batching {
            queue: 64,
            max_batch: 64,
        },
    );
    // Queued before the writer runs (this test's runtime is single-threaded): one batch.
    let receivers: Vec<_> = (0..10)
        .map(|i| {
            let user = ledger.user(&format!("user{}", i % 2));
            ledger
                .try_charge(Charge {
                    user,
                    amount: 0.25,
                    fallback: None,
                    now_ms: 0,
                    reserve: 0.0,
                })
                .unwrap()
        })
        .collect();
    let mut granted = 0;
    for rx in receivers {
        if rx.await.unwrap().unwrap().paid == Paid::Amount {
            granted += 1;
        }
    }
    assert_eq!(
        granted, 8,
        "four charges of 0.25 per user fit in a budget of 1"
    );
    let len = std::fs::metadata(dir.path().join(DIR).join(LEDGER_FILE))
        .unwrap()
        .len();
    assert_eq!(len, 8 * 56);
}

#[tokio::test]
async fn tagged_charges_of_one_commit_are_answered_in_one_message_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, hash, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let ledger = Ledger::start(
        backend,
        POLICY,
        hash,
        Batching {
            queue: 64,
            max_batch: 64,
        },
    );
    let (to, mut answers) = mpsc::channel(4);
    // Queued before the writer runs (this test's runtime is single-threaded): one commit, with a
    // charge answered on its own channel among the tagged ones.
    let user = ledger.user("alice");
    let charge = |amount| Charge {
        user,
        amount,
        fallback: None,
        now_ms: 0,
        reserve: 0.0,
    };
    for tag in [7, 3, 9] {
        ledger.try_charge_tagged(charge(0.4), tag, &to).unwrap();
    }
    let alone = ledger.try_charge(charge(0.1)).unwrap();
    ledger.try_charge_tagged(charge(0.1), 1, &to).unwrap();
    let message = answers.recv().await.unwrap();
    let tags: Vec<u64> = message.iter().map(|(tag, _)| *tag).collect();
    assert_eq!(tags, [7, 3, 9, 1], "the charges' order, in one message");
    let paid: Vec<Paid> = message
        .iter()
        .map(|(_, answer)| answer.as_ref().unwrap().paid)
        .collect();
    assert_eq!(
        paid,
        [Paid::Amount, Paid::Amount, Paid::Nothing, Paid::Amount],
        "0.4 + 0.4 fit a budget of 1, a third 0.4 does not, then 0.1 + 0.1 do"
    );
    assert_eq!(alone.await.unwrap().unwrap().paid, Paid::Amount);
    assert!(answers.try_recv().is_err(), "one message for the commit");
}

/// The daemon's file ledger runs its writer on a thread of its own ([`Ledger::start_file`]):
/// charges on their own channel and tagged ones are all answered, in the budget, and durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_thread_answers_every_charge_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (file, hash, _) = FileLedger::open(dir.path(), POLICY, 0).unwrap();
    let ledger = Ledger::start_file(
        file,
        POLICY,
        hash,
        Batching {
            queue: 64,
            max_batch: 8,
        },
    )
    .unwrap();
    let (to, mut tagged) = mpsc::channel(64);
    let mut own = Vec::new();
    for i in 0..20u64 {
        let charge = Charge {
            user: ledger.user(&format!("user{}", i % 2)),
            amount: 0.25,
            fallback: None,
            now_ms: 0,
            reserve: 0.0,
        };
        if i % 2 == 0 {
            own.push(ledger.try_charge(charge).unwrap());
        } else {
            ledger.try_charge_tagged(charge, i, &to).unwrap();
        }
    }
    let mut granted = 0;
    for rx in own {
        if rx.await.unwrap().unwrap().paid == Paid::Amount {
            granted += 1;
        }
    }
    let mut tags = Vec::new();
    while tags.len() < 10 {
        for (tag, answer) in tagged.recv().await.unwrap() {
            tags.push(tag);
            if answer.unwrap().paid == Paid::Amount {
                granted += 1;
            }
        }
    }
    assert_eq!(tags, (1..20).step_by(2).collect::<Vec<u64>>(), "in order");
    assert_eq!(
        granted, 8,
        "four charges of 0.25 per user fit in a budget of 1"
    );
    let len = std::fs::metadata(dir.path().join(DIR).join(LEDGER_FILE))
        .unwrap()
        .len();
    assert_eq!(len, 8 * 56);
    drop(ledger);
}
