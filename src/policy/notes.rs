//! Notes: what a valid policy allows that its reviewers should still see. A note never
//! stops a policy from loading; `toolgate policy check` prints them beside its result.

use std::path::Path;

use serde::Serialize;

use super::{AdapterConfig, Approval, Policy, Sandbox, Tool};

/// One note: the file and the part of it (`tool:NAME` or `lane:NAME`) it is about, what
/// it allows, and how to change that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    pub file: String,
    pub owner: String,
    pub message: String,
    pub help: String,
}

/// The notes of `policy`, lanes first, each in id order.
///
/// Approvals are a human control. An approver that is an enabled role with lanes is
/// also an agent's credential: an agent holding it can approve other agents' calls
/// (approving its own is refused when it decides). The policy is valid, and a team may
/// mean it, so this is a note, not a problem.
pub fn notes(policy: &Policy) -> Vec<Note> {
    let lanes_file = Path::new(&policy.source.policy_dir)
        .join("lanes.yaml")
        .display()
        .to_string();
    let mut notes = Vec::new();
    for lane in policy.lanes.values() {
        if let Some(approval) = &lane.approval {
            agent_approvers(
                policy,
                approval,
                &lanes_file,
                &format!("lane:{}", lane.lane_id),
                &mut notes,
            );
        }
    }
    for tool in policy.tools.values() {
        unconfined(policy, tool, &mut notes);
        if let Some(approval) = &tool.approval {
            agent_approvers(
                policy,
                approval,
                &policy.source.tools_file,
                &format!("tool:{}", tool.tool_name),
                &mut notes,
            );
        }
    }
    notes
}

fn agent_approvers(
    policy: &Policy,
    approval: &Approval,
    file: &str,
    owner: &str,
    notes: &mut Vec<Note>,
) {
    for approver in &approval.approvers {
        let Some(role) = policy.roles.get(approver) else {
            continue;
        };
        if !role.enabled || role.lanes.is_empty() {
            continue;
        }
        notes.push(Note {
            file: file.to_string(),
            owner: owner.to_string(),
            message: format!(
                "approver `{approver}` of `{owner}` is a role that also acts in lanes {}: \
                 an agent holding its credential can approve other agents' calls (never its own)",
                role.lanes
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            help: "give approvals to an admin, or to a role with `lanes: []` that only people hold"
                .to_string(),
        });
    }
}

/// A local process of `tool` that runs outside the sandbox (`sandbox: {unconfined:
/// reason}`): with toolgate's own authority, as its reviewers should know.
fn unconfined(policy: &Policy, tool: &Tool, notes: &mut Vec<Note>) {
    let mut found = Vec::new();
    match &tool.adapter {
        AdapterConfig::Command { sandbox, .. } => found.push(("its command", sandbox)),
        AdapterConfig::Mcp {
            sandbox: Some(sandbox),
            ..
        } => found.push(("its stdio MCP server", sandbox)),
        _ => {}
    }
    if let Some(sandbox) = tool.phases.as_ref().and_then(|p| p.sandbox.as_ref()) {
        found.push(("its commit and rollback phases", sandbox));
    }
    for (what, sandbox) in found {
        if let Sandbox::Unconfined { reason } = sandbox {
            notes.push(Note {
                file: policy.source.tools_file.clone(),
                owner: format!("tool:{}", tool.tool_name),
                message: format!(
                    "{what} runs unconfined (\"{reason}\"): with toolgate's own user, files and network; every call is audited with this reason"
                ),
                help: "give it a `sandbox:` profile (filesystem, network, limits) instead of `unconfined`".to_string(),
            });
        }
    }
}
