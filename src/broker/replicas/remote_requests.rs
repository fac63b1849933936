//! The broker's side of location across replicas ([`super`]): which requests go
//! to another replica, and what the origin keeps of them until their stream may close.
//!
//! A request of a local client whose cell another replica owns becomes a *remote request*: its
//! `(user, request_no)` stays taken (duplicates are refused as for a pending one) and the client's
//! stream stays open until it has its outcome. Phases: `Resolving` (its cell's owner is being
//! found), `Forwarded` (sent; waiting for Cloaked, Expired or Rejected), `Cloaked` (waiting for the
//! provider's first reply or `Undelivered`, as a local route does). Each phase has a deadline: a
//! request whose owner never answers is Rejected with UNAVAILABLE after its own deadline plus
//! `cluster.request_timeout_ms`; a cloaked one that heard neither an answer nor `Undelivered` by
//! `location.answer_ttl_ms` plus that (the owner or the providing replica reports `Undelivered`
//! before, unless it stopped) gets `Undelivered` here, so its client always hears its end. Events
//! for a request the origin no longer tracks (its client went away, or it was given up) are
//! dropped, so a client never gets two outcomes.
//!
//! The provider's side may overtake the owner's `Cloaked`: the owner publishes `Cloaked` itself,
//! while a relayed request's answer or `Undelivered` comes from the relay or the providing replica,
//! on other paths through NATS, which orders messages per publisher only. So an answer or
//! `Undelivered` that arrives while the request is still `Forwarded` is kept (at most
//! [`EARLY_EVENTS`]) and handed to the client right after its `Cloaked`, in arrival order.
//!
//! On the owner, a forwarded request is a one-request client stream (its events go to the origin):
//! it is cloaked here and never forwarded on.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use tonic::Code;

use crate::broker::Broker;
use crate::broker::clients::ClientState;
use crate::broker::message::{AdmittedRequest, CellOwner, ClientId, EventQueue, Rejection};
use crate::location::UserKey;
use crate::proto::LocationEvent;
use crate::proto::location_event::Outcome as EventOutcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Resolving,
    Forwarded,
    Cloaked { answered: bool },
}

impl Phase {
    /// Whether the client's stream waits for this request before it closes.
    fn awaited(self) -> bool {
        !matches!(self, Phase::Cloaked { answered: true })
    }
}

/// Events of the provider's side kept for a request still `Forwarded` (see the module doc): what
/// overtakes a `Cloaked` arrives in the milliseconds between two NATS paths, an answer or an
/// `Undelivered`; past this many the rest are dropped, so a request holds a bounded number.
const EARLY_EVENTS: usize = 4;

#[derive(Debug)]
struct RemoteEntry {
    client: ClientId,
    request_no: u64,
    user: UserKey,
    phase: Phase,
    /// Unix ms after which the entry ends (see the module doc).
    expires_ms: i64,
    /// The provider's side's events that overtook the owner's `Cloaked`, in arrival order.
    early: Vec<LocationEvent>,
}

/// The remote requests of this replica's clients, by tag (a number unique on this replica that
/// the owner's events carry back: one stream may use a request number for several users).
#[derive(Debug, Default)]
pub(in crate::broker) struct RemoteRequests {
    next_tag: u64,
    entries: HashMap<u64, RemoteEntry>,
    /// Each client's tags, and how many of them its stream still waits for.
    by_client: HashMap<ClientId, (usize, HashSet<u64>)>,
    /// Deadlines, checked against the entry when they come due (an entry's deadline only grows).
    expiry: BinaryHeap<Reverse<(i64, u64)>>,
}

impl RemoteRequests {
    /// How many remote requests `client`'s stream waits for.
    pub(in crate::broker) fn awaited(&self, client: ClientId) -> usize {
        self.by_client.get(&client).map_or(0, |(n, _)| *n)
    }

    /// The earliest deadline, if any.
    pub(in crate::broker) fn next_expiry(&self) -> Option<i64> {
        self.expiry
            .peek()
            .map(|Reverse((due, _))| due.saturating_add(1))
    }

    /// How many remote requests the broker waits for.
    pub(in crate::broker) fn len(&self) -> usize {
        self.entries.len()
    }

