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
//! what it needs to end its client's stream correctly ([`super::remote`] requests).
//! A cloaked request goes to a provider subscribed on the owner if there is one, else it is relayed
//! to a replica with a provider of its service ([`relay`]).
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
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::Code;

use super::message::{
    AdmittedRequest, CellOwner, Command, EventQueue, Outbound, Rejection, RemoteClient,
};
use super::providers::ProviderQueues;
use crate::cluster::{Cluster, ClusterError, LeaseTable, Owner};
use crate::config::CloakModel;
use crate::location::cells::CellGrid;
use crate::proto::{CloakedRequest, LocationEvent};
use wire::{ForwardReply, ForwardedRequest, ReplicaEvent};

mod relay;
pub(crate) mod wire;

/// Messages waiting for the NATS publisher; past this the broker treats the replica as too slow.
const OUTBOUND_QUEUE: usize = 65_536;

/// Who owns the grid cells, as the broker asks.
#[derive(Clone)]
enum Cells {
    /// The cell leases of the cluster.
    Leased(LeaseTable),
    /// Every cell has this owner, and none is ever contended for: the broker's unit tests drive one
    /// replica without NATS.
    #[cfg(test)]
    Fixed(Owner),
}

impl Cells {
    fn owner(&self, name: &str) -> Owner {
        match self {
            Cells::Leased(table) => table.owner(name),
            #[cfg(test)]
            Cells::Fixed(owner) => owner.clone(),
        }
    }

    async fn resolve(&self, name: &str, wait: Duration) -> Owner {
        match self {
            Cells::Leased(table) => table.resolve(name, wait).await,
            #[cfg(test)]
            Cells::Fixed(owner) => owner.clone(),
        }
    }
}

/// The broker's handle on the cluster: who owns which cell, and the way out to NATS.
pub(crate) struct ClusterLink {
    cells: Cells,
    grid: CellGrid,
    node: Arc<str>,
    out: mpsc::Sender<Outbound>,
    commands: mpsc::Sender<Command>,
    /// The services with a provider subscribed here: this replica takes relayed requests of them.
    providing: watch::Sender<BTreeSet<String>>,
    /// How long a request waits for a cell nobody is known to hold to get an owner.
    pub(super) resolve_within: Duration,
    /// How long the origin waits past a request's deadline for its owner's outcome.
    pub(super) request_timeout: Duration,
}

impl ClusterLink {
    /// This replica's node id.
    pub(super) fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// Sends a cloaked request to a replica with a provider of its service, its events to `to`;
    /// false when the outbound queue is full.
    pub(super) fn relay(&self, to: RemoteClient, request: CloakedRequest) -> bool {
        self.out.try_send(Outbound::Relay { to, request }).is_ok()
    }

    /// The services with at least one provider subscribed on this replica now.
    pub(super) fn providing(&self, services: BTreeSet<String>) {
        self.providing.send_if_modified(|current| {
            let changed = *current != services;
            *current = services;
            changed
        });
    }

    /// The owner of the cell of `(lat, lon)` as far as this replica knows now.
    pub(super) fn owner_of(&self, lat: f64, lon: f64) -> CellOwner {
        match self.cells.owner(&self.grid.cell_of(lat, lon).key()) {
            Owner::Local => CellOwner::Here,
            Owner::Remote(node) => CellOwner::Replica(node),
            Owner::Vacant => CellOwner::Unknown,
        }
    }

    /// Contends for the cell of `request` and hands the request back to the broker
    /// ([`Command::Resolved`]) once someone holds it, or after [`Self::resolve_within`].
    pub(super) fn resolve(&self, tag: u64, request: AdmittedRequest) {
        let cells = self.cells.clone();
        let name = self.grid.cell_of(request.lat, request.lon).key();
        let commands = self.commands.clone();
        let wait = self.resolve_within;
        tokio::spawn(async move {
            let owner = match cells.resolve(&name, wait).await {
                Owner::Local => CellOwner::Here,
                Owner::Remote(node) => CellOwner::Replica(node),
                Owner::Vacant => CellOwner::Unknown,
            };
            let _ = commands
                .send(Command::Resolved {
                    tag,
                    request,
                    owner,
                })
                .await;
        });
    }

    /// Sends `request` to `owner`; false when the outbound queue is full.
    pub(super) fn forward(
        &self,
        owner: String,
        tag: u64,
        principal: &str,
        request: &AdmittedRequest,
        service: &str,
    ) -> bool {
        let request = ForwardedRequest {
            origin: self.node.to_string(),
            tag,
            principal: principal.to_string(),
            user_id: request.user_id.clone(),
            request_no: request.request_no,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
            dt_ms: request.dt_ms,
            payload: request.payload.clone(),
            service: service.to_string(),
        };
        self.out
            .try_send(Outbound::Forward {
                owner,
                tag,
                request,
            })
            .is_ok()
    }
}

#[cfg(test)]
impl ClusterLink {
    /// The link of replica `node` in the broker's unit tests, which drive one replica without NATS:
    /// every cell is owned by `owner`; what the replica sends other replicas waits on `out` (the
    /// channel the NATS side reads), and what it hands itself on `commands`.
    pub(super) fn detached(
        node: &str,
        owner: Owner,
        out: mpsc::Sender<Outbound>,
        commands: mpsc::Sender<Command>,
        request_timeout: Duration,
    ) -> ClusterLink {
        ClusterLink {
            cells: Cells::Fixed(owner),
            grid: CellGrid::new(
                crate::config::Config::embedded_defaults()
                    .cluster
                    .cell_size_m,
            ),
            node: Arc::from(node),
            out,
            commands,
            providing: watch::channel(BTreeSet::new()).0,
            resolve_within: request_timeout,
            request_timeout,
        }
    }
}

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
        let link = ClusterLink {
            cells: Cells::Leased(self.cells.clone()),
            grid: self.grid,
            node,
            out: out.clone(),
            commands: commands.clone(),
            providing,
            resolve_within: request_timeout,
            request_timeout,
        };
        tokio::spawn(relay::serve(relay::Providing {
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
                tokio::spawn(relay::send(cluster.clone(), to, request));
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
