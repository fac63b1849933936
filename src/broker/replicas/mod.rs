//! Location cloaking across replicas (`[cluster]` configured): each grid cell
//! ([`crate::location::cells`], side `cluster.cell_size_m`) is owned by one replica at a time
//! through the lease `cell.<row>.<col>` of the bucket `<prefix>_leases`, and a request is cloaked by
//! the owner of the cell of its own position (the border rule), whichever replica the client is
//! connected to.
//!
//! Subjects (core NATS, `<prefix>` is `cluster.prefix`):
//! - `<prefix>.location.cloak.<node>`: request/reply. The replica holding a client's stream (the
//!   *origin*) sends the owner a [`ForwardedRequest`] (user id, exact position, tolerances, payload,
//!   service); the owner replies [`ForwardReply`] at once: accepted (handed to its broker) or refused
//!   (not the owner any more, overloaded). No responder means the owner is gone.
//! - `<prefix>.location.events.<node>`: the owner publishes every later event of a forwarded request
//!   (`Cloaked`, `Expired`, `Rejected`, then the provider's `LbsReply` or `Undelivered`) to the
//!   origin as a [`ReplicaEvent`]; the origin hands it to the client's stream.
//!
//! On the owner, a forwarded request is a stream of its own holding one request (a *replica
//! client*), so it goes through the same broker as a local one: the same limits, the same engine and
//! groups (k distinct users, padding), the same provider queues, acknowledgements and answer binding
//! (only the principal whose Subscribe stream received a pseudonym may answer it). The origin keeps
//! what it needs to end its client's stream correctly ([`remote_requests`]).
//! A cloaked request goes to a provider subscribed on the owner if there is one, else it is relayed
//! to a replica with a provider of its service ([`relay_nats`]; the actor's side in
//! [`relay_broker`]).
//!
//! While a cell's lease moves (its owner stopped and the lease has not lapsed yet, at most
//! `cluster.lease_ms`), requests for it are refused with UNAVAILABLE instead of held: a held request
//! would spend its own deadline (dt) waiting, and refusing tells the client to retry now with its
//! current position. A cell nobody holds yet is contended for on its first request, which waits for
//! that (one key-value round trip, at most `cluster.request_timeout_ms`); every replica follows
//! every cell any replica has leased, so a stopped owner's cells are taken over by another replica
//! within `cluster.lease_ms` whether or not it has had requests for them.
//!
//! Invariants: a forwarded request is cloaked on the replica it was sent to and never forwarded on
//! (if the owner lost the cell meanwhile it still cloaks it: every group still comes from one
//! engine, so every guarantee holds; only grouping across the move is lost); every request accepted
//! on the origin gets exactly one of Cloaked, Expired or Rejected there.
//!
//! The replica-facing code of the broker, by side. The actor's: [`link`] (its handle on the
//! cluster: cell owners and the outbound queue), [`remote_requests`] (requests of this replica's
//! clients cloaked or served on another, and requests another replica forwarded here),
//! [`relay_broker`] (whether a cloaked request is relayed, and taking one relayed here). NATS's:
//! this file (joining, the outbound publisher, taking forwarded requests and their events),
//! [`relay_nats`] (the provide subjects and their queue groups), [`wire`] (the messages).
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::Code;

use super::message::{AdmittedRequest, Command, EventQueue, Outbound, Rejection, RemoteClient};
use super::provider_queues::ProviderQueues;
use crate::cluster::{Cluster, ClusterError, LeaseTable, Owner};
use crate::config::CloakModel;
use crate::location::cells::CellGrid;
use crate::proto::LocationEvent;
pub(crate) use link::ClusterLink;
use remote_requests::RemoteRequests;
use wire::{ForwardReply, ForwardedRequest, ReplicaEvent};

mod link;
mod relay_broker;
mod relay_nats;
mod remote_requests;
pub(crate) mod wire;

/// The broker's replica state: its link to the cluster and the requests of its clients that
/// another replica cloaks or serves ([`remote_requests`]).
#[derive(Default)]
pub(super) struct ReplicaState {
    /// Cell owners and the way to other replicas (`None`: standalone).
    pub(super) link: Option<ClusterLink>,
    pub(super) remote: RemoteRequests,
}

/// Messages waiting for the NATS publisher; past this the broker treats the replica as too slow.
const OUTBOUND_QUEUE: usize = 65_536;

/// The NATS side of location across replicas, before the broker starts.
pub(crate) struct LocationCluster {
    cluster: Cluster,
    cells: LeaseTable,
    grid: CellGrid,
    forwarded: async_nats::Subscriber,
    events: async_nats::Subscriber,
}

