//! The outcome events of two-phase calls: owed in the state store before they are
//! appended, and appended later when the audit log could not take them (by the reaper
//! and at start), each once, never by running a phase again.

use serde_json::json;

use super::{now_ms, phase_event};
use crate::audit::{Appended, AuditError, EventFilter, EventType, NewEvent};
use crate::gateway::Gateway;
use crate::state::phases::{CommitState, PendingCommit, UnrecordedEvent};

impl Gateway {
    /// Records the outcome of a phase that happened upstream: the call's new state and
    /// the event it now owes are made durable together, the events it owed before are
    /// appended (oldest first), then this one. An event the log cannot take stays
    /// owed ([`Gateway::record_owed`]); the phase is never run again to record it.
    pub(super) async fn record_outcome(
        &self,
        call_id: &str,
        state: CommitState,
        mut event: NewEvent,
    ) -> Result<Appended, AuditError> {
        let outcome_id = format!("outcome-{}", uuid::Uuid::new_v4());
        event.details.insert("outcome_id".into(), json!(outcome_id));
        let _one_at_a_time = self.two_phase.recording.lock().await;
        let owed = self
            .two_phase
            .set_owing(call_id, state, Some(owed_event(&event)));
        let id = call_id.to_string();
        self.store_write(call_id, move |s| s.set_outcome(&id, state, &owed, now_ms()))
            .await;
        let appended = match self.append_owed(call_id, Some(&outcome_id)).await {
            Ok(()) => self.audit.append(event).await,
            Err(e) => Err(e),
        };
        match appended {
            Ok(appended) => {
                self.note_recorded(call_id, &outcome_id).await;
                Ok(appended)
            }
            Err(e) => {
                // The reaper tries again soon.
                self.two_phase.wake.notify_one();
                Err(e)
            }
        }
    }

    /// Appends the events the call owes, oldest first, except `skip`; stops at the
    /// first the log cannot take. Each may be in the log already (an append that
    /// timed out after all, a stop before the store noted it): it is looked up there
    /// first and never written twice. Called with `recording` held.
    async fn append_owed(&self, call_id: &str, skip: Option<&str>) -> Result<(), AuditError> {
        let Some(entry) = self.two_phase.entry(call_id) else {
            return Ok(());
        };
        for owed in &entry.unrecorded {
            let outcome_id = owed.outcome_id();
            if skip == Some(outcome_id) {
                continue;
            }
            let Some(event) = owed_to_event(&entry, owed) else {
                tracing::error!(call_id, event_type = %owed.event_type, "an owed two-phase event has an unknown type; it stays owed");
                return Ok(());
            };
            if !self.outcome_in_log(&entry, owed).await? {
                self.audit.append(event).await?;
            }
            self.note_recorded(call_id, outcome_id).await;
        }
        Ok(())
    }

    /// Notes durably that the call's event `outcome_id` is in the log.
    async fn note_recorded(&self, call_id: &str, outcome_id: &str) {
        let left = self.two_phase.recorded(call_id, outcome_id);
        let id = call_id.to_string();
        self.store_write(call_id, move |s| s.set_unrecorded(&id, &left, now_ms()))
            .await;
    }

    /// Whether the log holds the owed event (by its `details.outcome_id`).
    async fn outcome_in_log(
        &self,
        entry: &PendingCommit,
        owed: &UnrecordedEvent,
    ) -> Result<bool, AuditError> {
        let Some(event_type) = EventType::parse(&owed.event_type) else {
            return Ok(false);
        };
        let events = self
            .audit
            .events(EventFilter {
                run_id: Some(entry.run_id.clone()),
                event_types: vec![event_type],
                ..EventFilter::default()
            })
            .await?;
        Ok(events.iter().any(|e| {
            e.value["call_id"] == json!(entry.call_id)
                && e.value["details"]["outcome_id"] == json!(owed.outcome_id())
        }))
    }

    /// Whether the log holds the call's `tool_commit_requested`.
    pub(super) async fn commit_request_in_log(
        &self,
        entry: &PendingCommit,
    ) -> Result<bool, AuditError> {
        let events = self
            .audit
            .events(EventFilter {
                run_id: Some(entry.run_id.clone()),
                event_types: vec![EventType::ToolCommitRequested],
                ..EventFilter::default()
            })
            .await?;
        Ok(events.iter().any(|e| {
            e.value["call_id"] == json!(entry.call_id)
                && e.value["details"]["commit_id"] == json!(entry.commit_id)
        }))
    }

    /// Appends the outcome events the log could not take before; returns whether any
    /// is still owed.
    pub(super) async fn record_owed(&self) -> bool {
        let _one_at_a_time = self.two_phase.recording.lock().await;
        for call_id in self.two_phase.owing() {
            if let Err(e) = self.append_owed(&call_id, None).await {
                tracing::warn!(call_id, error = %e, "owed two-phase events could not be recorded yet");
                return true;
            }
        }
        !self.two_phase.owing().is_empty()
    }
}

/// What the state store keeps of an outcome event until the log holds it.
fn owed_event(event: &NewEvent) -> UnrecordedEvent {
    UnrecordedEvent {
        event_type: event.event_type.as_str().to_string(),
        output_hash_sha256: event.output_hash_sha256.clone(),
        error_code: event.error_code.clone(),
        reason: event.reason.clone(),
        failed_step: event.failed_step,
        details: event.details.clone(),
    }
}

/// The event an owed outcome is appended as (None: a type this build does not know).
fn owed_to_event(entry: &PendingCommit, owed: &UnrecordedEvent) -> Option<NewEvent> {
    let mut event = phase_event(EventType::parse(&owed.event_type)?, entry, "", 0);
    event.output_hash_sha256 = owed.output_hash_sha256.clone();
    event.error_code = owed.error_code.clone();
    event.reason = owed.reason.clone();
    event.failed_step = owed.failed_step;
    event.details = owed.details.clone();
    event.details.insert("recorded_late".into(), json!(true));
    Some(event)
}
