//! A lane's or tool's `approval` requirement.

use super::*;

pub(super) fn approval_json(a: &Approval) -> Value {
    json!({
        "required": a.when.is_none(),
        "when": a.when.as_ref().map(|c| c.expr.clone()),
        "approvers": a.approvers,
        "quorum": a.quorum,
        "ttl_s": a.ttl_s,
    })
}

/// A lane's or tool's `approval`: added narrows, removed widens; a change is widening
/// when any part of it lets more calls through or makes approving easier (`when`
/// instead of `required`, a changed `when`, an approver added, a lower quorum, a longer
/// ttl), else narrowing (the opposite changes), else neutral.
pub(super) fn approval(
    owner: Owner<'_>,
    old: Option<&Approval>,
    new: Option<&Approval>,
    out: &mut Vec<Change>,
) {
    let (label, kinds) = match owner {
        Owner::Lane(id) => (
            format!("lane `{id}`"),
            [
                Kind::LaneApprovalAdded,
                Kind::LaneApprovalRemoved,
                Kind::LaneApprovalChanged,
            ],
        ),
        Owner::Tool(id) => (
            format!("tool `{id}`"),
            [
                Kind::ToolApprovalAdded,
                Kind::ToolApprovalRemoved,
                Kind::ToolApprovalChanged,
            ],
        ),
    };
    let attach = |change: Change| match owner {
        Owner::Lane(id) => change.lane(id),
        Owner::Tool(id) => change.tool(id),
    };
    let (o, n) = match (old, new) {
        (None, None) => return,
        (None, Some(n)) => {
            out.push(attach(
                Change::new(
                    kinds[0],
                    Effect::Narrowing,
                    format!("{label} now requires approval"),
                )
                .values(Value::Null, approval_json(n)),
            ));
            return;
        }
        (Some(o), None) => {
            out.push(attach(
                Change::new(
                    kinds[1],
                    Effect::Widening,
                    format!("{label} no longer requires approval"),
                )
                .values(approval_json(o), Value::Null),
            ));
            return;
        }
        (Some(o), Some(n)) => (o, n),
    };
    let mut wider = Vec::new();
    let mut narrower = Vec::new();
    match (&o.when, &n.when) {
        (None, Some(_)) => wider.push("only calls matching `when` need approval now"),
        (Some(_), None) => narrower.push("every call needs approval now"),
        (Some(a), Some(b)) if a.expr != b.expr => wider.push("`when` changed"),
        _ => {}
    }
    if n.approvers.iter().any(|a| !o.approvers.contains(a)) {
        wider.push("approvers added");
    }
    if o.approvers.iter().any(|a| !n.approvers.contains(a)) {
        narrower.push("approvers removed");
    }
    if n.quorum < o.quorum {
        wider.push("quorum lowered");
    } else if n.quorum > o.quorum {
        narrower.push("quorum raised");
    }
    if n.ttl_s > o.ttl_s {
        wider.push("ttl_s raised");
    } else if n.ttl_s < o.ttl_s {
        narrower.push("ttl_s lowered");
    }
    let effect = if !wider.is_empty() {
        Effect::Widening
    } else if !narrower.is_empty() {
        Effect::Narrowing
    } else {
        return;
    };
    let parts: Vec<&str> = wider.into_iter().chain(narrower).collect();
    out.push(attach(
        Change::new(
            kinds[2],
            effect,
            format!("{label}: approval changed ({})", parts.join(", ")),
        )
        .values(approval_json(o), approval_json(n)),
    ));
}