impl LocationCluster {
    /// Opens the lease bucket and subscribes this replica's subjects.
    pub(crate) async fn join(cluster: &Cluster) -> Result<LocationCluster, ClusterError> {
        let kv = cluster.lease_bucket().await?;
        let cells = LeaseTable::new(kv, "cell", &cluster.node_id, cluster.config.lease);
        // Follow every cell any replica has leased, so a failed owner's cells are taken over even
        // by a replica that has had no request for them yet.
        cells.follow_all();
        let subscribe = |subject: String| {
            let client = cluster.client.clone();
            async move {
                client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| ClusterError::KeyValue {
                        key: subject,
                        message: format!("cannot subscribe: {e}"),
                    })
            }
        };
        let forwarded = subscribe(subject(cluster, "cloak", &cluster.node_id)).await?;
        let events = subscribe(subject(cluster, "events", &cluster.node_id)).await?;
        Ok(LocationCluster {
            cluster: cluster.clone(),
            cells,
            grid: CellGrid::new(cluster.config.cell_size_m),
            forwarded,
            events,
        })
    }

    /// Starts the NATS tasks; the link goes to the broker. Held cells are released at shutdown.
    pub(crate) fn start(
        self,
        commands: mpsc::Sender<Command>,
        provider_queues: Arc<ProviderQueues>,
        next_client: Arc<AtomicU64>,
        mut shutdown: watch::Receiver<bool>,
    ) -> ClusterLink {
        let (out, outbound) = mpsc::channel(OUTBOUND_QUEUE);
        let node: Arc<str> = Arc::from(self.cluster.node_id.as_str());
        let nats = self.cluster.config.nats.as_ref();
        let request_timeout = nats.map_or(Duration::from_secs(5), |n| n.request_timeout);
        let (providing, wanted) = watch::channel(BTreeSet::new());
        let link = ClusterLink::leased(
            self.cells.clone(),
            self.grid,
            node,
            out.clone(),
            commands.clone(),
            providing,
            request_timeout,
        );
        tokio::spawn(relay_nats::serve(relay_nats::Providing {
            cluster: self.cluster.clone(),
            wanted,
            commands: commands.clone(),
            provider_queues: Arc::clone(&provider_queues),
            next_client: Arc::clone(&next_client),
            out: out.clone(),
            shutdown: shutdown.clone(),
        }));
        tokio::spawn(publish(
            self.cluster.clone(),
            outbound,
            commands.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(take_forwarded(Owners {
            cluster: self.cluster.clone(),
            cells: self.cells.clone(),
            grid: self.grid,
            subscriber: self.forwarded,
            commands: commands.clone(),
            provider_queues,
            next_client,
            out,
            shutdown: shutdown.clone(),
        }));
        tokio::spawn(take_events(self.events, commands, shutdown.clone()));
        let cells = self.cells;
        tokio::spawn(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
            // Others take the cells over at once instead of after a lease duration.
            cells.stop().await;
        });
        link
    }
}

/// `<prefix>.location.<kind>.<node>`.
fn subject(cluster: &Cluster, kind: &str, node: &str) -> String {
    cluster.name('.', &format!("location.{kind}.{node}"))
}

