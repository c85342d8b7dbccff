//! Lanes: their fields, approvals, limits and conditions.

use super::*;

pub(super) fn lanes(old: &Policy, new: &Policy, out: &mut Vec<Change>) {
    for (id, o, n) in pair(&old.lanes, &new.lanes) {
        match (o, n) {
            (None, Some(l)) => out.push(
                Change::new(
                    Kind::LaneAdded,
                    Effect::Widening,
                    format!("lane `{id}` added (tools: {})", l.tools.join(", ")),
                )
                .lane(id),
            ),
            (Some(_), None) => out.push(
                Change::new(
                    Kind::LaneRemoved,
                    Effect::Narrowing,
                    format!("lane `{id}` removed"),
                )
                .lane(id),
            ),
            (Some(o), Some(n)) => lane_fields(id, o, n, out),
            (None, None) => {}
        }
    }
}

pub(super) fn lane_fields(id: &str, o: &Lane, n: &Lane, out: &mut Vec<Change>) {
    let (added, removed) = set_diff(&o.required_scope_keys, &n.required_scope_keys);
    for key in added {
        out.push(
            Change::new(
                Kind::LaneScopeKeyAdded,
                Effect::Narrowing,
                format!("lane `{id}` now requires scope key `{key}`"),
            )
            .lane(id),
        );
    }
    for key in removed {
        out.push(
            Change::new(
                Kind::LaneScopeKeyRemoved,
                Effect::Widening,
                format!("lane `{id}` no longer requires scope key `{key}`"),
            )
            .lane(id),
        );
    }
    let (added, removed) = set_diff(&o.prohibited_flags, &n.prohibited_flags);
    for flag in added {
        out.push(
            Change::new(
                Kind::LaneProhibitionAdded,
                Effect::Narrowing,
                format!("lane `{id}` now prohibits flag `{flag}`"),
            )
            .lane(id),
        );
    }
    for flag in removed {
        out.push(
            Change::new(
                Kind::LaneProhibitionRemoved,
                Effect::Widening,
                format!("lane `{id}` no longer prohibits flag `{flag}`"),
            )
            .lane(id),
        );
    }
    let statuses = |l: &Lane| -> Vec<String> {
        l.run_statuses
            .iter()
            .map(|s| s.as_str().to_string())
            .collect()
    };
    let (os, ns) = (statuses(o), statuses(n));
    let (added, removed) = set_diff(&os, &ns);
    for status in added {
        out.push(
            Change::new(
                Kind::LaneRunStatusAdded,
                Effect::Widening,
                format!("lane `{id}` may now act in `{status}` runs"),
            )
            .lane(id),
        );
    }
    for status in removed {
        out.push(
            Change::new(
                Kind::LaneRunStatusRemoved,
                Effect::Narrowing,
                format!("lane `{id}` may no longer act in `{status}` runs"),
            )
            .lane(id),
        );
    }
    if o.write != n.write {
        let (effect, text) = if n.write {
            (Effect::Widening, "is now a write lane")
        } else {
            (Effect::Narrowing, "is no longer a write lane")
        };
        out.push(
            Change::new(
                Kind::LaneWriteChanged,
                effect,
                format!("lane `{id}` {text}"),
            )
            .lane(id)
            .values(json!(o.write), json!(n.write)),
        );
    }
    conditions(Owner::Lane(id), &o.conditions, &n.conditions, out);
    approval(
        Owner::Lane(id),
        o.approval.as_ref(),
        n.approval.as_ref(),
        out,
    );
    call_limits(Owner::Lane(id), &o.call_limits, &n.call_limits, out);
}
