//! The authorization checks of pipeline steps 2-8, as pure functions.
//!
//! Each function takes the data it decides on (the policy snapshot, the request, the
//! run record) and returns what it matched or a [`Refusal`]. No I/O, no clock, no
//! randomness: the same input always gives the same decision, which is what makes
//! `policy explain`, `policy test`, replay and shadow decisions possible.

use serde_json::{Map, Value, json};
use subtle::ConstantTimeEq;

use serde::Serialize;
use std::collections::BTreeSet;

use crate::call::{ConditionResult, LimitClaim};
use crate::diagnostic::{Reason, Refusal};
use crate::policy::condition::{Condition, Inputs, Outcome, Variables};
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
    let actual = crate::canonical::sha256_hex(token.as_bytes());
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
    let admin = verify_auditor_jwt(policy, identity)?;
    full_access(admin)
}

/// Read-only audit endpoints for a caller authenticated by a verified JWT: any admin,
/// `full` or `audit_read`.
pub fn verify_auditor_jwt<'p>(
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

/// An admin endpoint that changes or operates something needs `access: full`; an
/// `audit_read` admin is refused (authenticated, but not allowed).
fn full_access(admin: &Admin) -> Result<&Admin, Refusal> {
    match admin.access {
        crate::policy::AdminAccess::Full => Ok(admin),
        crate::policy::AdminAccess::AuditRead => Err(Refusal::new(
            Reason::CredentialInvalid,
            format!(
                "admin `{}` has `access: audit_read`; this endpoint needs an admin with full access",
                admin.admin_id
            ),
        )
        .with_details(serde_json::json!({ "access": "audit_read", "needs": "full" }))),
    }
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

/// Who is calling, as the decision sees it: a bearer token from the request, or an
/// offline tool (`policy explain`, `policy test`, replay) that decides on behalf of a
/// role without its credential.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    Token(Option<&'a str>),
    Offline,
    /// A run token, resolved before the decision: its binding, or why it is dead.
    Run(&'a Result<crate::identity::RunBinding, Refusal>),
    /// A bearer JWT, verified before the decision: who it proves, or why it does not.
    Jwt(&'a Result<std::sync::Arc<crate::identity::JwtIdentity>, Refusal>),
}

/// Step 2 for any caller: the credential proves `role_id` (offline: the role exists
/// and is enabled).
pub fn verify_caller<'p>(
    policy: &'p Policy,
    caller: Caller<'_>,
    role_id: &str,
) -> Result<&'p Role, Refusal> {
    match caller {
        Caller::Token(token) => verify_identity(policy, role_id, token),
        Caller::Offline => find_role(policy, role_id),
        Caller::Run(Ok(binding)) => verify_run_token(policy, binding, role_id),
        Caller::Run(Err(dead)) => Err(dead.clone()),
        Caller::Jwt(Ok(identity)) => verify_jwt(policy, role_id, identity),
        Caller::Jwt(Err(refused)) => Err(refused.clone()),
    }
}

/// The ids steps 2-4 decide on: who acts, in which run and lane.
#[derive(Debug, Clone, Copy)]
pub struct Acting<'a> {
    pub role_id: &'a str,
    pub run_id: &'a str,
    pub lane_id: &'a str,
}

/// What steps 2-4 admitted.
#[derive(Debug)]
pub struct Admitted<'p, R> {
    pub role: &'p Role,
    pub run: R,
    pub lane: &'p Lane,
}

/// Steps 2-4 of a call: the caller proves the role (2); the run exists and is pinned
/// to the loaded policy versions, and a run token acts only in its own run (3); the
/// lane exists, the role may act in it, the run's status allows it, and a run token
/// acts only in its lanes (4). `runs` looks the run up (asked only once step 2
/// passed); `trace` records each step passed.
///
/// One decision for everything that acts as a call of its run and lane: the call
/// itself (`pipeline::decide`) and the commit of a prepared two-phase call
/// (`gateway::phases`), so whatever refuses the one refuses the other.
pub fn admit<'p, R: std::ops::Deref<Target = RunRecord>>(
    policy: &'p Policy,
    caller: Caller<'_>,
    acting: Acting<'_>,
    runs: impl FnOnce(&str) -> Option<R>,
    trace: &mut crate::call::Trace,
) -> Result<Admitted<'p, R>, Refusal> {
    // 2. verify caller identity (role_id)
    let role = verify_caller(policy, caller, acting.role_id)?;
    trace.role = Some(role.role_id.clone());
    trace.passed_step = 2;

    // 3. verify run_id exists (and is pinned to the loaded policy versions); a run
    //    token acts only in its own run
    if let Caller::Run(Ok(binding)) = caller {
        check_token_run(binding, acting.run_id)?;
    }
    let run = verify_run(runs(acting.run_id), acting.run_id, &policy.versions)?;
    trace.passed_step = 3;

    // 4. validate lane authorization for the role (and the run's status); a run token
    //    acts only in its lanes
    if let Caller::Run(Ok(binding)) = caller {
        check_token_lane(binding, acting.lane_id)?;
    }
    let lane = authorize_lane(policy, role, acting.lane_id, &run)?;
    trace.lane = Some(lane.lane_id.clone());
    trace.passed_step = 4;
    Ok(Admitted { role, run, lane })
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
    full_access(verify_auditor(policy, token)?)
}

