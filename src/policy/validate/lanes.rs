//! Validation rules, lanes: lanes.yaml.

use super::*;

pub(super) fn check_lanes(
    report: &mut Report<'_>,
    file: &str,
    raw: &LanesFile,
) -> BTreeMap<String, Lane> {
    check_version(report, file, &raw.version);
    let mut lanes = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for entry in &raw.lanes {
        let RawLane {
            lane_id,
            description,
            tools,
            required_scope_keys,
            prohibited_flags,
            run_statuses,
            write,
            conditions,
            approval,
            budget,
            rate,
        } = &entry.value;
        let id_ok = check_id(report, file, "lane id", lane_id);
        let unique = id_ok && check_unique(report, file, "lane id", &mut seen, lane_id);
        let owner = format!("lane `{}`", lane_id.value);
        check_description(report, file, &owner, description);
        let tools = check_id_list(report, file, "tool", &owner, tools);
        let required_scope_keys =
            check_id_list(report, file, "scope key", &owner, required_scope_keys);
        let prohibited_flags = check_id_list(report, file, "flag", &owner, prohibited_flags);
        let conditions = check_conditions(report, file, &owner, conditions, None);
        let approval = check_approval(report, file, &owner, approval.as_ref(), None);
        let call_limits = super::tools::check_call_limits(
            report,
            file,
            &owner,
            (budget.as_ref(), rate.as_ref()),
            &required_scope_keys,
            None,
        );
        let mut statuses = BTreeSet::new();
        for status in &run_statuses.value {
            if !statuses.insert(status.value) {
                report.spanned(
                    file,
                    status,
                    format!("{owner} lists run status `{}` twice", status.value.as_str()),
                    "list each status once",
                );
            }
        }
        if run_statuses.value.is_empty() {
            report.at(
                file,
                run_statuses.referenced,
                lane_id.referenced,
                format!("{owner} has no run statuses, so it could never act"),
                "list the run statuses the lane may act in, e.g. `run_statuses: [active]`",
            );
        }
        if unique {
            lanes.insert(
                lane_id.value.clone(),
                Lane {
                    lane_id: lane_id.value.clone(),
                    description: description.value.clone(),
                    tools,
                    required_scope_keys,
                    prohibited_flags,
                    run_statuses: statuses.into_iter().collect::<Vec<RunStatus>>(),
                    write: *write,
                    conditions,
                    approval,
                    call_limits,
                },
            );
        }
    }
    lanes
}

// ---------------------------------------------------------------------------------------
// tools/tool_registry.yaml
