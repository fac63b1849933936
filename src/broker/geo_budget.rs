//! The privacy budget on the GEO_IND path: before a GEO_IND answer is released, the broker plans it
//! with the predictive mechanism's reuse test ([`crate::location::geo_ind::predictive`]), charges
//! the user's budget in the [`crate::ledger`] and only once the charge is durable answers: a fresh
//! draw, the last report again, or RESOURCE_EXHAUSTED naming the budget and when it refills.
//!
//! **Holds.** A charge that goes to the ledger asks it to set aside more for the user in the same
//! commit (`location.geo_ind.budget_reserve_share` of the budget, [`crate::ledger::Charge::reserve`]);
//! the broker keeps what was set aside as the user's *hold* and pays the user's next charges from it
//! at once, with no commit to wait for. The ledger counts the hold as spent, so a crash forfeits its unspent part and
//! never lets the user spend more than the budget.
//!
//! Invariants:
//! - no answer is released before its charge is durable: paid by a commit (the ledger answers
//!   through [`Command::BudgetCharged`], which is when the broker draws and sends), or from a hold
//!   the ledger already made durable as spent;
//! - a user's charges are answered in the order they were made: a hold pays only while none of the
//!   user's charges waits for the ledger, and only a charge made while none waits asks for a hold;
//! - a hold belongs to one budget window and is dropped with it;
//! - the broker keeps, per user, the last point a GEO_IND answer released (already public: the
//!   provider saw it) and its radius, in memory only, for the reuse test; the ledger never holds a
//!   position; entries older than a budget window are dropped;
//! - a refusal names no user id: field `epsilon_per_km`, the budget key and the refill time.
use std::collections::HashMap;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use tokio::sync::mpsc;
use tonic::Code;

use super::Broker;
use super::delivery::Delivery;
use super::message::{ClientId, Command, Rejection};
use crate::ledger::{Answers, Charge, Charged, Ledger, LedgerError, Paid, UserHash};
use crate::location::geo_ind::Reported;
use crate::location::geo_ind::predictive::{
    self, LastReport, Plan, PredictiveParams, reused_radius_m,
};
use crate::proto::location_event;

/// Drop stale last reports once the map holds this many more than after its last sweep.
const SWEEP_EVERY: usize = 4096;

/// The budget state of a broker that keeps one.
pub(crate) struct GeoBudget {
    ledger: Ledger,
    /// Where the ledger sends the answers of this broker's charges, one message per group commit;
    /// a task hands each message to the broker as one [`Command::BudgetCharged`].
    answers: mpsc::Sender<Answers>,
    params: PredictiveParams,
    /// Per user (the ledger's key): the last released report and when (Unix ms).
    last: HashMap<UserHash, (LastReport, i64)>,
    swept_at_len: usize,
    /// The reuse test's noise (cryptographically secure, seeded from the operating system).
    rng: ChaCha20Rng,
    /// The answers waiting for their charge, by the number their ledger reply carries back.
    waiting: HashMap<u64, Waiting>,
    next_waiting: u64,
    /// What a charge that waits for the ledger asks it to set aside (`budget_reserve_share` of the
    /// budget).
    reserve: f64,
    /// Per user: what the ledger set aside for this broker and it has not spent yet.
    holds: HashMap<UserHash, Hold>,
    holds_swept_at_len: usize,
}

/// A user's hold in one budget window.
#[derive(Debug, Clone, Copy)]
struct Hold {
    window: i64,
    /// Set aside by the ledger (counted there as spent), not yet spent here.
    free: f64,
    /// What the ledger said is left beyond every hold, at its latest answer for the user.
    left_beyond: f64,
    /// The user's charges waiting for the ledger.
    in_flight: u32,
}

