//! The one validation step: raw registry files in, a [`Policy`] (or every problem) out.
//!
//! Each file is checked on its own first (ids, duplicates, values), then the
//! cross-references between files (roles -> lanes, lanes <-> tools, write tools only in
//! write lanes). A file that failed to parse is skipped, and so are the cross-checks
//! that need it, so one syntax error does not bury the report in follow-on noise.
//!
//! INVARIANT: every problem carries the file and, whenever the raw types kept one, the
//! line and column of the offending value (`Spanned`), falling back to the enclosing
//! entry's position.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use serde_saphyr::{Location, Spanned};

use super::Problem;
use super::condition::Condition;
use super::model::{
    AdapterConfig, Admin, Credential, Determinism, FileVersion, FlagMatcher, FlagRule, Lane,
    Limits, Policy, PolicySource, PolicyVersions, Redaction, Role, RunStatus, Tool,
};
use super::raw::{
    LanesFile, RawAdapter, RawAdapterKind, RawCondition, RawCredential, RawDeterminism,
    RawFlagRule, RawLane, RawRedaction, RawRedactionMode, RawRole, RawTool, RegistryFile,
    RolesFile,
};
use super::read::SourceFile;
use super::schema::{self, SchemaContext};

/// Upper bounds on tool limits: a registry can ask for less, never more.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
pub const MAX_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;
pub const MAX_CONCURRENCY: u32 = 1024;

/// A file that parsed: its bytes (for the hash) and its raw content.
pub(crate) struct Parsed<T> {
    pub file: SourceFile,
    pub raw: T,
}

/// Everything validation needs. A `None` file failed to read or parse (its problem is
/// already reported).
pub(crate) struct Input<'a> {
    pub roles: Option<Parsed<RolesFile>>,
    pub lanes: Option<Parsed<LanesFile>>,
    pub registry: Option<Parsed<RegistryFile>>,
    /// The registry's directory: schema paths resolve against it.
    pub tools_dir: &'a Path,
    /// Reads an environment variable (for `token_env` credentials).
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

/// Validates and builds. Pushes every problem found; returns the policy only when there
/// are none (its `source` is left empty for the caller to fill in).
pub(crate) fn build(input: Input<'_>, problems: &mut Vec<Problem>) -> Option<Policy> {
    let before = problems.len();
    let mut report = Report { problems };

    let roles = input
        .roles
        .as_ref()
        .map(|p| check_roles(&mut report, &p.file.display, &p.raw, input.env));
    let lanes = input
        .lanes
        .as_ref()
        .map(|p| check_lanes(&mut report, &p.file.display, &p.raw));
    let tools = input
        .registry
        .as_ref()
        .map(|p| check_tools(&mut report, &p.file.display, &p.raw, input.tools_dir));

    if let (Some(roles_file), Some(lanes)) = (&input.roles, &lanes) {
        check_role_lanes(
            &mut report,
            &roles_file.file.display,
            &roles_file.raw,
            lanes,
        );
    }
    if let (Some(lanes_file), Some(lanes), Some(registry_file)) =
        (&input.lanes, &lanes, &input.registry)
    {
        check_lanes_and_tools(
            &mut report,
            (&lanes_file.file.display, &lanes_file.raw),
            lanes,
            (&registry_file.file.display, &registry_file.raw),
        );
    }
    if let (Some(lanes_file), Some(lanes), Some(tools)) = (&input.lanes, &lanes, &tools) {
        check_lane_condition_arguments(
            &mut report,
            (&lanes_file.file.display, &lanes_file.raw),
            lanes,
            tools,
        );
    }

    if report.problems.len() != before {
        return None;
    }
    let (roles_file, lanes_file, registry_file) = (input.roles?, input.lanes?, input.registry?);
    let (roles, admins) = roles?;
    let version = |parsed_version: &Spanned<String>, file: &SourceFile| FileVersion {
        version: parsed_version.value.clone(),
        sha256: crate::canonical::sha256_hex(&file.bytes),
    };
    Some(Policy {
        roles,
        admins,
        lanes: lanes?,
        tools: tools?,
        versions: PolicyVersions {
            roles: version(&roles_file.raw.version, &roles_file.file),
            lanes: version(&lanes_file.raw.version, &lanes_file.file),
            registry: version(&registry_file.raw.version, &registry_file.file),
        },
        source: PolicySource::default(),
    })
}

// ---------------------------------------------------------------------------------------
// Reporting

struct Report<'p> {
    problems: &'p mut Vec<Problem>,
}

