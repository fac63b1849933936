//! The broker's handle on the cluster ([`super`]): which replica owns the cell of a position (the
//! cell leases, or one fixed owner in the broker's unit tests), and the way out to NATS for what
//! the actor sends other replicas (forwarded requests, relayed requests, events), through one
//! bounded outbound queue: a full queue is a refusal here, never a wait in the actor.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::super::message::{AdmittedRequest, CellOwner, Command, Outbound, RemoteClient};
use super::wire::ForwardedRequest;
use crate::cluster::{LeaseTable, Owner};
use crate::location::cells::CellGrid;
use crate::proto::CloakedRequest;

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
    /// The link of a replica whose cells are the cluster's leases ([`super::LocationCluster::start`]).
    pub(super) fn leased(
        cells: LeaseTable,
        grid: CellGrid,
        node: Arc<str>,
        out: mpsc::Sender<Outbound>,
        commands: mpsc::Sender<Command>,
        providing: watch::Sender<BTreeSet<String>>,
        request_timeout: Duration,
    ) -> ClusterLink {
        ClusterLink {
            cells: Cells::Leased(cells),
            grid,
            node,
            out,
            commands,
            providing,
            resolve_within: request_timeout,
            request_timeout,
        }
    }

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

    /// The owner of the cell of `(lat, lon)` when another replica is to cloak a request there, or
    /// `None` to cloak it here: this replica owns the cell, or the request was forwarded here
    /// (`forwarded_here`: it is never forwarded on).
    pub(in crate::broker) fn owner_elsewhere(
        &self,
        forwarded_here: bool,
        lat: f64,
        lon: f64,
    ) -> Option<CellOwner> {
        if forwarded_here {
            return None;
        }
        match self.owner_of(lat, lon) {
            CellOwner::Here => None,
            owner => Some(owner),
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
    pub(in crate::broker) fn detached(
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
