//! gRPC adapters: proto <-> domain conversion, validation and status codes. Services hold no science;
//! they hand validated domain values to the engines (directly, or through the actor that owns one).
//!
//! Each service has one error enum and one `From<Error> for tonic::Status` (its code mapping); no
//! handler builds a status by hand. Shared here: [`InboundError`] (what a broken request stream
//! means: an oversized or undecodable message, or a transport failure) and [`quote`], the one way an
//! error message quotes an input value (at most [`QUOTE_BYTES`] bytes of it). The counting limits
//! of streams and jobs ([`StreamLimit`], refusing with [`LimitExceeded`]) are
//! [`crate::connections`]'s; table jobs run through the jobs layer ([`crate::jobs`]), whose one
//! classification of their failures ([`JobFailure`]) [`job_status`] maps to a status.

pub mod anonymizer;
pub mod evaluation;
pub mod evaluation_risk;
pub mod location;
pub mod transactions;

/// Largest request message when the daemon does not set `server.max_message_bytes` (tonic's default).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

pub use crate::text::{QUOTE_BYTES, quote};

use crate::jobs::JobFailure;

/// The status of a table job's failure: gRPC's half of the one classification of table-job errors
/// ([`JobFailure`]; the workbench's is `crate::workbench::error::Code::of_failure`).
pub fn job_status(failure: JobFailure, message: String) -> tonic::Status {
    match failure {
        JobFailure::Invalid => tonic::Status::invalid_argument(message),
        JobFailure::Unsatisfiable => tonic::Status::failed_precondition(message),
        JobFailure::Exhausted => tonic::Status::resource_exhausted(message),
        JobFailure::Cancelled => tonic::Status::cancelled(message),
        JobFailure::OverBudget => tonic::Status::deadline_exceeded(message),
        JobFailure::Internal => tonic::Status::internal(message),
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

    /// What the failure means for a table job reading the stream ([`JobFailure`]).
    pub fn failure(&self) -> JobFailure {
        match self {
            InboundError::TooLarge { .. } => JobFailure::Exhausted,
            InboundError::Undecodable { .. } => JobFailure::Invalid,
            InboundError::Transport { .. } => JobFailure::Cancelled,
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
