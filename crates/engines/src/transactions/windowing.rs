//! The windowing rules of a transaction stream: which window a new record joins and when a window
//! closes. Pure: no clock (the time of each step is an argument, of any monotonic instant type `T`),
//! no I/O; the daemon's writer applies these rules and makes their outcome durable.
//!
//! A stream has exactly one open window at a time, with ids 0, 1, 2, ... in order. The open window
//! closes, and the next one opens:
//! * by **count**, right after the record that brings it to `window_records` records (or before
//!   the next record, if it got there by [`OpenWindow::replay_record`]);
//! * by **time**, once `window` has passed since its first record (never while it is empty);
//! * by **budget**, in exact mode only, right before a record whose adversary antecedents
//!   (Σ_{l<=m} C(|D_u|, l), [`antecedent_count`]) would push the window past `max_antecedents`; a
//!   record that exceeds the budget on its own is refused, since no window could hold it. This keeps
//!   every exact-mode window within what [`super::anonymize`] accepts.
//!
//! Invariants: a window never holds more than `window_records` records nor (exact mode) more than
//! `max_antecedents` antecedents; a closed window is never empty; ids increase by one per close.
use std::ops::Add;
use std::time::Duration;

use super::{Mode, antecedent_count};

/// The closing rules of one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowRules {
    /// Close after this many records (>= 1).
    pub window_records: usize,
    /// Close this long after the window's first record.
    pub window: Duration,
    /// Largest adversary knowledge |Q| (the budget counts antecedents up to m items).
    pub m: u32,
    pub mode: Mode,
    /// Exact mode's budget of antecedents per window.
    pub max_antecedents: u64,
}

impl WindowRules {
    /// What one record of `items` items costs a window's budget (0 in sampled mode).
    pub fn antecedents(&self, items: usize) -> u64 {
        match self.mode {
            Mode::Exact => antecedent_count(items, self.m),
            Mode::Sampled { .. } => 0,
        }
    }
}

/// A record that no window can hold: its antecedents alone exceed the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    pub antecedents: u64,
    pub limit: u64,
}

/// Where an admitted record goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The window that was open closed *before* this record (budget rule, or full): its id.
    pub closed_before: Option<u64>,
    /// The window the record joins.
    pub window_id: u64,
    /// The record's window closed right after it (count rule): its id (= `window_id`).
    pub closed_after: Option<u64>,
}

/// The open window of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenWindow<T> {
    /// Id of the open window.
    pub id: u64,
    /// Records in it.
    pub records: usize,
    /// Exact mode's antecedents of its records (0 in sampled mode).
    pub antecedents: u64,
    /// When its first record arrived; `None` while empty.
    pub opened_at: Option<T>,
}

impl<T: Copy + Ord + Add<Duration, Output = T>> OpenWindow<T> {
    /// The open window `id`, empty.
    pub fn new(id: u64) -> OpenWindow<T> {
        OpenWindow {
            id,
            records: 0,
            antecedents: 0,
            opened_at: None,
        }
    }

    /// Places a new record of `items` items arriving at `now`, closing windows by the budget and
    /// count rules. On `Err` nothing changes.
    pub fn admit(
        &mut self,
        rules: &WindowRules,
        items: usize,
        now: T,
    ) -> Result<Placement, OverBudget> {
        let cost = rules.antecedents(items);
        if cost > rules.max_antecedents {
            return Err(OverBudget {
                antecedents: cost,
                limit: rules.max_antecedents,
            });
        }
        // A full window closes first too: one replayed from a log that ends before its marker.
        let closed_before = if self.records > 0
            && (self.records >= rules.window_records
                || self.antecedents.saturating_add(cost) > rules.max_antecedents)
        {
            Some(self.close())
        } else {
            None
        };
        let window_id = self.id;
        self.join(cost, now);
        let closed_after = (self.records >= rules.window_records).then(|| self.close());
        Ok(Placement {
            closed_before,
            window_id,
            closed_after,
        })
    }

    /// Adds a record already placed in this window (replaying a log, where close markers decide).
    pub fn replay_record(&mut self, rules: &WindowRules, items: usize, now: T) {
        self.join(rules.antecedents(items), now);
    }

    /// When the open window closes by time; `None` while it is empty.
    pub fn deadline(&self, rules: &WindowRules) -> Option<T> {
        self.opened_at.map(|t| t + rules.window)
    }

    /// Closes the window by time if its deadline is at or before `now`: the closed id.
    pub fn close_if_due(&mut self, rules: &WindowRules, now: T) -> Option<u64> {
        if self.records > 0 && self.deadline(rules).is_some_and(|d| d <= now) {
            Some(self.close())
        } else {
            None
        }
    }

    /// Closes the open window (whatever the rules say) and opens the next: the closed id.
    pub fn close(&mut self) -> u64 {
        let closed = self.id;
        *self = OpenWindow::new(closed + 1);
        closed
    }

