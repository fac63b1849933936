//! The workbench API's one error type and its one mapping to an HTTP response:
//! `{"error":{"code":"...","field":"...","message":"..."}}` with the status of the code.
//!
//! Invariants: every refusal of an `/api/` route goes through [`ApiError`]'s `IntoResponse`; the
//! message names the field and the rule, quotes input through [`crate::text::quote`] and never holds
//! a token; a table job's failure ([`JobFailure`]) has one code ([`Code::of_failure`]) and a code
//! one failure ([`Code::failure`], its job's outcome); every response of this mapping carries `Cache-Control: no-store` (the router adds the
//! security headers).
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::jobs::JobFailure;

/// The code of an API error (gRPC's names, so both protocols say the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    /// A body not sent as `application/json`: 415.
    UnsupportedMediaType,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    /// A body past `tables.max_bytes`, or a job past `tables.max_job_bytes`: 413.
    TooLarge,
    /// No job place free, or another limit: 429.
    ResourceExhausted,
    FailedPrecondition,
    Cancelled,
    DeadlineExceeded,
    /// A request body that stopped arriving (`ui.idle_timeout_ms`): 408.
    RequestTimeout,
    Internal,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument | Code::UnsupportedMediaType => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::TooLarge | Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Cancelled => "cancelled",
            Code::DeadlineExceeded | Code::RequestTimeout => "deadline_exceeded",
            Code::Internal => "internal",
        }
    }

    /// The code of a table job's failure: the workbench's half of the one classification of
    /// table-job errors ([`JobFailure`]; gRPC's is `crate::service::job_status`).
    pub fn of_failure(failure: JobFailure) -> Code {
        match failure {
            JobFailure::Invalid => Code::InvalidArgument,
            JobFailure::Unsatisfiable => Code::FailedPrecondition,
            JobFailure::Exhausted => Code::ResourceExhausted,
            JobFailure::Cancelled => Code::Cancelled,
            JobFailure::OverBudget => Code::DeadlineExceeded,
            JobFailure::Internal => Code::Internal,
        }
    }

    /// The failure this code says, for counting a job's outcome.
    pub fn failure(self) -> JobFailure {
        match self {
            Code::InvalidArgument | Code::UnsupportedMediaType => JobFailure::Invalid,
            Code::FailedPrecondition => JobFailure::Unsatisfiable,
            Code::TooLarge | Code::ResourceExhausted => JobFailure::Exhausted,
            Code::Cancelled => JobFailure::Cancelled,
            Code::DeadlineExceeded | Code::RequestTimeout => JobFailure::OverBudget,
            Code::Unauthenticated | Code::PermissionDenied | Code::NotFound | Code::Internal => {
                JobFailure::Internal
            }
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::FailedPrecondition => StatusCode::CONFLICT,
            // nginx's "client closed request": the sweep was cancelled.
            Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::CONFLICT),
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A refused or failed API call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: Code,
    /// The request field at fault, when one is.
    pub field: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, field: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    /// Bad input in `field`: the message names the field and the rule.
    pub fn invalid(field: &str, rule: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            Code::InvalidArgument,
            Some(field),
            format!("{field}: {rule}"),
        )
    }

    pub fn not_found(field: &str, what: &str, id: &str) -> ApiError {
        ApiError::new(
            Code::NotFound,
            Some(field),
            format!(
                "{field}: no {what} {} (rule: ids are those this principal created and still kept; see ui.max_tables and ui.max_sweeps)",
                crate::text::quote(id)
            ),
        )
    }

    /// The job's memory budget (`tables.max_job_bytes`) refused what `e` names: 413.
    pub fn memory(e: &crate::budget::BudgetExceeded) -> ApiError {
        ApiError::new(Code::TooLarge, None, e.to_string())
    }

    pub fn internal(message: impl std::fmt::Display) -> ApiError {
        ApiError::new(Code::Internal, None, format!("internal error: {message}"))
    }

    /// The error as the JSON value of a response body (also a sweep's `error`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut error = serde_json::json!({
            "code": self.code.name(),
            "message": self.message,
        });
        if let Some(field) = &self.field {
            error["field"] = serde_json::Value::String(field.clone());
        }
        error
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.to_json() });
        super::json_response(self.status(), &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Outcome;

    #[test]
    fn every_job_failure_has_a_code_that_says_it_back() {
        for failure in [
            JobFailure::Invalid,
            JobFailure::Unsatisfiable,
            JobFailure::Exhausted,
            JobFailure::Cancelled,
            JobFailure::OverBudget,
            JobFailure::Internal,
        ] {
            assert_eq!(Code::of_failure(failure).failure(), failure);
        }
        assert_eq!(Code::TooLarge.failure(), JobFailure::Exhausted);
        assert_eq!(Code::RequestTimeout.failure().outcome(), Outcome::Cancelled);
    }
}
