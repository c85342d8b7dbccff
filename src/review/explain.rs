//! `toolgate policy explain`: runs the authorization steps for one request without
//! executing anything, and prints each step with pass or fail and why.

use serde_json::{Map, Value};

use crate::call::CallRequest;
use crate::policy::{PolicyVersions, RunStatus};
use crate::runs::RunRecord;

/// A run for an offline decision: bound to the call's scope keys that name a case or
/// matter, pinned to the loaded policy.
pub fn offline_run(
    scope: &Map<String, Value>,
    status: RunStatus,
    versions: &PolicyVersions,
) -> RunRecord {
    RunRecord {
        run_id: "offline-run".into(),
        status,
        scope: scope
            .iter()
            .filter(|(_, v)| v.is_string())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        policy_versions: versions.clone(),
        created_at: String::new(),
        created_by: "offline".into(),
    }
}

/// A request for an offline decision.
pub fn offline_request(
    role: &str,
    lane: &str,
    tool: &str,
    scope: Map<String, Value>,
    arguments: Value,
) -> CallRequest {
    CallRequest {
        role_id: role.into(),
        run_id: "offline-run".into(),
        lane_id: lane.into(),
        tool_name: tool.into(),
        arguments,
        scope,
        timeout_ms: None,
        idempotency_key: None,
        dry_run: true,
        approval_id: None,
    }
}
