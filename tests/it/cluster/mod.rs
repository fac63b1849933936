//! Cluster membership against real `nats-server` processes: leases and node ids.

mod lease;
mod node_id;