impl GeoBudget {
    /// Starts the task that hands the ledger's answers to the broker (on the current runtime).
    pub(crate) fn new(
        ledger: Ledger,
        commands: mpsc::Sender<Command>,
        params: PredictiveParams,
        reserve: f64,
    ) -> GeoBudget {
        // Each message holds at least one answer of a charge that waited in the ledger's queue, so
        // this many places never hold up its writer for long.
        let (answers, mut from_ledger) = mpsc::channel::<Answers>(ledger.queue());
        tokio::spawn(async move {
            while let Some(answers) = from_ledger.recv().await {
                if commands
                    .send(Command::BudgetCharged { answers })
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        GeoBudget {
            ledger,
            answers,
            params,
            last: HashMap::new(),
            swept_at_len: 0,
            rng: ChaCha20Rng::from_os_rng(),
            waiting: HashMap::new(),
            next_waiting: 0,
            reserve,
            holds: HashMap::new(),
            holds_swept_at_len: 0,
        }
    }

    /// The user's hold in `window`: a hold of an earlier window is replaced by an empty one (its
    /// charges still waiting, if any, come back for the old window and are not added to it).
    fn hold(&mut self, user: UserHash, window: i64) -> &mut Hold {
        let budget = self.ledger.policy().budget;
        let fresh = Hold {
            window,
            free: 0.0,
            left_beyond: budget,
            in_flight: 0,
        };
        let hold = self.holds.entry(user).or_insert(fresh);
        if hold.window < window {
            *hold = Hold {
                in_flight: hold.in_flight,
                ..fresh
            };
        }
        hold
    }

    /// Drops holds of windows that ended, with no charge waiting, once the map has grown by
    /// [`SWEEP_EVERY`] since the last sweep.
    fn sweep_holds(&mut self, window: i64) {
        if self.holds.len() >= self.holds_swept_at_len + SWEEP_EVERY {
            self.holds
                .retain(|_, hold| hold.window >= window || hold.in_flight > 0);
            self.holds_swept_at_len = self.holds.len();
        }
    }
}

/// A GEO_IND request waiting for its charge (or paid from a hold at once).
struct Waiting {
    to: Delivery,
    user: UserHash,
    lat: f64,
    lon: f64,
    epsilon: f64,
    plan: Plan,
    /// The last report the plan's reuse test was made against (a reuse sends this one).
    planned_on: Option<LastReport>,
    /// The budget window of the charge.
    window: i64,
}

impl Broker {
    /// The ledger's key of a user id, when this broker keeps a budget.
    pub(super) fn budget_user(&self, user_id: &str) -> Option<UserHash> {
        self.geo_ind.budget.as_ref().map(|b| b.ledger.user(user_id))
    }

    /// Plans and charges a GEO_IND answer at `epsilon` for the true position (`lat`, `lon`) of
    /// `user`; the answer follows on [`Command::BudgetCharged`], once the charge is durable.
    pub(super) fn charge_geo_ind(
        &mut self,
        to: Delivery,
        user: UserHash,
        lat: f64,
        lon: f64,
        epsilon: f64,
    ) {
        let now_ms = self.clock.now_ms();
        let (client, request_no) = (to.client, to.request_no);
        let Some(budget) = self.geo_ind.budget.as_mut() else {
            return;
        };
        let last = budget.last.get(&user).map(|(r, _)| *r);
        let plan = predictive::plan(
            budget.params,
            last.as_ref(),
            lat,
            lon,
            epsilon,
            &mut budget.rng,
        );
        let (amount, fallback) = plan.charge();
        let policy = budget.ledger.policy();
        let window = policy.window(now_ms);
        budget.sweep_holds(window);
        let reserve = budget.reserve;
        let hold = budget.hold(user, window);
        let waiting = Waiting {
            to,
            user,
            lat,
            lon,
            epsilon,
            plan,
            planned_on: last,
            window,
        };
        // Paid from the hold at once: the ledger already counts it as spent.
        if hold.in_flight == 0 && amount <= hold.free {
            hold.free -= amount;
            let charged = Charged {
                paid: Paid::Amount,
                left: hold.left_beyond + hold.free,
                reserved: 0.0,
                refill_at_ms: policy.refill_at_ms(window),
            };
            self.metrics.geo_budget.held.increment(1);
            return self.release_charged(waiting, Ok(charged));
        }
        let charge = Charge {
            user,
            amount,
            fallback,
            now_ms,
            // Only a charge made while none of the user's waits asks for a hold.
            reserve: if hold.in_flight == 0 { reserve } else { 0.0 },
        };
        let id = budget.next_waiting;
        match budget.ledger.try_charge_tagged(charge, id, &budget.answers) {
            Ok(()) => {
                budget.hold(user, window).in_flight += 1;
                budget.next_waiting = budget.next_waiting.wrapping_add(1);
                budget.waiting.insert(id, waiting);
                // The client's stream stays open until the answer is released.
                if let Some(state) = self.clients.get_mut(&client) {
                    state.awaiting_answer += 1;
                }
            }
            Err(e) => {
                self.budget_failed(client, request_no, &e);
                self.maybe_close(client);
            }
        }
    }

    /// The ledger answered: release what the charge paid for.
    pub(super) fn budget_charged(&mut self, id: u64, mut result: Result<Charged, LedgerError>) {
        let Some(waiting) = self
            .geo_ind
            .budget
            .as_mut()
            .and_then(|b| b.waiting.remove(&id))
        else {
            return;
        };
        let client = waiting.to.client;
        if let Some(state) = self.clients.get_mut(&client) {
            state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
        }
        // The hold exists: it was made before the charge was queued, and a hold with a charge
        // waiting is never swept.
        if let Some(hold) = self
            .geo_ind
            .budget
            .as_mut()
            .and_then(|b| b.holds.get_mut(&waiting.user))
        {
            hold.in_flight = hold.in_flight.saturating_sub(1);
            // What was set aside becomes the user's hold (in the charge's window only), and the
            // client is told what is left counting the hold as unspent.
            if let Ok(charged) = result.as_mut()
                && hold.window == waiting.window
            {
                hold.free += charged.reserved;
                hold.left_beyond = charged.left;
                charged.left += hold.free;
            }
        }
        self.release_charged(waiting, result);
        self.maybe_close(client);
    }

    fn release_charged(&mut self, waiting: Waiting, result: Result<Charged, LedgerError>) {
        let Waiting {
            to,
            user,
            lat,
            lon,
            epsilon,
            plan,
            planned_on,
            window: _,
        } = waiting;
        let (client, request_no) = (to.client, to.request_no);
        let charged = match result {
            Ok(charged) => charged,
            Err(e) => return self.budget_failed(client, request_no, &e),
        };
        let Some(budget) = self.geo_ind.budget.as_ref() else {
            return;
        };
        let policy = budget.ledger.policy();
        let params = budget.params;
        match (plan, charged.paid, planned_on) {
            (Plan::Reuse { .. }, Paid::Amount, Some(last)) => {
                self.metrics.geo_budget.reused.increment(1);
                // Wide enough that a position outside it passes the test with at most α_r.
                let reported = Reported {
                    lat: last.lat,
                    lon: last.lon,
                };
                let radius =
                    reused_radius_m(params, last.retrieval_radius_m, self.answer_confidence());
                self.send_geo_ind(to, reported, radius, Some(charged.left));
            }
            (Plan::Fresh { .. } | Plan::TestThenFresh { .. }, Paid::Amount, _) => {
                let drawn = match self.draw_geo_ind(to.user, lat, lon, epsilon) {
                    Ok(drawn) => drawn,
                    Err(rejection) => return self.reject(client, request_no, &rejection),
                };
                self.metrics.geo_budget.fresh.increment(1);
                self.remember_report(
                    user,
                    LastReport {
                        lat: drawn.reported.lat,
                        lon: drawn.reported.lon,
                        retrieval_radius_m: drawn.retrieval_radius_m,
                    },
                );
                self.send_geo_ind(
                    to,
                    drawn.reported,
                    drawn.retrieval_radius_m,
                    Some(charged.left),
                );
            }
            _ => self.budget_refused(client, request_no, charged, policy.budget, policy.window_ms),
        }
    }

    fn remember_report(&mut self, user: UserHash, report: LastReport) {
        let now_ms = self.clock.now_ms();
        let Some(budget) = self.geo_ind.budget.as_mut() else {
            return;
        };
        budget.last.insert(user, (report, now_ms));
        if budget.last.len() >= budget.swept_at_len + SWEEP_EVERY {
            let oldest = now_ms.saturating_sub(budget.ledger.policy().window_ms);
            budget.last.retain(|_, (_, at)| *at >= oldest);
            budget.swept_at_len = budget.last.len();
        }
    }
    fn budget_refused(
        &mut self,
        client: ClientId,
        request_no: u64,
        charged: Charged,
        budget: f64,
        window_ms: i64,
    ) {
        self.metrics.geo_budget.refused.increment(1);
        let rejection = Rejection::exhausted(
            "epsilon_per_km",
            format!(
                "the user's privacy budget is spent ({:.6} left of location.geo_ind.budget = {budget} per km per location.geo_ind.budget_window_ms = {window_ms}); it refills at Unix ms {}",
                charged.left, charged.refill_at_ms
            ),
        );
        self.count_rejection(&rejection);
        let mut event = rejection.to_event(request_no);
        if let Some(location_event::Outcome::Rejected(rejected)) = event.outcome.as_mut() {
            rejected.refill_at_ms = Some(charged.refill_at_ms);
        }
        self.send(client, event);
    }

    fn budget_failed(&mut self, client: ClientId, request_no: u64, error: &LedgerError) {
        self.metrics.geo_budget.failed.increment(1);
        let code = match error {
            LedgerError::Busy { .. } => Code::ResourceExhausted,
            _ => Code::Unavailable,
        };
        let rejection = Rejection {
            field: "epsilon_per_km",
            reason: format!("the privacy budget cannot be charged: {error}"),
            code,
        };
        self.reject(client, request_no, &rejection);
    }
}
