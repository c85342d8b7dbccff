//! The contract's version rules for tool schemas.

use super::*;

pub(super) fn moved(old: &semver::Version, new: &semver::Version) -> String {
    if old == new {
        format!("the version stayed {old}")
    } else {
        format!("the version only went from {old} to {new}")
    }
}

/// The version rules of the contract: a breaking schema change needs a major bump, a
/// compatible one at least a minor bump; a version never goes backwards. Sorted.
pub fn version_violations(old: &Policy, new: &Policy) -> Vec<Violation> {
    let mut out = Vec::new();
    for (id, o, n) in pair(&old.tools, &new.tools) {
        let (Some(o), Some(n)) = (o, n) else {
            continue;
        };
        let (ov, nv) = (&o.version, &n.version);
        let violation = |class: Option<Class>, message: String, help: String| Violation {
            tool: id.clone(),
            old_version: ov.to_string(),
            new_version: nv.to_string(),
            class,
            message,
            help,
        };
        if nv < ov {
            out.push(violation(
                None,
                format!("tool `{id}`: version went backwards from {ov} to {nv}"),
                format!("a tool's version only grows; use at least {ov}"),
            ));
            continue;
        }
        let class = [
            (&o.input_schema, &n.input_schema),
            (&o.output_schema, &n.output_schema),
        ]
        .iter()
        .filter_map(|(a, b)| schema::overall(&schema::compare(a, b)))
        .max();
        match class {
            Some(Class::Breaking) if nv.major <= ov.major => out.push(violation(
                Some(Class::Breaking),
                format!(
                    "tool `{id}`: a breaking schema change needs a major version bump, but {}",
                    moved(ov, nv)
                ),
                format!("set `version: {}.0.0` (or make the change compatible)", ov.major + 1),
            )),
            Some(Class::Compatible) if (nv.major, nv.minor) <= (ov.major, ov.minor) => {
                out.push(violation(
                    Some(Class::Compatible),
                    format!(
                        "tool `{id}`: a compatible schema change needs at least a minor version bump, but {}",
                        moved(ov, nv)
                    ),
                    format!("set `version: {}.{}.0`", ov.major, ov.minor + 1),
                ))
            }
            _ => {}
        }
    }
    out.sort();
    out
}
