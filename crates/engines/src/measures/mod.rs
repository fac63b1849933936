//! Privacy and utility measures shared by the engines and the reports
//! (docs/architecture.md#definitions): the distances between distributions live below, in
//! [`crate::relational::distance`] (t-closeness needs them, and arrows point from measures to
//! relational only); reading a published release back ([`released`]), the release as the measures see it ([`view`]),
//! Ploss / A_know / A_acc ([`privacy`]), Uloss over large populations ([`populations`]), COUNT query
//! error ([`queries`]), the whole evaluation of one release ([`evaluate`]), the privacy/utility
//! frontier and its charts ([`frontier`]), Brickell & Shmatikov's learning workload ([`workload`]) and
//! their Figures 1-4 ([`figures`]); `crate::plots` draws the charts.
pub mod evaluate;
pub mod figures;
pub mod frontier;
pub mod populations;
pub mod privacy;
pub mod queries;
pub mod released;
pub mod view;
pub mod workload;
