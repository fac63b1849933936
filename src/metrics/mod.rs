//! Privacy and utility measures shared by the engines and the reports (DESIGN.md §4).
pub mod distance;
