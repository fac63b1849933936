//! The reference LBS provider of points of interest, the server behind `cloakd provider`
//! (docs/provider.md): it subscribes to one service of a running broker's `LbsGateway` (with its own
//! credentials, like any provider), decodes each cloaked request's payload as a
//! `cloakd.v1.poi.PoiQuery` and answers with a `PoiCandidates` list that holds the exact answer for
//! every point of the cloaking box ([`crate::poi`]). It never sees a point: only the box, the
//! interval and the payload. A long-running client of the daemon, not a part of it: `cloakd
//! simulate` and the tests run it in process; `src/cli/provider.rs` holds the command's flags and
//! process.
//!
//! Split by job: `answer.rs` (the answer to one request, [`PoiProvider`], and the POI file),
//! `pool.rs` (the bounded worker pool that computes answers), `connection.rs` (the connection to the
//! broker: acknowledgements, shedding, reconnection).
//!
//! A query that does not decode, breaks a limit, asks for an unknown category, or whose list would not
//! fit the broker's payload limit is answered with `PoiCandidates.error` naming the field and the rule
//! (and no POIs); a request that finds the worker queue full is answered with the overloaded answer.
//! The provider keeps serving and reconnects when it loses the broker; [`connection::serve`] ends only
//! when told to stop or on an error retrying cannot cure (the broker refusing the credential or the
//! service).
pub mod answer;
pub mod connection;
pub mod pool;

pub use answer::{PoiProvider, load_pois, overloaded, to_proto};
pub use connection::{Bearer, Tally, Target};
