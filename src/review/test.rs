//! `toolgate policy test [DIR]`: runs the YAML test cases under `policy/tests/` against
//! the policy, offline, prints `N passed, N failed`, and reports the (role, lane, tool)
//! triples no test covers.

use std::collections::BTreeSet;

use crate::gateway::Loaded;
use crate::pipeline::explain;
use crate::policy::{ExpectedDecision, Policy, PolicyCase, RunStatus};
use crate::review::explain::{offline_request, offline_run};

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub file: String,
    pub name: String,
    /// None when the case passed; what differed otherwise.
    pub failure: Option<String>,
}

/// Decides one case with the gateway's own decision code.
pub fn run_case(loaded: &Loaded, case: &PolicyCase) -> Option<String> {
    let request = &case.request;
    let mut run = offline_run(
        case.run.scope.as_ref().unwrap_or(&request.scope),
        case.run.status.unwrap_or(RunStatus::Active),
        &loaded.policy.versions,
    );
    if let Some(scope) = &case.run.scope {
        run.scope = scope.clone();
    }
    if case.run.other_policy {
        run.policy_versions.lanes.sha256 = "0".repeat(64);
    }
    let run = (!case.run.missing).then_some(run);
    let req = offline_request(
        &request.role,
        &request.lane,
        &request.tool,
        request.scope.clone(),
        request.arguments.clone(),
    );
    let explanation = explain(loaded, req, run);
    match (&explanation.refusal, case.expect.decision) {
        (None, ExpectedDecision::Allow) => match case.expect.approval {
            Some(expected) if expected != !explanation.trace.approval.is_empty() => {
                Some(if expected {
                    "expected allow once approved, got allow without approval".to_string()
                } else {
                    let owners: Vec<&str> = explanation
                        .trace
                        .approval
                        .iter()
                        .map(|a| a.owner.as_str())
                        .collect();
                    format!(
                        "expected allow without approval, got allow once approved ({})",
                        owners.join(", ")
                    )
                })
            }
            _ => None,
        },
        (None, ExpectedDecision::Deny) => Some("expected deny, got allow".to_string()),
        (Some(r), ExpectedDecision::Allow) => Some(format!(
            "expected allow, got deny at step {} ({}): {}",
            r.step(),
            r.reason.as_str(),
            r.message
        )),
        (Some(r), ExpectedDecision::Deny) => {
            if let Some(reason) = &case.expect.reason
                && reason != r.reason.as_str()
            {
                return Some(format!(
                    "expected reason `{reason}`, got `{}`: {}",
                    r.reason.as_str(),
                    r.message
                ));
            }
            if let Some(step) = case.expect.step
                && step != r.step()
            {
                return Some(format!("expected step {step}, got step {}", r.step()));
            }
            if let Some(condition) = &case.expect.condition {
                let denied_by = r.details["condition"].as_str();
                if denied_by != Some(condition.as_str()) {
                    return Some(format!(
                        "expected condition `{condition}` to deny, got {}: {}",
                        denied_by.map_or_else(
                            || "no condition".to_string(),
                            |c| format!("condition `{c}`")
                        ),
                        r.message
                    ));
                }
            }
            None
        }
    }
}

/// Every (role, lane, tool) triple the policy allows on paper.
pub fn triples(policy: &Policy) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for role in policy.roles.values() {
        for lane_id in &role.lanes {
            if let Some(lane) = policy.lanes.get(lane_id) {
                for tool in &lane.tools {
                    out.insert((role.role_id.clone(), lane_id.clone(), tool.clone()));
                }
            }
        }
    }
    out
}
