//! Counting limits on concurrent streams and jobs: a [`StreamLimit`] (one count) or a
//! [`PrincipalStreamLimit`] (a count per principal) hands out slots and refuses past its maximum
//! with [`LimitExceeded`], naming its configuration key.
//!
//! Invariants: a slot holds exactly one place of its limit and frees it when dropped; the count
//! never exceeds the maximum; a per-principal table holds only principals with places in use.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A counting limit on concurrent streams or jobs of one kind; a [`StreamSlot`] frees its place when
/// dropped.
#[derive(Debug, Clone)]
pub struct StreamLimit {
    name: &'static str,
    in_use: Arc<AtomicUsize>,
    max: usize,
    /// The gauge (a metric of the catalog) that shows the places in use, if any.
    gauge: Option<&'static str>,
}

/// One occupied place of a [`StreamLimit`].
#[derive(Debug)]
pub struct StreamSlot {
    in_use: Arc<AtomicUsize>,
    gauge: Option<&'static str>,
}

/// A [`StreamLimit`] was full: each service maps it to RESOURCE_EXHAUSTED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{in_use} are running, the limit {name} is {max}; retry later")]
pub struct LimitExceeded {
    pub name: &'static str,
    pub in_use: usize,
    pub max: usize,
}

impl StreamLimit {
    /// `name` is the configuration key of the limit, quoted in the refusal.
    pub fn new(name: &'static str, max: usize) -> StreamLimit {
        StreamLimit {
            name,
            in_use: Arc::new(AtomicUsize::new(0)),
            max,
            gauge: None,
        }
    }

    /// The same limit, showing its places in use on the gauge `metric` (a name of the catalog).
    pub fn with_gauge(mut self, metric: &'static str) -> StreamLimit {
        self.gauge = Some(metric);
        self
    }

    /// Takes a place, or refuses naming the limit.
    pub fn acquire(&self) -> Result<StreamSlot, LimitExceeded> {
        let taken = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => {
                if let Some(gauge) = self.gauge {
                    metrics::gauge!(gauge).increment(1.0);
                }
                Ok(StreamSlot {
                    in_use: Arc::clone(&self.in_use),
                    gauge: self.gauge,
                })
            }
            Err(in_use) => Err(LimitExceeded {
                name: self.name,
                in_use,
                max: self.max,
            }),
        }
    }

    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }
}

/// A counting limit on concurrent streams per principal; a [`PrincipalSlot`] frees its place when
/// dropped. The table holds only principals with open streams.
#[derive(Debug, Clone)]
pub struct PrincipalStreamLimit {
    name: &'static str,
    in_use: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    max: usize,
}

/// One occupied place of a [`PrincipalStreamLimit`].
#[derive(Debug)]
pub struct PrincipalSlot {
    principal: String,
    in_use: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl PrincipalStreamLimit {
    pub fn new(name: &'static str, max: usize) -> PrincipalStreamLimit {
        PrincipalStreamLimit {
            name,
            in_use: Arc::default(),
            max,
        }
    }

    /// Takes a place for `principal`, or refuses naming the limit.
    pub fn acquire(&self, principal: &str) -> Result<PrincipalSlot, LimitExceeded> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        let count = in_use.entry(principal.to_string()).or_insert(0);
        if *count >= self.max {
            return Err(LimitExceeded {
                name: self.name,
                in_use: *count,
                max: self.max,
            });
        }
        *count += 1;
        Ok(PrincipalSlot {
            principal: principal.to_string(),
            in_use: Arc::clone(&self.in_use),
        })
    }
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = in_use.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                in_use.remove(&self.principal);
            }
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.in_use.fetch_sub(1, Ordering::AcqRel);
        if let Some(gauge) = self.gauge {
            metrics::gauge!(gauge).decrement(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_limit_counts_and_frees() {
        let limit = StreamLimit::new("x.max", 2);
        let a = limit.acquire().unwrap();
        let _b = limit.acquire().unwrap();
        let err = limit.acquire().unwrap_err();
        assert!(err.to_string().contains("x.max"), "{err}");
        drop(a);
        assert_eq!(limit.in_use(), 1);
        assert!(limit.acquire().is_ok());
    }

    #[test]
    fn principal_limit_counts_per_principal() {
        let limit = PrincipalStreamLimit::new("x.per_principal", 1);
        let a = limit.acquire("a").unwrap();
        let err = limit.acquire("a").unwrap_err();
        assert_eq!((err.name, err.in_use, err.max), ("x.per_principal", 1, 1));
        let _b = limit.acquire("b").unwrap();
        drop(a);
        assert!(limit.acquire("a").is_ok());
    }
}
