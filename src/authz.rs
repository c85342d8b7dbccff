//! The authorization checks of pipeline steps 2-8, as pure functions.
//!
//! Each function takes the data it decides on (the policy snapshot, the request, the
//! run record) and returns what it matched or a [`Refusal`]. No I/O, no clock, no
//! randomness: the same input always gives the same decision, which is what makes
//! `policy explain`, `policy test`, replay and shadow decisions possible.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::diagnostic::{Reason, Refusal};
use std::collections::BTreeSet;

use crate::policy::{Admin, Credential, Lane, Policy, PolicyVersions, ProhibitedBy, Role, Tool};
use crate::runs::RunRecord;

/// The most schema violations listed in one refusal.
const MAX_VIOLATIONS: usize = 50;

/// Whether `token` proves `credential`: sha256 of the token compared in constant time.
fn credential_matches(credential: &Credential, token: &str) -> bool {
    let expected = match credential {
        Credential::TokenSha256(hex) => Some(hex.as_str()),
        Credential::TokenEnv { sha256, .. } => sha256.as_deref(),
    };
    let Some(expected) = expected else {
        return false;
    };
    let actual = hex::encode(Sha256::digest(token.as_bytes()));
    actual.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Step 2: the caller proves it holds `role_id`.
pub fn verify_identity<'p>(
    policy: &'p Policy,
    role_id: &str,
    token: Option<&str>,
) -> Result<&'p Role, Refusal> {
    let Some(token) = token else {
        return Err(Refusal::new(
            Reason::CredentialMissing,
            "no bearer token in the Authorization header",
        ));
    };
    let Some(role) = policy.roles.get(role_id) else {
        return Err(Refusal::new(
            Reason::RoleUnknown,
            format!("role `{role_id}` is not defined"),
        ));
    };
    if !credential_matches(&role.credential, token) {
        return Err(Refusal::new(
            Reason::CredentialInvalid,
            format!("the bearer token does not prove role `{role_id}`"),
        ));
    }
    find_role(policy, role_id)
}

/// Step 2 without a credential (offline decisions): the role exists and is enabled.
pub fn find_role<'p>(policy: &'p Policy, role_id: &str) -> Result<&'p Role, Refusal> {
    let Some(role) = policy.roles.get(role_id) else {
        return Err(Refusal::new(
            Reason::RoleUnknown,
            format!("role `{role_id}` is not defined"),
        ));
    };
    if !role.enabled {
        return Err(Refusal::new(
            Reason::RoleDisabled,
            format!("role `{role_id}` is disabled"),
        ));
    }
    Ok(role)
}

/// Admin endpoints: the caller proves it is one of the policy's admins. Every admin is
/// compared so timing does not tell which one matched.
pub fn verify_admin<'p>(policy: &'p Policy, token: Option<&str>) -> Result<&'p Admin, Refusal> {
    let Some(token) = token else {
        return Err(Refusal::new(
            Reason::CredentialMissing,
            "no bearer token in the Authorization header",
        ));
    };
    let mut found = None;
    for admin in &policy.admins {
        if credential_matches(&admin.credential, token) && found.is_none() {
            found = Some(admin);
        }
    }
    found.ok_or_else(|| {
        Refusal::new(
            Reason::CredentialInvalid,
            "the bearer token is not an admin credential",
        )
    })
}

/// Step 3: the run exists and is pinned to the loaded policy versions.
pub fn verify_run<'r>(
    run: Option<&'r RunRecord>,
    run_id: &str,
    loaded: &PolicyVersions,
) -> Result<&'r RunRecord, Refusal> {
    let Some(run) = run else {
        return Err(Refusal::new(
            Reason::RunNotFound,
            format!("run `{run_id}` does not exist"),
        ));
    };
    if &run.policy_versions != loaded {
        let pinned = &run.policy_versions;
        return Err(Refusal::new(
            Reason::PolicyVersionMismatch,
            format!("run `{run_id}` is pinned to other policy versions than the loaded ones"),
        )
        .with_details(json!({
            "run_policy_versions": pinned,
            "loaded_policy_versions": loaded,
        })));
    }
    Ok(run)
}

/// Step 4: the lane exists, the role may act in it, and the run's status allows it.
pub fn authorize_lane<'p>(
    policy: &'p Policy,
    role: &Role,
    lane_id: &str,
    run: &RunRecord,
) -> Result<&'p Lane, Refusal> {
    let Some(lane) = policy.lanes.get(lane_id) else {
        return Err(Refusal::new(
            Reason::LaneUnknown,
            format!("lane `{lane_id}` is not defined"),
        ));
    };
    if !role.lanes.iter().any(|l| l == lane_id) {
        return Err(Refusal::new(
            Reason::LaneNotAllowedForRole,
            format!("role `{}` may not act in lane `{lane_id}`", role.role_id),
        )
        .with_details(json!({ "role_lanes": role.lanes })));
    }
    if !lane.run_statuses.contains(&run.status) {
        return Err(Refusal::new(
            Reason::RunNotActive,
            format!(
                "run `{}` is {}; lane `{lane_id}` acts only while the run is {}",
                run.run_id,
                run.status.as_str(),
                lane.run_statuses
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )
        .with_details(
            json!({ "run_status": run.status, "lane_run_statuses": lane.run_statuses }),
        ));
    }
    Ok(lane)
}

