//! Extraction: rebuilds each recorded call (its request, its run as it was, and what
//! was decided) from the audit log's events, in seq order.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::call::{Decision, Verdict};
use crate::canonical::{sha256_hex, to_canonical_bytes};
use crate::policy::RunStatus;
use crate::runs::RunRecord;

/// Recorded reasons that are not policy decisions a candidate could change.
const NOT_REPLAYABLE: [(&str, &str); 6] = [
    ("request_malformed", "the request was malformed"),
    ("request_too_large", "the request was too large"),
    ("safety_lock_engaged", "the safety lock was engaged"),
    ("credential_missing", "bearer tokens are not recorded"),
    ("credential_invalid", "bearer tokens are not recorded"),
    (
        "policy_version_mismatch",
        "the run was pinned to other policy versions",
    ),
];

/// How much of a call's arguments the log kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arguments {
    /// The arguments hash to the recorded `arguments_hash_sha256`: replayed exactly.
    Intact,
    /// Some values were redacted (or numbers kept in portable form).
    Altered,
    /// Not kept (hash only, or refused before the tool was known).
    Absent,
}

/// What the log says was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Decided(Verdict),
    /// Not a policy decision; why.
    Skipped(&'static str),
}

/// One recorded call, rebuilt from the log.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    /// The seq of the first event of the call.
    pub seq: u64,
    pub call_id: String,
    pub timestamp: Option<String>,
    pub role_id: String,
    pub lane_id: String,
    pub tool_name: String,
    pub run_id: String,
    pub scope: Map<String, Value>,
    pub arguments: Option<Value>,
    pub kept: Arguments,
    pub dry_run: bool,
    /// The run as it was when the call was made.
    pub run: Option<RunRecord>,
    pub recorded: Recorded,
}

/// Rebuilds calls from events in seq order (run events and tool events). At most
/// `limit` calls are returned; the flag says whether more were left out.
pub fn recorded_calls(events: &[Value], limit: usize) -> (Vec<RecordedCall>, bool) {
    let mut log = CallLog::default();
    let mut calls = Vec::new();
    for event in events {
        if let Some(call) = log.push(event) {
            if calls.len() >= limit {
                return (calls, true);
            }
            calls.push(call);
        }
    }
    (calls, false)
}

/// Follows the log in seq order: keeps the runs current and turns the first event of
/// each call into a [`RecordedCall`].
#[derive(Debug, Default)]
pub struct CallLog {
    runs: HashMap<String, RunRecord>,
    seen: HashSet<String>,
}

impl CallLog {
    /// Takes the next event; returns the call it starts, if it starts one.
    pub fn push(&mut self, event: &Value) -> Option<RecordedCall> {
        let kind = event["type"].as_str().unwrap_or_default();
        match kind {
            "run_created" => {
                if let Ok(run) =
                    serde_json::from_value::<RunRecord>(event["details"]["run"].clone())
                {
                    self.runs.insert(run.run_id.clone(), run);
                }
                None
            }
            "run_status_changed" => {
                let status = serde_json::from_value::<RunStatus>(event["details"]["to"].clone());
                if let (Some(run), Ok(status)) = (
                    event["run_id"]
                        .as_str()
                        .and_then(|id| self.runs.get_mut(id)),
                    status,
                ) {
                    run.status = status;
                }
                None
            }
            "tool_requested" | "tool_allowed" | "tool_denied" | "tool_executed" | "tool_failed"
            | "tool_timeout" => {
                let call_id = event["call_id"].as_str()?;
                if !self.seen.insert(call_id.to_string()) {
                    return None;
                }
                Some(call(event, kind, call_id, &self.runs))
            }
            _ => None,
        }
    }
}

fn text(event: &Value, key: &str) -> String {
    event[key].as_str().unwrap_or_default().to_string()
}

/// The call whose first event is `event`.
fn call(
    event: &Value,
    kind: &str,
    call_id: &str,
    runs: &HashMap<String, RunRecord>,
) -> RecordedCall {
    let details = &event["details"];
    let (arguments, kept) = match &event["arguments"] {
        Value::Object(_) => {
            let intact = event["arguments_hash_sha256"].as_str()
                == Some(sha256_hex(&to_canonical_bytes(&event["arguments"])).as_str());
            let kept = if intact {
                Arguments::Intact
            } else {
                Arguments::Altered
            };
            (Some(event["arguments"].clone()), kept)
        }
        _ => (None, Arguments::Absent),
    };
    let step = event["failed_step"].as_u64();
    let reason = event["reason"].as_str();
    let recorded = match (kind, step, reason) {
        ("tool_requested" | "tool_allowed" | "tool_executed", _, _) => {
            Recorded::Decided(Verdict::of(None))
        }
        (_, Some(step), Some(reason)) if step <= 8 => {
            match NOT_REPLAYABLE.iter().find(|(r, _)| *r == reason) {
                Some((_, why)) => Recorded::Skipped(why),
                None => Recorded::Decided(Verdict {
                    decision: Decision::Deny,
                    reason: Some(reason.to_string()),
                    step: u8::try_from(step).ok(),
                    message: details["message"].as_str().map(str::to_string),
                }),
            }
        }
        // Refused after the decision (executing, recording): it had been allowed.
        (_, Some(_), _) => Recorded::Decided(Verdict::of(None)),
        _ => Recorded::Skipped("the event does not say where the call stopped"),
    };
    let run_id = text(event, "run_id");
    RecordedCall {
        seq: event["seq"].as_u64().unwrap_or_default(),
        call_id: call_id.to_string(),
        timestamp: event["timestamp_utc"].as_str().map(str::to_string),
        role_id: text(event, "role_id"),
        lane_id: text(event, "lane_id"),
        tool_name: text(event, "tool_name"),
        scope: details["scope"].as_object().cloned().unwrap_or_default(),
        arguments,
        kept,
        dry_run: details["dry_run"] == Value::Bool(true),
        run: runs.get(&run_id).cloned(),
        run_id,
        recorded,
    }
}
