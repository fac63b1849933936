//! Location cloaking for location-based services: personalized k-anonymity with CliqueCloak
//! (Gedik & Liu, "Protecting Location Privacy with Personalized k-Anonymity", TMC 2008).
//!
//! A message m = (user, point P, arrival t, k, dx, dy, dt) has the constraint box
//! Bcn(m) = [x ± dx] × [y ± dy] × [t ± dt] and the deadline t + dt. Pending messages form the constraint
//! graph: an edge joins two messages of *different* users when each one's point (and arrival time) lies
//! in the other's constraint box (less twice the 2 m padding margin: [`CloakRequest::grouping_box`]). A clique of size >= the largest k among its members is cloaked
//! together: every member is forwarded with the same cloaking box and the same time interval [earliest
//! arrival, latest arrival]. The cloaking box is the minimum bounding rectangle (MBR) of the members'
//! points with each side pushed outward at random inside every member's constraint box
//! ([`padding`]), so that no edge gives a member's coordinate away.
//!
//! Invariants the engine keeps (checked by the brute-force checker in the tests):
//! - a forwarded group has >= max k of its members, all of distinct users, pairwise adjacent;
//! - every member's point lies in the cloaking box, and the cloaking box lies in every member's
//!   constraint box; the interval lies in every member's temporal constraint;
//! - a group is forwarded no later than any member's deadline; a message whose deadline passed while it
//!   was pending is reported expired and never forwarded; every message gets exactly one outcome.
//!
//! The engine forwards nothing itself: the broker names each forwarded message with a fresh
//! pseudonym ([`Pseudonym`]) when it routes it.
//!
//! A second model, presence k-anonymity (cloak at once into a reciprocal region of k users *present*), is
//! in [`presence`], over the Hilbert order of [`hilbert`], with its independent checker in
//! [`presence_checker`].
//!
//! [`yardstick`] measures any model's answers alike (Shokri et al.'s Bayesian adversary and the
//! quality loss) for `cloakd simulate --compare`.
//!
//! The engine is pure: no clock (time is an argument), no I/O, randomness from a seeded RNG, so for a
//! given input order and seed its output is deterministic.

pub mod cells;
#[cfg(test)]
mod checker;
pub mod engine;
pub mod geo;
pub mod geo_ind;
pub mod hilbert;
pub mod padding;
pub mod point_index;
pub mod presence;
pub mod presence_checker;
pub mod replay;
pub mod session;
pub mod trace;
pub mod tracking;
pub mod yardstick;

pub use engine::{Engine, SearchStats};
pub use geo::GeoBox;
pub use point_index::IndexKind;
pub use presence::{PresenceEngine, PresenceOutcome, PresenceParams, PresenceRequest};

/// Broker-internal identifier of one pending request, unique for the engine's lifetime (the caller
/// assigns it).
pub type RequestId = u64;

/// Broker-internal key of a user: two requests share a key exactly when they come from the same user.
pub type UserKey = u64;

/// Clique search strategy of CliqueCloak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    /// On each arrival, look for a clique among the neighbours whose k is at most the new message's k.
    LocalK,
    /// Also try the larger k values found among the neighbours (serves demanding messages sooner).
    NbrK,
}

/// One location request as the engine sees it (already validated by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct CloakRequest {
    pub id: RequestId,
    pub user: UserKey,
    /// WGS84 degrees.
    pub lat: f64,
    pub lon: f64,
    /// Anonymity level: forwarded only in a group of >= k messages of distinct users.
    pub k: u32,
    /// Spatial tolerance in metres (half-widths of the constraint box, east-west and north-south).
    pub dx_m: f64,
    pub dy_m: f64,
    /// Temporal tolerance in milliseconds; the deadline is `arrival_ms + dt_ms`.
    pub dt_ms: u64,
    /// Arrival time, Unix ms (the broker's clock).
    pub arrival_ms: i64,
}

impl CloakRequest {
    /// The last instant at which this request may still be forwarded.
    pub fn deadline_ms(&self) -> i64 {
        self.arrival_ms
            .saturating_add(i64::try_from(self.dt_ms).unwrap_or(i64::MAX))
    }