/// Step 5: the tool is registered and enabled.
pub fn find_tool<'p>(policy: &'p Policy, tool_name: &str) -> Result<&'p Tool, Refusal> {
    let Some(tool) = policy.tools.get(tool_name) else {
        return Err(Refusal::new(
            Reason::ToolUnregistered,
            format!("tool `{tool_name}` is not registered"),
        ));
    };
    if !tool.enabled {
        return Err(Refusal::new(
            Reason::ToolDisabled,
            format!("tool `{tool_name}` is disabled"),
        ));
    }
    Ok(tool)
}

/// Step 6: the lane's allowlist names the tool (and the tool names the lane; the loader
/// guarantees both agree).
pub fn lane_permits(lane: &Lane, tool: &Tool) -> Result<(), Refusal> {
    let listed = lane.tools.iter().any(|t| t == &tool.tool_name)
        && tool.allowed_lanes.iter().any(|l| l == &lane.lane_id);
    if listed {
        Ok(())
    } else {
        Err(Refusal::new(
            Reason::ToolNotAllowedInLane,
            format!(
                "lane `{}` does not allowlist tool `{}`",
                lane.lane_id, tool.tool_name
            ),
        )
        .with_details(json!({ "lane_tools": lane.tools })))
    }
}

/// Step 7: every scope key the lane and the tool require is present (and not null),
/// and the scope does not contradict the scope the run is bound to.
pub fn check_scope(
    lane: &Lane,
    tool: &Tool,
    scope: &Map<String, Value>,
    run: &RunRecord,
) -> Result<(), Refusal> {
    let mut missing: Vec<&str> = lane
        .required_scope_keys
        .iter()
        .chain(tool.required_scope_keys.iter())
        .filter(|key| scope.get(key.as_str()).is_none_or(Value::is_null))
        .map(String::as_str)
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        return Err(Refusal::new(
            Reason::ScopeKeyMissing,
            format!(
                "scope is missing {}",
                missing
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .with_details(json!({ "missing": missing })));
    }
    let conflicts: Vec<&str> = run
        .scope
        .iter()
        .filter(|(key, bound)| scope.get(key.as_str()).is_some_and(|v| v != *bound))
        .map(|(key, _)| key.as_str())
        .collect();
    if !conflicts.is_empty() {
        return Err(Refusal::new(
            Reason::ScopeConflictsWithRun,
            format!(
                "scope contradicts run `{}` on {}",
                run.run_id,
                conflicts
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .with_details(json!({ "conflicting_keys": conflicts, "run_scope": run.scope })));
    }
    Ok(())
}

/// Step 8 (first part): the arguments match the tool's input schema. Every violation is
/// listed with its JSON pointer; values are masked so they never reach the log.
pub fn check_arguments(tool: &Tool, arguments: &Value) -> Result<(), Refusal> {
    let violations: Vec<Value> = tool
        .input_validator
        .iter_errors(arguments)
        .take(MAX_VIOLATIONS)
        .map(|e| {
            json!({
                "pointer": e.instance_path().as_str(),
                "message": e.masked().to_string(),
            })
        })
        .collect();
    if violations.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Reason::ArgumentsInvalid,
        format!(
            "arguments do not match the input schema of `{}` ({} violation{})",
            tool.tool_name,
            violations.len(),
            if violations.len() == 1 { "" } else { "s" }
        ),
    )
    .with_details(json!({ "violations": violations })))
}

/// The flags a call raises (scope `true` keys and the tool's flag rules over the
/// normalized arguments), sorted; see `policy::raised_flags`.
pub fn raised_flags(tool: &Tool, scope: &Map<String, Value>, normalized: &Value) -> Vec<String> {
    crate::policy::raised_flags(scope, tool, normalized)
        .into_iter()
        .collect()
}

/// Step 8: no raised flag is prohibited by the lane or by the tool.
pub fn check_prohibitions(lane: &Lane, tool: &Tool, flags: &[String]) -> Result<(), Refusal> {
    let raised: BTreeSet<String> = flags.iter().cloned().collect();
    let hits = crate::policy::prohibitions(lane, tool, &raised);
    let Some(first) = hits.first() else {
        return Ok(());
    };
    let prohibited_by: Vec<String> = hits
        .iter()
        .filter(|h| h.flag == first.flag)
        .map(|h| match &h.by {
            ProhibitedBy::Lane(id) => format!("lane:{id}"),
            ProhibitedBy::Tool(id) => format!("tool:{id}"),
        })
        .collect();
    Err(Refusal::new(
        Reason::ProhibitedFlag,
        format!(
            "flag `{}` is prohibited by {}",
            first.flag,
            prohibited_by.join(" and ")
        ),
    )
    .with_details(
        json!({ "flag": first.flag, "prohibited_by": prohibited_by, "raised_flags": flags }),
    ))
}
