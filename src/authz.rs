//! The authorization checks of pipeline steps 2-8, as pure functions.
//!
//! Each function takes the data it decides on (the policy snapshot, the request, the
//! run record) and returns what it matched or a [`Refusal`]. No I/O, no clock, no
//! randomness: the same input always gives the same decision, which is what makes
//! `policy explain`, `policy test`, replay and shadow decisions possible.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use serde::Serialize;
use std::collections::BTreeSet;

use crate::call::ConditionResult;
use crate::diagnostic::{Reason, Refusal};
use crate::policy::condition::{Inputs, Outcome, Variables};
use crate::policy::{Admin, Credential, Lane, Policy, PolicyVersions, ProhibitedBy, Role, Tool};
use crate::runs::RunRecord;

/// The most schema violations listed in one refusal.
const MAX_VIOLATIONS: usize = 50;

/// Whether `token` proves `credential`: sha256 of the token compared in constant time.
fn credential_matches(credential: &Credential, token: &str) -> bool {
    let expected = match credential {
        Credential::TokenSha256(hex) => Some(hex.as_str()),
        Credential::TokenEnv { sha256, .. } => sha256.as_deref(),
        // A run-tokens-only role's static token proves nothing (see verify_identity);
        // a JWT credential is proven by a verified JWT only (verify_jwt).
        Credential::RunTokensOnly { .. } | Credential::Jwt(_) => None,
    };
    let Some(expected) = expected else {
        return false;
    };
    let actual = hex::encode(Sha256::digest(token.as_bytes()));
    actual.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Step 2: the caller proves it holds `role_id`. Authentication comes before anything
/// about the policy is revealed: a wrong or missing credential gets the same answer
/// (same reason, same message, same work) whether the role exists or not.
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
    let proven = match policy.roles.get(role_id) {
        Some(role) => credential_matches(&role.credential, token),
        None => {
            // The same work as a known role, so timing does not tell either.
            let unknown = Credential::TokenSha256("0".repeat(64));
            let _ = credential_matches(&unknown, token);
            false
        }
    };
    if !proven {
        if let Some(role) = policy.roles.get(role_id)
            && crate::identity::static_token_of_run_tokens_only(&role.credential, token)
        {
            return Err(Refusal::new(
                Reason::RunTokenRequired,
                format!(
                    "role `{role_id}` calls tools only with run tokens; its static token is not accepted"
                ),
            ));
        }
        return Err(Refusal::new(
            Reason::CredentialInvalid,
            "the bearer token does not prove the role named in the request",
        ));
    }
    find_role(policy, role_id)
}

/// Step 2 for a call authenticated by a JWT: the token was verified (signature, issuer,
/// audience, times) before the decision; this check is pure. The role's credential
/// must be a `jwt` credential the identity proves. A wrong role gets the same answer
/// whether it exists or not.
pub fn verify_jwt<'p>(
    policy: &'p Policy,
    role_id: &str,
    identity: &crate::identity::JwtIdentity,
) -> Result<&'p Role, Refusal> {
    let proven = policy
        .roles
        .get(role_id)
        .is_some_and(|role| matches!(&role.credential, Credential::Jwt(c) if identity.proves(c)));
    if !proven {
        return Err(Refusal::new(
            Reason::CredentialInvalid,
            "the JWT does not prove the role named in the request",
        ));
    }
    find_role(policy, role_id)
}

/// Admin endpoints for a caller authenticated by a verified JWT: the first admin whose
/// `jwt` credential the identity proves.
pub fn verify_admin_jwt<'p>(
    policy: &'p Policy,
    identity: &crate::identity::JwtIdentity,
) -> Result<&'p Admin, Refusal> {
    policy
        .admins
        .iter()
        .find(|admin| matches!(&admin.credential, Credential::Jwt(c) if identity.proves(c)))
        .ok_or_else(|| {
            Refusal::new(
                Reason::CredentialInvalid,
                "the JWT is not an admin credential",
            )
        })
}

/// Step 2 for a call authenticated by a run token: the token's role is the role, and a
/// role named in the request must be it. The token was resolved (known, unexpired, not
/// revoked) before the decision; this check is pure.
pub fn verify_run_token<'p>(
    policy: &'p Policy,
    binding: &crate::identity::RunBinding,
    role_id: &str,
) -> Result<&'p Role, Refusal> {
    if role_id != binding.role_id {
        return Err(Refusal::new(
            Reason::CredentialInvalid,
            "the run token is bound to another role than the one named in the request",
        ));
    }
    find_role(policy, role_id)
}

