//! Errors of the location services and their one mapping to `tonic::Status`. Per-request refusals are
//! not errors of the stream: they are [`Rejection`](super::Rejection) events and the stream goes on.
use tonic::Status;

use crate::broker::message::{Rejection, StreamEnd};
use crate::connections::LimitExceeded;
use crate::service::{InboundError, quote};

/// Why a location stream (Submit, Report, Subscribe or Answer) failed or ended early.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LocationError {
    #[error("{0}")]
    Limit(#[from] LimitExceeded),
    #[error("service: unknown service {}; this broker serves {services:?}", quote(.service))]
    UnknownService {
        service: String,
        services: Vec<String>,
    },
    #[error(
        "pseudonym: must be 32 hex digits as received in CloakedRequest (got {})",
        quote(.0)
    )]
    InvalidPseudonym(String),
    #[error("payload: must be at most {limit} bytes (got {got}; location.max_payload_bytes)")]
    PayloadTooLarge { limit: usize, got: usize },
    #[error(
        "the broker's command queue is full ({queue} commands waiting); {what} not accepted, send it again later"
    )]
    Overloaded { queue: usize, what: &'static str },
    /// The broker ended a client's or provider's stream.
    #[error(transparent)]
    Ended(#[from] StreamEnd),
    #[error(
        "payload: an acknowledgement (ack = true) carries no payload (got {got} bytes); send the answer in its own message"
    )]
    AckWithPayload { got: usize },
    #[error("the location broker is shutting down")]
    ShuttingDown,
    /// A Report stream's update that was refused; the `applied` ones before it were applied.
    #[error("{rejection} (update {} of this stream; the {applied} before it were applied)", .applied + 1)]
    UpdateRefused { rejection: Rejection, applied: u64 },
    #[error(transparent)]
    Inbound(#[from] InboundError),
    /// A role or scope rule of the caller's principal.
    #[error(transparent)]
    Denied(#[from] crate::auth::Denial),
    /// Answers for pseudonyms another principal received (already logged and counted).
    #[error(
        "pseudonym: {denied} answers were for pseudonyms principal {} did not receive; an answer is accepted only from the principal whose Subscribe stream received the pseudonym",
        quote(.principal)
    )]
    AnswerNotReceived { denied: u64, principal: String },
}

impl From<LocationError> for Status {
    fn from(err: LocationError) -> Status {
        let message = err.to_string();
        match err {
            LocationError::Limit(_)
            | LocationError::Overloaded { .. }
            | LocationError::Ended(StreamEnd::ClientTooSlow { .. })
            | LocationError::Ended(StreamEnd::ProviderStalled { .. }) => {
                Status::resource_exhausted(message)
            }
            LocationError::Ended(StreamEnd::InboundFailed(status)) => status,
            LocationError::UnknownService { .. }
            | LocationError::InvalidPseudonym(_)
            | LocationError::AckWithPayload { .. }
            | LocationError::PayloadTooLarge { .. } => Status::invalid_argument(message),
            LocationError::ShuttingDown => Status::unavailable(message),
            LocationError::UpdateRefused { rejection, .. } => Status::new(rejection.code, message),
            LocationError::Inbound(inbound) => inbound.status(),
            LocationError::Denied(denial) => denial.into_status(),
            LocationError::AnswerNotReceived { .. } => Status::permission_denied(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_the_broker_ends_is_resource_exhausted_naming_the_limit() {
        let cases = [
            (
                StreamEnd::ClientTooSlow { limit: 4 },
                "location.client_queue",
            ),
            (
                StreamEnd::ProviderStalled {
                    limit_ms: 500,
                    handed_on: 2,
                },
                "location.provider_ack_ms",
            ),
        ];
        for (end, key) in cases {
            let status = Status::from(LocationError::from(end));
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(status.message().contains(key), "{}", status.message());
        }
        let failed = Status::invalid_argument("request: too large");
        let status = Status::from(LocationError::from(StreamEnd::InboundFailed(failed)));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "request: too large");
    }
}