impl Report<'_> {
    /// A problem at `at`, or at `fallback` when the parser kept no position for `at`.
    fn at(
        &mut self,
        file: &str,
        at: Location,
        fallback: Location,
        message: String,
        help: impl Into<String>,
    ) {
        let location = if at.line() > 0 { at } else { fallback };
        let help = Some(help.into());
        self.problems.push(if location.line() > 0 {
            Problem {
                file: file.to_string(),
                line: Some(location.line() as usize),
                column: Some(location.column() as usize),
                message,
                help,
            }
        } else {
            Problem {
                file: file.to_string(),
                line: None,
                column: None,
                message,
                help,
            }
        });
    }

    fn spanned<T>(
        &mut self,
        file: &str,
        value: &Spanned<T>,
        message: String,
        help: impl Into<String>,
    ) {
        self.at(file, value.referenced, value.referenced, message, help);
    }
}

// ---------------------------------------------------------------------------------------
// Shared value checks

/// `^[a-z][a-z0-9_]{0,63}$`: role, admin, lane and tool ids, scope keys and flags.
pub(crate) fn is_id(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
}

/// MCP's tool-name rule: 1 to 64 characters of `[A-Za-z0-9_.-]`.
pub(crate) fn is_mcp_tool_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// An RFC 6901 JSON pointer naming something inside the document: `/` followed by
/// reference tokens in which `~` is only ever `~0` or `~1`.
pub(crate) fn is_json_pointer(s: &str) -> bool {
    if !s.starts_with('/') {
        return false;
    }
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return false;
        }
    }
    true
}

fn is_env_var_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const ID_HELP: &str =
    "ids are 1-64 characters: a lowercase letter, then lowercase letters, digits or `_`";

