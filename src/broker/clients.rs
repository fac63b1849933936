//! Client streams: each stream's state, the events of one wake-up it has not been handed yet (sent
//! together at the wake-up's end), closing a draining stream once nothing more can reach it, and
//! forgetting a stream that is gone (its pending requests withdrawn from the engine).
//!
//! Invariants: a client that reads too slowly loses its stream with RESOURCE_EXHAUSTED; a draining
//! stream closes once nothing more can reach it (no pending request here or at another replica, no
//! answer awaited), after its last events.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Broker;
use super::message::{ClientId, EventQueue, StreamEnd};
use crate::location::RequestId;
use crate::proto::{self, LocationEvent};

/// The client streams of this broker, and which of them have events waiting this wake-up.
#[derive(Default)]
pub(super) struct ClientStreams {
    /// foldhash: the broker's own sequential ids.
    streams: HashMap<ClientId, ClientState, foldhash::fast::RandomState>,
    /// Clients with events in their outbox, in the order of their first event this wake-up.
    to_flush: Vec<ClientId>,
}

impl ClientStreams {
    pub(super) fn get(&self, client: &ClientId) -> Option<&ClientState> {
        self.streams.get(client)
    }

    pub(super) fn get_mut(&mut self, client: &ClientId) -> Option<&mut ClientState> {
        self.streams.get_mut(client)
    }

    pub(super) fn contains_key(&self, client: &ClientId) -> bool {
        self.streams.contains_key(client)
    }

    pub(super) fn insert(&mut self, client: ClientId, state: ClientState) {
        self.streams.insert(client, state);
    }

    pub(super) fn remove(&mut self, client: &ClientId) -> Option<ClientState> {
        self.streams.remove(client)
    }

    pub(super) fn clear(&mut self) {
        self.streams.clear();
    }

    /// Adds `event` to `client`'s events of this wake-up (none when the client is gone).
    fn push(&mut self, client: ClientId, event: LocationEvent) {
        let Some(state) = self.streams.get_mut(&client) else {
            return;
        };
        if state.outbox.is_empty() {
            self.to_flush.push(client);
        }
        state.outbox.push(event);
    }
}

#[cfg(test)]
impl std::ops::Index<&ClientId> for ClientStreams {
    type Output = ClientState;

    fn index(&self, client: &ClientId) -> &ClientState {
        &self.streams[client]
    }
}

/// One client stream, as the broker tracks it.
pub(super) struct ClientState {
    pub(super) events: EventQueue,
    /// Events of this wake-up not yet handed to the stream ([`Broker::flush_events`]).
    pub(super) outbox: Vec<proto::LocationEvent>,
    /// What ends the stream once it has drained (OK when `None`).
    pub(super) final_status: Option<StreamEnd>,
    pub(super) principal: Arc<str>,
    pub(super) rate_limited: bool,
    /// foldhash: the broker's own sequential ids.
    pub(super) pending: HashSet<RequestId, foldhash::fast::RandomState>,
    /// Forwarded requests whose pseudonym is still routable and has not been answered yet.
    pub(super) awaiting_answer: usize,
    pub(super) draining: bool,
}

impl ClientState {
    /// A stream of `principal`; `draining` when it brings one request and ends with its outcome
    /// (a request another replica forwarded or relayed here).
    pub(super) fn new(
        events: EventQueue,
        principal: Arc<str>,
        rate_limited: bool,
        draining: bool,
    ) -> Self {
        ClientState {
            events,
            outbox: Vec::new(),
            final_status: None,
            principal,
            rate_limited,
            pending: HashSet::default(),
            awaiting_answer: 0,
            draining,
        }
    }

    /// Hands the stream the events of this wake-up in order; false when one could not be queued
    /// (the client is gone or reads too slowly), and the rest are dropped with it.
    pub(super) fn flush(&mut self) -> bool {
        for event in self.outbox.drain(..) {
            if !self.events.try_event(event) {
                return false;
            }
        }
        true
    }
}

impl Broker {
    /// Queues an event for the client; it goes out with the client's other events of this wake-up
    /// ([`Broker::flush_events`]).
    pub(super) fn send(&mut self, client: ClientId, event: LocationEvent) {
        self.clients.push(client, event);
    }

    /// Hands every client stream its events of this wake-up, in order, as one burst: its task is
    /// woken once per wake-up rather than once per event, and tonic encodes the burst into one write.
    /// The run loop calls it after each wake-up (as Redis writes its clients' replies before it
    /// sleeps again); an event therefore waits at most one wake-up. A client that is gone or reads
    /// too slowly loses its stream (the slow one is told so with RESOURCE_EXHAUSTED when it reads
    /// again).
    pub(super) fn flush_events(&mut self) {
        let mut clients = std::mem::take(&mut self.clients.to_flush);
        for client in clients.drain(..) {
            let sent = match self.clients.get_mut(&client) {
                Some(state) => state.flush(),
                None => true,
            };
            if !sent {
                self.too_slow(client);
            }
        }
        // Keep the list's allocation for the next wake-up.
        if self.clients.to_flush.is_empty() {
            self.clients.to_flush = clients;
        }
    }

    /// A client whose events could not be queued: told why when it reads again (unless gone), and
    /// forgotten.
    fn too_slow(&mut self, client: ClientId) {
        if let Some(state) = self.clients.get(&client) {
            self.end_too_slow(client, &state.events);
        }
        self.drop_client(client);
    }

    fn end_too_slow(&self, client: ClientId, events: &EventQueue) {
        if !events.is_closed() {
            tracing::warn!(
                client,
                limit = self.cfg.client_queue,
                "client reads too slowly; closing its stream (location.client_queue)"
            );
            events.finish(StreamEnd::ClientTooSlow {
                limit: self.cfg.client_queue,
            });
        }
    }

    /// Closes a draining stream once nothing more can reach it: its last events go out, then the
    /// status that ends it (OK when it has none).
    pub(super) fn maybe_close(&mut self, client: ClientId) {
        let done = self.clients.get(&client).is_some_and(|state| {
            state.draining
                && state.pending.is_empty()
                && state.awaiting_answer == 0
                && self.replicas.remote.awaited(client) == 0
        });
        if !done {
            return;
        }
        let Some(mut state) = self.clients.remove(&client) else {
            return;
        };
        if !state.flush() {
            self.end_too_slow(client, &state.events);
        } else if let Some(end) = state.final_status {
            state.events.finish(end);
        }
    }

    /// Forgets a client and withdraws its pending requests from the engine.
    pub(super) fn drop_client(&mut self, client: ClientId) {
        let Some(state) = self.clients.remove(&client) else {
            return;
        };
        self.forget_remote(client);
        for id in state.pending {
            self.cloaking.engine.cancel(id);
            if self.take_pending(id).is_some() {
                self.metrics.withdrawn.increment(1);
            }
        }
    }
}
