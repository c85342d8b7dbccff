//! Validation rules, tools: registry entries, their limits, write targets and flag rules.

use super::*;

pub(super) fn check_tools(
    report: &mut Report<'_>,
    file: &str,
    raw: &RegistryFile,
    tools_dir: &Path,
) -> BTreeMap<String, Tool> {
    check_version(report, file, &raw.version);
    let servers = check_servers(report, file, &raw.servers, tools_dir);
    let mut tools = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for entry in &raw.tools {
        let name = &entry.value.tool_name;
        let name_ok = if !is_mcp_tool_name(&name.value) {
            report.spanned(
                file,
                name,
                format!("tool name `{}` is not a valid MCP tool name", name.value.escape_debug()),
                "MCP tool names are 1-64 characters of letters, digits, `_`, `.` and `-`; toolgate also requires a valid id",
            );
            false
        } else {
            check_id(report, file, "tool name", name)
        };
        let unique = name_ok && check_unique(report, file, "tool name", &mut seen, name);
        let tool = check_tool(report, file, entry, (tools_dir, &servers), name_ok);
        if let (true, Some(tool)) = (unique, tool) {
            tools.insert(tool.tool_name.clone(), tool);
        }
    }
    tools
}

pub(super) fn check_tool(
    report: &mut Report<'_>,
    file: &str,
    entry: &Spanned<RawTool>,
    (tools_dir, servers): (&Path, &BTreeMap<String, McpServer>),
    name_ok: bool,
) -> Option<Tool> {
    let before = report.problems.len();
    let raw = &entry.value;
    let name = &raw.tool_name.value;
    let owner = format!("tool `{name}`");

    check_description(report, file, &owner, &raw.description);

    let version = match semver::Version::parse(&raw.version.value) {
        Ok(version) => Some(version),
        Err(err) => {
            report.spanned(
                file,
                &raw.version,
                format!(
                    "{owner}: version `{}` is not a semantic version ({err})",
                    raw.version.value.escape_debug()
                ),
                "write MAJOR.MINOR.PATCH, e.g. `1.0.0`",
            );
            None
        }
    };

    let determinism = match raw.determinism.value {
        RawDeterminism::Pure => Determinism::Pure,
        RawDeterminism::Idempotent => Determinism::Idempotent,
        RawDeterminism::SideEffectful => Determinism::SideEffectful,
    };
    if determinism != Determinism::SideEffectful && !raw.idempotent.value {
        report.spanned(
            file,
            &raw.idempotent,
            format!("{owner} is `{}` but says `idempotent: false`", determinism_str(determinism)),
            "a pure or idempotent tool is idempotent: set `idempotent: true`, or `determinism: side_effectful`",
        );
    }

    let limits = check_limits(report, file, &owner, raw);

    let allowed_lanes = check_id_list(report, file, "lane", &owner, &raw.allowed_lanes);
    let required_scope_keys =
        check_id_list(report, file, "scope key", &owner, &raw.required_scope_keys);
    let prohibited_flags = check_id_list(report, file, "flag", &owner, &raw.prohibited_flags);
    let write_targets = check_write_targets(report, file, &owner, raw, determinism);
    let flag_rules: Vec<FlagRule> = raw
        .flag_rules
        .iter()
        .filter_map(|rule| check_flag_rule(report, file, &owner, rule))
        .collect();
    let adapter = check_adapter(report, file, &owner, &raw.adapter, servers, tools_dir);
    let phases = adapters::check_phases(report, file, &owner, &raw.adapter, determinism, tools_dir);
    let redaction = check_redaction(report, file, &owner, raw.redaction.as_ref());

    let mut conditions = Vec::new();
    let mut approval = None;
    let schemas = if name_ok {
        let context = |field| SchemaContext {
            tools_dir,
            registry: file,
            tool_name: name,
            field,
        };
        let input = schema::load(&raw.input_schema, &context("input_schema"), report.problems);
        let output = schema::load(
            &raw.output_schema,
            &context("output_schema"),
            report.problems,
        );
        if let Some(input) = &input {
            conditions =
                check_conditions(report, file, &owner, &raw.conditions, Some(&input.value));
            approval = check_approval(
                report,
                file,
                &owner,
                raw.approval.as_ref(),
                Some(&input.value),
            );
            for (rule, raw_rule) in flag_rules.iter().zip(&raw.flag_rules) {
                if let Err(message) = pointer_fits_schema(&rule.pointer, &input.value) {
                    report.spanned(
                        file,
                        &raw_rule.value.pointer,
                        format!("{owner}: flag rule for `{}`: pointer `{}` {message}", rule.flag, rule.pointer),
                        "point at an argument the input schema declares, or the rule can never raise its flag",
                    );
                }
            }
        }
        input.zip(output)
    } else {
        None
    };
    let call_limits = check_call_limits(
        report,
        file,
        &owner,
        (raw.budget.as_ref(), raw.rate.as_ref()),
        &required_scope_keys,
        schemas.as_ref().map(|(input, _)| &*input.value),
    );

    if report.problems.len() != before {
        return None;
    }
    let (input, output) = schemas?;
    Some(Tool {
        tool_name: name.clone(),
        description: raw.description.value.clone(),
        enabled: raw.enabled,
        version: version?,
        determinism,
        idempotent: raw.idempotent.value,
        timeout_default_ms: raw.timeout_default_ms.value,
        limits: limits?,
        allowed_lanes,
        required_scope_keys,
        prohibited_flags,
        flag_rules,
        conditions,
        approval,
        write_targets,
        adapter: adapter?,
        phases,
        call_limits,
        redaction: redaction?,
        input_schema: input.value,
        output_schema: output.value,
        input_validator: input.validator,
        output_validator: output.validator,
    })
}

