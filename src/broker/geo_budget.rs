//! The privacy budget on the GEO_IND path: before a GEO_IND answer is released, the broker plans it
//! with the predictive mechanism's reuse test ([`crate::location::geo_ind::predictive`]), charges
//! the user's budget in the [`crate::ledger`] and only once the charge is durable answers: a fresh
//! draw, the last report again, or RESOURCE_EXHAUSTED naming the budget and when it refills.
//!
//! Invariants:
//! - no answer is released before its charge is durable (the ledger answers through
//!   [`Command::BudgetCharged`], which is when the broker draws and sends);
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
use crate::telemetry::catalog;

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
}

impl GeoBudget {
    /// Starts the task that hands the ledger's answers to the broker (on the current runtime).
    pub(crate) fn new(
        ledger: Ledger,
        commands: mpsc::Sender<Command>,
        params: PredictiveParams,
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
        }
    }
}

/// A GEO_IND request waiting for its charge.
struct Waiting {
    to: Delivery,
    user: UserHash,
    lat: f64,
    lon: f64,
    epsilon: f64,
    plan: Plan,
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
        let charge = Charge {
            user,
            amount,
            fallback,
            now_ms,
        };
        let id = budget.next_waiting;
        match budget.ledger.try_charge_tagged(charge, id, &budget.answers) {
            Ok(()) => {
                budget.next_waiting = budget.next_waiting.wrapping_add(1);
                budget.waiting.insert(
                    id,
                    Waiting {
                        to,
                        user,
                        lat,
                        lon,
                        epsilon,
                        plan,
                    },
                );
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
    pub(super) fn budget_charged(&mut self, id: u64, result: Result<Charged, LedgerError>) {
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
        let last = budget.last.get(&user).map(|(r, _)| *r);
        match (plan, charged.paid, last) {
            (Plan::Reuse { .. }, Paid::Amount, Some(last)) => {
                metrics::counter!(catalog::GEO_BUDGET_ANSWERS, "outcome" => "reused").increment(1);
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
                metrics::counter!(catalog::GEO_BUDGET_ANSWERS, "outcome" => "fresh").increment(1);
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
        metrics::counter!(catalog::GEO_BUDGET_ANSWERS, "outcome" => "refused").increment(1);
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
        metrics::counter!(catalog::GEO_BUDGET_ANSWERS, "outcome" => "failed").increment(1);
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
