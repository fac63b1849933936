//! A memory budget for one table job (`tables.max_job_bytes`): the engines charge their heavy
//! allocations to it before making them (population mining, the per-population sensitive
//! histograms, learning datasets, sweep outcomes, upload parsing) and a charge that would pass the
//! limit is refused with [`BudgetExceeded`], naming the limit and what needed it, instead of the
//! allocation aborting the daemon.
//!
//! Invariants: plain synchronous accounting (an atomic counter, no clock, no runtime), so every
//! engine may take one by reference; a charge is checked before anything of its size is allocated
//! and is all or nothing (a refused charge holds nothing); what a [`Reservation`] holds is given
//! back when it is dropped, so a job that ends, fails or unwinds holds nothing afterwards; the
//! observer (the daemon's gauge of bytes held by jobs) sees every change exactly once, as a delta,
//! so the sum of the deltas is what the job holds.
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The configuration key every refusal names.
pub const LIMIT: &str = "tables.max_job_bytes";

/// Told every change of the bytes a budget holds (positive when reserved, negative when released).
pub type Observer = fn(i64);

#[derive(Debug)]
struct Inner {
    limit: u64,
    held: AtomicU64,
    observer: Option<Observer>,
}

/// One job's memory budget; cheap to clone (the clones share the account).
#[derive(Debug, Clone)]
pub struct MemoryBudget(Arc<Inner>);

/// A charge refused: `what` needed `needed` more bytes while the job held `held` of `limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {needed} more bytes while the job holds {held}, past {LIMIT} = {limit} (rule: one table job holds at most {LIMIT} bytes)"
)]
pub struct BudgetExceeded {
    pub what: String,
    pub needed: u64,
    pub held: u64,
    pub limit: u64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> MemoryBudget {
        MemoryBudget(Arc::new(Inner {
            limit,
            held: AtomicU64::new(0),
            observer: None,
        }))
    }

    /// A budget that refuses nothing (library calls and the CLI's own runs).
    pub fn unlimited() -> MemoryBudget {
        MemoryBudget::new(u64::MAX)
    }

