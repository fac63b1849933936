//! gRPC adapters: proto <-> domain conversion, validation and status codes. Services hold no science;
//! they hand validated domain values to the engines (directly, or through the actor that owns one).

pub mod evaluation;
pub mod location;
pub mod table;
pub mod transactions;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A counting limit on concurrent streams of one kind; a [`StreamSlot`] frees its place when dropped.
#[derive(Debug, Clone)]
pub struct StreamLimit {
    name: &'static str,
    in_use: Arc<AtomicUsize>,
    max: usize,
}

/// One occupied place of a [`StreamLimit`].
#[derive(Debug)]
pub struct StreamSlot {
    in_use: Arc<AtomicUsize>,
}

impl StreamLimit {
    /// `name` is the configuration key of the limit, quoted in the RESOURCE_EXHAUSTED message.
    pub fn new(name: &'static str, max: usize) -> StreamLimit {
        StreamLimit {
            name,
            in_use: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Takes a place, or answers RESOURCE_EXHAUSTED naming the limit.
    #[allow(clippy::result_large_err)]
    pub fn acquire(&self) -> Result<StreamSlot, tonic::Status> {
        let taken = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(StreamSlot {
                in_use: Arc::clone(&self.in_use),
            }),
            Err(n) => Err(tonic::Status::resource_exhausted(format!(
                "{n} streams are open, the limit {} is {}",
                self.name, self.max
            ))),
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

    /// Takes a place for `principal`, or answers RESOURCE_EXHAUSTED naming the limit.
    #[allow(clippy::result_large_err)]
    pub fn acquire(&self, principal: &str) -> Result<PrincipalSlot, tonic::Status> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        let count = in_use.entry(principal.to_string()).or_insert(0);
        if *count >= self.max {
            return Err(tonic::Status::resource_exhausted(format!(
                "principal {principal:?} already has {count} streams open, the limit {} is {}",
                self.name, self.max
            )));
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
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("x.max"), "{}", err.message());
        drop(a);
        assert_eq!(limit.in_use(), 1);
        assert!(limit.acquire().is_ok());
    }

    #[test]
    fn principal_limit_counts_per_principal() {
        let limit = PrincipalStreamLimit::new("x.per_principal", 1);
        let a = limit.acquire("a").unwrap();
        let err = limit.acquire("a").unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("x.per_principal"));
        let _b = limit.acquire("b").unwrap();
        drop(a);
        assert!(limit.acquire("a").is_ok());
    }
}
