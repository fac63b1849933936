//! The broker's side of relaying cloaked requests to providers on other replicas
//! (the NATS side is [`super::relay_nats`]).
//!
//! On the replica that formed a group, a member whose service has no provider subscribed here is
//! relayed: a client of this replica keeps a remote request (by tag) that waits for the answer or
//! `Undelivered`, exactly as when another replica cloaks it; a request another replica forwarded
//! here is relayed with that replica's tag, so its answer goes straight to the client's replica.
//! On the replica that takes it, a relayed request is a one-request client stream (its events go
//! to the client's replica) put on the local provider queue like any other.
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::broker::Broker;
use crate::broker::clients::ClientState;
use crate::broker::message::{ClientId, EventQueue, RelayRefusal, RemoteClient};
use crate::location::{Pseudonym, UserKey};
use crate::proto::CloakedRequest;

impl Broker {
    /// Whether a provider of `service` is subscribed to this replica.
    pub(in crate::broker) fn has_provider(&self, service: usize) -> bool {
        self.delivery
            .providers
            .values()
            .any(|p| p.service == service)
    }

    /// Whether a cloaked request of `service` goes to another replica: in a cluster, when no
    /// provider of the service is subscribed here, or the service's provider queue here is full
    /// (another replica's providers may have room).
    pub(in crate::broker) fn relays(&self, service: usize) -> bool {
        self.replicas.link.is_some()
            && (self.delivery.provider_queues[service].queue.is_full()
                || !self.has_provider(service))
    }

    /// Relays the cloaked request of `client` to a replica with a provider of its service.
    pub(in crate::broker) fn relay(
        &mut self,
        client: ClientId,
        request_no: u64,
        user: UserKey,
        service: usize,
        forwarded: CloakedRequest,
    ) {
        let Some(link) = self.replicas.link.as_ref() else {
            return;
        };
        let forwarded_here = self
            .clients
            .get(&client)
            .and_then(|state| state.events.remote_client().cloned());
        let (to, local_tag) = match forwarded_here {
            // The client's replica waits for this request's answer already.
            Some(to) => (to, None),
            None => {
                let node = Arc::clone(link.node());
                let expires = self.clock.now_ms().saturating_add(self.answer_window());
                let tag = self
                    .replicas
                    .remote
                    .insert_relayed(client, request_no, user, expires);
                (RemoteClient { node, tag }, Some(tag))
            }
        };
        if !link.relay(to, forwarded) {
            if let Some(tag) = local_tag {
                self.replicas.remote.forget(tag);
            }
            self.undelivered(
                client,
                request_no,
                service,
                "queue_full",
                "too many requests are waiting to be sent to other replicas".to_string(),
            );
        }
    }

    /// A cloaked request another replica relayed here: a stream of its own, closed once its one
    /// request is answered or undelivered. Refused (and nothing kept) when the service's queue is
    /// full or no provider of it is left here: the relaying replica asks another.
    pub(in crate::broker) fn take_relayed(
        &mut self,
        client: ClientId,
        events: EventQueue,
        service: usize,
        request: CloakedRequest,
    ) -> Result<(), RelayRefusal> {
        let Ok(pseudonym) = request.pseudonym.parse::<Pseudonym>() else {
            tracing::warn!("a relayed request carries an unreadable pseudonym; refused");
            return Err(RelayRefusal::UnreadablePseudonym);
        };
        // The last provider of the service here left while this request was on its way (the
        // subscription drains what is in flight): nobody would take it off the queue. Or the
        // queue is full. Either way the relaying replica asks another, or tells the client
        // `Undelivered` with this reason.
        if !self.has_provider(service) {
            return Err(RelayRefusal::NoProvider);
        }
        if self.delivery.provider_queues[service].queue.is_full() {
            return Err(RelayRefusal::QueueFull);
        }
        // The client's replica holds its principal to the rate limit.
        self.clients.insert(
            client,
            ClientState::new(events, Arc::from("relayed"), false, true),
        );
        // The client's replica puts the request's own number in every event.
        let expires = self.route_expires();
        self.enqueue(client, 0, service, pseudonym, request, expires);
        self.maybe_close(client);
        Ok(())
    }

    /// Tells the cluster side which services have a provider subscribed here now. (Membership
    /// of a service's queue group does not follow the queue's fill: a subscription that ends loses
    /// the requests on their way to it, so a full queue refuses instead.)
    pub(in crate::broker) fn providers_changed(&self) {
        if let Some(link) = self.replicas.link.as_ref() {
            let services: BTreeSet<String> = self
                .delivery
                .providers
                .values()
                .map(|p| self.delivery.provider_queues[p.service].service.clone())
                .collect();
            link.providing(services);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::broker::message::RelayRefusal;
    use crate::broker::testing::{Fixture, config};
    use crate::cluster::Owner;
    use crate::location::Pseudonym;
    use crate::proto::CloakedRequest;

    fn relayed(pseudonym: u128) -> CloakedRequest {
        CloakedRequest {
            pseudonym: Pseudonym(pseudonym).to_string(),
            payload: b"query relayed".to_vec(),
            service: "poi".into(),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_whose_last_provider_left_refuses_a_relayed_request() {
        let (mut f, wire) = Fixture::clustered(config(), Owner::Local);
        let provider = f.subscribe(10);
        // The request was on its way when the provider left (the subscription still drains what
        // is in flight); its queue has room.
        f.leave(&provider);
        assert_eq!(
            f.relayed(&wire, 100, 1, relayed(1)),
            Err(RelayRefusal::NoProvider),
            "refused: nobody here would take it off the queue"
        );
        assert!(f.queues.get("poi").unwrap().queue.is_empty());
        assert!(!f.broker.clients.contains_key(&100), "nothing kept of it");

        // Taken again once a provider of the service is subscribed.
        let _again = f.subscribe(11);
        assert_eq!(f.relayed(&wire, 101, 2, relayed(2)), Ok(()));
        assert_eq!(f.queues.get("poi").unwrap().queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_refuses_a_relayed_request_when_its_queue_is_full_and_says_so() {
        let mut cfg = config();
        cfg.provider_queue = 2;
        let (mut f, wire) = Fixture::clustered(cfg, Owner::Local);
        let _provider = f.subscribe(10);
        assert_eq!(f.relayed(&wire, 100, 1, relayed(1)), Ok(()));
        assert_eq!(f.relayed(&wire, 101, 2, relayed(2)), Ok(()));
        assert_eq!(
            f.relayed(&wire, 102, 3, relayed(3)),
            Err(RelayRefusal::QueueFull)
        );
        assert!(!f.broker.clients.contains_key(&102), "nothing kept of it");
        let mut unreadable = relayed(4);
        unreadable.pseudonym = "not a pseudonym".into();
        assert_eq!(
            f.relayed(&wire, 103, 4, unreadable),
            Err(RelayRefusal::UnreadablePseudonym)
        );
        assert_eq!(f.queues.get("poi").unwrap().queue.len(), 2);
    }
}