/// The closest known id to `unknown`, if it is a plausible typo.
fn did_you_mean<'a>(
    unknown: &str,
    known: impl IntoIterator<Item = &'a String>,
) -> Option<&'a String> {
    known
        .into_iter()
        .map(|k| (edit_distance(unknown, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn unknown_help(
    kind: &str,
    unknown: &str,
    known: &BTreeMap<String, impl Sized>,
    defined_in: &str,
) -> String {
    match did_you_mean(unknown, known.keys()) {
        Some(guess) => format!("did you mean `{guess}`? {kind}s are defined in {defined_in}"),
        None if known.is_empty() => format!("no {kind}s are defined in {defined_in}"),
        None => format!(
            "{kind}s defined in {defined_in}: {}",
            known
                .keys()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn check_version(report: &mut Report<'_>, file: &str, version: &Spanned<String>) {
    let v = &version.value;
    if v.trim().is_empty() {
        report.spanned(
            file,
            version,
            "`version` is empty".into(),
            "write the policy version, e.g. `version: \"2026.11.1\"`",
        );
    } else if v.len() > 64 || v.chars().any(char::is_control) {
        report.spanned(
            file,
            version,
            format!(
                "`version` `{}` is longer than 64 characters or holds control characters",
                v.escape_debug()
            ),
            "use a short printable version such as `2026.11.1`",
        );
    }
}

fn check_description(
    report: &mut Report<'_>,
    file: &str,
    what: &str,
    description: &Spanned<String>,
) {
    if description.value.trim().is_empty() {
        report.spanned(
            file,
            description,
            format!("{what} has an empty description"),
            "say in one line what it is for",
        );
    }
}

/// Checks an id; returns whether it is valid.
fn check_id(report: &mut Report<'_>, file: &str, kind: &str, id: &Spanned<String>) -> bool {
    if is_id(&id.value) {
        return true;
    }
    report.spanned(
        file,
        id,
        format!("{kind} `{}` is not a valid id", id.value.escape_debug()),
        ID_HELP,
    );
    false
}

/// Checks a list of ids (scope keys, flags, lane or tool references): each valid, none
/// twice. Returns the valid ones, sorted and deduplicated.
fn check_id_list(
    report: &mut Report<'_>,
    file: &str,
    kind: &str,
    owner: &str,
    list: &[Spanned<String>],
) -> Vec<String> {
    let mut seen = BTreeSet::new();
    for item in list {
        if !check_id(report, file, kind, item) {
            continue;
        }
        if !seen.insert(item.value.clone()) {
            report.spanned(
                file,
                item,
                format!("{owner} lists {kind} `{}` twice", item.value),
                "list each entry once",
            );
        }
    }
    seen.into_iter().collect()
}

/// Registers an id; reports a duplicate (pointing back at the first definition).
fn check_unique(
    report: &mut Report<'_>,
    file: &str,
    kind: &str,
    seen: &mut BTreeMap<String, Location>,
    id: &Spanned<String>,
) -> bool {
    if let Some(first) = seen.get(&id.value) {
        report.spanned(
            file,
            id,
            format!(
                "duplicate {kind} `{}` (first defined at line {})",
                id.value,
                first.line()
            ),
            format!("every {kind} must be unique; rename or remove one of them"),
        );
        return false;
    }
    seen.insert(id.value.clone(), id.referenced);
    true
}

// ---------------------------------------------------------------------------------------
// roles.yaml

type RolesAndAdmins = (BTreeMap<String, Role>, Vec<Admin>);

fn check_roles(
    report: &mut Report<'_>,
    file: &str,
    raw: &RolesFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> RolesAndAdmins {
    check_version(report, file, &raw.version);
    let mut roles = BTreeMap::new();
    let mut seen = BTreeMap::new();
    // Who holds each credential hash, so two principals never share a token.
    let mut holders: BTreeMap<String, String> = BTreeMap::new();

    for entry in &raw.roles {
        let RawRole {
            role_id,
            description,
            enabled,
            lanes,
            credential,
        } = &entry.value;
        let id_ok = check_id(report, file, "role id", role_id);
        let unique = id_ok && check_unique(report, file, "role id", &mut seen, role_id);
        check_description(
            report,
            file,
            &format!("role `{}`", role_id.value),
            description,
        );
        let owner = format!("role `{}`", role_id.value);
        let lanes = check_id_list(report, file, "lane", &owner, lanes);
        let credential = check_credential(report, file, &owner, credential, env, &mut holders);
        if let (true, Some(credential)) = (unique, credential) {
            roles.insert(
                role_id.value.clone(),
                Role {
                    role_id: role_id.value.clone(),
                    description: description.value.clone(),
                    enabled: *enabled,
                    lanes,
                    credential,
                },
            );
        }
    }

    let mut admins = Vec::new();
    let mut seen_admins = BTreeMap::new();
    for entry in &raw.admins {
        let admin = &entry.value;
        let id_ok = check_id(report, file, "admin id", &admin.admin_id);
        let unique =
            id_ok && check_unique(report, file, "admin id", &mut seen_admins, &admin.admin_id);
        check_description(
            report,
            file,
            &format!("admin `{}`", admin.admin_id.value),
            &admin.description,
        );
        let owner = format!("admin `{}`", admin.admin_id.value);
        let credential =
            check_credential(report, file, &owner, &admin.credential, env, &mut holders);
        if let (true, Some(credential)) = (unique, credential) {
            admins.push(Admin {
                admin_id: admin.admin_id.value.clone(),
                description: admin.description.value.clone(),
                credential,
            });
        }
    }
    admins.sort_by(|a, b| a.admin_id.cmp(&b.admin_id));
    (roles, admins)
}

fn check_credential(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    credential: &Spanned<RawCredential>,
    env: &dyn Fn(&str) -> Option<String>,
    holders: &mut BTreeMap<String, String>,
) -> Option<Credential> {
    const HELP: &str =
        "bind the credential as `{token_sha256: <64 lowercase hex>}` or `{token_env: VAR_NAME}`";
    let run_tokens_only = match super::identity::run_tokens_only(owner, &credential.value) {
        Err((message, help)) => {
            report.spanned(file, credential, message, help);
            return None;
        }
        Ok(super::identity::RunTokensOnly::Alone) => {
            return Some(Credential::RunTokensOnly { sha256: None });
        }
        Ok(super::identity::RunTokensOnly::WithStatic) => true,
        Ok(super::identity::RunTokensOnly::No) => false,
    };
    let (credential_value, sha256) = match (
        &credential.value.token_sha256,
        &credential.value.token_env,
    ) {
        (Some(_), Some(_)) | (None, None) => {
            report.spanned(
                file,
                credential,
                format!("{owner}: credential needs exactly one of `token_sha256` or `token_env`"),
                HELP,
            );
            return None;
        }
        (Some(hash), None) => {
            if !is_sha256_hex(&hash.value) {
                let hint = if hash.value.len() == 64
                    && hash.value.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    "write it in lowercase"
                } else {
                    "a sha256 is 64 hex digits, e.g. `printf %s \"$TOKEN\" | sha256sum`"
                };
                report.spanned(
                    file,
                    hash,
                    format!(
                        "{owner}: `token_sha256` `{}` is not a lowercase hex sha256",
                        hash.value.escape_debug()
                    ),
                    hint,
                );
                return None;
            }
            (
                Credential::TokenSha256(hash.value.clone()),
                hash.value.clone(),
            )
        }
        (None, Some(var)) => {
            if !is_env_var_name(&var.value) {
                report.spanned(
                    file,
                    var,
                    format!(
                        "{owner}: `token_env` `{}` is not an environment variable name",
                        var.value.escape_debug()
                    ),
                    "use letters, digits and `_`, not starting with a digit",
                );
                return None;
            }
            match env(&var.value).filter(|token| !token.is_empty()) {
                Some(token) => {
                    let sha256 = crate::canonical::sha256_hex(token.as_bytes());
                    (
                        Credential::TokenEnv {
                            var: var.value.clone(),
                            sha256: Some(sha256.clone()),
                        },
                        sha256,
                    )
                }
                None => {
                    report.spanned(
                        file,
                        var,
                        format!("{owner}: environment variable `{}` is not set, so the credential cannot be proven", var.value),
                        format!("set `{}` to the token before loading the policy, or bind `token_sha256` instead", var.value),
                    );
                    return None;
                }
            }
        }
    };
    if let Some(first) = holders.get(&sha256) {
        report.spanned(
            file,
            credential,
            format!("{owner} has the same credential as {first}"),
            "give every role and admin its own token, so a token proves exactly one identity",
        );
        return None;
    }
    holders.insert(sha256.clone(), owner.to_string());
    if run_tokens_only {
        return Some(Credential::RunTokensOnly {
            sha256: Some(sha256),
        });
    }
    Some(credential_value)
}

// ---------------------------------------------------------------------------------------
// lanes.yaml

fn check_lanes(report: &mut Report<'_>, file: &str, raw: &LanesFile) -> BTreeMap<String, Lane> {
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
                },
            );
        }
    }
    lanes
}

// ---------------------------------------------------------------------------------------
// tools/tool_registry.yaml

fn check_tools(
    report: &mut Report<'_>,
    file: &str,
    raw: &RegistryFile,
    tools_dir: &Path,
) -> BTreeMap<String, Tool> {
    check_version(report, file, &raw.version);
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
        let tool = check_tool(report, file, entry, tools_dir, name_ok);
        if let (true, Some(tool)) = (unique, tool) {
            tools.insert(tool.tool_name.clone(), tool);
        }
    }
    tools
}

fn check_tool(
    report: &mut Report<'_>,
    file: &str,
    entry: &Spanned<RawTool>,
    tools_dir: &Path,
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
    let adapter = check_adapter(report, file, &owner, &raw.adapter);
    let redaction = check_redaction(report, file, &owner, raw.redaction.as_ref());

    let mut conditions = Vec::new();
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
        write_targets,
        adapter: adapter?,
        redaction: redaction?,
        input_schema: input.value,
        output_schema: output.value,
        input_validator: input.validator,
        output_validator: output.validator,
    })
}

