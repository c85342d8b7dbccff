//! Validation rules, conditions: lane and tool conditions (CEL) and the arguments they read.

use super::*;

/// Compiles the conditions of a lane or a tool (with the tool's input schema, so that
/// every argument a condition reads is one the schema declares). Problems are located at
/// the expression, with the position inside it.
pub(super) fn check_conditions(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &[Spanned<RawCondition>],
    input_schema: Option<&Value>,
) -> Vec<Condition> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for entry in raw {
        let RawCondition {
            name,
            expr,
            message,
        } = &entry.value;
        if !check_id(report, file, "condition name", name) {
            continue;
        }
        if !seen.insert(name.value.clone()) {
            report.spanned(
                file,
                name,
                format!("{owner} has two conditions named `{}`", name.value),
                "give each condition of a lane or tool its own name",
            );
            continue;
        }
        if message.value.trim().is_empty() {
            report.spanned(
                file,
                message,
                format!("{owner}: condition `{}` has an empty message", name.value),
                "say in one line why a call that fails the condition is denied",
            );
        }
        match Condition::compile(&name.value, &expr.value, &message.value, input_schema) {
            Ok(condition) => out.push(condition),
            Err(errors) => {
                for e in errors {
                    let message = format!(
                        "{owner}: condition `{}`: {} (expression {}:{})",
                        name.value, e.message, e.line, e.column
                    );
                    let help = "conditions are CEL over args, scope, run, caller, tool and lane; see docs/policy.md";
                    condition_problem(report, file, expr, (e.line, e.column), message, help);
                }
            }
        }
    }
    out
}

/// A problem at `at` (line, column) inside a condition's expression.
pub(super) fn condition_problem(
    report: &mut Report<'_>,
    file: &str,
    expr: &Spanned<String>,
    at: (usize, usize),
    message: String,
    help: &str,
) {
    match inside_scalar(expr, at.0, at.1) {
        Some((line, column)) => report.problems.push(Problem {
            file: file.to_string(),
            line: Some(line),
            column: Some(column),
            message,
            help: Some(help.to_string()),
        }),
        None => report.spanned(file, expr, message, help),
    }
}

/// The file position of `line:column` inside a one-line expression written as a plain or
/// quoted scalar without escapes (the scalar's span is then the text, with or without its
/// two quotes); None where that cannot be told (block scalars, escapes, other lines), and
/// the problem is located at the scalar's start.
pub(super) fn inside_scalar(
    expr: &Spanned<String>,
    line: usize,
    column: usize,
) -> Option<(usize, usize)> {
    let at = expr.referenced;
    if at.line() == 0 || line != 1 || expr.value.contains('\n') {
        return None;
    }
    let chars = expr.value.chars().count() as u64;
    let quote = match at.span().len() {
        len if len == chars + 2 => 1,
        len if len == chars => 0,
        _ => return None,
    };
    Some((
        at.line() as usize,
        at.column() as usize + quote + column.saturating_sub(1),
    ))
}

/// A lane's conditions may read only arguments that at least one tool of the lane
/// declares (where its input schema is closed): anything else is a typo or a condition
/// that could never hold. On a tool without the argument, reading it is an evaluation
/// error (a denial) unless the condition guards it with `has()`.
pub(super) fn check_lane_condition_arguments(
    report: &mut Report<'_>,
    (file, raw): (&str, &LanesFile),
    lanes: &BTreeMap<String, Lane>,
    tools: &BTreeMap<String, Tool>,
) {
    for raw_lane in &raw.lanes {
        let Some(lane) = lanes.get(&raw_lane.value.lane_id.value) else {
            continue;
        };
        let lane_tools: Vec<&Tool> = lane.tools.iter().filter_map(|t| tools.get(t)).collect();
        for condition in &lane.conditions {
            let Some(raw_condition) = raw_lane
                .value
                .conditions
                .iter()
                .find(|c| c.value.name.value == condition.name)
            else {
                continue;
            };
            for arg in condition.arg_refs() {
                let declared = lane_tools
                    .iter()
                    .any(|tool| pointer_fits_schema(&arg.pointer, &tool.input_schema).is_ok());
                if !declared {
                    condition_problem(
                        report,
                        file,
                        &raw_condition.value.expr,
                        (arg.line, arg.column),
                        format!(
                            "lane `{}`: condition `{}`: `args{}` is not an argument of any tool of the lane ({}) (expression {}:{})",
                            lane.lane_id,
                            condition.name,
                            arg.pointer.replace('/', "."),
                            lane.tools.join(", "),
                            arg.line,
                            arg.column
                        ),
                        "read arguments the lane's tools declare in their input schemas",
                    );
                }
            }
        }
    }
}
