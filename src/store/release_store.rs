//! The release store, as a trait: where each closed window's outcome (its release, or why it could
//! not be anonymized) is kept for subscribers. The embedded implementation is
//! [`super::released_windows::ReleasedWindows`] (one file per window).
//!
//! # Contract of every implementation
//! 1. **Durable and whole.** [`ReleaseStore::write_once`] returns `Ok` only once the outcome is
//!    durable; a reader sees either no outcome or the complete one.
//! 2. **Once.** A window's outcome is stored once and never replaced: a second `write_once` of the
//!    same window stores nothing and reports [`Stored::Already`], and every reader, before and after
//!    any restart or change of writer, gets the first outcome's exact bytes.
//! 3. **In order.** The writer stores the windows of a stream in increasing id without gaps, so
//!    [`ReleaseStore::next_unreleased`] (one past the highest stored window) is where releasing
//!    resumes, and `0..next_unreleased` can all be read.
//! 4. **In its place.** [`ReleaseStore::read`] returns only an outcome stored for that stream and
//!    window; one that cannot be shown to be (a file copied over another window's) is an error,
//!    never served. (The file store checks the place its header names; JetStream keys each outcome
//!    by a subject naming its stream and window.)

use async_trait::async_trait;

use super::StoreError;

/// What became of a closed window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowOutcome {
    /// The encoded released window, exactly as sent to subscribers.
    Released(Vec<u8>),
    /// The window could not be anonymized; the reason. Its records are never released.
    Failed(String),
}

/// Whether [`ReleaseStore::write_once`] stored the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// This call stored it.
    Written,
    /// The window already had an outcome; nothing was written (contract 2).
    Already,
}

/// The store of window outcomes (see the module doc for the contract).
#[async_trait]
pub trait ReleaseStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores the outcome of window `window_id` of `stream` unless it has one (contracts 1, 2).
    async fn write_once(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError>;

    /// The outcome of window `window_id` of `stream`, if it has one.
    async fn read(&self, stream: &str, window_id: u64)
    -> Result<Option<WindowOutcome>, StoreError>;

    /// One past the highest window of `stream` with an outcome; 0 if none (contract 3).
    async fn next_unreleased(&self, stream: &str) -> Result<u64, StoreError>;
}

/// A shared store is a store (so wrappers such as [`super::faults::FaultyReleases`] take either).
#[async_trait]
impl<R: ReleaseStore + ?Sized> ReleaseStore for std::sync::Arc<R> {
    async fn write_once(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        (**self).write_once(stream, window_id, outcome).await
    }

    async fn read(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        (**self).read(stream, window_id).await
    }

    async fn next_unreleased(&self, stream: &str) -> Result<u64, StoreError> {
        (**self).next_unreleased(stream).await
    }
}
