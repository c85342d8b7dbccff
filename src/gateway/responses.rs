//! The typed answers of the gateway's admin API, serialized by the server
//! (`server::respond`). Their JSON is the API's (docs/api.md): a field added or
//! renamed here changes what clients read.

use serde::Serialize;
use serde_json::Value;

use crate::authz::RunScopeCheck;
use std::sync::Arc;

use crate::policy::{Determinism, Limits, PolicySource, PolicyVersions};
use crate::runs::RunRecord;

/// `POST /v1/policy/reload`'s answer: the versions now served.
#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    /// Always true: a candidate that does not load is refused, never answered.
    pub reloaded: bool,
    pub policy_versions: PolicyVersions,
}

/// `GET /v1/policy`'s answer: the versions and the source of the policy served.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyServed {
    pub policy_versions: PolicyVersions,
    pub source: PolicySource,
}

/// `GET /v1/runs`' answer: a page of runs in run-id order.
#[derive(Debug, Clone, Serialize)]
pub struct RunPage {
    pub runs: Vec<RunRecord>,
    /// The run id the next page starts after (None: this is the last page).
    pub next_cursor: Option<String>,
}

/// `POST /v1/runs/{run_id}/repin`'s answer: the run, whether it was re-pinned (false:
/// already on the loaded versions), the versions it left, and its scope's check.
#[derive(Debug, Clone, Serialize)]
pub struct Repinned {
    pub run: RunRecord,
    pub repinned: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_policy_versions: Option<PolicyVersions>,
    pub scope_check: RunScopeCheck,
}

/// `GET /v1/audit/events`' answer: the events (each the audit line's JSON) and the
/// `after_seq` of the next page (the last event's `seq`; None when there is none).
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvents {
    pub events: Vec<Value>,
    pub next_after_seq: Option<u64>,
}

/// `GET /v1/tools`' answer (and the MCP front's `tools/list`): the tools a role may use
/// in a lane.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCatalog {
    pub role_id: String,
    pub lane_id: String,
    pub required_scope_keys: Vec<String>,
    pub tools: Vec<CatalogTool>,
}

/// One tool of a [`ToolCatalog`], with its schemas and a prompt-ready description.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogTool {
    pub tool_name: String,
    pub version: String,
    pub description: String,
    pub determinism: Determinism,
    pub idempotent: bool,
    pub timeout_default_ms: u64,
    pub limits: Limits,
    /// The lane's and the tool's, sorted, each once.
    pub required_scope_keys: Vec<String>,
    /// What else a call must satisfy (the lane's, then the tool's).
    pub conditions: Vec<CatalogCondition>,
    pub input_schema: Arc<Value>,
    pub output_schema: Arc<Value>,
    pub prompt: String,
}

/// A CEL condition as the catalog shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogCondition {
    pub name: String,
    pub expr: String,
    pub message: String,
}
