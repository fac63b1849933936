//! Set-valued transactions anonymized with personalized rho-uncertainty by partial suppression
//! (Nakagawa, Arai & Nakagawa, 2018).
//!
//! Each record u has items D_u and its own sensitive items E_u (which may include items u does not
//! hold). conf(Q → e) = supp(Q ∪ {e}) / supp(Q) over the released window D'. D' is safe for adversary
//! (u, Q), Q ⊆ D_u with |Q| <= m, when for every e ∈ E_u \ Q: supp(Q ∪ {e}) <= rho · supp(Q) or
//! supp(Q) = 0. Exact mode guarantees this for every such adversary; sampled mode gives
//! (eps, delta)-rho^m-uncertainty by checking n_S = ceil(ln(1/delta) / (2 eps²)) sampled adversaries per
//! level. Suppression only removes items from records: no record is added, dropped or merged.

/// Dense item identifier within one window (the caller interns item names).
pub type ItemId = u32;

/// One record of a window: its items D_u and its own sensitive items E_u (both sorted, no duplicates).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub items: Vec<ItemId>,
    pub sensitive: Vec<ItemId>,
}

/// Which guarantee to give.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// rho^m-uncertainty against every adversary with |Q| <= m.
    Exact,
    /// (eps, delta)-rho^m-uncertainty with sampled adversaries.
    Sampled { epsilon: f64, delta: f64 },
}

/// Parameters of one anonymization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// rho in (0, 1).
    pub rho: f64,
    /// Largest adversary knowledge |Q|, >= 1.
    pub m: u32,
    pub mode: Mode,
}
