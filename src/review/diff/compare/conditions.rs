//! CEL conditions by name, on a lane or a tool.

use super::*;

/// Whose conditions are compared.
#[derive(Clone, Copy)]
pub(super) enum Owner<'a> {
    Lane(&'a str),
    Tool(&'a str),
}

/// Conditions by name: an added one narrows; a removed one widens; a changed expression
/// widens (whether the new one allows less cannot be proven in general); a changed
/// message alone is neutral.
pub(super) fn conditions(
    owner: Owner<'_>,
    old: &[Condition],
    new: &[Condition],
    out: &mut Vec<Change>,
) {
    let (label, kinds) = match owner {
        Owner::Lane(id) => (
            format!("lane `{id}`"),
            [
                Kind::LaneConditionAdded,
                Kind::LaneConditionRemoved,
                Kind::LaneConditionChanged,
            ],
        ),
        Owner::Tool(id) => (
            format!("tool `{id}`"),
            [
                Kind::ToolConditionAdded,
                Kind::ToolConditionRemoved,
                Kind::ToolConditionChanged,
            ],
        ),
    };
    let attach = |change: Change| match owner {
        Owner::Lane(id) => change.lane(id),
        Owner::Tool(id) => change.tool(id),
    };
    let o: BTreeMap<&str, &Condition> = old.iter().map(|c| (c.name.as_str(), c)).collect();
    let n: BTreeMap<&str, &Condition> = new.iter().map(|c| (c.name.as_str(), c)).collect();
    for (name, c) in &n {
        match o.get(name) {
            None => out.push(attach(
                Change::new(
                    kinds[0],
                    Effect::Narrowing,
                    format!("{label}: condition `{name}` added: {}", c.expr),
                )
                .values(Value::Null, json!(c)),
            )),
            Some(before) if before.expr != c.expr => out.push(attach(
                Change::new(
                    kinds[2],
                    Effect::Widening,
                    format!(
                        "{label}: condition `{name}` changed from `{}` to `{}` (may allow calls the old one denied)",
                        before.expr, c.expr
                    ),
                )
                .values(json!(before), json!(c)),
            )),
            Some(before) if before.message != c.message => out.push(attach(
                Change::new(
                    kinds[2],
                    Effect::Neutral,
                    format!("{label}: condition `{name}`: message changed"),
                )
                .values(json!(before), json!(c)),
            )),
            Some(_) => {}
        }
    }
    for (name, c) in &o {
        if !n.contains_key(name) {
            out.push(attach(
                Change::new(
                    kinds[1],
                    Effect::Widening,
                    format!("{label}: condition `{name}` removed: {}", c.expr),
                )
                .values(json!(c), Value::Null),
            ));
        }
    }
}