/// Step 3 for a call authenticated by a run token: the call's run must be the token's
/// run (`credential_not_for_run`), whether or not the other run exists.
pub fn check_token_run(binding: &crate::identity::RunBinding, run_id: &str) -> Result<(), Refusal> {
    if run_id != binding.run_id {
        return Err(Refusal::new(
            Reason::CredentialNotForRun,
            "the run token is bound to another run than the one named in the request",
        ));
    }
    Ok(())
}

/// Step 4 for a call authenticated by a run token: the lane is one of the token's.
pub fn check_token_lane(
    binding: &crate::identity::RunBinding,
    lane_id: &str,
) -> Result<(), Refusal> {
    if !binding.lanes.iter().any(|l| l == lane_id) {
        return Err(Refusal::new(
            Reason::LaneNotAllowedForRole,
            format!("the run token may act only in lanes {:?}", binding.lanes),
        )
        .with_details(json!({ "token_lanes": binding.lanes })));
    }
    Ok(())
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

/// The scope a call is decided on: the run's scope merged with the call's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EffectiveScope {
    pub scope: Map<String, Value>,
    /// The keys that came from the run's scope (whether or not the call repeated them),
    /// sorted.
    pub from_run: Vec<String>,
}

impl EffectiveScope {
    /// Where a flag raised from this scope came from: `run` when the run's scope sets
    /// it, `call` when only the call's does, None when the scope does not raise it.
    pub fn flag_source(&self, flag: &str) -> Option<&'static str> {
        if self.scope.get(flag) != Some(&Value::Bool(true)) {
            None
        } else if self.from_run.iter().any(|k| k == flag) {
            Some("run")
        } else {
            Some("call")
        }
    }
}

/// Merges a run's scope with a call's: every run key applies to the call whether or not
/// the call repeats it, the call may add keys the run does not have, and a call key that
/// differs from the run's value (`null` included) is a contradiction. Returns the
/// contradicting keys, sorted, on a conflict.
pub fn merge_scope(
    run: &Map<String, Value>,
    call: &Map<String, Value>,
) -> Result<EffectiveScope, Vec<String>> {
    let mut conflicts: Vec<String> = call
        .iter()
        .filter(|(key, value)| run.get(key.as_str()).is_some_and(|bound| bound != *value))
        .map(|(key, _)| key.clone())
        .collect();
    if !conflicts.is_empty() {
        conflicts.sort_unstable();
        return Err(conflicts);
    }
    let mut scope = run.clone();
    for (key, value) in call {
        scope.entry(key.clone()).or_insert_with(|| value.clone());
    }
    let mut from_run: Vec<String> = run.keys().cloned().collect();
    from_run.sort_unstable();
    Ok(EffectiveScope { scope, from_run })
}

/// Step 7: the call's scope does not contradict the run's, and every scope key the lane
/// and the tool require is present (and not null) in the effective scope, which is
/// returned.
pub fn check_scope(
    lane: &Lane,
    tool: &Tool,
    scope: &Map<String, Value>,
    run: &RunRecord,
) -> Result<EffectiveScope, Refusal> {
    let effective = merge_scope(&run.scope, scope).map_err(|conflicts| {
        Refusal::new(
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
        .with_details(json!({ "conflicting_keys": conflicts, "run_scope": run.scope }))
    })?;
    let mut missing: Vec<&str> = lane
        .required_scope_keys
        .iter()
        .chain(tool.required_scope_keys.iter())
        .filter(|key| effective.scope.get(key.as_str()).is_none_or(Value::is_null))
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
        .with_details(json!({ "missing": missing, "scope_from_run": effective.from_run })));
    }
    Ok(effective)
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