pub(super) fn determinism_str(determinism: Determinism) -> &'static str {
    match determinism {
        Determinism::Pure => "pure",
        Determinism::Idempotent => "idempotent",
        Determinism::SideEffectful => "side_effectful",
    }
}

pub(super) fn check_limits(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawTool,
) -> Option<Limits> {
    let before = report.problems.len();
    let limits = &raw.limits;
    let bounded = |report: &mut Report<'_>, field: &str, value: &Spanned<u64>, max: u64| {
        if value.value == 0 {
            report.spanned(
                file,
                value,
                format!("{owner}: `{field}` is 0"),
                format!("`{field}` must be at least 1"),
            );
        } else if value.value > max {
            report.spanned(
                file,
                value,
                format!(
                    "{owner}: `{field}` {} is over the ceiling of {max}",
                    value.value
                ),
                format!("`{field}` may be at most {max}"),
            );
        }
    };
    bounded(
        report,
        "limits.timeout_ms_max",
        &limits.timeout_ms_max,
        MAX_TIMEOUT_MS,
    );
    bounded(
        report,
        "limits.max_output_bytes",
        &limits.max_output_bytes,
        MAX_OUTPUT_BYTES,
    );
    let concurrency = Spanned::new(
        u64::from(limits.max_concurrency.value),
        limits.max_concurrency.referenced,
        limits.max_concurrency.defined,
    );
    bounded(
        report,
        "limits.max_concurrency",
        &concurrency,
        u64::from(MAX_CONCURRENCY),
    );
    let default = &raw.timeout_default_ms;
    if default.value == 0 {
        report.spanned(
            file,
            default,
            format!("{owner}: `timeout_default_ms` is 0"),
            "the default timeout must be at least 1 ms",
        );
    } else if default.value > limits.timeout_ms_max.value {
        report.spanned(
            file,
            default,
            format!(
                "{owner}: `timeout_default_ms` {} is greater than `limits.timeout_ms_max` {}",
                default.value, limits.timeout_ms_max.value
            ),
            "lower the default or raise the maximum; callers may only ask for timeouts up to the maximum",
        );
    }
    (report.problems.len() == before).then_some(Limits {
        timeout_ms_max: limits.timeout_ms_max.value,
        max_output_bytes: limits.max_output_bytes.value,
        max_concurrency: limits.max_concurrency.value,
    })
}

