//! The end of a gateway's life: how long a shutdown waits for the calls in flight, and
//! the cancellation of those still running when that time is up.

use std::time::Duration;

use super::Gateway;

impl Gateway {
    /// Cancels every call still running (the end of a shutdown's drain): each stops
    /// executing and closes as `cancelled`, with its closing event.
    pub fn cancel_in_flight(&self) {
        self.shutdown.cancel();
    }

    /// Resolves once [`Gateway::cancel_in_flight`] was called.
    pub(crate) fn shutting_down(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    /// Whether [`Gateway::cancel_in_flight`] was called.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// How long a shutdown waits for the calls in flight, read from the policy loaded
    /// now (a reload may have raised a tool's limits): the longest a call may take
    /// (`timeout_ms_max`) or a commit or rollback (`phases.max_attempts` times
    /// `phases.timeout_ms`), plus a second.
    pub fn drain_time(&self) -> Duration {
        let loaded = self.current();
        let longest = loaded
            .policy
            .tools
            .values()
            .map(|t| {
                let phases = t.phases.as_ref().map_or(0, |p| {
                    p.timeout_ms.saturating_mul(u64::from(p.max_attempts))
                });
                t.limits.timeout_ms_max.max(phases)
            })
            .max()
            .unwrap_or(0);
        Duration::from_millis(longest.saturating_add(1000))
    }
}