    /// A new entry; its tag.
    fn insert(
        &mut self,
        client: ClientId,
        request_no: u64,
        user: UserKey,
        phase: Phase,
        expires_ms: i64,
    ) -> u64 {
        self.next_tag += 1;
        let tag = self.next_tag;
        self.entries.insert(
            tag,
            RemoteEntry {
                client,
                request_no,
                user,
                phase,
                expires_ms,
                early: Vec::new(),
            },
        );
        let (awaited, tags) = self.by_client.entry(client).or_default();
        tags.insert(tag);
        if phase.awaited() {
            *awaited += 1;
        }
        self.expiry.push(Reverse((expires_ms, tag)));
        tag
    }

    /// Moves an entry to `phase`, extending its deadline to `expires_ms`.
    fn advance(&mut self, tag: u64, phase: Phase, expires_ms: i64) {
        let Some(entry) = self.entries.get_mut(&tag) else {
            return;
        };
        let (was, now) = (entry.phase.awaited(), phase.awaited());
        entry.phase = phase;
        if expires_ms > entry.expires_ms {
            entry.expires_ms = expires_ms;
            self.expiry.push(Reverse((expires_ms, tag)));
        }
        if let Some((awaited, _)) = self.by_client.get_mut(&entry.client) {
            match (was, now) {
                (true, false) => *awaited = awaited.saturating_sub(1),
                (false, true) => *awaited += 1,
                _ => {}
            }
        }
    }

    fn remove(&mut self, tag: u64) -> Option<RemoteEntry> {
        let entry = self.entries.remove(&tag)?;
        if let Some((awaited, tags)) = self.by_client.get_mut(&entry.client) {
            tags.remove(&tag);
            if entry.phase.awaited() {
                *awaited = awaited.saturating_sub(1);
            }
            if tags.is_empty() {
                self.by_client.remove(&entry.client);
            }
        }
        Some(entry)
    }

    /// A request of this replica's client that another replica's provider serves (its group was
    /// formed here, [`super::relay_broker`]): it waits for the answer or `Undelivered`; its tag.
    pub(in crate::broker) fn insert_relayed(
        &mut self,
        client: ClientId,
        request_no: u64,
        user: UserKey,
        expires_ms: i64,
    ) -> u64 {
        let phase = Phase::Cloaked { answered: false };
        self.insert(client, request_no, user, phase, expires_ms)
    }

    /// Forgets the request `tag`.
    pub(in crate::broker) fn forget(&mut self, tag: u64) {
        self.remove(tag);
    }

    fn get(&self, tag: u64) -> Option<&RemoteEntry> {
        self.entries.get(&tag)
    }

    /// Keeps an event of the provider's side that came before the owner's `Cloaked`.
    fn keep_early(&mut self, tag: u64, event: LocationEvent) {
        if let Some(entry) = self.entries.get_mut(&tag)
            && entry.early.len() < EARLY_EVENTS
        {
            entry.early.push(event);
        }
    }

    /// The events kept by [`Self::keep_early`], oldest first.
    fn take_early(&mut self, tag: u64) -> Vec<LocationEvent> {
        self.entries
            .get_mut(&tag)
            .map(|entry| std::mem::take(&mut entry.early))
            .unwrap_or_default()
    }

    /// Removes and returns every entry of `client`.
    fn take_client(&mut self, client: ClientId) -> Vec<RemoteEntry> {
        let tags = self
            .by_client
            .get(&client)
            .map(|(_, tags)| tags.iter().copied().collect::<Vec<_>>())
            .unwrap_or_default();
        tags.into_iter()
            .filter_map(|tag| self.remove(tag))
            .collect()
    }

