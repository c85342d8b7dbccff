//! Observability: Prometheus metrics ([`metrics`]), traces and logs ([`trace`]), and the
//! JSON log line ([`json_log`]).
//!
//! INVARIANT: observing a call never changes its outcome and never blocks it: metrics
//! are atomic updates, logs are one line per call, and spans are exported in the
//! background (or not at all when no OTLP endpoint is configured).

pub mod json_log;
pub mod log_writer;
pub mod metrics;
pub mod trace;

pub use metrics::Metrics;
