//! Delivery and acknowledgements: a cloaked request goes to its client (`Cloaked`) and to its
//! service's bounded provider queue under its pseudonym (`Undelivered` when the queue is full); the
//! Subscribe stream that takes it must acknowledge it within `provider_ack_ms` or is closed and the
//! request handed to another provider of the service; answers come back by pseudonym while the
//! route lives (`answer_ttl_ms`), and only from the principal whose stream received it.
//!
//! Invariants: no forwarded request is silently lost (acknowledged, handed on, or its client told
//! `Undelivered`); an answer from another principal is refused and counted. The client streams
//! the events go to are [`super::clients`].
use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::collections::{HashMap, HashSet, VecDeque};

use tokio::sync::oneshot;

use super::Broker;
use super::message::{AnswerTally, ClientId, ProviderId, ProviderWindow, StreamEnd};
use super::provider_queues::{ProviderQueue, ProviderQueues, Queued, Refused};
use super::routes::Routes;
use crate::location::{Pseudonym, UserKey};
use crate::proto::{self, CloakedRequest, LocationEvent, location_event};
use crate::telemetry::catalog;

/// Delivery's state: the provider queues and streams, the routes of forwarded requests and the
/// deadlines of their acknowledgements.
pub(super) struct DeliveryState {
    /// The broker's copy of the provider queues (by service index; grows on reload).
    pub(super) provider_queues: Vec<ProviderQueue>,
    pub(super) all_provider_queues: Arc<ProviderQueues>,
    /// Named by the broker, in the order they were made ([`super::routes`]).
    pub(super) routes: Routes<Route>,
    pub(super) providers: HashMap<ProviderId, ProviderState>,
    /// When each delivered request must be acknowledged, in order (the ack time is one constant).
    pub(super) ack_expiry: VecDeque<(i64, Pseudonym, ProviderId)>,
}

impl DeliveryState {
    /// Wakes the Subscribe streams waiting on the queues the broker put requests on (once per
    /// wake-up of the broker, after its events are flushed).
    pub(super) fn announce(&self) {
        for queue in &self.provider_queues {
            queue.queue.announce();
        }
    }

    pub(super) fn new(all_provider_queues: Arc<ProviderQueues>) -> DeliveryState {
        let mut provider_queues = Vec::new();
        all_provider_queues.extend(&mut provider_queues);
        DeliveryState {
            provider_queues,
            all_provider_queues,
            routes: Routes::default(),
            providers: HashMap::new(),
            ack_expiry: VecDeque::new(),
        }
    }
}

/// Where a cloaked request goes: the client to tell, and the provider queue with its payload.
pub(super) struct Delivery {
    pub(super) client: ClientId,
    pub(super) request_no: u64,
    pub(super) user: UserKey,
    pub(super) service: usize,
    pub(super) payload: Vec<u8>,
}

pub(super) struct Route {
    pub(super) client: ClientId,
    pub(super) request_no: u64,
    pub(super) answered: bool,
    /// The principal whose provider stream received the pseudonym; only it may answer.
    pub(super) delivered_to: Option<Arc<str>>,
    pub(super) service: usize,
    /// The Subscribe stream that took the request and has not acknowledged it yet.
    pub(super) holder: Option<ProviderId>,
    /// The request as forwarded (shared with the provider queue), kept until a provider
    /// acknowledges it so it can be handed on.
    pub(super) unacknowledged: Option<Arc<CloakedRequest>>,
}

/// One provider's Subscribe stream, as the broker tracks it.
pub(super) struct ProviderState {
    pub(super) service: usize,
    pub(super) window: Arc<ProviderWindow>,
    pub(super) close: oneshot::Sender<StreamEnd>,
    /// Requests it took and has not acknowledged.
    pub(super) unacknowledged: HashSet<Pseudonym>,
}

/// Why a request is handed on: the requests of a provider stream, or one waiting on its queue.
#[derive(Debug, Clone, Copy)]
pub(super) enum HandOver {
    /// The stream did not acknowledge one of them within `provider_ack_ms` (it was closed).
    Stalled,
    /// The stream ended.
    Gone,
    /// In a cluster, the last provider of its service here left while it waited on the service's
    /// provider queue.
    Unsubscribed,
}

