//! The audit events and refusals of two-phase calls: what a prepared call's answer
//! says about its commit, the event of each phase, and the refusal of a commit request
//! or of a failed phase.

use serde_json::{Map, Value, json};

use super::{bounded, bounded_error, rfc3339};
use crate::adapter::{ExecError, Phase};
use crate::audit::{EventType, NewEvent};
use crate::diagnostic::{Reason, Refusal};
use crate::requests::Commit;
use crate::state::phases::PendingCommit;

/// What the response and closing event of a prepared call say about it.
pub(super) fn prepared_details(row: &PendingCommit) -> Map<String, Value> {
    let mut details = Map::new();
    details.insert("phase".into(), json!("prepared"));
    details.insert(
        "commit".into(),
        json!({
            "commit_id": row.commit_id,
            "deadline": rfc3339(row.deadline_ms),
            "deadline_unix_ms": row.deadline_ms,
            "commit_url": format!("/v1/tool-calls/{}/commit", row.call_id),
        }),
    );
    details
}

/// An audit event of a phase of a prepared call.
pub(super) fn phase_event(
    event_type: EventType,
    entry: &PendingCommit,
    trigger: &str,
    attempts: u32,
) -> NewEvent {
    let mut event = NewEvent::new(event_type);
    event.call_id = Some(entry.call_id.clone());
    event.run_id = Some(entry.run_id.clone());
    event.role_id = Some(entry.role_id.clone());
    event.lane_id = Some(entry.lane_id.clone());
    event.tool_name = Some(entry.tool_name.clone());
    event.tool_version = Some(entry.tool_version.clone());
    event
        .details
        .insert("commit_id".into(), json!(entry.commit_id));
    event.details.insert("trigger".into(), json!(trigger));
    event.details.insert("attempts".into(), json!(attempts));
    event
        .details
        .insert("commit_deadline".into(), json!(rfc3339(entry.deadline_ms)));
    event
        .details
        .insert("commit_token_sha256".into(), json!(entry.token_sha256));
    event
}

/// Records the sandbox a command phase's process ran under (`details.sandbox`).
pub(super) fn with_sandbox(event: &mut NewEvent, sandbox: Option<Map<String, Value>>) {
    if let Some(sandbox) = sandbox {
        event
            .details
            .insert("sandbox".into(), Value::Object(sandbox));
    }
}

/// The `tool_commit_refused` event of a refused commit request.
pub(super) fn refusal_event(
    call_id: &str,
    known: Option<&PendingCommit>,
    request: &Commit,
) -> NewEvent {
    let mut event = match known {
        Some(entry) => phase_event(EventType::ToolCommitRefused, entry, "request", 0),
        None => {
            let mut event = NewEvent::new(EventType::ToolCommitRefused);
            event.call_id = Some(bounded(call_id));
            event
                .details
                .insert("commit_id".into(), json!(bounded(&request.commit_id)));
            event
        }
    };
    event.details.insert(
        "requested_by".into(),
        json!({ "role_id": bounded(&request.role_id), "run_id": bounded(&request.run_id) }),
    );
    event
}

/// The `tool_commit_refused` event of an authenticated commit request whose body is
/// malformed: the call it names (bounded), nothing it sent.
pub(super) fn malformed_event(call_id: &str) -> NewEvent {
    let mut event = NewEvent::new(EventType::ToolCommitRefused);
    event.call_id = Some(bounded(call_id));
    event
}

/// Writes a refusal into its closing event: the error code, reason and step of its
/// diagnostic, its message and its details.
pub(crate) fn add_refusal(event: &mut NewEvent, refusal: &Refusal) {
    let diagnostic = refusal.diagnostic();
    event.error_code = Some(diagnostic.error_code.as_str().to_string());
    event.reason = Some(refusal.reason.as_str().to_string());
    event.failed_step = Some(diagnostic.failed_step);
    event
        .details
        .insert("message".into(), json!(refusal.message));
    event
        .details
        .insert("diagnostic_details".into(), refusal.details.clone());
}

/// The refusal of a failed commit or rollback: the upstream's error, bounded.
pub(super) fn phase_refusal(
    reason: Reason,
    entry: &PendingCommit,
    phase: Phase,
    error: &ExecError,
    attempts: u32,
) -> Refusal {
    let upstream = match error {
        ExecError::Timeout => "did not answer within the phase's timeout_ms".to_string(),
        ExecError::Cancelled => "cancelled".to_string(),
        ExecError::Busy(m)
        | ExecError::DependencyDown(m)
        | ExecError::Unreachable(m)
        | ExecError::Failed(m)
        | ExecError::OutputNotJson(m)
        | ExecError::NotImplemented(m)
        | ExecError::CallerJwtRequired(m)
        | ExecError::CredentialRefused(m) => m.clone(),
        ExecError::ArgumentUnsafe { problem, .. } => problem.clone(),
        ExecError::RateLimited { message, .. } => message.clone(),
        ExecError::SandboxUnavailable { guarantee, detail } => {
            format!("not started: its sandbox's `{guarantee}` guarantee cannot be held: {detail}")
        }
        ExecError::ResourceLimit { limit, detail } => {
            format!("stopped at its sandbox's `{limit}` limit: {detail}")
        }
    };
    Refusal::new(
        reason,
        format!(
            "the {} of call `{}` (tool `{}`) failed after {attempts} attempt(s)",
            phase.as_str(),
            entry.call_id,
            entry.tool_name
        ),
    )
    .with_details(json!({
        "phase": phase.as_str(),
        "attempts": attempts,
        "upstream_error": bounded_error(&upstream),
    }))
}
