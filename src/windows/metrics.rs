//! Metric handles of the window manager (names and meaning in [`crate::telemetry::catalog`]).
use crate::telemetry::catalog;

/// Metric handles of one stream.
#[derive(Debug, Clone)]
pub(super) struct StreamMetrics {
    pub stored: metrics::Counter,
    pub duplicate: metrics::Counter,
    pub open_records: metrics::Gauge,
    pub windows_closed: metrics::Counter,
    pub windows_released: metrics::Counter,
    pub windows_failed: metrics::Counter,
    pub windows_unreleased: metrics::Gauge,
}

impl StreamMetrics {
    pub fn new(stream: &str) -> StreamMetrics {
        let stream = stream.to_string();
        StreamMetrics {
            stored: metrics::counter!(catalog::TX_RECORDS, "stream" => stream.clone(), "result" => "stored"),
            duplicate: metrics::counter!(catalog::TX_RECORDS, "stream" => stream.clone(), "result" => "duplicate"),
            open_records: metrics::gauge!(catalog::TX_OPEN_RECORDS, "stream" => stream.clone()),
            windows_closed: metrics::counter!(catalog::TX_WINDOWS_CLOSED, "stream" => stream.clone()),
            windows_released: metrics::counter!(catalog::TX_WINDOWS_RELEASED, "stream" => stream.clone()),
            windows_failed: metrics::counter!(catalog::TX_WINDOWS_FAILED, "stream" => stream.clone()),
            windows_unreleased: metrics::gauge!(catalog::TX_WINDOWS_UNRELEASED, "stream" => stream),
        }
    }
}

/// Counts a record refused before it was stored (`reason`: invalid, too_many_open, unavailable).
pub fn count_refused(reason: &'static str) {
    metrics::counter!(catalog::TX_RECORDS_REFUSED, "reason" => reason).increment(1);
}
