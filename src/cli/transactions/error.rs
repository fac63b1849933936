//! The one error of the `cloakd transactions` commands: each names the file and line, the flag, or
//! the engine's refusal, and the command exits non-zero with it.
use crate::transactions::AnonymizeError;

/// Why a batch command failed.
#[derive(Debug, thiserror::Error)]
pub enum TransactionsCliError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {rule}")]
    Line {
        path: String,
        line: usize,
        rule: String,
    },
    #[error("{field}: {rule}")]
    Argument { field: &'static str, rule: String },
    #[error(
        "{sensitive}: has {constraint_lines} lines but {input} has {records} records; line i must hold the sensitive items of record i"
    )]
    LineCountMismatch {
        sensitive: String,
        constraint_lines: usize,
        input: String,
        records: usize,
    },
    #[error("{input}: {source}")]
    Engine {
        input: String,
        source: AnonymizeError,
    },
}