/// Step 8: no raised flag is prohibited by the lane or by the tool. A flag the scope
/// raises is named with its source (`run` or `call`); one a flag rule raises, with
/// `arguments`.
pub fn check_prohibitions(
    lane: &Lane,
    tool: &Tool,
    flags: &[String],
    scope: &EffectiveScope,
) -> Result<(), Refusal> {
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
    let source = scope.flag_source(&first.flag).unwrap_or("arguments");
    let from = match source {
        "run" => "the run's scope",
        "call" => "the call's scope",
        _ => "a flag rule over the arguments",
    };
    Err(Refusal::new(
        Reason::ProhibitedFlag,
        format!(
            "flag `{}` (raised by {from}) is prohibited by {}",
            first.flag,
            prohibited_by.join(" and ")
        ),
    )
    .with_details(json!({
        "flag": first.flag,
        "source": source,
        "prohibited_by": prohibited_by,
        "raised_flags": flags,
    })))
}

/// What conditions see on one call: the normalized arguments, the effective scope, the
/// run, the caller, the tool and the lane.
pub fn condition_variables(
    role: &Role,
    lane: &Lane,
    tool: &Tool,
    run: &RunRecord,
    scope: &EffectiveScope,
    arguments: &Value,
) -> Variables {
    Variables::new(Inputs {
        args: arguments,
        scope: &scope.scope,
        run: json!({"id": run.run_id, "status": run.status, "scope": run.scope}),
        caller: json!({"role": role.role_id, "lanes": role.lanes}),
        tool: json!({"name": tool.tool_name, "version": tool.version.to_string()}),
        lane: &lane.lane_id,
    })
}

/// Evaluates every condition of the lane, then of the tool (all of them, so a trace or
/// `policy explain` shows each value).
pub fn evaluate_conditions(lane: &Lane, tool: &Tool, vars: &Variables) -> Vec<ConditionResult> {
    let of_lane = lane
        .conditions
        .iter()
        .map(|c| (format!("lane:{}", lane.lane_id), c));
    let of_tool = tool
        .conditions
        .iter()
        .map(|c| (format!("tool:{}", tool.tool_name), c));
    of_lane
        .chain(of_tool)
        .map(|(owner, condition)| {
            let outcome = condition.evaluate(vars);
            ConditionResult {
                name: condition.name.clone(),
                owner,
                value: outcome.value(),
                error: match outcome {
                    Outcome::Error(e) => Some(e),
                    Outcome::True | Outcome::False => None,
                },
            }
        })
        .collect()
}

/// Step 8 (last part): every condition evaluated to true. The first that did not is the
/// reason, named with its message.
pub fn check_conditions(
    lane: &Lane,
    tool: &Tool,
    results: &[ConditionResult],
) -> Result<(), Refusal> {
    let Some(failed) = results.iter().find(|r| r.value != Value::Bool(true)) else {
        return Ok(());
    };
    let message = lane
        .conditions
        .iter()
        .chain(tool.conditions.iter())
        .zip(results)
        .find(|(_, r)| r.name == failed.name && r.owner == failed.owner)
        .map(|(c, _)| c.message.clone())
        .unwrap_or_default();
    let owner = failed.owner.replacen(':', " `", 1) + "`";
    let text = match &failed.error {
        None => format!("condition `{}` of {owner} is false: {message}", failed.name),
        Some(error) => format!(
            "condition `{}` of {owner} could not be evaluated ({error}), so it denies: {message}",
            failed.name
        ),
    };
    Err(
        Refusal::new(Reason::ConditionFailed, text).with_details(json!({
            "condition": failed.name,
            "owner": failed.owner,
            "condition_message": message,
            "value": failed.value,
            "error": failed.error,
        })),
    )
}

/// What a run's scope allows under a policy: the lanes where at least one enabled tool
/// is not blocked by a flag the run's scope raises, and for each blocked (lane, tool)
/// the prohibited flags. Shown when an admin re-pins a run to a new policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunScopeCheck {
    pub usable_lanes: Vec<String>,
    pub blocked:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<String>>>,
}

