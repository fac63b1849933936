//! GEO_IND answers: a request of the model, or a REQUESTS request that reached its deadline without
//! a group and named `fallback_epsilon_per_km`, is answered at once with a point drawn by the planar
//! Laplace mechanism ([`crate::location::geo_ind`]) and forwarded alone (group size 1) under a fresh
//! 128-bit pseudonym, like any cloaked request.
//!
//! Invariants: every draw goes through [`Broker::draw_geo_ind`]; with a privacy budget, the answer
//! is charged first and released only once the charge is durable ([`super::geo_budget`]); the draws use the broker's generator seeded from the operating system,
//! never the configurable `location.seed`; the true position appears in no event, log line or error
//! (providers get the reported point, the area of retrieval and its bounding box).
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::Broker;
use super::delivery::Delivery;
use super::geo_budget::GeoBudget;
use super::message::{AdmittedRequest, ClientId, Rejection};
use crate::location::UserKey;
use crate::location::geo_ind::{Mechanism, Reported, circle_bbox};
use crate::proto::{self, GeoPoint};

/// GEO_IND's state: the generator of its draws and the privacy budget its answers are charged to.
pub(super) struct GeoIndState {
    /// GEO_IND draws: seeded from the operating system, never from `location.seed`.
    rng: ChaCha20Rng,
    /// The privacy budget of GEO_IND answers (`None`: `location.geo_ind.budget = 0`).
    pub(super) budget: Option<GeoBudget>,
}

impl GeoIndState {
    pub(super) fn new() -> GeoIndState {
        GeoIndState {
            rng: ChaCha20Rng::from_os_rng(),
            budget: None,
        }
    }
}

/// What a REQUESTS request with a fallback keeps for its deadline.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fallback {
    pub(super) lat: f64,
    pub(super) lon: f64,
    pub(super) epsilon_per_km: f64,
    /// The ledger's key of the user, when the broker keeps a privacy budget.
    pub(super) budget_user: Option<crate::ledger::UserHash>,
}

/// One draw: the reported point, the area of retrieval and what is left of the user's budget.
pub(super) struct GeoIndDraw {
    pub(super) reported: Reported,
    pub(super) retrieval_radius_m: f64,
    pub(super) budget_left: Option<f64>,
}

impl Broker {
    /// A GEO_IND request: answered at once.
    pub(super) fn submit_geo_ind(&mut self, client: ClientId, request: AdmittedRequest) {
        let Some(epsilon_per_km) = request.epsilon_per_km else {
            // Validation fills it in for every GEO_IND request.
            let rejection = Rejection::invalid("epsilon_per_km", "must be set under GEO_IND");
            return self.reject(client, request.request_no, &rejection);
        };
        let user = self.user_key(&request.user_id);
        let delivery = Delivery {
            client,
            request_no: request.request_no,
            user,
            service: request.service,
            payload: request.payload,
        };
        let budget_user = self.budget_user(&request.user_id);
        if self.answer_geo_ind(
            delivery,
            budget_user,
            request.lat,
            request.lon,
            epsilon_per_km,
        ) {
            self.metrics.geo_ind_direct.increment(1);
        }
    }

    /// A REQUESTS request that found no group by its deadline: answered under GEO_IND at its
    /// fallback level instead of `Expired`.
    pub(super) fn answer_fallback(&mut self, delivery: Delivery, fallback: Fallback) {
        let client = delivery.client;
        if self.answer_geo_ind(
            delivery,
            fallback.budget_user,
            fallback.lat,
            fallback.lon,
            fallback.epsilon_per_km,
        ) {
            self.metrics.geo_ind_fallback.increment(1);
        }
        self.maybe_close(client);
    }

    /// Draws, answers the client and forwards the request; false when the draw was refused (the
    /// client got `Rejected`).
    fn answer_geo_ind(
        &mut self,
        to: Delivery,
        budget_user: Option<crate::ledger::UserHash>,
        lat: f64,
        lon: f64,
        epsilon_per_km: f64,
    ) -> bool {
        if let Some(user) = budget_user {
            // Charged first; answered once the charge is durable ([`super::geo_budget`]).
            self.charge_geo_ind(to, user, lat, lon, epsilon_per_km);
            return true;
        }
        let (client, request_no) = (to.client, to.request_no);
        let drawn = match self.draw_geo_ind(to.user, lat, lon, epsilon_per_km) {
            Ok(drawn) => drawn,
            Err(rejection) => {
                self.reject(client, request_no, &rejection);
                self.maybe_close(client);
                return false;
            }
        };
        self.send_geo_ind(
            to,
            drawn.reported,
            drawn.retrieval_radius_m,
            drawn.budget_left,
        );
        true
    }

    /// Answers the client with `reported` and forwards the request under a fresh pseudonym.
    pub(super) fn send_geo_ind(
        &mut self,
        to: Delivery,
        reported: Reported,
        retrieval_radius_m: f64,
        budget_left: Option<f64>,
    ) {
        let now = self.clock.now_ms();
        let Reported { lat, lon } = reported;
        let area = circle_bbox(lat, lon, retrieval_radius_m);
        self.deliver(
            to,
            proto::Cloaked {
                // Named by the route table.
                pseudonym: String::new(),
                r#box: Some(super::message::to_proto_box(&area)),
                t_start_ms: now,
                t_end_ms: now,
                group_size: 1,
                reported: Some(GeoPoint { lat, lon }),
                retrieval_radius_m,
                budget_left,
            },
        );
    }

    /// Every GEO_IND draw goes through here. A privacy budget per user is charged here, before the
    /// draw (`user` is the broker's key of the user; the position is only passed to the mechanism).
    /// The confidence of each answer's area of retrieval: the configured one, or with a privacy
    /// budget (so that answers may be reused) its square root, so that every answer, fresh or reused,
    /// holds the true position with at least the configured confidence
    /// ([`crate::location::geo_ind::predictive::per_answer_confidence`]).
    pub(super) fn answer_confidence(&self) -> f64 {
        let confidence = self.cfg.geo_ind.params.confidence;
        if self.geo_ind.budget.is_some() {
            crate::location::geo_ind::predictive::per_answer_confidence(confidence)
        } else {
            confidence
        }
    }

    pub(super) fn draw_geo_ind(
        &mut self,
        _user: UserKey,
        lat: f64,
        lon: f64,
        epsilon_per_km: f64,
    ) -> Result<GeoIndDraw, Rejection> {
        let params = crate::location::geo_ind::GeoIndParams {
            confidence: self.answer_confidence(),
            ..self.cfg.geo_ind.params
        };
        let mechanism = Mechanism::new(epsilon_per_km / 1000.0, &params)
            .map_err(|err| Rejection::invalid(err.field, err.rule))?;
        let reported = mechanism.draw(&mut self.geo_ind.rng, lat, lon);
        Ok(GeoIndDraw {
            reported,
            retrieval_radius_m: mechanism.retrieval_radius_m(),
            budget_left: None,
        })
    }
}
