//! The audit log: a hash-chained, append-only record of every request and outcome.
//!
//! Events are stored in SQLite (WAL) as one line of canonical JSON each (RFC 8785);
//! each line carries `seq` and `prev` (the hash of the line before), and the lines are
//! the leaves of an RFC 9162 Merkle tree whose signed checkpoints let an auditor prove
//! that nothing was edited, removed, inserted or cut off.
//!
//! INVARIANT: only this module knows rusqlite; there is no code path that updates or
//! deletes an event; `append` returns only once the event is durable.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::policy::PolicyVersions;

/// The kinds of event the log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    ToolRequested,
    ToolAllowed,
    ToolDenied,
    ToolExecuted,
    ToolFailed,
    ToolTimeout,
    RunCreated,
    RunStatusChanged,
    PolicyLoaded,
    SafetyLockEngaged,
    SafetyLockReleased,
    /// Shadow mode: the candidate policy decided a call differently from the active one.
    ShadowDivergence,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ToolRequested => "tool_requested",
            EventType::ToolAllowed => "tool_allowed",
            EventType::ToolDenied => "tool_denied",
            EventType::ToolExecuted => "tool_executed",
            EventType::ToolFailed => "tool_failed",
            EventType::ToolTimeout => "tool_timeout",
            EventType::RunCreated => "run_created",
            EventType::RunStatusChanged => "run_status_changed",
            EventType::PolicyLoaded => "policy_loaded",
            EventType::SafetyLockEngaged => "safety_lock_engaged",
            EventType::SafetyLockReleased => "safety_lock_released",
            EventType::ShadowDivergence => "shadow_divergence",
        }
    }
}

/// What a caller hands to [`AuditLog::append`]; the log adds seq, event_id,
/// timestamp_utc, contract_version and prev, and computes the hash.
///
/// INVARIANT: every number in `details` is an integer within +-2^53, so any RFC 8785
/// implementation reproduces the canonical bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub event_type: EventType,
    pub call_id: Option<String>,
    pub run_id: Option<String>,
    pub role_id: Option<String>,
    pub lane_id: Option<String>,
    pub tool_name: Option<String>,
    pub tool_version: Option<String>,
    /// sha256 of the canonical (RFC 8785) arguments.
    pub arguments_hash_sha256: Option<String>,
    /// HMAC-SHA256 of the canonical arguments under the log's commitment key.
    pub arguments_hmac_sha256: Option<String>,
    /// The arguments as kept readable, after the tool's redaction setting.
    pub arguments: Option<Value>,
    pub output_hash_sha256: Option<String>,
    pub error_code: Option<String>,
    pub reason: Option<String>,
    pub failed_step: Option<u8>,
    pub execution_time_ms: Option<u64>,
    pub policy_versions: Option<PolicyVersions>,
    /// Event-specific fields: decision trace, dry_run, artifacts, run record, ...
    pub details: Map<String, Value>,
}

impl NewEvent {
    /// An event of this type with every optional field empty.
    pub fn new(event_type: EventType) -> Self {
        NewEvent {
            event_type,
            call_id: None,
            run_id: None,
            role_id: None,
            lane_id: None,
            tool_name: None,
            tool_version: None,
            arguments_hash_sha256: None,
            arguments_hmac_sha256: None,
            arguments: None,
            output_hash_sha256: None,
            error_code: None,
            reason: None,
            failed_step: None,
            execution_time_ms: None,
            policy_versions: None,
            details: Map::new(),
        }
    }
}

mod interim;
pub use interim::*;
