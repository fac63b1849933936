//! Relaying cloaked requests to providers connected to other replicas.
//!
//! A group is formed on its cell's owner. If the owner has a provider stream subscribed to a
//! member's service, the cloaked request goes on that local queue. Otherwise the owner *relays* it:
//! it sends it as a request on `<prefix>.location.provide.<service>` (the service name in lower-case
//! hex, one subject token). Every replica with at least one provider of that service subscribed
//! listens there, in the queue group `<prefix>.providers.<service>`, so exactly one of them takes each
//! request. It replies at once (accepted, or refused when its broker is overloaded) and puts the
//! request on its own provider queue, as a request of a *relayed client*. That is a one-request
//! stream whose events (the provider's `LbsReply` or `Undelivered`) are published to the replica
//! holding the client's stream (`<prefix>.location.events.<node>`), as for a forwarded request.
//! Acknowledgements, handing on, `answer_ttl_ms` and the answer binding (only the principal whose
//! Subscribe stream received the pseudonym may answer it) therefore apply on the providing replica
//! unchanged.
//!
//! What travels: the [`CloakedRequest`] exactly as a provider receives it (pseudonym, box, interval,
//! payload, service), the node id of the replica holding the client's stream and a tag there. No
//! user id and no exact position.
//!
//! No replica with a provider of the service (no responder): the client gets `Undelivered` at once
//! (reason `no_provider`), instead of after `location.answer_ttl_ms` in a queue nobody drains.
//! Local providers are preferred: a relay costs two NATS hops.
//!
//! Overflow: when the owner's own provider queue of the service is full, the request is relayed
//! too, so providers on other replicas take what the owner's cannot. A replica accepts a relayed
//! request only once its broker has put it on the queue; one whose queue is full refuses, and the
//! owner asks again (NATS picks a member of the queue group at random each time, the owner itself
//! among them), at most [`RELAY_ATTEMPTS`] times in all, before the client gets
//! `Undelivered` (reason `relay_failed`). A relayed request is never relayed on.
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tonic::Code;

use super::wire::{ForwardReply, RelayedRequest};
use super::{publish_event, refused, subject};
use crate::broker::message::{Command, EventQueue, Outbound, RelayRefusal, RemoteClient};
use crate::broker::provider_queues::ProviderQueues;
use crate::cluster::Cluster;
use crate::proto::{self, CloakedRequest, LocationEvent, location_event};
use crate::store::stream_dir_name;
use crate::telemetry::catalog;

/// Members of a service's queue group asked for one request before it is undelivered.
pub(super) const RELAY_ATTEMPTS: usize = 6;

/// `<prefix>.location.provide.<service hex>`.
fn provide_subject(cluster: &Cluster, service: &str) -> String {
    subject(cluster, "provide", &stream_dir_name(service))
}

/// `<prefix>.providers.<service hex>`: the queue group of the replicas serving the service.
fn queue_group(cluster: &Cluster, service: &str) -> String {
    cluster.name('.', &format!("providers.{}", stream_dir_name(service)))
}

/// Counts a relay by its result (`cloakd_location_relayed_total`).
fn count(result: &'static str) {
    metrics::counter!(catalog::LOCATION_RELAYED, "result" => result).increment(1);
}

/// The group's side: sends `request` to a replica with a provider of its service; when none takes
/// it, tells the client's replica `Undelivered` (by `to`'s tag).
pub(super) async fn send(cluster: Cluster, to: RemoteClient, request: CloakedRequest) {
    let service = request.service.clone();
    let payload = Bytes::from(
        RelayedRequest {
            origin: to.node.to_string(),
            tag: to.tag,
            request: Some(request),
        }
        .encode_to_vec(),
    );
    let provide = provide_subject(&cluster, &service);
    let mut attempt = 0;
    let (label, reason) = loop {
        attempt += 1;
        let outcome = match cluster.client.request(provide.clone(), payload.clone()).await {
            Ok(reply) => match ForwardReply::decode(reply.payload) {
                Ok(reply) if reply.accepted => return count("accepted"),
                Ok(reply) => ("refused", reply.reason),
                Err(_) => (
                    "failed",
                    "the replica with a provider of the service answered with an unreadable message"
                        .to_string(),
                ),
            },
            Err(err) if err.kind() == async_nats::RequestErrorKind::NoResponders => {
                break (
                    "no_provider",
                    format!("no provider of service {service:?} is subscribed on any replica"),
                );
            }
            Err(err) => {
                tracing::warn!(%err, "cannot relay a cloaked request to a replica with a provider of its service");
                break (
                    "failed",
                    format!(
                        "the replica with a provider of service {service:?} did not take it ({})",
                        err.kind()
                    ),
                );
            }
        };
        // Refused (that replica's queue is full): another member may have room.
        if attempt >= RELAY_ATTEMPTS {
            break outcome;
        }
    };
    count(label);
    metrics::counter!(
        catalog::LOCATION_UNDELIVERED,
        "service" => service,
        "reason" => if label == "no_provider" { "no_provider" } else { "relay_failed" },
    )
    .increment(1);
    let event = LocationEvent {
        // The client's replica puts the request's own number in.
        request_no: 0,
        outcome: Some(location_event::Outcome::Undelivered(proto::Undelivered {
            reason,
        })),
    };
    publish_event(&cluster, &to, event).await;
}

