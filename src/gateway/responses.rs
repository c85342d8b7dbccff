//! The typed answers of the gateway's admin API, serialized by the server
//! (`server::respond`). Their JSON is the API's (docs/api.md): a field added or
//! renamed here changes what clients read.

use serde::Serialize;
use serde_json::Value;

use crate::authz::RunScopeCheck;
use crate::policy::{PolicySource, PolicyVersions};
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
