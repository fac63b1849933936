//! The messages replicas exchange over core NATS for location cloaking ([`super`]): protobuf
//! encoded with prost, declared here by hand (they never leave the cluster, so they are not part of
//! the public API in `proto/`). Tags are never reused.
use crate::proto::{CloakedRequest, LocationEvent};

/// A location request on its way from the replica holding the client's stream to its cell's owner.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ForwardedRequest {
    /// Node id of the replica holding the client's stream.
    #[prost(string, tag = "1")]
    pub origin: String,
    /// The request's tag on the origin (what its events carry back).
    #[prost(uint64, tag = "2")]
    pub tag: u64,
    /// Name of the client's principal (for the owner's logs and permission checks).
    #[prost(string, tag = "3")]
    pub principal: String,
    #[prost(string, tag = "4")]
    pub user_id: String,
    #[prost(uint64, tag = "5")]
    pub request_no: u64,
    #[prost(double, tag = "6")]
    pub lat: f64,
    #[prost(double, tag = "7")]
    pub lon: f64,
    #[prost(uint32, tag = "8")]
    pub k: u32,
    #[prost(double, tag = "9")]
    pub dx_m: f64,
    #[prost(double, tag = "10")]
    pub dy_m: f64,
    #[prost(uint64, tag = "11")]
    pub dt_ms: u64,
    #[prost(bytes = "vec", tag = "12")]
    pub payload: Vec<u8>,
    #[prost(string, tag = "13")]
    pub service: String,
}

/// The owner's immediate answer to a [`ForwardedRequest`].
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ForwardReply {
    #[prost(bool, tag = "1")]
    pub accepted: bool,
    /// When refused: the gRPC code, field and reason the client is told.
    #[prost(int32, tag = "2")]
    pub code: i32,
    #[prost(string, tag = "3")]
    pub field: String,
    #[prost(string, tag = "4")]
    pub reason: String,
}

/// An event for a client stream held by another replica.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ReplicaEvent {
    /// The request's tag on the origin.
    #[prost(uint64, tag = "1")]
    pub tag: u64,
    #[prost(message, optional, tag = "2")]
    pub event: Option<LocationEvent>,
}

/// A cloaked request on its way to a replica with a provider of its service.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RelayedRequest {
    /// Node id of the replica holding the client's stream.
    #[prost(string, tag = "1")]
    pub origin: String,
    /// The request's tag there (what its events carry back).
    #[prost(uint64, tag = "2")]
    pub tag: u64,
    #[prost(message, optional, tag = "3")]
    pub request: Option<CloakedRequest>,
}
