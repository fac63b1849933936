//! The provider queues: one bounded queue (`location.provider_queue`) per service ever configured,
//! shared by the broker actor (which fills it) and the providers' Subscribe streams (which drain it).
//!
//! Invariants: the list only grows, so a queue's index never changes while the daemon runs (an
//! admitted request carries its service as that index). A reload that adds a service adds its queue
//! before any request can name it; a reload that drops a service keeps its queue, so requests
//! already admitted for it are still delivered to the providers subscribed to it, while new
//! requests and subscriptions naming it are refused. [`ProviderQueues::close`] (at shutdown) ends
//! every Subscribe stream once its queue is drained.
use std::sync::{Arc, RwLock};

use crate::location::Pseudonym;
use crate::proto::CloakedRequest;
use crate::telemetry::catalog;

/// A cloaked request on a queue, with the pseudonym the broker drew for it, so a Subscribe stream
/// reports what it took (`Delivered`) without parsing the request's pseudonym back from its text.
/// The request is shared with its route (which keeps it until a provider acknowledges it), so
/// neither the broker nor a hand-over copies it.
#[derive(Debug, Clone)]
pub struct Queued {
    pub pseudonym: Pseudonym,
    pub request: Arc<CloakedRequest>,
}

impl Queued {
    /// The entry of `request`, whose pseudonym is `pseudonym` (checked in debug builds).
    pub fn new(pseudonym: Pseudonym, request: Arc<CloakedRequest>) -> Queued {
        debug_assert_eq!(
            request.pseudonym.parse::<Pseudonym>().ok(),
            Some(pseudonym),
            "a queued request carries the pseudonym it is queued under"
        );
        Queued { pseudonym, request }
    }
}

/// One service's queue.
#[derive(Debug, Clone)]
pub struct ProviderQueue {
    pub service: String,
    pub sender: async_channel::Sender<Queued>,
    pub receiver: async_channel::Receiver<Queued>,
    /// `cloakd_location_provider_queue_depth{service}`.
    pub depth: metrics::Gauge,
}

/// Every service's queue, by a stable index.
#[derive(Debug)]
pub struct ProviderQueues {
    capacity: usize,
    queues: RwLock<Vec<ProviderQueue>>,
}

impl ProviderQueues {
    /// Queues of `capacity` requests for `services`.
    pub fn new(services: &[String], capacity: usize) -> ProviderQueues {
        let queues = ProviderQueues {
            capacity,
            queues: RwLock::new(Vec::new()),
        };
        queues.ensure(services);
        queues
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<ProviderQueue>> {
        self.queues
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a queue for every service of `services` that has none yet.
    pub fn ensure(&self, services: &[String]) {
        let mut queues = self
            .queues
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for service in services {
            if queues.iter().any(|q| q.service == *service) {
                continue;
            }
            let (sender, receiver) = async_channel::bounded(self.capacity);
            queues.push(ProviderQueue {
                service: service.clone(),
                sender,
                receiver,
                depth: metrics::gauge!(catalog::LOCATION_PROVIDER_QUEUE_DEPTH, "service" => service.clone()),
            });
        }
    }

    /// The index of `service`'s queue.
    pub fn index_of(&self, service: &str) -> Option<usize> {
        self.read().iter().position(|q| q.service == service)
    }

    /// The queue of `service`.
    pub fn get(&self, service: &str) -> Option<ProviderQueue> {
        self.read().iter().find(|q| q.service == service).cloned()
    }

    /// Appends to `local` the queues it does not have yet (the broker's copy of the list).
    pub fn extend(&self, local: &mut Vec<ProviderQueue>) {
        let queues = self.read();
        if queues.len() > local.len() {
            local.extend(queues[local.len()..].iter().cloned());
        }
    }

    /// Closes every queue: Subscribe streams end once they drained what is queued.
    pub fn close(&self) {
        for queue in self.read().iter() {
            queue.sender.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_stable_and_queues_only_added() {
        let queues = ProviderQueues::new(&["a".into(), "b".into()], 4);
        assert_eq!(queues.index_of("b"), Some(1));
        queues.ensure(&["c".into(), "b".into()]);
        assert_eq!(queues.index_of("a"), Some(0));
        assert_eq!(queues.index_of("b"), Some(1));
        assert_eq!(queues.index_of("c"), Some(2));
        let mut local = Vec::new();
        queues.extend(&mut local);
        assert_eq!(local.len(), 3);
        queues.ensure(&["d".into()]);
        queues.extend(&mut local);
        assert_eq!(local[3].service, "d");
        queues.close();
        assert!(local[0].sender.is_closed());
        assert!(queues.get("c").unwrap().receiver.is_closed());
    }
}
