//! The audit log's headroom as the gateway sees it (`capacity.rs` samples it): the
//! recorded refusal at step 1, and the unrecorded one the fronts give under the half of
//! the reserve kept for admin changes.

use super::Gateway;
use crate::capacity::CapacityOptions;
use crate::diagnostic::Refusal;

impl Gateway {
    /// The refusal of a new call when the audit log has no headroom left.
    pub fn capacity_refusal(&self) -> Option<Refusal> {
        self.capacity.as_ref().and_then(|c| c.refusal())
    }

    /// The refusal of a call in front of the pipeline, unrecorded, once the audit
    /// log's headroom is down to the half of the reserve kept for admin changes
    /// (`capacity::RECORDED_REFUSALS_FLOOR`); counted in `/metrics`.
    pub fn unrecorded_refusal(&self) -> Option<Refusal> {
        let refusal = self.capacity.as_ref()?.unrecorded_refusal()?;
        self.metrics.count_unrecorded();
        Some(refusal)
    }

    /// The audit log's headroom, when it is bounded.
    pub fn audit_headroom(&self) -> Option<(crate::capacity::Headroom, CapacityOptions)> {
        self.capacity
            .as_ref()
            .map(|c| (c.headroom(), c.options().clone()))
    }
}