fn determinism_str(determinism: Determinism) -> &'static str {
    match determinism {
        Determinism::Pure => "pure",
        Determinism::Idempotent => "idempotent",
        Determinism::SideEffectful => "side_effectful",
    }
}

fn check_limits(report: &mut Report<'_>, file: &str, owner: &str, raw: &RawTool) -> Option<Limits> {
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

fn check_write_targets(
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

fn check_flag_rule(
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
        let token = token.replace("~1", "/").replace("~0", "~");
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

/// Compiles the conditions of a lane or a tool (with the tool's input schema, so that
/// every argument a condition reads is one the schema declares). Problems are located at
/// the expression, with the position inside it.
fn check_conditions(
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
fn condition_problem(
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
fn inside_scalar(expr: &Spanned<String>, line: usize, column: usize) -> Option<(usize, usize)> {
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
fn check_lane_condition_arguments(
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

fn check_adapter(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    adapter: &Spanned<RawAdapter>,
) -> Option<AdapterConfig> {
    let before = report.problems.len();
    let raw = &adapter.value;
    let kind = raw.kind.value;
    let present: [(&str, Option<Location>); 9] = [
        ("name", raw.name.as_ref().map(|v| v.referenced)),
        ("settings", raw.settings.as_ref().map(|v| v.referenced)),
        ("argv", raw.argv.as_ref().map(|v| v.referenced)),
        (
            "working_dir",
            raw.working_dir.as_ref().map(|v| v.referenced),
        ),
        (
            "env_allowlist",
            raw.env_allowlist.as_ref().map(|v| v.referenced),
        ),
        ("command", raw.command.as_ref().map(|v| v.referenced)),
        ("url", raw.url.as_ref().map(|v| v.referenced)),
        (
            "allowed_hosts",
            raw.allowed_hosts.as_ref().map(|v| v.referenced),
        ),
        ("tool", raw.tool.as_ref().map(|v| v.referenced)),
    ];
    let allowed: &[&str] = match kind {
        RawAdapterKind::Builtin => &["name", "settings"],
        RawAdapterKind::Command => &["argv", "working_dir", "env_allowlist"],
        RawAdapterKind::Http => &["url", "allowed_hosts"],
        RawAdapterKind::Mcp => &["command", "url", "tool"],
    };
    for (field, location) in present {
        if let Some(location) = location
            && !allowed.contains(&field)
        {
            report.at(
                file,
                location,
                adapter.referenced,
                format!(
                    "{owner}: adapter field `{field}` does not apply to kind `{}`",
                    kind.as_str()
                ),
                format!(
                    "an adapter of kind `{}` takes: {}",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            );
        }
    }
    let mut missing = Vec::new();
    let non_empty = |report: &mut Report<'_>, field: &str, value: &Spanned<String>| {
        if value.value.trim().is_empty() {
            report.spanned(
                file,
                value,
                format!("{owner}: adapter `{field}` is empty"),
                format!("give the adapter's `{field}`"),
            );
        }
    };
    let argv_ok = |report: &mut Report<'_>, field: &str, argv: &Spanned<Vec<String>>| {
        if argv
            .value
            .first()
            .is_none_or(|program| program.trim().is_empty())
        {
            report.spanned(
                file,
                argv,
                format!("{owner}: adapter `{field}` has no program"),
                format!(
                    "`{field}` is the program and its fixed arguments, e.g. `[python3, tools/x.py]`"
                ),
            );
        }
    };
    let config = match kind {
        RawAdapterKind::Builtin => {
            let name = raw.name.as_ref();
            match name {
                Some(name) => non_empty(report, "name", name),
                None => missing.push("name"),
            }
            name.map(|name| AdapterConfig::Builtin {
                name: name.value.clone(),
                settings: raw
                    .settings
                    .as_ref()
                    .map(|s| s.value.clone())
                    .unwrap_or_default(),
            })
        }
        RawAdapterKind::Command => {
            match &raw.argv {
                Some(argv) => argv_ok(report, "argv", argv),
                None => missing.push("argv"),
            }
            let mut env_allowlist = Vec::new();
            for var in raw.env_allowlist.iter().flat_map(|l| &l.value) {
                if !is_env_var_name(&var.value) {
                    report.spanned(
                        file,
                        var,
                        format!(
                            "{owner}: `{}` is not an environment variable name",
                            var.value.escape_debug()
                        ),
                        "use letters, digits and `_`, not starting with a digit",
                    );
                }
                env_allowlist.push(var.value.clone());
            }
            env_allowlist.sort();
            env_allowlist.dedup();
            raw.argv.as_ref().map(|argv| AdapterConfig::Command {
                argv: argv.value.clone(),
                working_dir: raw.working_dir.as_ref().map(|w| w.value.clone()),
                env_allowlist,
            })
        }
        RawAdapterKind::Http => {
            match &raw.url {
                Some(url) => non_empty(report, "url", url),
                None => missing.push("url"),
            }
            let hosts: Vec<String> = raw
                .allowed_hosts
                .iter()
                .flat_map(|l| &l.value)
                .map(|h| h.value.clone())
                .collect();
            match &raw.allowed_hosts {
                Some(list) if list.value.is_empty() => report.spanned(
                    file,
                    list,
                    format!("{owner}: `allowed_hosts` is empty"),
                    "list the host (or host:port) the adapter may connect to",
                ),
                None => missing.push("allowed_hosts"),
                Some(_) => {}
            }
            raw.url.as_ref().map(|url| AdapterConfig::Http {
                url: url.value.clone(),
                allowed_hosts: hosts,
            })
        }
        RawAdapterKind::Mcp => {
            match &raw.tool {
                Some(tool) => non_empty(report, "tool", tool),
                None => missing.push("tool"),
            }
            match (&raw.command, &raw.url) {
                (Some(command), None) => argv_ok(report, "command", command),
                (None, Some(url)) => non_empty(report, "url", url),
                _ => report.spanned(
                    file,
                    adapter,
                    format!(
                        "{owner}: adapter of kind `mcp` needs exactly one of `command` or `url`"
                    ),
                    "start the server with `command: [argv...]` or connect to it with `url:`",
                ),
            }
            raw.tool.as_ref().map(|tool| AdapterConfig::Mcp {
                command: raw.command.as_ref().map(|c| c.value.clone()),
                url: raw.url.as_ref().map(|u| u.value.clone()),
                tool: tool.value.clone(),
            })
        }
    };
    if !missing.is_empty() {
        report.spanned(
            file,
            adapter,
            format!(
                "{owner}: adapter of kind `{}` is missing {}",
                kind.as_str(),
                missing
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            format!(
                "an adapter of kind `{}` takes: {}",
                kind.as_str(),
                allowed.join(", ")
            ),
        );
    }
    (report.problems.len() == before)
        .then_some(config)
        .flatten()
}

fn check_redaction(
    report: &mut Report<'_>,
    file: &str,
    owner: &str,
    redaction: Option<&Spanned<RawRedaction>>,
) -> Option<Redaction> {
    let Some(redaction) = redaction else {
        return Some(Redaction::Full);
    };
    let RawRedaction { mode, pointers } = &redaction.value;
    match (mode.value, pointers) {
        (RawRedactionMode::Full, None) => Some(Redaction::Full),
        (RawRedactionMode::HashOnly, None) => Some(Redaction::HashOnly),
        (RawRedactionMode::Fields, Some(pointers)) if !pointers.is_empty() => {
            let before = report.problems.len();
            for pointer in pointers {
                if !is_json_pointer(&pointer.value) {
                    report.spanned(
                        file,
                        pointer,
                        format!("{owner}: redaction pointer `{}` is not a JSON pointer", pointer.value.escape_debug()),
                        "a JSON pointer starts with `/`, e.g. `/body`; use `mode: hash_only` to keep nothing",
                    );
                }
            }
            let mut list: Vec<String> = pointers.iter().map(|p| p.value.clone()).collect();
            list.sort();
            list.dedup();
            (report.problems.len() == before).then_some(Redaction::Fields { pointers: list })
        }
        (RawRedactionMode::Fields, _) => {
            report.spanned(
                file,
                redaction,
                format!("{owner}: redaction `mode: fields` needs a non-empty `pointers` list"),
                "e.g. `{mode: fields, pointers: [/body]}`",
            );
            None
        }
        (_, Some(_)) => {
            report.spanned(
                file,
                redaction,
                format!("{owner}: redaction `pointers` only apply to `mode: fields`"),
                "remove `pointers` or use `mode: fields`",
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cross-references

fn check_role_lanes(
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

fn check_lanes_and_tools(
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "case_id", "r2d2", &format!("a{}", "b".repeat(63))] {
            assert!(is_id(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "_a",
            "a-b",
            "a.b",
            "a b",
            "é",
            &format!("a{}", "b".repeat(64)),
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn every_id_is_an_mcp_tool_name() {
        for name in ["a", "read_document", &"z".repeat(64)] {
            assert!(is_id(name) && is_mcp_tool_name(name));
        }
        assert!(is_mcp_tool_name("Read.Doc-2"));
        assert!(!is_mcp_tool_name(""));
        assert!(!is_mcp_tool_name("a/b"));
        assert!(!is_mcp_tool_name(&"z".repeat(65)));
    }

    #[test]
    fn json_pointers() {
        for ok in ["/path", "/a/b", "/a~0b", "/a~1b", "/", "/0"] {
            assert!(is_json_pointer(ok), "{ok}");
        }
        for bad in ["", "path", "a/b", "/a~2", "/a~"] {
            assert!(!is_json_pointer(bad), "{bad}");
        }
    }

    #[test]
    fn sha256_hex_is_64_lowercase_digits() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex(&"a".repeat(63)));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let known: Vec<String> = ["research", "drafting", "filing"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            did_you_mean("reserch", &known).map(String::as_str),
            Some("research")
        );
        assert_eq!(
            did_you_mean("filling", &known).map(String::as_str),
            Some("filing")
        );
        assert_eq!(did_you_mean("accounting", &known), None);
    }

    #[test]
    fn flag_pointers_must_fit_a_closed_input_schema() {
        let schema = serde_json::json!({
            "type": "object", "additionalProperties": false,
            "properties": {"path": {"type": "string"}, "meta": {"type": "object"}}
        });
        assert!(pointer_fits_schema("/path", &schema).is_ok());
        assert!(pointer_fits_schema("/meta/anything", &schema).is_ok());
        assert!(pointer_fits_schema("/pth", &schema).is_err());
        let open = serde_json::json!({"type": "object", "properties": {}});
        assert!(pointer_fits_schema("/pth", &open).is_ok());
    }

    // -----------------------------------------------------------------------------------
    // Whole-policy checks over small in-memory registries.

    use crate::policy::raw::{LanesFile, RegistryFile, RolesFile};
    use crate::policy::read::parse_yaml;

    const ROLES: &str = "version: \"1\"
roles:
  - role_id: reader
    description: Reads.
    enabled: true
    lanes: [research]
    credential: {token_sha256: 1111111111111111111111111111111111111111111111111111111111111111}
  - role_id: writer
    description: Writes.
    enabled: true
    lanes: [drafting]
    credential: {token_env: WRITER_TOKEN}
admins:
  - admin_id: ops
    description: Operations.
    credential: {token_sha256: 2222222222222222222222222222222222222222222222222222222222222222}
";

    const LANES: &str = "version: \"1\"
lanes:
  - lane_id: research
    description: Research.
    tools: [lookup]
    required_scope_keys: [case_id]
    prohibited_flags: [sealed]
    run_statuses: [active]
    write: false
  - lane_id: drafting
    description: Drafting.
    tools: [lookup, save_draft]
    required_scope_keys: [case_id]
    prohibited_flags: []
    run_statuses: [active, suspended]
    write: true
";

    const REGISTRY: &str = "version: \"1\"
tools:
  - tool_name: lookup
    description: Looks up.
    enabled: true
    version: 1.0.0
    determinism: pure
    idempotent: true
    timeout_default_ms: 100
    limits: {timeout_ms_max: 1000, max_output_bytes: 1024, max_concurrency: 2}
    allowed_lanes: [research, drafting]
    required_scope_keys: []
    prohibited_flags: []
    flag_rules:
      - {flag: privileged, pointer: /path, prefix: privileged/}
    write_targets: []
    adapter: {kind: builtin, name: lookup}
    input_schema: {type: object, additionalProperties: false, properties: {path: {type: string}}}
    output_schema: {type: object}
  - tool_name: save_draft
    description: Saves.
    enabled: true
    version: 1.0.0
    determinism: side_effectful
    idempotent: false
    timeout_default_ms: 100
    limits: {timeout_ms_max: 1000, max_output_bytes: 1024, max_concurrency: 2}
    allowed_lanes: [drafting]
    required_scope_keys: [case_id]
    prohibited_flags: [sealed]
    write_targets: [\"data_dir:drafts/\"]
    adapter: {kind: command, argv: [save]}
    redaction: {mode: fields, pointers: [/body]}
    input_schema: {type: object}
    output_schema: {type: object}
";

    fn source(display: &str, text: &str) -> SourceFile {
        SourceFile {
            display: display.into(),
            bytes: text.as_bytes().to_vec(),
        }
    }

    fn parsed<T: serde::de::DeserializeOwned>(display: &str, text: &str) -> Parsed<T> {
        let file = source(display, text);
        let raw = parse_yaml(&file).unwrap_or_else(|p| panic!("{p}"));
        Parsed { file, raw }
    }

    /// Validates the three texts; the problems as `file:line:col: message`.
    fn check(roles: &str, lanes: &str, registry: &str) -> Result<Policy, Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let env = |var: &str| (var == "WRITER_TOKEN").then(|| "writer-token".to_string());
        let input = Input {
            roles: Some(parsed::<RolesFile>("roles.yaml", roles)),
            lanes: Some(parsed::<LanesFile>("lanes.yaml", lanes)),
            registry: Some(parsed::<RegistryFile>("tool_registry.yaml", registry)),
            tools_dir: dir.path(),
            env: &env,
        };
        let mut problems = Vec::new();
        let policy = build(input, &mut problems);
        crate::policy::sort_problems(&mut problems);
        match policy {
            Some(policy) if problems.is_empty() => Ok(policy),
            _ => Err(problems
                .iter()
                .map(|p| {
                    format!(
                        "{}:{}:{}: {}",
                        p.file,
                        p.line.unwrap_or(0),
                        p.column.unwrap_or(0),
                        p.message
                    )
                })
                .collect()),
        }
    }

    fn problems(roles: &str, lanes: &str, registry: &str) -> Vec<String> {
        check(roles, lanes, registry).err().unwrap_or_default()
    }

    #[test]
    fn the_base_policy_builds_with_sorted_lists() {
        let policy = check(ROLES, LANES, REGISTRY).unwrap();
        assert_eq!(policy.lanes["drafting"].tools, ["lookup", "save_draft"]);
        assert_eq!(
            policy.tools["lookup"].allowed_lanes,
            ["drafting", "research"]
        );
        assert_eq!(
            policy.lanes["drafting"].run_statuses,
            [RunStatus::Active, RunStatus::Suspended]
        );
        assert_eq!(
            policy.roles["writer"].credential,
            Credential::TokenEnv {
                var: "WRITER_TOKEN".into(),
                sha256: Some(crate::canonical::sha256_hex(b"writer-token"))
            }
        );
        assert_eq!(
            policy.tools["save_draft"].redaction,
            Redaction::Fields {
                pointers: vec!["/body".into()]
            }
        );
        assert_eq!(policy.tools["lookup"].redaction, Redaction::Full);
        assert!(
            policy.tools["lookup"]
                .input_validator
                .is_valid(&serde_json::json!({"path": "a"}))
        );
        assert!(
            !policy.tools["lookup"]
                .input_validator
                .is_valid(&serde_json::json!({"pth": "a"}))
        );
    }

    #[test]
    fn a_role_naming_an_unknown_lane() {
        let roles = ROLES.replace("lanes: [research]", "lanes: [research, filing]");
        assert_eq!(
            problems(&roles, LANES, REGISTRY),
            ["roles.yaml:6:23: role `reader` names unknown lane `filing`"]
        );
    }

    #[test]
    fn a_lane_allowlisting_an_unregistered_tool() {
        let lanes = LANES.replace("tools: [lookup]", "tools: [lookup, search]");
        assert_eq!(
            problems(ROLES, &lanes, REGISTRY),
            ["lanes.yaml:5:21: lane `research` allowlists unregistered tool `search`"]
        );
    }

    #[test]
    fn allowlists_must_agree_in_both_directions() {
        // The lane lists the tool; the tool does not list the lane.
        let registry = REGISTRY.replace(
            "allowed_lanes: [research, drafting]",
            "allowed_lanes: [drafting]",
        );
        assert_eq!(
            problems(ROLES, LANES, &registry),
            [
                "lanes.yaml:5:13: lane `research` allowlists tool `lookup`, but the tool's `allowed_lanes` does not include `research`"
            ]
        );
        // The tool lists the lane; the lane does not list the tool.
        let lanes = LANES.replace("tools: [lookup, save_draft]", "tools: [save_draft]");
        assert_eq!(
            problems(ROLES, &lanes, REGISTRY),
            [
                "tool_registry.yaml:11:31: tool `lookup` lists lane `drafting` in `allowed_lanes`, but that lane does not allowlist it"
            ]
        );
    }

    #[test]
    fn a_tool_that_writes_only_in_write_lanes() {
        let lanes = LANES.replace("tools: [lookup]", "tools: [lookup, save_draft]");
        let registry = REGISTRY.replace(
            "allowed_lanes: [drafting]",
            "allowed_lanes: [drafting, research]",
        );
        assert_eq!(
            problems(ROLES, &lanes, &registry),
            [
                "lanes.yaml:5:21: lane `research` is not a write lane, but allowlists `save_draft`, which writes"
            ]
        );
    }

    #[test]
    fn duplicate_ids_point_back_at_the_first() {
        let lanes = LANES.replace("lane_id: drafting", "lane_id: research");
        let found = problems(ROLES, &lanes, REGISTRY);
        assert!(
            found.contains(
                &"lanes.yaml:10:14: duplicate lane id `research` (first defined at line 3)"
                    .to_string()
            ),
            "{found:#?}"
        );
    }

    #[test]
    fn two_principals_may_not_share_a_token() {
        let roles = ROLES.replace(&"2".repeat(64), &"1".repeat(64));
        assert_eq!(
            problems(&roles, LANES, REGISTRY),
            ["roles.yaml:16:17: admin `ops` has the same credential as role `reader`"]
        );
    }

    #[test]
    fn determinism_write_targets_and_idempotence_agree() {
        let pure_writer = REGISTRY.replace(
            "determinism: side_effectful\n    idempotent: false",
            "determinism: pure\n    idempotent: false",
        );
        assert_eq!(
            problems(ROLES, LANES, &pure_writer),
            [
                "tool_registry.yaml:25:17: tool `save_draft` is `pure` but says `idempotent: false`",
                "tool_registry.yaml:31:20: tool `save_draft` is `pure` but declares write targets",
            ]
        );
        let silent_writer = REGISTRY.replace("[\"data_dir:drafts/\"]", "[]");
        assert_eq!(
            problems(ROLES, LANES, &silent_writer),
            [
                "tool_registry.yaml:31:20: tool `save_draft` is `side_effectful` but declares no write targets"
            ]
        );
        // Side effectful yet idempotent (a write that repeats identically) is allowed.
        let idempotent_writer = REGISTRY.replace(
            "determinism: side_effectful\n    idempotent: false",
            "determinism: side_effectful\n    idempotent: true",
        );
        assert!(check(ROLES, LANES, &idempotent_writer).is_ok());
    }

    #[test]
    fn one_file_failing_to_parse_skips_the_checks_that_need_it() {
        let dir = tempfile::tempdir().unwrap();
        let env = |_: &str| Some("t".to_string());
        let roles = ROLES.replace("lanes: [research]", "lanes: [nowhere]");
        let input = Input {
            roles: Some(parsed::<RolesFile>("roles.yaml", &roles)),
            lanes: None,
            registry: Some(parsed::<RegistryFile>("tool_registry.yaml", REGISTRY)),
            tools_dir: dir.path(),
            env: &env,
        };
        let mut found = Vec::new();
        assert!(build(input, &mut found).is_none());
        // No "unknown lane" noise: lanes.yaml did not parse, so nothing can be said.
        assert!(found.is_empty(), "{found:#?}");
    }
}