    /// The spatial part of the constraint box, in degrees.
    pub fn constraint_box(&self) -> GeoBox {
        geo::constraint_box(self.lat, self.lon, self.dx_m, self.dy_m)
    }

    /// The box in which another member's point must lie for the two to be grouped: the constraint
    /// box less twice [`padding::MIN_PAD_M`] on each side ([`padding::grouping_tolerance`]). Grouping by it
    /// leaves every group's bounding box at least that far from the edges of the intersection of the
    /// members' constraint boxes, so padding can always push each side off the members.
    pub fn grouping_box(&self) -> GeoBox {
        geo::constraint_box(
            self.lat,
            self.lon,
            padding::grouping_tolerance(self.dx_m),
            padding::grouping_tolerance(self.dy_m),
        )
    }
}

/// A one-time pseudonym: 128 bits that look random to anyone but the broker that named them,
/// shown as 32 lower-case hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pseudonym(pub u128);

impl Pseudonym {
    /// The 32 lower-case hex digits, written by hand: every forwarded request and every answer
    /// shows or reads one, and the formatting machinery costs several times more.
    fn hex_digits(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        out
    }
}

impl std::fmt::Display for Pseudonym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.hex_digits();
        // Hex digits are ASCII.
        f.pad(std::str::from_utf8(&digits).map_err(|_| std::fmt::Error)?)
    }
}

impl std::str::FromStr for Pseudonym {
    type Err = std::num::ParseIntError;
    /// The 32 hex digits a pseudonym is shown as (either case) by hand; anything else as
    /// `u128::from_str_radix` reads it (so the accepted forms and the errors are unchanged).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() == 32 {
            let mut value = 0u128;
            let mut all_hex = true;
            for &b in s.as_bytes() {
                let digit = match b {
                    b'0'..=b'9' => b - b'0',
                    b'a'..=b'f' => b - b'a' + 10,
                    b'A'..=b'F' => b - b'A' + 10,
                    _ => {
                        all_hex = false;
                        break;
                    }
                };
                value = (value << 4) | u128::from(digit);
            }
            if all_hex {
                return Ok(Pseudonym(value));
            }
        }
        u128::from_str_radix(s, 16).map(Pseudonym)
    }
}

/// A set of requests cloaked together.
#[derive(Debug, Clone, PartialEq)]
pub struct CloakedGroup {
    /// The members' requests (the broker names each one's route with a fresh pseudonym).
    pub members: Vec<RequestId>,
    /// The members' MBR, padded at random inside every member's constraint box ([`padding`]), degrees.
    pub cloaking_box: GeoBox,
    /// Earliest and latest arrival among the members (Unix ms); `t_end_ms` is when the group formed.
    pub t_start_ms: i64,
    pub t_end_ms: i64,
}

/// What happened to pending requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Cloaked(CloakedGroup),
    /// The request's deadline passed before it could be made k-anonymous; it was never forwarded.
    Expired {
        id: RequestId,
        deadline_ms: i64,
    },
}

/// Why the engine refused a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("request id {0} is already pending")]
    DuplicateId(RequestId),
    #[error("{field}: {rule}")]
    Invalid { field: &'static str, rule: String },
}

#[cfg(test)]
mod pseudonym_tests {
    use super::Pseudonym;
    use proptest::prelude::*;

    proptest! {
        /// Shown as `{:032x}` would show it, and read back as `u128::from_str_radix` reads any
        /// string (the hand-written paths change no accepted form and no error).
        #[test]
        fn hex_as_the_formatter_and_the_parser(value in any::<u128>(), text in "[+0-9a-fA-FxX -]{0,34}") {
            let p = Pseudonym(value);
            let shown = p.to_string();
            prop_assert_eq!(&shown, &format!("{value:032x}"));
            prop_assert_eq!(shown.parse::<Pseudonym>(), Ok(p));
            prop_assert_eq!(shown.to_uppercase().parse::<Pseudonym>(), Ok(p));
            prop_assert_eq!(
                text.parse::<Pseudonym>().map(|p| p.0),
                u128::from_str_radix(&text, 16)
            );
        }
    }
}