    /// A budget of `limit` bytes whose every change is told to `observer`.
    pub fn observed(limit: u64, observer: Observer) -> MemoryBudget {
        MemoryBudget(Arc::new(Inner {
            limit,
            held: AtomicU64::new(0),
            observer: Some(observer),
        }))
    }

    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.0.held.load(Ordering::Relaxed)
    }

    /// Charges `bytes` for `what`, or refuses (holding nothing) when the job would pass the limit.
    pub fn try_reserve(
        &self,
        bytes: u64,
        what: impl Into<String>,
    ) -> Result<Reservation, BudgetExceeded> {
        let mut reservation = Reservation {
            budget: self.clone(),
            bytes: 0,
        };
        reservation.grow(bytes, what)?;
        Ok(reservation)
    }

    /// An empty reservation, to [`Reservation::grow`] as a structure grows.
    pub fn reservation(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    fn charge(&self, bytes: u64, what: impl Into<String>) -> Result<(), BudgetExceeded> {
        let inner = &self.0;
        let mut held = inner.held.load(Ordering::Relaxed);
        loop {
            let after = held.checked_add(bytes).filter(|&a| a <= inner.limit);
            let Some(after) = after else {
                return Err(BudgetExceeded {
                    what: what.into(),
                    needed: bytes,
                    held,
                    limit: inner.limit,
                });
            };
            match inner.held.compare_exchange_weak(
                held,
                after,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => held = now,
            }
        }
        if let Some(observe) = inner.observer {
            observe(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.0.held.fetch_sub(bytes, Ordering::Relaxed);
        if let Some(observe) = self.0.observer {
            observe(-i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
}

/// Bytes charged to a budget, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl Reservation {
    /// Charges `bytes` more for `what`; refused, the reservation keeps what it held.
    pub fn grow(&mut self, bytes: u64, what: impl Into<String>) -> Result<(), BudgetExceeded> {
        if bytes == 0 {
            return Ok(());
        }
        self.budget.charge(bytes, what)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves what `other` holds into this reservation (same budget).
    pub fn absorb(&mut self, mut other: Reservation) {
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// `count` elements of `size` bytes each, saturating (an estimate to charge, never to allocate).
pub fn bytes_of(count: usize, size: usize) -> u64 {
    (count as u64).saturating_mul(size as u64)
}

/// Reserves room in `vec` for one more element, charging the growth of its capacity (doubling, as
/// `Vec` does) to `reservation` first: the vector never grows past what the budget allowed.
pub fn reserve_one<T>(
    vec: &mut Vec<T>,
    reservation: &mut Reservation,
    what: &str,
) -> Result<(), BudgetExceeded> {
    if vec.len() < vec.capacity() {
        return Ok(());
    }
    let extra = vec.capacity().max(4);
    reservation.grow(bytes_of(extra, std::mem::size_of::<T>()), what)?;
    vec.try_reserve_exact(extra).map_err(|_| BudgetExceeded {
        what: what.to_string(),
        needed: bytes_of(extra, std::mem::size_of::<T>()),
        held: reservation.budget.held(),
        limit: reservation.budget.limit(),
    })
}

/// Why [`read_to_end_within`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadWithin {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Memory(#[from] BudgetExceeded),
    /// More than the limit of bytes.
    #[error("more than {0} bytes")]
    TooLarge(usize),
}

/// Reads `reader` to its end, at most `limit` bytes, charging each growth of the buffer to
/// `reservation` before it is made (64 KiB at first, then doubling).
pub fn read_to_end_within(
    mut reader: impl Read,
    limit: usize,
    reservation: &mut Reservation,
    what: &str,
) -> Result<Vec<u8>, ReadWithin> {
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.len() > limit {
            return Err(ReadWithin::TooLarge(limit));
        }
        let room = limit.saturating_add(1).saturating_sub(out.len());
        let extra = out.capacity().max(64 << 10).min(room);
        reservation.grow(extra as u64, what)?;
        out.try_reserve_exact(extra).map_err(|_| BudgetExceeded {
            what: what.to_string(),
            needed: extra as u64,
            held: reservation.budget.held(),
            limit: reservation.budget.limit(),
        })?;
        let read = (&mut reader).take(extra as u64).read_to_end(&mut out)?;
        if read < extra {
            if out.len() > limit {
                return Err(ReadWithin::TooLarge(limit));
            }
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    static OBSERVED: AtomicI64 = AtomicI64::new(0);

    fn observe(delta: i64) {
        OBSERVED.fetch_add(delta, Ordering::Relaxed);
    }

    #[test]
    fn charges_refuses_past_the_limit_and_gives_back_on_drop() {
        let budget = MemoryBudget::observed(1000, observe);
        let a = budget.try_reserve(600, "a").unwrap();
        assert_eq!(budget.held(), 600);
        let refused = budget.try_reserve(401, "the second table").unwrap_err();
        assert_eq!(refused.needed, 401);
        assert_eq!(refused.held, 600);
        let message = refused.to_string();
        assert!(
            message.contains("tables.max_job_bytes = 1000") && message.contains("the second table"),
            "{message}"
        );
        // A refused charge holds nothing.
        assert_eq!(budget.held(), 600);
        let mut b = budget.try_reserve(400, "b").unwrap();
        assert_eq!(budget.held(), 1000);
        assert!(b.grow(1, "more").is_err());
        assert_eq!(b.bytes(), 400);
        assert_eq!(OBSERVED.load(Ordering::Relaxed), 1000);
        drop(a);
        b.grow(100, "more").unwrap();
        assert_eq!(budget.held(), 500);
        drop(b);
        assert_eq!(budget.held(), 0);
        assert_eq!(OBSERVED.load(Ordering::Relaxed), 0);
        // Overflowing sizes are refused, not wrapped.
        assert!(budget.try_reserve(u64::MAX, "huge").is_err());
        let unlimited = MemoryBudget::unlimited();
        let _r = unlimited.try_reserve(1, "x").unwrap();
        assert!(unlimited.try_reserve(u64::MAX, "huge").is_err());
    }

    #[test]
    fn a_vector_grows_only_within_the_budget() {
        let budget = MemoryBudget::new(64);
        let mut reservation = budget.reservation();
        let mut v: Vec<u64> = Vec::new();
        let mut pushed = 0;
        while reserve_one(&mut v, &mut reservation, "v").is_ok() {
            v.push(pushed);
            pushed += 1;
        }
        assert_eq!(
            pushed, 8,
            "4 then 4 more elements of 8 bytes fit in 64 bytes"
        );
        assert!(v.capacity() * 8 <= 64);
        assert_eq!(budget.held(), 64);
        drop(reservation);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn reading_charges_the_buffer_and_stops_at_the_limits() {
        let data = vec![7u8; 200_000];
        let budget = MemoryBudget::new(1 << 20);
        let mut held = budget.reservation();
        let out = read_to_end_within(data.as_slice(), 300_000, &mut held, "body").unwrap();
        assert_eq!(out, data);
        assert!(held.bytes() >= out.capacity() as u64, "{}", held.bytes());
        assert!(matches!(
            read_to_end_within(data.as_slice(), 100_000, &mut budget.reservation(), "body"),
            Err(ReadWithin::TooLarge(100_000))
        ));
        let small = MemoryBudget::new(100_000);
        let refused =
            read_to_end_within(data.as_slice(), 300_000, &mut small.reservation(), "body");
        assert!(matches!(refused, Err(ReadWithin::Memory(_))), "{refused:?}");
        assert_eq!(small.held(), 0);
    }
}
