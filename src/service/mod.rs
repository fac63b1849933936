//! gRPC adapters: proto <-> domain conversion, validation and status codes. Services hold no science;
//! they hand validated domain values to the engines (directly, or through the actor that owns one).
//!
//! Each service has one error enum and one `From<Error> for tonic::Status` (its code mapping); no
//! handler builds a status by hand. Shared here: [`StreamLimit`] (a counting limit whose refusal is
//! [`LimitExceeded`]), [`InboundError`] (what a broken request stream means: an oversized or
//! undecodable message, or a transport failure), [`quote`], the one way an error message quotes an
//! input value (at most [`QUOTE_BYTES`] bytes of it), and [`run_job`], the one way long engine work
//! (a table job) runs: on a blocking thread, holding its limiter slot, stopped through its
//! cancellation flag when the caller goes away, its deadline passes or the server's budget is spent.

pub mod evaluation;
pub mod evaluation_risk;
pub mod frontier;
pub mod jobs;
pub mod location;
pub mod table;
pub mod transactions;
pub mod workbench;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Largest request message when the daemon does not set `server.max_message_bytes` (tonic's default).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

pub use crate::text::{QUOTE_BYTES, quote};

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

/// Sets its flag when dropped: the engine work watching the flag stops at its next look.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Why [`run_job`] has no result of the work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobStopped {
    /// The work ran past the server's budget and was stopped.
    #[error("the job ran longer than {budget_ms} ms and was stopped")]
    OverBudget { budget_ms: u64 },
    /// The work panicked (a bug): the job fails, the daemon lives.
    #[error("the job's thread failed: {0}")]
    Panicked(String),
}

/// Runs `work` on a blocking thread, handing it a cancellation flag that turns true when the
/// returned future is dropped (tonic drops a call's future when its client goes away or its
/// deadline passes) or when `budget` has passed. `slot` (the job's place of its limiter) is held
/// by the thread and freed when `work` returns, so the limiter counts exactly the jobs still
/// computing, and a cancelled job frees its place as soon as the engine looks at the flag. The
/// slot comes back with the result, for a job that still has a response to send.
pub async fn run_job<T: Send + 'static>(
    slot: StreamSlot,
    budget: Duration,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Result<(T, StreamSlot), JobStopped> {
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(Arc::clone(&cancelled));
    let thread = tokio::task::spawn_blocking(move || (work(&cancelled), slot));
    match tokio::time::timeout(budget, thread).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(JobStopped::Panicked(e.to_string())),
        // `_cancel` sets the flag on return.
        Err(_) => Err(JobStopped::OverBudget {
            budget_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// Why reading a request stream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InboundError {
    /// A message longer than `server.max_message_bytes` (or than it once decompressed).
    #[error("message: larger than the limit server.max_message_bytes = {limit} bytes ({detail})")]
    TooLarge { limit: usize, detail: String },
    /// A message that is not a valid protobuf of the method's type, or broken gRPC framing.
    #[error("message: cannot be decoded ({detail})")]
    Undecodable { detail: String },
    /// The transport failed (the client reset the stream or the connection broke): nobody is left to
    /// tell, the stream just ends.
    #[error("the request stream broke: {detail}")]
    Transport { detail: String },
}

impl InboundError {
    /// Classifies the error a request stream (`tonic::Streaming`) returned. tonic reports an
    /// oversized message as OUT_OF_RANGE (RESOURCE_EXHAUSTED once decompressed), and a decode or
    /// framing error as INTERNAL without a source; transport errors carry their h2/hyper source.
    pub fn classify(status: &tonic::Status, limit: usize) -> InboundError {
        let detail = status.message().chars().take(200).collect::<String>();
        match status.code() {
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
                InboundError::TooLarge { limit, detail }
            }
            tonic::Code::Internal if std::error::Error::source(status).is_none() => {
                InboundError::Undecodable { detail }
            }
            _ => InboundError::Transport { detail },
        }
    }

    /// The status that ends the stream (a transport failure has no reader, but gets one anyway).
    pub fn status(&self) -> tonic::Status {
        match self {
            InboundError::TooLarge { .. } => tonic::Status::resource_exhausted(self.to_string()),
            InboundError::Undecodable { .. } => tonic::Status::invalid_argument(self.to_string()),
            InboundError::Transport { .. } => tonic::Status::cancelled(self.to_string()),
        }
    }
}

/// Reads a request stream to its end in the background, discarding what comes. A stream that failed
/// is drained rather than dropped: HTTP/2 then never buffers frames nobody reads (which would spend
/// the connection's frame budget and make it close every stream of the connection), and no reset is
/// sent while the client is still sending.
pub fn drain<T: Send + 'static>(mut inbound: tonic::Streaming<T>) {
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
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

    #[test]
    fn inbound_errors_are_classified() {
        let too_large = tonic::Status::out_of_range("Error, decoded message length too large");
        assert!(matches!(
            InboundError::classify(&too_large, 4),
            InboundError::TooLarge { limit: 4, .. }
        ));
        let bad = tonic::Status::internal("failed to decode Protobuf message");
        let classified = InboundError::classify(&bad, 4);
        assert!(matches!(classified, InboundError::Undecodable { .. }));
        assert_eq!(classified.status().code(), tonic::Code::InvalidArgument);
        let gone = tonic::Status::from_error(Box::new(std::io::Error::other("reset")));
        assert!(matches!(
            InboundError::classify(&gone, 4),
            InboundError::Transport { .. }
        ));
    }
}
