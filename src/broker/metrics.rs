//! The location broker's metrics (names in [`crate::telemetry::catalog`]): handles registered
//! once when the actor starts, and the gauges it sets after each wake-up.
use super::Broker;
use crate::telemetry::catalog;

/// The broker's metric handles, registered once (see [`crate::telemetry::catalog`]).
pub(super) struct BrokerMetrics {
    pub(super) cloaked: metrics::Counter,
    pub(super) expired: metrics::Counter,
    pub(super) rejected: metrics::Counter,
    pub(super) withdrawn: metrics::Counter,
    pub(super) pending: metrics::Gauge,
    pub(super) command_queue: metrics::Gauge,
    /// Group size and relative anonymity by model: CliqueCloak groups ...
    pub(super) requests: ModelMetrics,
    /// ... and PRESENCE anonymity sets.
    pub(super) presence: ModelMetrics,
    pub(super) overhead: metrics::Histogram,
    pub(super) answers_delivered: metrics::Counter,
    pub(super) answers_undeliverable: metrics::Counter,
    /// GEO_IND answers: requests of the model, and REQUESTS requests answered by their fallback.
    pub(super) geo_ind_direct: metrics::Counter,
    pub(super) geo_ind_fallback: metrics::Counter,
    /// The privacy budget's answers by outcome, and the charges paid from holds.
    pub(super) geo_budget: BudgetMetrics,
}

/// `cloakd_geo_budget_answers_total` by outcome, and `cloakd_geo_budget_charges_total` of the
/// charges the broker pays from holds (the ledger counts the ones it decides).
pub(super) struct BudgetMetrics {
    pub(super) held: metrics::Counter,
    pub(super) reused: metrics::Counter,
    pub(super) fresh: metrics::Counter,
    pub(super) refused: metrics::Counter,
    pub(super) failed: metrics::Counter,
}

impl BudgetMetrics {
    fn new() -> BudgetMetrics {
        let answers = |outcome: &'static str| metrics::counter!(catalog::GEO_BUDGET_ANSWERS, "outcome" => outcome);
        BudgetMetrics {
            held: metrics::counter!(catalog::GEO_BUDGET_CHARGES, "outcome" => "held"),
            reused: answers("reused"),
            fresh: answers("fresh"),
            refused: answers("refused"),
            failed: answers("failed"),
        }
    }
}

/// `cloakd_location_group_size` and `cloakd_location_relative_anonymity` of one cloaking model.
pub(super) struct ModelMetrics {
    pub(super) group_size: metrics::Histogram,
    pub(super) relative_anonymity: metrics::Histogram,
}

impl ModelMetrics {
    fn new(model: &'static str) -> ModelMetrics {
        ModelMetrics {
            group_size: metrics::histogram!(catalog::LOCATION_GROUP_SIZE, "model" => model),
            relative_anonymity: metrics::histogram!(
                catalog::LOCATION_RELATIVE_ANONYMITY,
                "model" => model
            ),
        }
    }
}

impl BrokerMetrics {
    pub(super) fn new() -> BrokerMetrics {
        let requests = |outcome: &'static str| metrics::counter!(catalog::LOCATION_REQUESTS, "outcome" => outcome);
        let answers =
            |result: &'static str| metrics::counter!(catalog::LBS_ANSWERS, "result" => result);
        BrokerMetrics {
            cloaked: requests("cloaked"),
            expired: requests("expired"),
            rejected: requests("rejected"),
            withdrawn: requests("withdrawn"),
            pending: metrics::gauge!(catalog::LOCATION_PENDING),
            command_queue: metrics::gauge!(catalog::LOCATION_COMMAND_QUEUE_DEPTH),
            requests: ModelMetrics::new("requests"),
            presence: ModelMetrics::new("presence"),
            overhead: metrics::histogram!(catalog::LOCATION_BROKER_OVERHEAD),
            answers_delivered: answers("delivered"),
            answers_undeliverable: answers("undeliverable"),
            geo_ind_direct: metrics::counter!(catalog::LOCATION_GEO_IND_ANSWERS, "path" => "direct"),
            geo_ind_fallback: metrics::counter!(catalog::LOCATION_GEO_IND_ANSWERS, "path" => "fallback"),
            geo_budget: BudgetMetrics::new(),
        }
    }
}

impl Broker {
    /// Updates the pending, command-queue and provider-queue gauges.
    pub(super) fn record_gauges(&self, commands_waiting: usize) {
        self.metrics.pending.set(self.cloaking.pending.len() as f64);
        self.metrics.command_queue.set(commands_waiting as f64);
        for queue in &self.delivery.provider_queues {
            queue.depth.set(queue.queue.len() as f64);
        }
    }
}