pub(super) fn check_write_targets(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    raw: &RawTool,
    determinism: Determinism,
) -> Vec<String> {
    let targets = &raw.write_targets;
    let mut seen = BTreeSet::new();
    for target in &targets.value {
        let t = &target.value;
        let well_formed = t
            .split_once(':')
            .is_some_and(|(kind, place)| is_id(kind) && !place.trim().is_empty())
            && !t.chars().any(char::is_control);
        if !well_formed {
            report.spanned(
                file,
                target,
                format!("{owner}: write target `{}` is not `<kind>:<place>`", t.escape_debug()),
                "say what kind of place and where, e.g. `data_dir:drafts/{case_id}/` or `http:127.0.0.1:8799/filings`",
            );
        } else if !seen.insert(t.clone()) {
            report.spanned(
                file,
                target,
                format!("{owner} lists write target `{t}` twice"),
                "list each target once",
            );
        }
    }
    match determinism {
        Determinism::Pure if !targets.value.is_empty() => report.at(
            file,
            targets.referenced,
            raw.determinism.referenced,
            format!("{owner} is `pure` but declares write targets"),
            "a pure tool writes nothing: remove the write targets or declare `determinism: idempotent` or `side_effectful`",
        ),
        Determinism::SideEffectful if targets.value.is_empty() => report.at(
            file,
            targets.referenced,
            raw.determinism.referenced,
            format!("{owner} is `side_effectful` but declares no write targets"),
            "declare where the tool writes (the contract requires write targets for tools that write)",
        ),
        _ => {}
    }
    seen.into_iter().collect()
}

pub(super) fn check_flag_rule(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    rule: &Spanned<RawFlagRule>,
) -> Option<FlagRule> {
    let before = report.problems.len();
    let RawFlagRule {
        flag,
        pointer,
        prefix,
        equals,
        is_true,
    } = &rule.value;
    check_id(report, file, "flag", flag);
    if !is_json_pointer(&pointer.value) {
        report.spanned(
            file,
            pointer,
            format!(
                "{owner}: flag rule pointer `{}` is not a JSON pointer",
                pointer.value.escape_debug()
            ),
            "a JSON pointer starts with `/` and escapes `~` as `~0` and `/` as `~1`, e.g. `/path`",
        );
    }
    let matcher = match (prefix, equals, is_true) {
        (Some(prefix), None, None) => {
            if prefix.value.is_empty() {
                report.spanned(
                    file,
                    prefix,
                    format!("{owner}: flag rule `prefix` is empty"),
                    "an empty prefix matches every string; name the prefix that matters",
                );
            }
            Some(FlagMatcher::Prefix(prefix.value.clone()))
        }
        (None, Some(equals), None) => Some(FlagMatcher::Equals(equals.value.clone())),
        (None, None, Some(is_true)) => {
            if !is_true.value {
                report.spanned(file, is_true, format!("{owner}: flag rule says `is_true: false`"), "`is_true: true` raises the flag when the value is boolean true; there is no `false` form");
            }
            Some(FlagMatcher::IsTrue)
        }
        _ => {
            report.spanned(
                file,
                rule,
                format!("{owner}: flag rule for `{}` needs exactly one of `prefix`, `equals` or `is_true`", flag.value),
                "e.g. `{flag: privileged, pointer: /path, prefix: privileged/}`",
            );
            None
        }
    };
    if report.problems.len() != before {
        return None;
    }
    Some(FlagRule {
        flag: flag.value.clone(),
        pointer: pointer.value.clone(),
        matcher: matcher?,
    })
}

