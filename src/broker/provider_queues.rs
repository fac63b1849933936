//! The provider queues: one bounded queue (`location.provider_queue`) per service ever configured,
//! shared by the broker actor (which fills it) and the providers' Subscribe streams (which drain it).
//!
//! Invariants: the list only grows, so a queue's index never changes while the daemon runs (an
//! admitted request carries its service as that index). A reload that adds a service adds its queue
//! before any request can name it; a reload that drops a service keeps its queue, so requests
//! already admitted for it are still delivered to the providers subscribed to it, while new
//! requests and subscriptions naming it are refused. [`ProviderQueues::close`] (at shutdown) ends
//! every Subscribe stream once its queue is drained.
//!
//! A queue ([`RequestQueue`]) holds at most its capacity, gives each entry to one stream, and
//! wakes its waiting streams only when the broker announces what it put
//! ([`RequestQueue::announce`], once at the end of each of the broker's wake-ups), so that a
//! stream wakes once for all the requests of a wake-up rather than once for each. Every entry
//! put is announced before the broker sleeps again.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

/// Why a queue refused an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// It holds its capacity already.
    Full,
    /// The daemon is shutting down.
    Closed,
}

/// A bounded queue of cloaked requests with any number of takers (clones share it).
#[derive(Debug, Clone)]
pub struct RequestQueue {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    entries: Mutex<VecDeque<Queued>>,
    capacity: usize,
    closed: AtomicBool,
    /// Set by a put, cleared by the announcement that wakes the takers.
    unannounced: AtomicBool,
    arrived: tokio::sync::Notify,
}

impl RequestQueue {
    /// A queue of at most `capacity` (at least 1) requests.
    pub fn new(capacity: usize) -> RequestQueue {
        RequestQueue {
            shared: Arc::new(Shared {
                entries: Mutex::new(VecDeque::new()),
                capacity: capacity.max(1),
                closed: AtomicBool::new(false),
                unannounced: AtomicBool::new(false),
                arrived: tokio::sync::Notify::new(),
            }),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Puts `entry` at the back, unless the queue is full or closed. Waiting takers are woken by
    /// the next [`RequestQueue::announce`].
    pub fn put(&self, entry: Queued) -> Result<(), Refused> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed);
        }
        let mut entries = self.entries();
        if entries.len() >= self.shared.capacity {
            return Err(Refused::Full);
        }
        entries.push_back(entry);
        drop(entries);
        self.shared.unannounced.store(true, Ordering::Release);
        Ok(())
    }

    /// Wakes the waiting takers if anything was put since the last announcement.
    pub fn announce(&self) {
        if self.shared.unannounced.swap(false, Ordering::AcqRel) {
            self.shared.arrived.notify_waiters();
        }
    }

    /// The front entry, if any.
    pub fn try_take(&self) -> Option<Queued> {
        self.entries().pop_front()
    }

    /// The front entry, waiting for an announced one; `None` once the queue is closed and empty.
    pub async fn take(&self) -> Option<Queued> {
        loop {
            let arrived = self.shared.arrived.notified();
            tokio::pin!(arrived);
            // Registered before looking, so an announcement made after the look wakes it.
            arrived.as_mut().enable();
            if let Some(entry) = self.try_take() {
                return Some(entry);
            }
            if self.is_closed() {
                return self.try_take();
            }
            arrived.await;
        }
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_full(&self) -> bool {
        self.len() >= self.shared.capacity
    }

    /// Refuses every later put and wakes the takers, which end once the queue is empty.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.arrived.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

/// One service's queue.
#[derive(Debug, Clone)]
pub struct ProviderQueue {
    pub service: String,
    pub queue: RequestQueue,
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
            queues.push(ProviderQueue {
                service: service.clone(),
                queue: RequestQueue::new(self.capacity),
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
            queue.queue.close();
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
        assert!(local[0].queue.is_closed());
        assert!(queues.get("c").unwrap().queue.is_closed());
    }

    fn entry(n: u128) -> Queued {
        let pseudonym = Pseudonym(n);
        Queued::new(
            pseudonym,
            Arc::new(CloakedRequest {
                pseudonym: pseudonym.to_string(),
                ..CloakedRequest::default()
            }),
        )
    }

    /// A waiting taker wakes at the announcement, not at the put, and gets every entry of the
    /// announcement in order; a full queue refuses; a closed one refuses puts and its takers end
    /// once it is empty.
    #[tokio::test]
    async fn takers_wake_at_the_announcement_and_end_after_close() {
        let queue = RequestQueue::new(3);
        let taker = {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(entry) = queue.take().await {
                    got.push(entry.pseudonym.0);
                }
                got
            })
        };
        tokio::task::yield_now().await;
        queue.put(entry(1)).unwrap();
        queue.put(entry(2)).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.len(), 2, "not taken before the announcement");
        queue.announce();
        while !queue.is_empty() {
            tokio::task::yield_now().await;
        }
        queue.put(entry(3)).unwrap();
        queue.put(entry(4)).unwrap();
        queue.put(entry(5)).unwrap();
        assert!(queue.is_full());
        assert_eq!(queue.put(entry(6)).unwrap_err(), Refused::Full);
        queue.close();
        assert_eq!(queue.put(entry(7)).unwrap_err(), Refused::Closed);
        assert_eq!(taker.await.unwrap(), vec![1, 2, 3, 4, 5]);
    }

    /// Several takers of one queue: every entry goes to exactly one of them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_entry_goes_to_one_taker() {
        let queue = RequestQueue::new(64);
        let takers: Vec<_> = (0..3)
            .map(|_| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    while let Some(entry) = queue.take().await {
                        got.push(entry.pseudonym.0);
                        // What else is there at once, as a Subscribe stream takes it.
                        got.extend(
                            (0..4)
                                .map_while(|_| queue.try_take())
                                .map(|e| e.pseudonym.0),
                        );
                    }
                    got
                })
            })
            .collect();
        let mut n = 0u128;
        while n < 2_000 {
            if queue.put(entry(n)).is_ok() {
                n += 1;
            } else {
                queue.announce();
                tokio::task::yield_now().await;
            }
            if n.is_multiple_of(7) {
                queue.announce();
            }
        }
        queue.announce();
        while !queue.is_empty() {
            tokio::task::yield_now().await;
        }
        queue.close();
        let mut all = Vec::new();
        for taker in takers {
            all.extend(taker.await.unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0..2_000).collect::<Vec<_>>());
    }
}
