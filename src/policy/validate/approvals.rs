//! Validation rules, approvals: the `approval:` block of a lane or a tool, and its
//! approvers against roles.yaml.

use super::*;
use crate::policy::model::{
    Approval, DEFAULT_APPROVAL_TTL_S, MAX_APPROVAL_TTL_S, MIN_APPROVAL_TTL_S,
};

/// The most approvers one approval may name.
pub const MAX_APPROVERS: usize = 64;

/// Checks one `approval:` block on its own (shape, quorum, ttl, the `when` condition
/// against the tool's input schema); the approvers are checked against roles.yaml by
/// [`check_approvers`].
pub(super) fn check_approval(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: Option<&Spanned<RawApproval>>,
    input_schema: Option<&Value>,
) -> Option<Approval> {
    let entry = raw?;
    let RawApproval {
        required,
        when,
        approvers,
        quorum,
        ttl_s,
    } = &entry.value;
    let before = report.problems.len();
    let when = match (required, when) {
        (Some(required), None) if required.value => None,
        (Some(required), None) => {
            report.spanned(
                file,
                required,
                format!("{owner}: `approval.required` is false"),
                "write `required: true` (or `when: <condition>`); remove the `approval` block to require no approval",
            );
            None
        }
        (Some(required), Some(_)) => {
            report.spanned(
                file,
                required,
                format!("{owner}: `approval` has both `required` and `when`"),
                "keep one: `required: true` for every call, or `when:` for the calls the condition selects",
            );
            None
        }
        (None, None) => {
            report.spanned(
                file,
                entry,
                format!("{owner}: `approval` has neither `required: true` nor `when`"),
                "add `required: true`, or `when: <CEL condition>` for the calls that need approval",
            );
            None
        }
        (None, Some(expr)) => {
            match Condition::compile(
                "approval.when",
                &expr.value,
                "this call needs human approval",
                input_schema,
            ) {
                Ok(condition) => Some(condition),
                Err(errors) => {
                    for e in errors {
                        let message = format!(
                            "{owner}: `approval.when`: {} (expression {}:{})",
                            e.message, e.line, e.column
                        );
                        let help = "approval conditions are CEL over args, scope, run, caller, tool and lane; see docs/policy.md";
                        condition_problem(report, file, expr, (e.line, e.column), message, help);
                    }
                    None
                }
            }
        }
    };
    let mut ids = BTreeSet::new();
    for approver in &approvers.value {
        if !check_id(report, file, "approver", approver) {
            continue;
        }
        if !ids.insert(approver.value.clone()) {
            report.spanned(
                file,
                approver,
                format!("{owner}: approver `{}` is listed twice", approver.value),
                "list each approver once; quorum counts distinct approvers",
            );
        }
    }
    if approvers.value.is_empty() {
        report.spanned(
            file,
            approvers,
            format!("{owner}: `approval.approvers` is empty, so no call could ever be approved"),
            "name the roles or admins (roles.yaml) who may approve, e.g. `approvers: [supervisor]`",
        );
    }
    if approvers.value.len() > MAX_APPROVERS {
        report.spanned(
            file,
            approvers,
            format!("{owner}: `approval.approvers` names more than {MAX_APPROVERS} approvers"),
            "name a role that your approvers share instead of each of them",
        );
    }
    let quorum_value = quorum.as_ref().map_or(1, |q| q.value);
    if let Some(q) = quorum
        && (q.value == 0 || q.value as usize > ids.len().max(1))
    {
        report.spanned(
            file,
            q,
            format!(
                "{owner}: `approval.quorum` is {} but {} distinct approvers are named",
                q.value,
                ids.len()
            ),
            "set a quorum from 1 to the number of approvers (it counts distinct approvers)",
        );
    }
    let ttl = ttl_s.as_ref().map_or(DEFAULT_APPROVAL_TTL_S, |t| t.value);
    if let Some(t) = ttl_s
        && !(MIN_APPROVAL_TTL_S..=MAX_APPROVAL_TTL_S).contains(&t.value)
    {
        report.spanned(
            file,
            t,
            format!("{owner}: `approval.ttl_s` is {}", t.value),
            format!("set ttl_s from {MIN_APPROVAL_TTL_S} to {MAX_APPROVAL_TTL_S} seconds (7 days)"),
        );
    }
    if report.problems.len() != before {
        return None;
    }
    Some(Approval {
        when,
        approvers: ids.into_iter().collect(),
        quorum: quorum_value,
        ttl_s: ttl,
    })
}

/// Every approver of every lane and tool names a role or an admin of roles.yaml, and
/// not an id that is both (who would be approving would be ambiguous).
pub(super) fn check_approvers(
    report: &mut Report<'_>,
    roles: &RolesFile,
    (lanes_file, lanes_raw): (&str, Option<&LanesFile>),
    (registry_file, registry_raw): (&str, Option<&RegistryFile>),
) {
    let role_ids: BTreeSet<&str> = roles
        .roles
        .iter()
        .map(|r| r.value.role_id.value.as_str())
        .collect();
    let admin_ids: BTreeSet<&str> = roles
        .admins
        .iter()
        .map(|a| a.value.admin_id.value.as_str())
        .collect();
    // An `access: audit_read` admin only reads: it can never decide an approval.
    let read_only_admins: BTreeSet<&str> = roles
        .admins
        .iter()
        .filter(|a| {
            a.value
                .access
                .as_ref()
                .is_some_and(|access| access.value == "audit_read")
        })
        .map(|a| a.value.admin_id.value.as_str())
        .collect();
    let lanes = lanes_raw
        .into_iter()
        .flat_map(|l| &l.lanes)
        .filter_map(|l| {
            let owner = format!("lane `{}`", l.value.lane_id.value);
            l.value.approval.as_ref().map(|a| (lanes_file, owner, a))
        });
    let tools = registry_raw
        .into_iter()
        .flat_map(|r| &r.tools)
        .filter_map(|t| {
            let owner = format!("tool `{}`", t.value.tool_name.value);
            t.value.approval.as_ref().map(|a| (registry_file, owner, a))
        });
    for (file, owner, approval) in lanes.chain(tools) {
        for approver in &approval.value.approvers.value {
            let id = approver.value.as_str();
            if !is_id(id) {
                continue;
            }
            match (role_ids.contains(id), admin_ids.contains(id)) {
                (true, true) => report.spanned(
                    file,
                    approver,
                    format!("{owner}: approver `{id}` is both a role and an admin"),
                    "rename the role or the admin so that an approver names exactly one",
                ),
                (false, false) => report.spanned(
                    file,
                    approver,
                    format!("{owner}: approver `{id}` is neither a role nor an admin"),
                    "name a role_id or an admin_id of roles.yaml (identity-provider claims: a role with a `jwt` credential)",
                ),
                (false, true) if read_only_admins.contains(id) => report.spanned(
                    file,
                    approver,
                    format!(
                        "{owner}: approver `{id}` is an admin with `access: audit_read`, which can never decide an approval"
                    ),
                    "name an admin with full access or a role; an `audit_read` admin only reads the audit trail",
                ),
                _ => {}
            }
        }
    }
}