/// Whether `pointer` can name something the input schema allows. Follows `properties`
/// one token at a time; where the schema is open (no `additionalProperties: false`) or
/// not a plain object schema, anything may be there and the check stops.
pub(crate) fn pointer_fits_schema(pointer: &str, schema: &Value) -> Result<(), String> {
    let mut current = schema;
    for token in pointer.split('/').skip(1) {
        let token = crate::text::pointer_unescape(token);
        let Some(object) = current.as_object() else {
            return Ok(());
        };
        if let Some(next) = object.get("properties").and_then(|p| p.get(&token)) {
            current = next;
            continue;
        }
        let closed = object.get("additionalProperties") == Some(&Value::Bool(false))
            && !object.contains_key("patternProperties")
            && !["allOf", "anyOf", "oneOf", "$ref"]
                .iter()
                .any(|k| object.contains_key(*k));
        return if closed {
            Err(format!(
                "names `{token}`, which the input schema does not allow"
            ))
        } else {
            Ok(())
        };
    }
    Ok(())
}

/// `budget` and `rate` of a lane or tool: bounded numbers, and a rate `key` that names
/// `run`, `role`, one of the owner's required scope keys (so it is always there) or an
/// argument its input schema declares (on a lane: any argument name).
pub(super) fn check_call_limits(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    (budget, rate): (
        Option<&Spanned<crate::policy::raw::RawBudget>>,
        Option<&Spanned<crate::policy::raw::RawRate>>,
    ),
    scope_keys: &[String],
    input_schema: Option<&Value>,
) -> crate::policy::CallLimits {
    use crate::policy::{Budget, CallLimits, LimitKey, RateLimit};
    const MAX_COUNT: u64 = 1_000_000;
    const MAX_WINDOW_S: u64 = 7 * 24 * 3600;
    let mut limits = CallLimits::default();
    let count = |report: &mut Report<'_>, field: &str, value: &Spanned<u64>, max: u64| {
        let ok = (1..=max).contains(&value.value);
        if !ok {
            report.spanned(
                file,
                value,
                format!(
                    "{owner}: `{field}` is {}, not within 1..={max}",
                    value.value
                ),
                "give a positive bound; remove the setting for no limit",
            );
        }
        ok
    };
    if let Some(b) = budget
        && count(
            report,
            "budget.max_calls_per_run",
            &b.value.max_calls_per_run,
            MAX_COUNT,
        )
    {
        limits.budget = Some(Budget {
            max_calls_per_run: b.value.max_calls_per_run.value,
        });
    }
    if let Some(r) = rate {
        let max_ok = count(report, "rate.max", &r.value.max, MAX_COUNT);
        let per_ok = count(report, "rate.per_s", &r.value.per_s, MAX_WINDOW_S);
        let key = match &r.value.key {
            None => Some(None),
            Some(text) => {
                match LimitKey::parse(&text.value) {
                    None => {
                        report.spanned(
                        file,
                        text,
                        format!("{owner}: rate key `{}` is not `run`, `role`, `scope.<key>` or `args.<name>`", text.value.escape_debug()),
                        "e.g. `key: scope.service` counts the calls per service",
                    );
                        None
                    }
                    Some(LimitKey::Scope(k)) if !scope_keys.contains(&k) => {
                        report.spanned(
                        file,
                        text,
                        format!("{owner}: rate key `scope.{k}` is not one of its required scope keys"),
                        "add the key to `required_scope_keys`, so every call carries it",
                    );
                        None
                    }
                    Some(LimitKey::Args(a))
                        if input_schema.is_some_and(|s| {
                            s.get("properties")
                                .and_then(Value::as_object)
                                .is_none_or(|p| !p.contains_key(&a))
                        }) =>
                    {
                        report.spanned(
                        file,
                        text,
                        format!("{owner}: rate key `args.{a}` is not an argument its input schema declares"),
                        "declare the argument under the input schema's `properties`",
                    );
                        None
                    }
                    Some(k) => Some(Some(k)),
                }
            }
        };
        if let (true, true, Some(key)) = (max_ok, per_ok, key) {
            limits.rate = Some(RateLimit {
                max: r.value.max.value,
                per_s: r.value.per_s.value,
                key,
            });
        }
    }
    limits
}