pub fn check_run_scope(policy: &Policy, run_scope: &Map<String, Value>) -> RunScopeCheck {
    let raised: BTreeSet<String> = run_scope
        .iter()
        .filter(|(_, v)| **v == Value::Bool(true))
        .map(|(k, _)| k.clone())
        .collect();
    let mut check = RunScopeCheck::default();
    for lane in policy.lanes.values() {
        let mut usable = false;
        for tool in lane.tools.iter().filter_map(|t| policy.tools.get(t)) {
            if !tool.enabled {
                continue;
            }
            let hits = crate::policy::prohibitions(lane, tool, &raised);
            if hits.is_empty() {
                usable = true;
            } else {
                let mut flags: Vec<String> = hits.into_iter().map(|h| h.flag).collect();
                flags.dedup();
                check
                    .blocked
                    .entry(lane.lane_id.clone())
                    .or_default()
                    .insert(tool.tool_name.clone(), flags);
            }
        }
        if usable {
            check.usable_lanes.push(lane.lane_id.clone());
        }
    }
    check
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    /// (run scope, call scope, effective scope or the conflicting keys, keys from the run)
    type Row = (
        Value,
        Value,
        Result<Value, Vec<&'static str>>,
        Vec<&'static str>,
    );

    #[test]
    fn the_run_scope_binds_every_call() {
        let table: Vec<Row> = vec![
            // The call omits a run key: it applies anyway.
            (
                json!({"case_id": "C-1", "sealed": true}),
                json!({"case_id": "C-1"}),
                Ok(json!({"case_id": "C-1", "sealed": true})),
                vec!["case_id", "sealed"],
            ),
            // The call adds a key the run does not have.
            (
                json!({"case_id": "C-1"}),
                json!({"matter_id": "M-1"}),
                Ok(json!({"case_id": "C-1", "matter_id": "M-1"})),
                vec!["case_id"],
            ),
            // Repeating a run key with the same value is fine.
            (
                json!({"case_id": "C-1"}),
                json!({"case_id": "C-1"}),
                Ok(json!({"case_id": "C-1"})),
                vec!["case_id"],
            ),
            // No run scope: the call's scope as is.
            (json!({}), json!({"x": 1}), Ok(json!({"x": 1})), vec![]),
            // Contradictions, `false` and `null` included, are refused.
            (
                json!({"case_id": "C-1"}),
                json!({"case_id": "C-2"}),
                Err(vec!["case_id"]),
                vec![],
            ),
            (
                json!({"sealed": true, "case_id": "C-1"}),
                json!({"sealed": false, "case_id": null}),
                Err(vec!["case_id", "sealed"]),
                vec![],
            ),
            (json!({"n": 1}), json!({"n": 1.0}), Err(vec!["n"]), vec![]),
        ];
        for (run, call, expected, from_run) in table {
            let got = merge_scope(&map(run.clone()), &map(call.clone()));
            match expected {
                Ok(scope) => {
                    let got = got.unwrap_or_else(|c| panic!("{run} + {call}: conflict {c:?}"));
                    assert_eq!(Value::Object(got.scope), scope, "{run} + {call}");
                    assert_eq!(got.from_run, from_run, "{run} + {call}");
                }
                Err(keys) => assert_eq!(got.unwrap_err(), keys, "{run} + {call}"),
            }
        }
    }

    #[test]
    fn a_flag_names_where_it_came_from() {
        let scope = merge_scope(
            &map(json!({"sealed": true})),
            &map(json!({"privileged": true, "urgent": false})),
        )
        .unwrap();
        assert_eq!(scope.flag_source("sealed"), Some("run"));
        assert_eq!(scope.flag_source("privileged"), Some("call"));
        assert_eq!(scope.flag_source("urgent"), None);
        assert_eq!(scope.flag_source("other"), None);
    }

    // -----------------------------------------------------------------------------------
    // The denial matrix of steps 2-8: every reason each pure check can return, and the
    // allow cases, one row each, over the shipped demo policy.

    use crate::identity::RunBinding;
    use crate::policy::RunStatus;

    /// The demo policy with what the shipped one does not have, made in code: a disabled
    /// role, and a run-tokens-only role that also binds a static token.
    fn world_policy() -> Policy {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut policy =
            crate::policy::load(&root.join("policy"), &root.join("tools/tool_registry.yaml"))
                .unwrap();
        let mut retired = policy.roles["research_agent"].clone();
        retired.role_id = "retired_agent".into();
        retired.enabled = false;
        retired.credential =
            Credential::TokenSha256(crate::canonical::sha256_hex(b"demo-retired_agent"));
        policy.roles.insert("retired_agent".into(), retired);
        policy.roles.get_mut("paralegal_agent").unwrap().credential = Credential::RunTokensOnly {
            sha256: Some(crate::canonical::sha256_hex(b"demo-paralegal_agent")),
        };
        policy
    }

    fn run_record(policy: &Policy, status: RunStatus, scope: Value) -> RunRecord {
        RunRecord {
            run_id: "run-1".into(),
            status,
            scope: map(scope),
            policy_versions: policy.versions.clone(),
            created_at: "2026-11-23T00:00:00.000Z".into(),
            created_by: "ops".into(),
        }
    }

    fn binding(role: &str, run: &str, lanes: &[&str]) -> RunBinding {
        RunBinding {
            token_id: "rtk-1".into(),
            run_id: run.into(),
            role_id: role.into(),
            lanes: lanes.iter().map(|l| l.to_string()).collect(),
            expires_unix: i64::MAX,
        }
    }

    /// Steps 2-8 for one call as the pipeline runs them, after identity and run: lane,
    /// tool, allowlist, scope, arguments, prohibitions, conditions.
    fn from_lane(
        policy: &Policy,
        role: &str,
        lane: &str,
        tool: &str,
        run: &RunRecord,
        scope: Value,
        arguments: Value,
    ) -> Result<(), Refusal> {
        let role = find_role(policy, role)?;
        let lane = authorize_lane(policy, role, lane, run)?;
        let tool = find_tool(policy, tool)?;
        lane_permits(lane, tool)?;
        let scope = check_scope(lane, tool, &map(scope), run)?;
        check_arguments(tool, &arguments)?;
        let flags = raised_flags(tool, &scope.scope, &arguments);
        check_prohibitions(lane, tool, &flags, &scope)?;
        let vars = condition_variables(role, lane, tool, run, &scope, &arguments);
        check_conditions(lane, tool, &evaluate_conditions(lane, tool, &vars))
    }

    /// A row's check: one or more of the pure functions above, on the policy.
    type Check = dyn Fn(&Policy) -> Result<(), Refusal>;

    /// One row: the step, what it shows, the decision (None allows), and the check.
    struct Decision {
        step: u8,
        case: &'static str,
        expect: Option<Reason>,
        check: Box<Check>,
    }

    fn row(
        step: u8,
        case: &'static str,
        expect: Option<Reason>,
        check: impl Fn(&Policy) -> Result<(), Refusal> + 'static,
    ) -> Decision {
        Decision {
            step,
            case,
            expect,
            check: Box::new(check),
        }
    }

    fn active(p: &Policy, scope: Value) -> RunRecord {
        run_record(p, RunStatus::Active, scope)
    }

    fn matrix() -> Vec<Decision> {
        use Reason as R;
        fn case() -> Value {
            json!({"case_id": "C-1"})
        }
        fn ok(r: Result<&Role, Refusal>) -> Result<(), Refusal> {
            r.map(|_| ())
        }
        vec![
            // Step 2: identity (static tokens).
            row(2, "no token", Some(R::CredentialMissing), |p| {
                ok(verify_identity(p, "research_agent", None))
            }),
            row(2, "a wrong token", Some(R::CredentialInvalid), |p| {
                ok(verify_identity(p, "research_agent", Some("guess")))
            }),
            row(2, "another role's token", Some(R::CredentialInvalid), |p| {
                ok(verify_identity(
                    p,
                    "research_agent",
                    Some("demo-supervisor"),
                ))
            }),
            row(
                2,
                "an unknown role is answered as a bad credential, not role_unknown",
                Some(R::CredentialInvalid),
                |p| {
                    ok(verify_identity(
                        p,
                        "ghost_agent",
                        Some("demo-research_agent"),
                    ))
                },
            ),
            row(
                2,
                "the static token of a run-tokens-only role",
                Some(R::RunTokenRequired),
                |p| {
                    ok(verify_identity(
                        p,
                        "paralegal_agent",
                        Some("demo-paralegal_agent"),
                    ))
                },
            ),
            row(
                2,
                "a run-tokens-only role with a wrong token",
                Some(R::CredentialInvalid),
                |p| ok(verify_identity(p, "paralegal_agent", Some("guess"))),
            ),
            row(
                2,
                "a disabled role with its token",
                Some(R::RoleDisabled),
                |p| {
                    ok(verify_identity(
                        p,
                        "retired_agent",
                        Some("demo-retired_agent"),
                    ))
                },
            ),
            row(2, "the role's own token", None, |p| {
                ok(verify_identity(
                    p,
                    "research_agent",
                    Some("demo-research_agent"),
                ))
            }),
            // Step 2: offline (explain, replay): the role only.
            row(2, "offline: an unknown role", Some(R::RoleUnknown), |p| {
                ok(find_role(p, "ghost_agent"))
            }),
            row(2, "offline: a disabled role", Some(R::RoleDisabled), |p| {
                ok(find_role(p, "retired_agent"))
            }),
            row(2, "offline: an enabled role", None, |p| {
                ok(find_role(p, "research_agent"))
            }),
            // Step 2: run tokens.
            row(
                2,
                "a run token naming another role",
                Some(R::CredentialInvalid),
                |p| {
                    let b = binding("paralegal_agent", "run-1", &["drafting"]);
                    ok(verify_run_token(p, &b, "drafting_agent"))
                },
            ),
            row(2, "a run token for its own role", None, |p| {
                let b = binding("paralegal_agent", "run-1", &["drafting"]);
                ok(verify_run_token(p, &b, "paralegal_agent"))
            }),
            // Step 2: admin endpoints.
            row(2, "admin: no token", Some(R::CredentialMissing), |p| {
                verify_admin(p, None).map(|_| ())
            }),
            row(
                2,
                "admin: a role's token",
                Some(R::CredentialInvalid),
                |p| verify_admin(p, Some("demo-supervisor")).map(|_| ()),
            ),
            row(2, "admin: the admin token", None, |p| {
                verify_admin(p, Some("demo-admin")).map(|_| ())
            }),
            // Step 3: the run.
            row(
                3,
                "a run token for another run",
                Some(R::CredentialNotForRun),
                |_| check_token_run(&binding("paralegal_agent", "run-1", &["drafting"]), "run-2"),
            ),
            row(3, "a run token for its run", None, |_| {
                check_token_run(&binding("paralegal_agent", "run-1", &["drafting"]), "run-1")
            }),
            row(3, "no such run", Some(R::RunNotFound), |p| {
                verify_run(None, "run-404", &p.versions).map(|_| ())
            }),
            row(
                3,
                "a run pinned to other policy versions",
                Some(R::PolicyVersionMismatch),
                |p| {
                    let mut run = active(p, json!({}));
                    run.policy_versions.lanes.version = "0.0.1-other".into();
                    verify_run(Some(&run), "run-1", &p.versions).map(|_| ())
                },
            ),
            row(3, "a run pinned to the loaded policy", None, |p| {
                let run = active(p, json!({}));
                verify_run(Some(&run), "run-1", &p.versions).map(|_| ())
            }),
            // Step 4: the lane.
            row(
                4,
                "a lane outside the run token's lanes",
                Some(R::LaneNotAllowedForRole),
                |_| {
                    check_token_lane(
                        &binding("paralegal_agent", "run-1", &["drafting"]),
                        "filing",
                    )
                },
            ),
            row(4, "a lane of the run token", None, |_| {
                check_token_lane(
                    &binding("paralegal_agent", "run-1", &["drafting"]),
                    "drafting",
                )
            }),
            row(
                4,
                "an unknown lane (before the role's lanes)",
                Some(R::LaneUnknown),
                |p| {
                    let run = active(p, case());
                    let role = &p.roles["research_agent"];
                    authorize_lane(p, role, "reserch", &run).map(|_| ())
                },
            ),
            row(
                4,
                "a lane the role may not act in",
                Some(R::LaneNotAllowedForRole),
                |p| {
                    let run = active(p, case());
                    authorize_lane(p, &p.roles["research_agent"], "drafting", &run).map(|_| ())
                },
            ),
            row(4, "a suspended run", Some(R::RunNotActive), |p| {
                let run = run_record(p, RunStatus::Suspended, case());
                authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
            }),
            row(4, "a closed run", Some(R::RunNotActive), |p| {
                let run = run_record(p, RunStatus::Closed, case());
                authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
            }),
            row(4, "the role's lane on an active run", None, |p| {
                let run = active(p, case());
                authorize_lane(p, &p.roles["research_agent"], "research", &run).map(|_| ())
            }),
            // Step 5: the tool.
            row(5, "an unregistered tool", Some(R::ToolUnregistered), |p| {
                find_tool(p, "shred_documents").map(|_| ())
            }),
            row(5, "a disabled tool", Some(R::ToolDisabled), |p| {
                find_tool(p, "disabled_tool").map(|_| ())
            }),
            row(5, "an enabled tool", None, |p| {
                find_tool(p, "case_lookup").map(|_| ())
            }),
            // Step 6: the lane's allowlist.
            row(
                6,
                "a tool the lane does not allowlist",
                Some(R::ToolNotAllowedInLane),
                |p| lane_permits(&p.lanes["research"], &p.tools["draft_document"]),
            ),
            row(
                6,
                "a lane listing a tool that does not name the lane",
                Some(R::ToolNotAllowedInLane),
                |p| {
                    let mut lane = p.lanes["drafting"].clone();
                    lane.tools.push("legal_search".into());
                    lane_permits(&lane, &p.tools["legal_search"])
                },
            ),
            row(6, "an allowlisted tool", None, |p| {
                lane_permits(&p.lanes["drafting"], &p.tools["draft_document"])
            }),
            // Step 7: the scope.
            row(
                7,
                "a call scope contradicting the run's",
                Some(R::ScopeConflictsWithRun),
                |p| {
                    let run = active(p, json!({"case_id": "C-1"}));
                    let scope = map(json!({"case_id": "C-2"}));
                    check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run)
                        .map(|_| ())
                },
            ),
            row(
                7,
                "a contradiction is reported before a missing key",
                Some(R::ScopeConflictsWithRun),
                |p| {
                    let run = active(p, json!({"sealed": true}));
                    let scope = map(json!({"sealed": false}));
                    check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run)
                        .map(|_| ())
                },
            ),
            row(
                7,
                "a required scope key missing",
                Some(R::ScopeKeyMissing),
                |p| {
                    let run = active(p, json!({}));
                    check_scope(
                        &p.lanes["filing"],
                        &p.tools["file_with_court"],
                        &map(case()),
                        &run,
                    )
                    .map(|_| ())
                },
            ),
            row(
                7,
                "a required scope key null",
                Some(R::ScopeKeyMissing),
                |p| {
                    let run = active(p, json!({}));
                    let scope = map(json!({"case_id": null}));
                    check_scope(&p.lanes["research"], &p.tools["case_lookup"], &scope, &run)
                        .map(|_| ())
                },
            ),
            row(7, "a required key that comes from the run", None, |p| {
                let run = active(p, case());
                check_scope(
                    &p.lanes["research"],
                    &p.tools["case_lookup"],
                    &map(json!({})),
                    &run,
                )
                .map(|_| ())
            }),
            // Step 8: arguments, prohibitions, conditions.
            row(
                8,
                "arguments outside the input schema",
                Some(R::ArgumentsInvalid),
                |p| check_arguments(&p.tools["read_document"], &json!({"path": "", "x": 1})),
            ),
            row(8, "arguments inside the input schema", None, |p| {
                check_arguments(&p.tools["read_document"], &json!({"path": "notes.md"}))
            }),
            row(
                8,
                "a flag the call's scope raises, prohibited by the lane",
                Some(R::ProhibitedFlag),
                |p| {
                    let run = active(p, case());
                    from_lane(
                        p,
                        "research_agent",
                        "research",
                        "case_lookup",
                        &run,
                        json!({"case_id": "C-1", "privileged": true}),
                        json!({}),
                    )
                },
            ),
            row(
                8,
                "a flag the run's scope raises, prohibited by the lane and the tool",
                Some(R::ProhibitedFlag),
                |p| {
                    let run = active(p, json!({"case_id": "C-1", "sealed": true}));
                    from_lane(
                        p,
                        "drafting_agent",
                        "drafting",
                        "read_document",
                        &run,
                        json!({}),
                        json!({"path": "notes.md"}),
                    )
                },
            ),
            row(
                8,
                "a flag a flag rule raises from the arguments",
                Some(R::ProhibitedFlag),
                |p| {
                    let run = active(p, case());
                    from_lane(
                        p,
                        "research_agent",
                        "research",
                        "read_document",
                        &run,
                        json!({}),
                        json!({"path": "privileged/strategy.md"}),
                    )
                },
            ),
            row(
                8,
                "the same flag in a lane that does not prohibit it",
                None,
                |p| {
                    let run = active(p, case());
                    from_lane(
                        p,
                        "drafting_agent",
                        "drafting",
                        "read_document",
                        &run,
                        json!({}),
                        json!({"path": "privileged/strategy.md"}),
                    )
                },
            ),
            row(
                8,
                "a condition that is false",
                Some(R::ConditionFailed),
                |p| {
                    let run = active(p, case());
                    from_lane(
                        p,
                        "research_agent",
                        "research",
                        "legal_search",
                        &run,
                        json!({}),
                        json!({"query": "duty", "limit": 50}),
                    )
                },
            ),
            row(
                8,
                "a condition on a run without the case it reads",
                Some(R::ConditionFailed),
                |p| {
                    let run = active(p, json!({}));
                    from_lane(
                        p,
                        "research_agent",
                        "research",
                        "case_lookup",
                        &run,
                        case(),
                        json!({}),
                    )
                },
            ),
            row(8, "every condition true: the call is allowed", None, |p| {
                let run = active(p, case());
                from_lane(
                    p,
                    "research_agent",
                    "research",
                    "legal_search",
                    &run,
                    json!({}),
                    json!({"query": "duty", "limit": 5}),
                )
            }),
        ]
    }

    #[test]
    fn the_denial_matrix_holds_row_by_row() {
        let policy = world_policy();
        let mut failures = Vec::new();
        for row in matrix() {
            let got = (row.check)(&policy);
            match (&got, row.expect) {
                (Ok(()), None) => {}
                (Err(refusal), Some(reason)) if refusal.reason == reason => {
                    if refusal.reason.info().step != row.step {
                        failures.push(format!(
                            "step {} `{}`: {:?} is cataloged at step {}",
                            row.step,
                            row.case,
                            reason,
                            reason.info().step
                        ));
                    }
                }
                _ => failures.push(format!(
                    "step {} `{}`: want {:?}, got {:?}",
                    row.step,
                    row.case,
                    row.expect,
                    got.map_err(|r| (r.reason, r.message))
                )),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Reasons of steps 2-8 that are decided outside this file (not pure: they need the
    /// clock or the file system), with where.
    const DECIDED_ELSEWHERE: [(Reason, &str); 11] = [
        (
            Reason::JwtMalformed,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtExpired,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtNotYetValid,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtIssuerMismatch,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtAudienceMismatch,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtUnknownKid,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtAlgorithmRefused,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwtSignatureInvalid,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::JwksUnavailable,
            "identity::jwt verifies a bearer JWT before the decision (signature, claims, keys)",
        ),
        (
            Reason::CredentialExpired,
            "identity::run_tokens resolves a run token before the decision (the clock)",
        ),
        (
            Reason::ArgumentUnsafe,
            "the adapter's validate (a path that escapes the case folder, a symlink)",
        ),
    ];

    #[test]
    fn the_denial_matrix_covers_every_reason_of_steps_2_to_8() {
        let rows = matrix();
        let covered: BTreeSet<Reason> = rows.iter().filter_map(|r| r.expect).collect();
        // Every step has an allow row.
        for step in 2..=8 {
            assert!(
                rows.iter().any(|r| r.step == step && r.expect.is_none()),
                "step {step} has no allow row"
            );
        }
        // Every reason the code above returns has a row (read from the source, so a new
        // `Reason::` in this file without a row fails here).
        let source = include_str!("authz.rs");
        let code = source.split("#[cfg(test)]").next().unwrap();
        for reason in Reason::ALL {
            let named = format!("Reason::{reason:?}");
            let returned = code.match_indices(&named).any(|(at, _)| {
                !code[at + named.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            });
            let elsewhere = DECIDED_ELSEWHERE.iter().any(|(r, _)| *r == reason);
            assert!(
                !returned || covered.contains(&reason),
                "src/authz.rs returns {reason:?} but the denial matrix has no row for it"
            );
            assert!(
                !(returned && elsewhere),
                "{reason:?} is returned here now: give it a row instead of DECIDED_ELSEWHERE"
            );
            // Every reason cataloged at steps 2-8 is a row or decided elsewhere.
            if (2..=8).contains(&reason.info().step) {
                assert!(
                    covered.contains(&reason) || elsewhere,
                    "{reason:?} (step {}) has no row in the denial matrix",
                    reason.info().step
                );
            }
        }
    }
}