    fn join(&mut self, cost: u64, now: T) {
        self.records += 1;
        self.antecedents = self.antecedents.saturating_add(cost);
        self.opened_at.get_or_insert(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Milliseconds as the instant type: the rules need only order and addition.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Ms(u64);

    impl Add<Duration> for Ms {
        type Output = Ms;
        fn add(self, d: Duration) -> Ms {
            Ms(self.0 + d.as_millis() as u64)
        }
    }

    fn rules(window_records: usize, mode: Mode, max_antecedents: u64) -> WindowRules {
        WindowRules {
            window_records,
            window: Duration::from_millis(100),
            m: 2,
            mode,
            max_antecedents,
        }
    }

    #[test]
    fn closes_by_count_right_after_the_last_record() {
        let r = rules(2, Mode::Exact, 1000);
        let mut w = OpenWindow::new(0);
        let p = w.admit(&r, 1, Ms(0)).unwrap();
        assert_eq!(
            (p.closed_before, p.window_id, p.closed_after),
            (None, 0, None)
        );
        let p = w.admit(&r, 1, Ms(1)).unwrap();
        assert_eq!(
            (p.closed_before, p.window_id, p.closed_after),
            (None, 0, Some(0))
        );
        assert_eq!(w, OpenWindow::new(1));
        assert_eq!(w.admit(&r, 1, Ms(2)).unwrap().window_id, 1);
    }

    #[test]
    fn a_replayed_full_window_closes_before_the_next_record() {
        let r = rules(2, Mode::Exact, 1000);
        let mut w = OpenWindow::new(5);
        w.replay_record(&r, 1, Ms(0));
        w.replay_record(&r, 1, Ms(0));
        let p = w.admit(&r, 1, Ms(1)).unwrap();
        assert_eq!(
            (p.closed_before, p.window_id, p.closed_after),
            (Some(5), 6, None)
        );
    }

    #[test]
    fn closes_by_time_only_when_not_empty() {
        let r = rules(100, Mode::Exact, 1000);
        let mut w: OpenWindow<Ms> = OpenWindow::new(3);
        assert_eq!(w.deadline(&r), None);
        assert_eq!(w.close_if_due(&r, Ms(1_000_000)), None);
        w.admit(&r, 1, Ms(50)).unwrap();
        w.admit(&r, 1, Ms(120)).unwrap();
        assert_eq!(w.deadline(&r), Some(Ms(150)));
        assert_eq!(w.close_if_due(&r, Ms(149)), None);
        assert_eq!(w.close_if_due(&r, Ms(150)), Some(3));
        assert_eq!(w, OpenWindow::new(4));
    }

    #[test]
    fn exact_mode_closes_before_the_budget_is_exceeded_and_refuses_what_never_fits() {
        // m = 2: a record of 3 items has C(3,1) + C(3,2) = 6 antecedents.
        let r = rules(100, Mode::Exact, 10);
        let mut w = OpenWindow::new(0);
        assert_eq!(w.admit(&r, 3, Ms(0)).unwrap().closed_before, None);
        let p = w.admit(&r, 3, Ms(1)).unwrap();
        assert_eq!((p.closed_before, p.window_id), (Some(0), 1));
        assert_eq!(w.antecedents, 6);
        // 5 items: 5 + 10 = 15 > 10.
        let before = w.clone();
        assert_eq!(
            w.admit(&r, 5, Ms(2)),
            Err(OverBudget {
                antecedents: 15,
                limit: 10
            })
        );
        assert_eq!(w, before);
        // Sampled mode has no budget.
        let s = rules(
            100,
            Mode::Sampled {
                epsilon: 0.1,
                delta: 0.1,
            },
            10,
        );
        let mut w = OpenWindow::new(0);
        for t in 0..20 {
            assert_eq!(w.admit(&s, 5, Ms(t)).unwrap().window_id, 0);
        }
    }

    proptest! {
        /// Against a brute-force model: windows never exceed the count or the budget, are never
        /// empty when closed, and ids run 0, 1, 2, ... in arrival order.
        #[test]
        fn windows_respect_every_rule(
            steps in prop::collection::vec((1usize..8, 0u64..80, any::<bool>()), 1..200),
            window_records in 1usize..6,
            budget in 30u64..200,
        ) {
            let r = rules(window_records, Mode::Exact, budget);
            let mut w = OpenWindow::new(0);
            let mut now = 0;
            // Per window id: records and antecedents placed into it.
            let mut placed: Vec<(usize, u64)> = Vec::new();
            let mut closed = Vec::new();
            for (items, gap, tick) in steps {
                now += gap;
                if tick {
                    closed.extend(w.close_if_due(&r, Ms(now)));
                }
                match w.admit(&r, items, Ms(now)) {
                    Ok(p) => {
                        closed.extend(p.closed_before);
                        if placed.len() <= p.window_id as usize {
                            placed.resize(p.window_id as usize + 1, (0, 0));
                        }
                        let slot = &mut placed[p.window_id as usize];
                        slot.0 += 1;
                        slot.1 += antecedent_count(items, 2);
                        closed.extend(p.closed_after);
                    }
                    Err(e) => prop_assert!(e.antecedents > budget),
                }
            }
            let expected: Vec<u64> = (0..closed.len() as u64).collect();
            prop_assert_eq!(&closed, &expected);
            for (id, &(records, antecedents)) in placed.iter().enumerate() {
                prop_assert!(records <= window_records, "window {} has {} records", id, records);
                prop_assert!(antecedents <= budget, "window {} has {} antecedents", id, antecedents);
                if (id as u64) < w.id {
                    prop_assert!(records > 0, "closed window {} is empty", id);
                }
            }
        }
    }
}