    /// Removes and returns the entries whose deadline has passed.
    fn take_expired(&mut self, now: i64) -> Vec<RemoteEntry> {
        let mut expired = Vec::new();
        while let Some(&Reverse((due, tag))) = self.expiry.peek() {
            if due > now {
                break;
            }
            self.expiry.pop();
            if self.entries.get(&tag).is_some_and(|e| e.expires_ms <= now)
                && let Some(entry) = self.remove(tag)
            {
                expired.push(entry);
            }
        }
        expired
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Broker {
    /// Hands an admitted request (its key held, [`super::super::admission`]) to the replica
    /// owning its cell: it becomes a remote request of its client.
    pub(in crate::broker) fn send_remote(
        &mut self,
        client: ClientId,
        user: UserKey,
        request: AdmittedRequest,
        owner: CellOwner,
    ) {
        // Its deadline comes with its phase at once (`send_to_owner`): a deadline only grows, so
        // it starts from now, not from a "never".
        let now = self.clock.now_ms();
        let tag =
            self.replicas
                .remote
                .insert(client, request.request_no, user, Phase::Resolving, now);
        self.send_to_owner(tag, request, owner);
    }

    /// Sends the remote request `tag` on according to what is known of its cell's owner.
    fn send_to_owner(&mut self, tag: u64, request: AdmittedRequest, owner: CellOwner) {
        let (Some(link), Some(entry)) =
            (self.replicas.link.as_ref(), self.replicas.remote.get(tag))
        else {
            return;
        };
        let (client, user) = (entry.client, entry.user);
        let now = self.clock.now_ms();
        let timeout = millis(link.request_timeout);
        match owner {
            CellOwner::Here => {
                // Resolved to this replica: cloak it here like any other.
                // Its key stays held: it moves from the remote requests to the pending ones.
                self.replicas.remote.remove(tag);
                self.cloak_here(client, user, request);
            }
            CellOwner::Unknown => {
                let wait = millis(link.resolve_within);
                self.replicas.remote.advance(
                    tag,
                    Phase::Resolving,
                    now.saturating_add(wait).saturating_add(timeout),
                );
                link.resolve(tag, request);
            }
            CellOwner::Replica(node) => {
                let principal = self
                    .clients
                    .get(&client)
                    .map(|s| Arc::clone(&s.principal))
                    .unwrap_or_else(|| Arc::from(""));
                let service = self.delivery.provider_queues[request.service]
                    .service
                    .clone();
                let deadline = now
                    .saturating_add(i64::try_from(request.dt_ms).unwrap_or(i64::MAX))
                    .saturating_add(timeout);
                self.replicas
                    .remote
                    .advance(tag, Phase::Forwarded, deadline);
                if !link.forward(node, tag, &principal, &request, &service) {
                    self.end_remote(
                        tag,
                        Rejection::exhausted(
                            "request_no",
                            "too many requests are waiting to be sent to other replicas",
                        ),
                    );
                }
            }
        }
    }

    /// The remote request `tag`, whose cell was being contended for, has an owner now (or still
    /// none).
    pub(in crate::broker) fn resolved(
        &mut self,
        tag: u64,
        request: AdmittedRequest,
        owner: CellOwner,
    ) {
        if self.replicas.remote.get(tag).map(|e| e.phase) != Some(Phase::Resolving) {
            // The client went away meanwhile, or the request was given up.
            return;
        }
        match owner {
            CellOwner::Unknown => self.end_remote(
                tag,
                Rejection {
                    field: "lat",
                    reason: "no replica holds the lease of the request's cell yet (it is being taken over); retry".into(),
                    code: Code::Unavailable,
                },
            ),
            owner => self.send_to_owner(tag, request, owner),
        }
    }

    /// Ends the remote request `tag` with `rejection`, telling its client.
    fn end_remote(&mut self, tag: u64, rejection: Rejection) {
        if let Some(entry) = self.replicas.remote.remove(tag) {
            self.admission.release(entry.user, entry.request_no);
            self.reject(entry.client, entry.request_no, &rejection);
            self.maybe_close(entry.client);
        }
    }

    /// An event from the replica cloaking the remote request `tag`.
    pub(in crate::broker) fn remote_event(&mut self, tag: u64, event: LocationEvent) {
        let Some(entry) = self.replicas.remote.get(tag) else {
            // Given up, or the client is gone: it has had its outcome already.
            return;
        };
        let (client, phase, user, request_no) =
            (entry.client, entry.phase, entry.user, entry.request_no);
        let now = self.clock.now_ms();
        let answer_window = self.answer_window();
        let mut early = Vec::new();
        match &event.outcome {
            Some(EventOutcome::Cloaked(_)) if phase == Phase::Forwarded => {
                self.admission.release(user, request_no);
                self.replicas.remote.advance(
                    tag,
                    Phase::Cloaked { answered: false },
                    now.saturating_add(answer_window),
                );
                early = self.replicas.remote.take_early(tag);
            }
            // The provider's side overtook the owner's `Cloaked`: kept until it comes.
            Some(EventOutcome::Reply(_) | EventOutcome::Undelivered(_))
                if phase == Phase::Forwarded =>
            {
                self.replicas.remote.keep_early(tag, event);
                return;
            }
            Some(EventOutcome::Expired(_) | EventOutcome::Rejected(_))
                if phase == Phase::Forwarded =>
            {
                self.admission.release(user, request_no);
                self.replicas.remote.remove(tag);
            }
            Some(EventOutcome::Reply(_)) if matches!(phase, Phase::Cloaked { .. }) => {
                self.replicas
                    .remote
                    .advance(tag, Phase::Cloaked { answered: true }, now);
            }
            Some(EventOutcome::Undelivered(_)) if matches!(phase, Phase::Cloaked { .. }) => {
                self.replicas.remote.remove(tag);
            }
            // Out of order or unexpected for its phase: not for this client.
            _ => return,
        }
        // The owner's request number is the client's own.
        let event = LocationEvent {
            request_no,
            outcome: event.outcome,
        };
        self.send(client, event);
        // What overtook the `Cloaked` just sent follows it, as if it had come after it.
        for event in early {
            self.remote_event(tag, event);
        }
        self.maybe_close(client);
    }

    /// How long a cloaked remote request waits for its answer or `Undelivered`: the provider's
    /// replica reports `Undelivered` at `location.answer_ttl_ms`, and its event may take up to
    /// `cluster.request_timeout_ms` more.
    pub(in crate::broker) fn answer_window(&self) -> i64 {
        i64::try_from(self.cfg.answer_ttl_ms)
            .unwrap_or(i64::MAX)
            .saturating_add(
                self.replicas
                    .link
                    .as_ref()
                    .map_or(0, |l| millis(l.request_timeout)),
            )
    }

    /// Ends the remote requests whose deadline passed: one still waiting for its owner is Rejected
    /// with UNAVAILABLE; a cloaked one that heard neither an answer nor `Undelivered` gets
    /// `Undelivered`; an answered one is forgotten.
    pub(in crate::broker) fn expire_remote(&mut self) {
        let now = self.clock.now_ms();
        for entry in self.replicas.remote.take_expired(now) {
            match entry.phase {
                Phase::Resolving | Phase::Forwarded => {
                    self.admission.release(entry.user, entry.request_no);
                    let rejection = Rejection {
                        field: "lat",
                        reason: "the replica owning the request's cell did not answer by the request's deadline (it may have stopped; its cells move to another replica within cluster.lease_ms); retry".into(),
                        code: Code::Unavailable,
                    };
                    self.reject(entry.client, entry.request_no, &rejection);
                }
                // Nothing came back (the providing replica stopped, or its event was lost): the
                // client still hears the request's end.
                Phase::Cloaked { answered: false } => {
                    let event = LocationEvent {
                        request_no: entry.request_no,
                        outcome: Some(EventOutcome::Undelivered(crate::proto::Undelivered {
                            reason: "no answer nor Undelivered came back from the replica cloaking or serving it within location.answer_ttl_ms plus cluster.request_timeout_ms".into(),
                        })),
                    };
                    self.send(entry.client, event);
                }
                Phase::Cloaked { answered: true } => {}
            }
            self.maybe_close(entry.client);
        }
    }

    /// Forgets the remote requests of a client that went away.
    pub(in crate::broker) fn forget_remote(&mut self, client: ClientId) {
        for entry in self.replicas.remote.take_client(client) {
            if matches!(entry.phase, Phase::Resolving | Phase::Forwarded) {
                self.admission.release(entry.user, entry.request_no);
            }
        }
    }

    /// At shutdown: every remote request without an outcome is told it was not forwarded.
    pub(in crate::broker) fn shut_down_remote(&mut self) {
        let clients: Vec<ClientId> = self.replicas.remote.by_client.keys().copied().collect();
        for client in clients {
            for entry in self.replicas.remote.take_client(client) {
                if matches!(entry.phase, Phase::Resolving | Phase::Forwarded) {
                    let rejection = Rejection {
                        field: "request_no",
                        reason: "the broker is shutting down; the request's outcome from the replica owning its cell will not be relayed".into(),
                        code: Code::Unavailable,
                    };
                    self.reject(client, entry.request_no, &rejection);
                }
            }
        }
    }

    /// A request another replica forwarded here: a stream of its own, closed once its one request
    /// has its outcome and answer.
    pub(in crate::broker) fn submit_forwarded(
        &mut self,
        client: ClientId,
        events: EventQueue,
        principal: Arc<str>,
        request: AdmittedRequest,
    ) {
        // The origin holds its principal to the rate limit.
        self.clients
            .insert(client, ClientState::new(events, principal, false, true));
        self.submit(client, request);
        self.maybe_close(client);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::broker::message::{Command, Outbound};
    use crate::broker::testing::{Events, Fixture, REQUEST_TIMEOUT, Wire, config, drain, request};
    use crate::cluster::Owner;
    use crate::proto::location_event::Outcome;
    use crate::proto::{Cloaked, LbsReply, LocationEvent, Undelivered};

    /// The window a cloaked remote request waits in for its answer or `Undelivered`, in ms.
    fn answer_window(ttl_ms: u64) -> u64 {
        ttl_ms + u64::try_from(REQUEST_TIMEOUT.as_millis()).unwrap()
    }

    /// Nothing comes back until one ms before the window ends; at its end client 1 (whose inbound
    /// stream ended) gets `Undelivered` and its stream closes.
    async fn silence_ends_undelivered(f: &mut Fixture, a: &mut Events, window_ms: u64) {
        tokio::time::advance(Duration::from_millis(window_ms - 1)).await;
        f.tick();
        assert!(drain(a).0.is_empty());
        assert!(f.broker.clients.contains_key(&1), "it still waits");

        tokio::time::advance(Duration::from_millis(1)).await;
        f.tick();
        let (outcomes, _) = drain(a);
        match outcomes.as_slice() {
            [Outcome::Undelivered(u)] => assert!(
                u.reason
                    .contains("within location.answer_ttl_ms plus cluster.request_timeout_ms"),
                "{}",
                u.reason
            ),
            other => panic!("expected Undelivered, got {other:?}"),
        }
        assert!(
            !f.broker.clients.contains_key(&1),
            "closed once it had its outcome"
        );
    }

    fn only_relays(wire: &mut Wire) -> usize {
        let sent = wire.sent();
        for message in &sent {
            assert!(
                matches!(message, Outbound::Relay { to, .. } if &*to.node == "a"),
                "{message:?}"
            );
        }
        sent.len()
    }

    #[tokio::test(start_paused = true)]
    async fn a_relayed_request_that_hears_nothing_back_is_undelivered_at_the_end_of_its_window() {
        let cfg = config();
        let window_ms = answer_window(cfg.answer_ttl_ms);
        let (mut f, mut wire) = Fixture::clustered(cfg, Owner::Local);
        // Cloaked here; no provider of the service here: both requests are relayed, their events
        // to come back to this replica.
        let mut a = f.open(1, "app", false);
        let _b = f.open(2, "app", false);
        f.submit(1, request("alice", 1, 2));
        f.submit(2, request("bob", 1, 2));
        f.handle(Command::InboundClosed { client: 1 });
        assert_eq!(only_relays(&mut wire), 2);
        assert!(matches!(drain(&mut a).0.as_slice(), [Outcome::Cloaked(_)]));

        // The providing replica stopped: neither the answer nor its Undelivered comes back.
        silence_ends_undelivered(&mut f, &mut a, window_ms).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_cells_owner_never_answers_is_rejected_after_its_deadline() {
        let (mut f, mut wire) = Fixture::clustered(config(), Owner::Remote("b".into()));
        let mut a = f.open(1, "app", false);
        let forwarded = request("alice", 1, 2);
        let deadline_ms = forwarded.dt_ms + u64::try_from(REQUEST_TIMEOUT.as_millis()).unwrap();
        f.submit(1, forwarded);
        assert!(matches!(
            wire.sent().as_slice(),
            [Outbound::Forward { owner, .. }] if owner == "b"
        ));
        // b accepted it and stopped: nothing comes back.
        tokio::time::advance(Duration::from_millis(deadline_ms - 1)).await;
        f.tick();
        assert!(drain(&mut a).0.is_empty());

        tokio::time::advance(Duration::from_millis(1)).await;
        f.tick();
        match drain(&mut a).0.as_slice() {
            [Outcome::Rejected(r)] => {
                assert_eq!(r.code, tonic::Code::Unavailable as i32);
                assert!(
                    r.reason
                        .contains("did not answer by the request's deadline"),
                    "{}",
                    r.reason
                );
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        // Its request number is free again.
        f.submit(1, request("alice", 1, 2));
        assert_eq!(
            wire.sent().len(),
            1,
            "forwarded again, not refused as pending"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_cloaked_on_its_cells_owner_that_hears_nothing_more_is_undelivered() {
        let cfg = config();
        let window_ms = answer_window(cfg.answer_ttl_ms);
        let (mut f, mut wire) = Fixture::clustered(cfg, Owner::Remote("b".into()));
        let mut a = f.open(1, "app", false);
        f.submit(1, request("alice", 1, 2));
        f.handle(Command::InboundClosed { client: 1 });
        let tag = match wire.sent().as_slice() {
            [Outbound::Forward { owner, tag, .. }] if owner == "b" => *tag,
            other => panic!("expected the request forwarded to b, got {other:?}"),
        };
        // The owner cloaked it (what its event hands this broker).
        let cloaked = LocationEvent {
            request_no: 1,
            outcome: Some(Outcome::Cloaked(Cloaked {
                pseudonym: "1".into(),
                group_size: 2,
                ..Default::default()
            })),
        };
        f.handle(Command::RemoteEvent {
            tag,
            event: cloaked,
        });
        assert!(matches!(drain(&mut a).0.as_slice(), [Outcome::Cloaked(_)]));

        // Its provider's answer or Undelivered never comes.
        silence_ends_undelivered(&mut f, &mut a, window_ms).await;
    }

    /// Forwards alice's request to b; its tag.
    fn forwarded_to_b(f: &mut Fixture, wire: &mut Wire) -> u64 {
        f.submit(1, request("alice", 1, 2));
        f.handle(Command::InboundClosed { client: 1 });
        match wire.sent().as_slice() {
            [Outbound::Forward { owner, tag, .. }] if owner == "b" => *tag,
            other => panic!("expected the request forwarded to b, got {other:?}"),
        }
    }

    fn event(outcome: Outcome) -> LocationEvent {
        LocationEvent {
            request_no: 1,
            outcome: Some(outcome),
        }
    }

    fn cloaked() -> Outcome {
        Outcome::Cloaked(Cloaked {
            pseudonym: "1".into(),
            group_size: 2,
            ..Default::default()
        })
    }

    /// The relay's `Undelivered` (no provider on any replica) overtook the owner's `Cloaked`: the
    /// client hears both at once, in their order, and its stream closes; nothing waits out
    /// `answer_ttl_ms`.
    #[tokio::test(start_paused = true)]
    async fn an_undelivered_that_overtakes_its_cloaked_follows_it_at_once() {
        let (mut f, mut wire) = Fixture::clustered(config(), Owner::Remote("b".into()));
        let mut a = f.open(1, "app", false);
        let tag = forwarded_to_b(&mut f, &mut wire);
        let no_provider = Outcome::Undelivered(Undelivered {
            reason: "no provider".into(),
        });
        f.handle(Command::RemoteEvent {
            tag,
            event: event(no_provider),
        });
        assert!(drain(&mut a).0.is_empty(), "nothing before the Cloaked");
        f.handle(Command::RemoteEvent {
            tag,
            event: event(cloaked()),
        });
        assert!(matches!(
            drain(&mut a).0.as_slice(),
            [Outcome::Cloaked(_), Outcome::Undelivered(_)]
        ));
        assert!(
            !f.broker.clients.contains_key(&1),
            "closed once it had its outcome"
        );
    }

    /// A provider on a third replica answered before the owner's `Cloaked` reached the origin:
    /// the answer is not lost.
    #[tokio::test(start_paused = true)]
    async fn an_answer_that_overtakes_its_cloaked_is_delivered_after_it() {
        let (mut f, mut wire) = Fixture::clustered(config(), Owner::Remote("b".into()));
        let mut a = f.open(1, "app", false);
        let tag = forwarded_to_b(&mut f, &mut wire);
        let answer = Outcome::Reply(LbsReply {
            payload: b"42".to_vec(),
        });
        f.handle(Command::RemoteEvent {
            tag,
            event: event(answer),
        });
        f.handle(Command::RemoteEvent {
            tag,
            event: event(cloaked()),
        });
        match drain(&mut a).0.as_slice() {
            [Outcome::Cloaked(_), Outcome::Reply(reply)] => assert_eq!(reply.payload, b"42"),
            other => panic!("expected Cloaked then the answer, got {other:?}"),
        }
        assert!(
            !f.broker.clients.contains_key(&1),
            "closed once it had its answer"
        );
    }
}
