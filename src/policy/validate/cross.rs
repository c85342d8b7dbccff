//! Validation rules, cross-references between the files (roles -> lanes, lanes <-> tools).

use super::*;

pub(super) fn check_role_lanes(
    report: &mut Report<'_>,
    file: &str,
    raw: &RolesFile,
    lanes: &BTreeMap<String, Lane>,
) {
    for entry in &raw.roles {
        for lane in &entry.value.lanes {
            if is_id(&lane.value) && !lanes.contains_key(&lane.value) {
                report.spanned(
                    file,
                    lane,
                    format!(
                        "role `{}` names unknown lane `{}`",
                        entry.value.role_id.value, lane.value
                    ),
                    unknown_help("lane", &lane.value, lanes, "lanes.yaml"),
                );
            }
        }
    }
}

pub(super) fn check_lanes_and_tools(
    report: &mut Report<'_>,
    (lanes_file, lanes_raw): (&str, &LanesFile),
    lanes: &BTreeMap<String, Lane>,
    (registry_file, registry_raw): (&str, &RegistryFile),
) {
    // Tools that exist in the registry (even if they had problems of their own), with
    // their declared allowed lanes and write targets, so one broken tool does not also
    // show up as "unregistered" everywhere.
    let registered: BTreeMap<&str, &RawTool> = registry_raw
        .tools
        .iter()
        .map(|t| (t.value.tool_name.value.as_str(), &t.value))
        .collect();
    let registered_names: BTreeMap<String, ()> =
        registered.keys().map(|k| (k.to_string(), ())).collect();

    for entry in &lanes_raw.lanes {
        let lane = &entry.value;
        let lane_id = &lane.lane_id.value;
        if !is_id(lane_id) {
            // Already reported; its allowlist cannot be matched against anything.
            continue;
        }
        for tool_ref in &lane.tools {
            let tool_name = &tool_ref.value;
            if !is_id(tool_name) {
                continue;
            }
            let Some(tool) = registered.get(tool_name.as_str()) else {
                report.spanned(
                    lanes_file,
                    tool_ref,
                    format!("lane `{lane_id}` allowlists unregistered tool `{tool_name}`"),
                    unknown_help(
                        "tool",
                        tool_name,
                        &registered_names,
                        "tools/tool_registry.yaml",
                    ),
                );
                continue;
            };
            if !tool.allowed_lanes.iter().any(|l| &l.value == lane_id) {
                report.spanned(
                    lanes_file,
                    tool_ref,
                    format!("lane `{lane_id}` allowlists tool `{tool_name}`, but the tool's `allowed_lanes` does not include `{lane_id}`"),
                    format!("add `{lane_id}` to `allowed_lanes` of `{tool_name}` in the registry, or remove the tool from this lane; both must agree"),
                );
            }
            if !lane.write && !tool.write_targets.value.is_empty() {
                report.spanned(
                    lanes_file,
                    tool_ref,
                    format!("lane `{lane_id}` is not a write lane, but allowlists `{tool_name}`, which writes"),
                    format!("tools with write targets may only be bound to write lanes: set `write: true` on `{lane_id}` or remove `{tool_name}` from it"),
                );
            }
        }
    }

    for entry in &registry_raw.tools {
        let tool = &entry.value;
        let tool_name = &tool.tool_name.value;
        for lane_ref in &tool.allowed_lanes {
            let lane_id = &lane_ref.value;
            if !is_id(lane_id) {
                continue;
            }
            match lanes.get(lane_id) {
                None if !lanes_raw.lanes.iter().any(|l| &l.value.lane_id.value == lane_id) => report.spanned(
                    registry_file,
                    lane_ref,
                    format!("tool `{tool_name}` names unknown lane `{lane_id}` in `allowed_lanes`"),
                    unknown_help("lane", lane_id, lanes, "lanes.yaml"),
                ),
                Some(lane) if !lane.tools.contains(tool_name) => report.spanned(
                    registry_file,
                    lane_ref,
                    format!("tool `{tool_name}` lists lane `{lane_id}` in `allowed_lanes`, but that lane does not allowlist it"),
                    format!("add `{tool_name}` to the `tools` of lane `{lane_id}` in lanes.yaml, or remove the lane here; both must agree"),
                ),
                _ => {}
            }
        }
    }
}