impl Broker {
    /// Names the request's route with a fresh pseudonym ([`super::routes`]), tells the client it
    /// was cloaked and puts it on its service's provider queue under that pseudonym (or tells the
    /// client it was undelivered when the queue is full); in a cluster without a provider of the
    /// service here, relays it to another replica's ([`super::replicas`]).
    pub(super) fn deliver(&mut self, to: Delivery, mut cloaked: proto::Cloaked) {
        let Delivery {
            client,
            request_no,
            user,
            service,
            payload,
        } = to;
        self.metrics.cloaked.increment(1);
        let expires = self.route_expires();
        let pseudonym = self.delivery.routes.name(expires);
        cloaked.pseudonym = pseudonym.to_string();
        let forwarded = CloakedRequest {
            pseudonym: cloaked.pseudonym.clone(),
            r#box: cloaked.r#box,
            t_start_ms: cloaked.t_start_ms,
            t_end_ms: cloaked.t_end_ms,
            payload,
            service: self.delivery.provider_queues[service].service.clone(),
            reported: cloaked.reported,
            retrieval_radius_m: cloaked.retrieval_radius_m,
        };
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Cloaked(cloaked)),
            },
        );
        if self.relays(service) {
            self.relay(client, request_no, user, service, forwarded);
        } else {
            self.enqueue(client, request_no, service, pseudonym, forwarded, expires);
        }
        self.maybe_close(client);
    }

    /// When a route made now expires (`location.answer_ttl_ms` from now).
    pub(super) fn route_expires(&self) -> i64 {
        self.clock
            .now_ms()
            .saturating_add(i64::try_from(self.cfg.answer_ttl_ms).unwrap_or(i64::MAX))
    }

    /// Puts a cloaked request on its service's provider queue and routes its answers to `client`
    /// until `expires` (or tells the client it was undelivered when the queue is full).
    pub(super) fn enqueue(
        &mut self,
        client: ClientId,
        request_no: u64,
        service: usize,
        pseudonym: Pseudonym,
        forwarded: CloakedRequest,
        expires: i64,
    ) {
        let forwarded = Arc::new(forwarded);
        match self.delivery.provider_queues[service]
            .queue
            .put(Queued::new(pseudonym, Arc::clone(&forwarded)))
        {
            Ok(()) => {
                self.delivery.routes.insert(
                    pseudonym,
                    Route {
                        client,
                        request_no,
                        answered: false,
                        delivered_to: None,
                        service,
                        holder: None,
                        unacknowledged: Some(forwarded),
                    },
                    expires,
                );
                if let Some(state) = self.clients.get_mut(&client) {
                    state.awaiting_answer += 1;
                }
            }
            Err(refused) => {
                let (label, reason) = self.queue_refusal(service, refused);
                self.undelivered(client, request_no, service, label, reason);
            }
        }
    }

    /// The label and reason of a provider queue that refused a request (full, or closed at shutdown).
    pub(super) fn queue_refusal(&self, service: usize, refused: Refused) -> (&'static str, String) {
        if refused == Refused::Full {
            (
                "queue_full",
                format!(
                    "the provider queue of service {:?} is full ({} requests waiting; location.provider_queue)",
                    self.delivery.provider_queues[service].service, self.cfg.provider_queue
                ),
            )
        } else {
            ("shutting_down", "the broker is shutting down".to_string())
        }
    }

    /// Tells the client its forwarded request reached no provider, counting it by `label`.
    pub(super) fn undelivered(
        &mut self,
        client: ClientId,
        request_no: u64,
        service: usize,
        label: &'static str,
        reason: String,
    ) {
        metrics::counter!(
            catalog::LOCATION_UNDELIVERED,
            "service" => self.delivery.provider_queues[service].service.clone(),
            "reason" => label,
        )
        .increment(1);
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Undelivered(proto::Undelivered {
                    reason,
                })),
            },
        );
    }

    /// The Subscribe stream `provider` took the request of `pseudonym`: it must acknowledge it within
    /// `provider_ack_ms`.
    pub(super) fn delivered(
        &mut self,
        pseudonym: Pseudonym,
        principal: Arc<str>,
        provider: ProviderId,
    ) {
        let Some(route) = self.delivery.routes.get_mut(&pseudonym) else {
            // Expired or undelivered meanwhile: nothing to wait for.
            if let Some(state) = self.delivery.providers.get(&provider) {
                state.window.release();
            }
            return;
        };
        route.delivered_to = Some(principal);
        if route.unacknowledged.is_none() {
            // Acknowledged already (a copy handed on earlier was answered): nothing to wait for.
            if let Some(state) = self.delivery.providers.get(&provider) {
                state.window.release();
            }
            return;
        }
        match self.delivery.providers.get_mut(&provider) {
            Some(state) => {
                route.holder = Some(provider);
                state.unacknowledged.insert(pseudonym);
                let due = self
                    .clock
                    .now_ms()
                    .saturating_add(i64::try_from(self.cfg.provider_ack_ms).unwrap_or(i64::MAX));
                self.delivery
                    .ack_expiry
                    .push_back((due, pseudonym, provider));
            }
            // The stream is gone already: hand the request on at once.
            None => self.hand_on(pseudonym, HandOver::Gone),
        }
    }

    /// Closes the streams whose acknowledgement is overdue and hands their requests on.
    pub(super) fn expire_acks(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&(due, pseudonym, provider)) = self.delivery.ack_expiry.front() {
            if due > now {
                break;
            }
            self.delivery.ack_expiry.pop_front();
            // The stream's own set is small and holds exactly the requests it still has to
            // acknowledge (so no lookup in the large route table).
            let overdue = self
                .delivery
                .providers
                .get(&provider)
                .is_some_and(|state| state.unacknowledged.contains(&pseudonym));
            if overdue {
                self.end_provider(provider, HandOver::Stalled);
            }
        }
    }

    /// Starts tracking a provider's Subscribe stream for `service` (its queue's index).
    pub(super) fn open_provider(
        &mut self,
        provider: ProviderId,
        service: usize,
        window: Arc<ProviderWindow>,
        close: oneshot::Sender<StreamEnd>,
    ) {
        self.delivery.providers.insert(
            provider,
            ProviderState {
                service,
                window,
                close,
                unacknowledged: HashSet::new(),
            },
        );
        self.providers_changed();
    }

    /// Forgets a provider stream (closing it with a status when it stalled) and hands on every
    /// request it has not acknowledged.
    pub(super) fn end_provider(&mut self, provider: ProviderId, why: HandOver) {
        let Some(state) = self.delivery.providers.remove(&provider) else {
            return;
        };
        self.providers_changed();
        let held = state.unacknowledged.len();
        if let HandOver::Stalled = why {
            tracing::warn!(
                provider,
                service = %self.delivery.provider_queues[state.service].service,
                unacknowledged = held,
                limit_ms = self.cfg.provider_ack_ms,
                "provider did not acknowledge a request in time; closing its stream (location.provider_ack_ms)"
            );
            let _ = state.close.send(StreamEnd::ProviderStalled {
                limit_ms: self.cfg.provider_ack_ms,
                handed_on: held,
            });
        }
        for pseudonym in state.unacknowledged {
            self.hand_on(pseudonym, why);
        }
        // In a cluster, the last provider of the service here left: new requests are relayed to other
        // replicas, and what waits on this queue (relayed here, or queued before) would sit there
        // until `location.answer_ttl_ms`; its clients get `Undelivered` (no provider) now. (A single
        // daemon keeps them for a provider that subscribes again, docs/api.md.) The queue's depth
        // gauge follows after this wake-up, as for every change of the queue (`record_gauges`).
        if self.replicas.link.is_some() && !self.has_provider(state.service) {
            let queue = self.delivery.provider_queues[state.service].queue.clone();
            while let Some(waiting) = queue.try_take() {
                self.hand_on(waiting.pseudonym, HandOver::Unsubscribed);
            }
        }
    }

    /// Hands a request whose stream stalled or ended to another provider of its service (through
    /// the service's queue), or tells its client it was undelivered when no other provider of the
    /// service is subscribed or the queue is full.
    pub(super) fn hand_on(&mut self, pseudonym: Pseudonym, why: HandOver) {
        let Some(route) = self.delivery.routes.get_mut(&pseudonym) else {
            return;
        };
        let Some(forwarded) = route.unacknowledged.clone() else {
            return;
        };
        route.holder = None;
        route.delivered_to = None;
        let (client, request_no, service) = (route.client, route.request_no, route.service);
        let another = self.has_provider(service);
        let refusal = if another {
            match self.delivery.provider_queues[service]
                .queue
                .put(Queued::new(pseudonym, forwarded))
            {
                Ok(()) => {
                    metrics::counter!(
                        catalog::LOCATION_REHANDED,
                        "service" => self.delivery.provider_queues[service].service.clone(),
                    )
                    .increment(1);
                    return;
                }
                Err(refused) => self.queue_refusal(service, refused),
            }
        } else {
            let service = &self.delivery.provider_queues[service].service;
            let no_other = format!("no other provider of service {service:?} is subscribed");
            let reason = match why {
                HandOver::Stalled => format!(
                    "the provider that received it did not acknowledge it within {} ms (location.provider_ack_ms) and {no_other}",
                    self.cfg.provider_ack_ms
                ),
                HandOver::Gone => format!(
                    "the provider stream that received it ended before acknowledging it (location.provider_ack_ms) and {no_other}"
                ),
                HandOver::Unsubscribed => format!(
                    "it was waiting on a replica's provider queue of service {service:?} when that replica's last provider of the service left"
                ),
            };
            ("no_provider", reason)
        };
        // Undelivered: the route is over (an answer that still comes is undeliverable).
        self.delivery.routes.remove(&pseudonym);
        if let Some(state) = self.clients.get_mut(&client) {
            state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
        }
        self.undelivered(client, request_no, service, refusal.0, refusal.1);
        self.maybe_close(client);
    }

    pub(super) fn answer(
        &mut self,
        pseudonym: Pseudonym,
        payload: Option<Vec<u8>>,
        tally: &AnswerTally,
        principal: &str,
    ) {
        let Some(route) = self.delivery.routes.get_mut(&pseudonym) else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
            return;
        };
        if route.delivered_to.as_deref() != Some(principal) {
            tally.denied.fetch_add(1, Ordering::Relaxed);
            crate::auth::permission_denied(
                principal,
                "answer_binding",
                "an answer is accepted only from the principal whose Subscribe stream received the pseudonym",
            );
            return;
        }
        // An answer or an acknowledgement: stop waiting for the acknowledgement and free the
        // request's place in its stream's window.
        route.unacknowledged = None;
        let holder = route.holder.take();
        let (client, request_no) = (route.client, route.request_no);
        let first = payload.is_some() && !route.answered;
        if payload.is_some() {
            route.answered = true;
        }
        if let Some(holder) = holder
            && let Some(state) = self.delivery.providers.get_mut(&holder)
            && state.unacknowledged.remove(&pseudonym)
        {
            state.window.release();
        }
        let Some(payload) = payload else {
            tally.acknowledged.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !self.clients.contains_key(&client) {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
            return;
        }
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Reply(proto::LbsReply { payload })),
            },
        );
        if self.clients.contains_key(&client) {
            tally.delivered.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_delivered.increment(1);
        } else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
        }
        if first {
            if let Some(state) = self.clients.get_mut(&client) {
                state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
            }
            self.maybe_close(client);
        }
    }

    pub(super) fn prune_routes(&mut self) {
        let now = self.clock.now_ms();
        while let Some((pseudonym, route)) = self.delivery.routes.pop_expired(now) {
            if route.answered {
                continue;
            }
            if let Some(holder) = route.holder
                && let Some(state) = self.delivery.providers.get_mut(&holder)
                && state.unacknowledged.remove(&pseudonym)
            {
                state.window.release();
            }
            if let Some(state) = self.clients.get_mut(&route.client) {
                state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
            }
            if route.unacknowledged.is_some() {
                let reason = format!(
                    "no provider of service {:?} acknowledged it within {} ms (location.answer_ttl_ms)",
                    self.delivery.provider_queues[route.service].service, self.cfg.answer_ttl_ms
                );
                self.undelivered(
                    route.client,
                    route.request_no,
                    route.service,
                    "expired",
                    reason,
                );
            }
            self.maybe_close(route.client);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::super::message::{AnswerTally, Command, Outbound, StreamEnd};
    use super::super::testing::{Fixture, config, drain, pseudonym, request};
    use crate::cluster::Owner;
    use crate::location::Pseudonym;
    use crate::proto::CloakedRequest;
    use crate::proto::location_event::Outcome;
    use crate::telemetry::catalog::LOCATION_PROVIDER_QUEUE_DEPTH;

    /// Two clients of two users at one spot with k = 2: one group, cloaked at once.
    fn cloak_a_pair(
        f: &mut Fixture,
    ) -> (super::super::testing::Events, super::super::testing::Events) {
        let a = f.open(1, "app", false);
        let b = f.open(2, "app", false);
        f.submit(1, request("alice", 1, 2));
        f.submit(2, request("bob", 1, 2));
        (a, b)
    }

    fn answer(
        f: &mut Fixture,
        pseudonym: Pseudonym,
        payload: Option<&[u8]>,
        principal: &str,
    ) -> Arc<AnswerTally> {
        let tally = Arc::new(AnswerTally::default());
        f.handle(Command::Answers {
            answers: vec![(pseudonym, payload.map(<[u8]>::to_vec))],
            tally: Arc::clone(&tally),
            principal: principal.into(),
        });
        tally
    }

    fn undelivered_reason(outcomes: &[Outcome]) -> String {
        match outcomes {
            [Outcome::Undelivered(u)] => u.reason.clone(),
            other => panic!("expected one Undelivered, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_reaches_its_clients_and_the_provider_queue_under_its_pseudonyms() {
        let mut f = Fixture::new(config());
        let (mut a, mut b) = cloak_a_pair(&mut f);
        let provider = f.subscribe(10);
        let taken = f.take(&provider, "lbs");
        assert_eq!(taken.len(), 2);
        let mut told = Vec::new();
        for events in [&mut a, &mut b] {
            match drain(events).0.as_slice() {
                [Outcome::Cloaked(c)] => {
                    assert_eq!(c.group_size, 2);
                    told.push(c.clone());
                }
                other => panic!("expected Cloaked, got {other:?}"),
            }
        }
        assert_eq!(told[0].r#box, told[1].r#box, "one box for the group");
        for (cloaked, payload) in told.iter().zip([&b"query of alice"[..], b"query of bob"]) {
            let forwarded = taken
                .iter()
                .find(|r| r.pseudonym == cloaked.pseudonym)
                .expect("each client's pseudonym is on the provider queue");
            assert_eq!(cloaked.r#box, forwarded.r#box);
            assert_eq!(forwarded.service, "poi");
            assert_eq!(forwarded.payload, payload);
        }
        assert!(f.broker.cloaking.pending.is_empty());
        assert_eq!(f.broker.clients[&1].awaiting_answer, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_routed_only_from_the_principal_whose_stream_took_the_request() {
        let mut f = Fixture::new(config());
        let (mut a, _b) = cloak_a_pair(&mut f);
        let provider = f.subscribe(10);
        f.take(&provider, "lbs");
        let to_alice = match drain(&mut a).0.as_slice() {
            [Outcome::Cloaked(c)] => c.pseudonym.parse().expect("a pseudonym"),
            other => panic!("expected Cloaked, got {other:?}"),
        };

        let denied = answer(&mut f, to_alice, Some(b"forged"), "other");
        assert_eq!(denied.denied.load(Ordering::Relaxed), 1);
        assert!(
            drain(&mut a).0.is_empty(),
            "no answer from another principal"
        );

        let delivered = answer(&mut f, to_alice, Some(b"42"), "lbs");
        assert_eq!(delivered.delivered.load(Ordering::Relaxed), 1);
        match drain(&mut a).0.as_slice() {
            [Outcome::Reply(reply)] => assert_eq!(reply.payload, b"42"),
            other => panic!("expected the reply, got {other:?}"),
        }
        // The answer acknowledged the request: its place in the stream's window is free again.
        assert!(
            provider.window.has_room(2),
            "one request of two left unacknowledged"
        );
        assert!(!provider.window.has_room(1));
        assert_eq!(f.broker.clients[&1].awaiting_answer, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_provider_is_closed_and_its_requests_are_handed_to_another() {
        let cfg = config();
        let ack_ms = cfg.provider_ack_ms;
        let mut f = Fixture::new(cfg);
        let (mut a, mut b) = cloak_a_pair(&mut f);
        let mut stalled = f.subscribe(10);
        let other = f.subscribe(11);
        let first = f.take(&stalled, "lbs");
        assert_eq!(first.len(), 2);

        tokio::time::advance(Duration::from_millis(ack_ms - 1)).await;
        f.tick();
        assert!(
            stalled.closed.try_recv().is_err(),
            "not overdue before provider_ack_ms"
        );

        tokio::time::advance(Duration::from_millis(1)).await;
        f.tick();
        let end = stalled
            .closed
            .try_recv()
            .expect("the stalled stream is closed");
        // RESOURCE_EXHAUSTED (the service's mapping, `service/location/error.rs` tests).
        assert!(matches!(end, StreamEnd::ProviderStalled { .. }), "{end:?}");
        assert!(
            end.to_string().contains("location.provider_ack_ms"),
            "{end}"
        );
        let again = f.take(&other, "lbs2");
        let sorted = |requests: &[crate::proto::CloakedRequest]| {
            let mut pseudonyms: Vec<_> = requests.iter().map(|r| r.pseudonym.clone()).collect();
            pseudonyms.sort();
            pseudonyms
        };
        assert_eq!(
            sorted(&again),
            sorted(&first),
            "the same requests, handed on"
        );
        // The client is told nothing more than Cloaked: the request was not lost.
        assert_eq!(drain(&mut a).0.len(), 1);
        assert_eq!(drain(&mut b).0.len(), 1);
        // The new holder's principal answers now; the stalled one's may not.
        let late = answer(&mut f, pseudonym(&first[0]), Some(b"late"), "lbs");
        assert_eq!(late.denied.load(Ordering::Relaxed), 1);
        let acked = answer(&mut f, pseudonym(&first[0]), None, "lbs2");
        assert_eq!(acked.acknowledged.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_another_provider_a_stalled_request_is_undelivered() {
        let cfg = config();
        let ack_ms = cfg.provider_ack_ms;
        let mut f = Fixture::new(cfg);
        let (mut a, _b) = cloak_a_pair(&mut f);
        let stalled = f.subscribe(10);
        f.take(&stalled, "lbs");
        drain(&mut a);
        tokio::time::advance(Duration::from_millis(ack_ms + 1)).await;
        f.tick();
        let reason = undelivered_reason(&drain(&mut a).0);
        assert!(
            reason.contains("did not acknowledge it within")
                && reason.contains("no other provider"),
            "{reason}"
        );
        assert_eq!(f.broker.clients[&1].awaiting_answer, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_provider_queue_reports_undelivered() {
        let mut cfg = config();
        cfg.provider_queue = 1;
        let mut f = Fixture::new(cfg);
        let (mut a, mut b) = cloak_a_pair(&mut f);
        let mut outcomes = drain(&mut a).0;
        outcomes.extend(drain(&mut b).0);
        let undelivered: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Undelivered(u) => Some(u.reason.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(undelivered.len(), 1, "{outcomes:?}");
        assert!(
            undelivered[0].contains("location.provider_queue)"),
            "{}",
            undelivered[0]
        );
        assert_eq!(f.queues.get("poi").unwrap().queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unacknowledged_route_expires_undelivered_and_the_draining_stream_closes() {
        let cfg = config();
        let ttl_ms = cfg.answer_ttl_ms;
        let mut f = Fixture::new(cfg);
        let (mut a, _b) = cloak_a_pair(&mut f);
        f.handle(Command::InboundClosed { client: 1 });
        assert!(
            f.broker.clients.contains_key(&1),
            "open while its request awaits an answer"
        );
        drain(&mut a);
        tokio::time::advance(Duration::from_millis(ttl_ms + 1)).await;
        f.tick();
        let reason = undelivered_reason(&drain(&mut a).0);
        assert!(reason.contains("(location.answer_ttl_ms)"), "{reason}");
        assert!(
            !f.broker.clients.contains_key(&1),
            "closed once nothing can reach it"
        );
        assert!(a.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_too_slowly_loses_its_stream_with_resource_exhausted() {
        let mut cfg = config();
        cfg.client_queue = 1;
        let mut f = Fixture::new(cfg);
        let mut slow = f.open(1, "app", false);
        // Two rejections (the same request number twice) for a queue of one.
        f.submit(1, request("u", 1, 20));
        f.submit(1, request("u", 1, 20));
        f.submit(1, request("u", 1, 20));
        let (outcomes, ended) = drain(&mut slow);
        assert_eq!(outcomes.len(), 1);
        let end = ended.expect("the stream ends with a status");
        // RESOURCE_EXHAUSTED (the service's mapping, `service/location/error.rs` tests).
        assert!(matches!(end, StreamEnd::ClientTooSlow { .. }), "{end:?}");
        assert!(end.to_string().contains("location.client_queue"), "{end}");
        assert!(!f.broker.clients.contains_key(&1));
        assert!(
            f.broker.cloaking.pending.is_empty(),
            "its pending request was withdrawn"
        );
    }

    /// Two requests of this replica's clients and one another replica relayed here wait on the
    /// provider queue; the one provider subscribed took none of them yet.
    fn queue_three(
        f: &mut Fixture,
        wire: &super::super::testing::Wire,
    ) -> [super::super::testing::Events; 2] {
        let (a, b) = cloak_a_pair(f);
        let relayed = CloakedRequest {
            pseudonym: Pseudonym(1).to_string(),
            payload: b"query relayed".to_vec(),
            service: "poi".into(),
            ..Default::default()
        };
        assert_eq!(
            f.relayed(wire, 100, 7, relayed),
            Ok(()),
            "a provider is subscribed"
        );
        f.tick();
        assert_eq!(f.queues.get("poi").unwrap().queue.len(), 3);
        assert_eq!(f.gauge_of_poi(LOCATION_PROVIDER_QUEUE_DEPTH), Some(3.0));
        [a, b]
    }

    #[tokio::test(start_paused = true)]
    async fn in_a_cluster_the_last_provider_leaving_undelivers_what_waits_on_its_queue() {
        let (mut f, mut wire) = Fixture::clustered(config(), Owner::Local);
        let provider = f.subscribe(10);
        let mut clients = queue_three(&mut f, &wire);
        for events in &mut clients {
            assert!(matches!(drain(events).0.as_slice(), [Outcome::Cloaked(_)]));
        }

        f.leave(&provider);
        f.tick();
        for events in &mut clients {
            let reason = undelivered_reason(&drain(events).0);
            assert_eq!(
                reason,
                "it was waiting on a replica's provider queue of service \"poi\" when that replica's last provider of the service left",
                "it was never sent to the provider that left"
            );
        }
        assert_eq!(f.broker.clients[&1].awaiting_answer, 0);
        // The relayed request's client hears it through its own replica.
        match wire.sent().as_slice() {
            [Outbound::Event { to, event }] => {
                assert_eq!((&*to.node, to.tag), ("b", 7));
                assert!(
                    matches!(&event.outcome, Some(Outcome::Undelivered(_))),
                    "{event:?}"
                );
            }
            other => panic!("expected one event for the relayed request, got {other:?}"),
        }
        assert!(!f.broker.clients.contains_key(&100), "its stream is over");
        assert!(f.queues.get("poi").unwrap().queue.is_empty());
        assert_eq!(f.gauge_of_poi(LOCATION_PROVIDER_QUEUE_DEPTH), Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_daemon_keeps_what_waits_on_the_queue_for_a_provider_that_subscribes_again() {
        let mut f = Fixture::new(config());
        let provider = f.subscribe(10);
        let (mut a, _b) = cloak_a_pair(&mut f);
        drain(&mut a);
        f.leave(&provider);
        f.tick();
        assert!(drain(&mut a).0.is_empty());
        assert_eq!(f.queues.get("poi").unwrap().queue.len(), 2);
        assert_eq!(f.gauge_of_poi(LOCATION_PROVIDER_QUEUE_DEPTH), Some(2.0));
        let again = f.subscribe(11);
        assert_eq!(f.take(&again, "lbs").len(), 2);
    }
}