/// Read-only audit endpoints: the caller proves it is one of the policy's admins,
/// `full` or `audit_read`. Every admin is compared so timing does not tell which one
/// matched.
pub fn verify_auditor<'p>(policy: &'p Policy, token: Option<&str>) -> Result<&'p Admin, Refusal> {
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
pub fn verify_run<R: std::ops::Deref<Target = RunRecord>>(
    run: Option<R>,
    run_id: &str,
    loaded: &PolicyVersions,
) -> Result<R, Refusal> {
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
    // `is_valid` is the validator's fast path (no error objects, stops at the first
    // mismatch); the violations are collected only for a call that is refused.
    if tool.input_validator.is_valid(arguments) {
        return Ok(());
    }
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
    // Only the variables some condition of the call names are built.
    let whens = [&lane.approval, &tool.approval]
        .into_iter()
        .flatten()
        .filter_map(|approval| approval.when.as_ref());
    let conditions: Vec<&Condition> = lane
        .conditions
        .iter()
        .chain(&tool.conditions)
        .chain(whens)
        .collect();
    let named = |root: &str| conditions.iter().any(|c| c.names(root));
    Variables::new(Inputs {
        args: named("args").then(|| arguments.clone()),
        scope: named("scope").then(|| Value::Object(scope.scope.clone())),
        run: named("run")
            .then(|| json!({"id": run.run_id, "status": run.status, "scope": run.scope})),
        caller: named("caller").then(|| json!({"role": role.role_id, "lanes": role.lanes})),
        tool: named("tool")
            .then(|| json!({"name": tool.tool_name, "version": tool.version.to_string()})),
        lane: named("lane").then(|| json!(lane.lane_id)),
    })
}

/// Step 8 (after the conditions): the human approvals this call needs, the lane's
/// then the tool's. An `approval.when` that cannot be evaluated applies (fail closed).
/// Only says what is needed; whether an approval was granted is the pipeline's gate.
pub fn approval_requirements(
    lane: &Lane,
    tool: &Tool,
    vars: Option<&Variables>,
) -> Vec<crate::call::ApprovalRequirement> {
    let owners = [
        ("lane", lane.lane_id.as_str(), lane.approval.as_ref()),
        ("tool", tool.tool_name.as_str(), tool.approval.as_ref()),
    ];
    let mut needed = Vec::new();
    for (kind, name, approval) in owners {
        let Some(approval) = approval else { continue };
        let (applies, when_error) = match (&approval.when, vars) {
            (None, _) => (true, None),
            (Some(_), None) => (
                true,
                Some("no values to evaluate the condition".to_string()),
            ),
            (Some(condition), Some(vars)) => match condition.evaluate(vars) {
                Outcome::True => (true, None),
                Outcome::False => (false, None),
                Outcome::Error(e) => (true, Some(e)),
            },
        };
        if applies {
            needed.push(crate::call::ApprovalRequirement {
                owner: format!("{kind}:{name}"),
                approvers: approval.approvers.clone(),
                quorum: approval.quorum,
                ttl_s: approval.ttl_s,
                when: approval.when.as_ref().map(|c| c.expr.clone()),
                when_error,
            });
        }
    }
    needed
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

/// The budgets and rates of the lane, then the tool, that a call is counted against.
pub fn limit_claims(
    lane: &Lane,
    tool: &Tool,
    run: &RunRecord,
    role: &Role,
    scope: &Map<String, Value>,
    arguments: &Value,
) -> Vec<LimitClaim> {
    let mut claims = Vec::new();
    let owners = [
        ("lane", lane.lane_id.as_str(), &lane.call_limits),
        ("tool", tool.tool_name.as_str(), &tool.call_limits),
    ];
    for (kind, name, limits) in owners {
        if limits.budget.is_none() && limits.rate.is_none() {
            continue;
        }
        let owner = format!("{kind}:{name}");
        if let Some(budget) = limits.budget {
            let value = json!(run.run_id);
            claims.push(LimitClaim {
                counter: counter_id("budget", &owner, &value),
                owner: owner.clone(),
                kind: "budget",
                max: budget.max_calls_per_run,
                per_s: None,
                key: None,
                key_value: value,
            });
        }
        if let Some(rate) = &limits.rate {
            let value = match &rate.key {
                None => Value::Null,
                Some(crate::policy::LimitKey::Run) => json!(run.run_id),
                Some(crate::policy::LimitKey::Role) => json!(role.role_id),
                Some(crate::policy::LimitKey::Scope(k)) => {
                    scope.get(k).cloned().unwrap_or(Value::Null)
                }
                Some(crate::policy::LimitKey::Args(a)) => {
                    arguments.get(a).cloned().unwrap_or(Value::Null)
                }
            };
            let counter = counter_id("rate", &owner, &value);
            // An argument may be redacted: the trace shows its digest, never its value.
            let value = match &rate.key {
                Some(crate::policy::LimitKey::Args(_)) => json!({
                    "sha256": crate::canonical::sha256_hex(&crate::canonical::to_canonical_bytes(&value))
                }),
                _ => value,
            };
            claims.push(LimitClaim {
                counter,
                owner,
                kind: "rate",
                max: rate.max,
                per_s: Some(rate.per_s),
                key: rate.key.as_ref().map(ToString::to_string),
                key_value: value,
            });
        }
    }
    claims
}

/// `kind|owner|sha256(canonical value)`: bounded whatever the value.
fn counter_id(kind: &str, owner: &str, value: &Value) -> String {
    let digest = crate::canonical::sha256_hex(&crate::canonical::to_canonical_bytes(value));
    format!("{kind}|{owner}|{digest}")
}

#[cfg(test)]
mod tests;