/// What the providing side needs.
pub(super) struct Providing {
    pub cluster: Cluster,
    /// The services with at least one provider subscribed on this replica (kept by the broker).
    pub wanted: watch::Receiver<BTreeSet<String>>,
    pub commands: mpsc::Sender<Command>,
    pub provider_queues: Arc<ProviderQueues>,
    pub next_client: Arc<AtomicU64>,
    pub out: mpsc::Sender<Outbound>,
    pub shutdown: watch::Receiver<bool>,
}

/// One service's subscription: the task taking its relayed requests, and how to stop it.
struct Serving {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

/// The providing side: listens in the queue group of every service with a provider subscribed
/// here, for as long as one is, until shutdown.
pub(super) async fn serve(mut providing: Providing) {
    let mut serving: HashMap<String, Serving> = HashMap::new();
    loop {
        let wanted = providing.wanted.borrow_and_update().clone();
        serving.retain(|service, _| wanted.contains(service));
        // (A dropped `stop` drains the subscription: the requests already on their way here are
        // still answered, so none waits out its request timeout.)
        for service in wanted {
            if serving.contains_key(&service) {
                continue;
            }
            let cluster = &providing.cluster;
            match cluster
                .client
                .queue_subscribe(
                    provide_subject(cluster, &service),
                    queue_group(cluster, &service),
                )
                .await
            {
                Ok(subscriber) => {
                    let (stop, stopped) = oneshot::channel();
                    let task = tokio::spawn(take(
                        subscriber,
                        stopped,
                        cluster.clone(),
                        providing.commands.clone(),
                        Arc::clone(&providing.provider_queues),
                        Arc::clone(&providing.next_client),
                        providing.out.clone(),
                    ));
                    serving.insert(service, Serving { task, stop });
                }
                Err(err) => {
                    // Tried again on the next change of providers.
                    tracing::warn!(%service, %err, "cannot take relayed requests of a service");
                }
            }
        }
        tokio::select! {
            changed = providing.wanted.changed() => if changed.is_err() { break },
            _ = providing.shutdown.wait_for(|stop| *stop) => break,
        }
    }
    for serving in serving.into_values() {
        serving.task.abort();
        drop(serving.stop);
    }
}

/// Takes the relayed requests of one service and hands each to the broker as a relayed client;
/// the broker says whether it took it (its queue had room), and that is the reply. Once `stop`
/// fires or is dropped, the subscription is drained: what is on its way is still answered.
async fn take(
    mut subscriber: async_nats::Subscriber,
    mut stop: oneshot::Receiver<()>,
    cluster: Cluster,
    commands: mpsc::Sender<Command>,
    provider_queues: Arc<ProviderQueues>,
    next_client: Arc<AtomicU64>,
    out: mpsc::Sender<Outbound>,
) {
    let mut draining = false;
    loop {
        let message = if draining {
            subscriber.next().await
        } else {
            tokio::select! {
                message = subscriber.next() => message,
                _ = &mut stop => {
                    draining = true;
                    if subscriber.drain().await.is_err() {
                        return;
                    }
                    continue;
                }
            }
        };
        let Some(message) = message else {
            return;
        };
        let Some(reply_to) = message.reply else {
            continue;
        };
        let taken = match RelayedRequest::decode(message.payload) {
            Ok(RelayedRequest {
                origin,
                tag,
                request: Some(request),
            }) => match provider_queues.index_of(&request.service) {
                None => Err(refused(
                    Code::InvalidArgument,
                    "service",
                    "the replica taking the request does not serve this service",
                )),
                Some(service) => {
                    let (taken, answer) = oneshot::channel();
                    let command = Command::Relayed {
                        client: next_client.fetch_add(1, Ordering::Relaxed),
                        events: EventQueue::replica(
                            RemoteClient {
                                node: Arc::from(origin.as_str()),
                                tag,
                            },
                            out.clone(),
                        ),
                        service,
                        request,
                        taken,
                    };
                    match commands.try_send(command) {
                        Ok(()) => Ok(answer),
                        Err(_) => Err(refused(
                            Code::ResourceExhausted,
                            "service",
                            "the broker of the replica with a provider of the service is overloaded",
                        )),
                    }
                }
            },
            _ => Err(refused(
                Code::InvalidArgument,
                "service",
                "unreadable relayed request",
            )),
        };
        let cluster = cluster.clone();
        // The broker's answer in a task of its own, so requests are handed over back to back.
        tokio::spawn(async move {
            let reply = match taken {
                Err(refusal) => refusal,
                Ok(answer) => match answer.await {
                    Ok(Ok(())) => ForwardReply {
                        accepted: true,
                        ..Default::default()
                    },
                    Ok(Err(RelayRefusal::QueueFull)) => refused(
                        Code::ResourceExhausted,
                        "service",
                        "the provider queue of the service is full on every replica asked (location.provider_queue)",
                    ),
                    Ok(Err(RelayRefusal::NoProvider)) => refused(
                        Code::Unavailable,
                        "service",
                        "the last provider of the service on the replica asked left while the request was on its way",
                    ),
                    Ok(Err(RelayRefusal::UnreadablePseudonym)) => refused(
                        Code::InvalidArgument,
                        "pseudonym",
                        "unreadable relayed pseudonym",
                    ),
                    Err(_) => refused(
                        Code::Unavailable,
                        "service",
                        "the replica asked stopped before taking the request",
                    ),
                },
            };
            let _ = cluster
                .client
                .publish(reply_to, Bytes::from(reply.encode_to_vec()))
                .await;
        });
    }
}