/// What `next` yields, or `None` once the daemon shuts down.
async fn until_stopped<T>(
    next: impl std::future::Future<Output = Option<T>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<T> {
    tokio::select! {
        item = next => item,
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// Publishes `event` to the replica holding `to`'s stream (`<prefix>.location.events.<node>`).
async fn publish_event(cluster: &Cluster, to: &RemoteClient, event: LocationEvent) {
    let payload = ReplicaEvent {
        tag: to.tag,
        event: Some(event),
    }
    .encode_to_vec();
    let subject = subject(cluster, "events", &to.node);
    if let Err(err) = cluster.client.publish(subject, Bytes::from(payload)).await {
        tracing::warn!(node = %to.node, %err, "cannot publish a location event to its replica");
    }
}

/// Publishes events for other replicas' clients and sends forwarded requests, until shutdown.
async fn publish(
    cluster: Cluster,
    mut outbound: mpsc::Receiver<Outbound>,
    commands: mpsc::Sender<Command>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let Some(message) = until_stopped(outbound.recv(), &mut shutdown).await else {
            return;
        };
        match message {
            Outbound::Event { to, event } => publish_event(&cluster, &to, event).await,
            Outbound::Relay { to, request } => {
                // Published after every earlier event (the client's Cloaked among them), each in
                // its own task.
                tokio::spawn(relay_nats::send(cluster.clone(), to, request));
            }
            Outbound::Forward {
                owner,
                tag,
                request,
            } => {
                // Each in its own task: a slow owner delays only its own requests.
                let cluster = cluster.clone();
                let commands = commands.clone();
                tokio::spawn(async move {
                    let request_no = request.request_no;
                    let subject = subject(&cluster, "cloak", &owner);
                    let payload = Bytes::from(request.encode_to_vec());
                    let refusal = match cluster.client.request(subject, payload).await {
                        Ok(reply) => match ForwardReply::decode(reply.payload) {
                            Ok(reply) if reply.accepted => return,
                            Ok(reply) => Rejection {
                                field: known_field(&reply.field),
                                reason: reply.reason,
                                code: Code::from_i32(reply.code),
                            },
                            Err(_) => unavailable(
                                "the replica owning the request's cell answered with an unreadable message",
                            ),
                        },
                        Err(err) => {
                            tracing::warn!(%owner, %err, "cannot forward a location request to the owner of its cell");
                            unavailable(&format!(
                                "the replica owning the request's cell does not answer ({}); a stopped replica's cells move to another within cluster.lease_ms: retry",
                                err.kind()
                            ))
                        }
                    };
                    let _ = commands
                        .send(Command::RemoteEvent {
                            tag,
                            event: refusal.to_event(request_no),
                        })
                        .await;
                });
            }
        }
    }
}

fn unavailable(reason: &str) -> Rejection {
    Rejection {
        field: "lat",
        reason: reason.to_string(),
        code: Code::Unavailable,
    }
}

/// A rejection field named by another replica, as one of ours (they run the same code).
fn known_field(field: &str) -> &'static str {
    match field {
        "service" => "service",
        "user_id" => "user_id",
        "lat" => "lat",
        "lon" => "lon",
        _ => "request_no",
    }
}

/// What the owner side needs to take forwarded requests.
struct Owners {
    cluster: Cluster,
    cells: LeaseTable,
    grid: CellGrid,
    subscriber: async_nats::Subscriber,
    commands: mpsc::Sender<Command>,
    provider_queues: Arc<ProviderQueues>,
    next_client: Arc<AtomicU64>,
    out: mpsc::Sender<Outbound>,
    shutdown: watch::Receiver<bool>,
}

/// The owner side: takes forwarded requests and hands each to the broker as a replica client.
async fn take_forwarded(mut owners: Owners) {
    loop {
        let Some(message) = until_stopped(owners.subscriber.next(), &mut owners.shutdown).await
        else {
            return;
        };
        let reply = match ForwardedRequest::decode(message.payload) {
            Ok(request) => owners.admit(request),
            Err(_) => refused(
                Code::InvalidArgument,
                "request_no",
                "unreadable forwarded request",
            ),
        };
        if let Some(to) = message.reply {
            let _ = owners
                .cluster
                .client
                .publish(to, Bytes::from(reply.encode_to_vec()))
                .await;
        }
    }
}

fn refused(code: Code, field: &str, reason: &str) -> ForwardReply {
    ForwardReply {
        accepted: false,
        code: code as i32,
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

impl Owners {
    fn admit(&self, request: ForwardedRequest) -> ForwardReply {
        let cell = self.grid.cell_of(request.lat, request.lon);
        if self.cells.owner(&cell.key()) != Owner::Local {
            return refused(
                Code::Unavailable,
                "lat",
                "the request's cell is moving between replicas; retry",
            );
        }
        let Some(service) = self.provider_queues.index_of(&request.service) else {
            return refused(
                Code::InvalidArgument,
                "service",
                "the replica owning the request's cell does not serve this service",
            );
        };
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        let events = EventQueue::replica(
            RemoteClient {
                node: Arc::from(request.origin.as_str()),
                tag: request.tag,
            },
            self.out.clone(),
        );
        let admitted = AdmittedRequest {
            user_id: request.user_id,
            request_no: request.request_no,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
            dt_ms: request.dt_ms,
            payload: request.payload,
            service,
            model: CloakModel::Requests,
            // Not carried between replicas: a forwarded request expires as before.
            epsilon_per_km: None,
            fallback_epsilon_per_km: None,
        };
        let command = Command::SubmitForwarded {
            client,
            events,
            principal: Arc::from(request.principal.as_str()),
            request: admitted,
            received: std::time::Instant::now(),
        };
        match self.commands.try_send(command) {
            Ok(()) => ForwardReply {
                accepted: true,
                ..Default::default()
            },
            Err(_) => refused(
                Code::ResourceExhausted,
                "request_no",
                "the broker of the replica owning the request's cell is overloaded",
            ),
        }
    }
}

/// The origin side: events of forwarded requests, handed to their client streams.
async fn take_events(
    mut subscriber: async_nats::Subscriber,
    commands: mpsc::Sender<Command>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let Some(message) = until_stopped(subscriber.next(), &mut shutdown).await else {
            return;
        };
        let Ok(ReplicaEvent {
            tag,
            event: Some(event),
        }) = ReplicaEvent::decode(message.payload)
        else {
            tracing::warn!("unreadable location event from another replica; dropped");
            continue;
        };
        if commands
            .send(Command::RemoteEvent { tag, event })
            .await
            .is_err()
        {
            return;
        }
    }
}
