//! The broker's clock: Unix milliseconds read from tokio's clock, so tests can pause time. The
//! actor stamps arrival times and schedules every deadline with it.
use std::time::Duration;

/// The broker's clock: Unix milliseconds read from tokio's clock, so tests can pause time.
#[derive(Debug, Clone, Copy)]
pub struct BrokerClock {
    start: tokio::time::Instant,
    start_unix_ms: i64,
}

impl BrokerClock {
    pub fn new() -> BrokerClock {
        let start_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        BrokerClock {
            start: tokio::time::Instant::now(),
            start_unix_ms,
        }
    }

    pub fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.start_unix_ms.saturating_add(elapsed)
    }

    /// The tokio instant at which the clock reads `unix_ms`.
    pub fn instant_at(&self, unix_ms: i64) -> tokio::time::Instant {
        let offset = unix_ms.saturating_sub(self.start_unix_ms).max(0);
        self.start + Duration::from_millis(offset.unsigned_abs())
    }
}

impl Default for BrokerClock {
    fn default() -> Self {
        Self::new()
    }
}
